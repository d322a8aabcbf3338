//! The report: one JSON line with the pipeline's figures, each ceiling and
//! the pipeline's rate over it, the memory used, and what went wrong.

use crate::bench::ceilings::Ceilings;
use crate::bench::drive::Pipeline;
use crate::bench::options::Options;

/// A field of `/proc/self/status` (`VmRSS:`, `VmHWM:`), in KiB; 0 if it
/// cannot be read.
pub(super) fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

/// What the run measured besides the pipeline and its ceilings.
pub(super) struct Run {
    /// How long filling the broker took, where it was filled first.
    pub publish_seconds: Option<f64>,
    /// The resident set before anything was opened.
    pub baseline_kib: u64,
}

/// Prints the line.
pub(super) fn print(options: &Options, run: &Run, pipeline: &Pipeline, ceilings: &Ceilings) {
    let n = options.messages;
    let Pipeline {
        seconds,
        peak_kib,
        stats,
        allocated,
    } = pipeline;
    let Ceilings {
        memory: ceiling_memory,
        sqlite: ceiling_sqlite,
        sqlite_durable: ceiling_sqlite_durable,
        sqlite_sqlx: ceiling_sqlite_sqlx,
        nats: ceiling_nats,
        postgres: ceiling_postgres,
        pubsub: ceiling_pubsub,
    } = *ceilings;
    let msgs_per_s = n as f64 / seconds;
    let acked = stats.acked.get();
    let ratio = |ceiling: f64| (msgs_per_s / ceiling * 1e3).round() / 1e3;
    println!(
        "{}",
        serde_json::json!({
            "messages": n,
            "acked": acked,
            "seconds": (seconds * 1e4).round() / 1e4,
            "msgs_per_s": msgs_per_s.round(),
            // As given: `sqlite` alone is broker and store in one file.
            "broker": options.broker,
            "db": options.db,
            "writers": options.db.starts_with("postgres://").then_some(options.writers),
            "ids": if options.random_ids { "random" } else { "ordered" },
            "publish_seconds": run.publish_seconds.map(|s| (s * 1e4).round() / 1e4),
            // Each ceiling, and the pipeline's rate over it (module `ceilings`).
            "ceiling_memory_msgs_per_s": ceiling_memory.map(f64::round),
            "ratio_memory": ceiling_memory.map(ratio),
            "ceiling_sqlite_msgs_per_s": ceiling_sqlite.map(f64::round),
            "ratio_sqlite": ceiling_sqlite.map(ratio),
            "ceiling_sqlite_durable_msgs_per_s": ceiling_sqlite_durable.map(f64::round),
            "ratio_sqlite_durable": ceiling_sqlite_durable.map(ratio),
            "ceiling_sqlite_sqlx_msgs_per_s": ceiling_sqlite_sqlx.map(|(multi, _)| multi.round()),
            "ceiling_sqlite_sqlx_one_row_msgs_per_s": ceiling_sqlite_sqlx.map(|(_, one)| one.round()),
            "ceiling_nats_msgs_per_s": ceiling_nats.map(f64::round),
            "ratio_nats": ceiling_nats.map(ratio),
            "ceiling_postgres_msgs_per_s": ceiling_postgres.map(f64::round),
            "ratio_postgres": ceiling_postgres.map(ratio),
            "pull": options.broker.starts_with("pubsub://").then(|| options.pull.clone()),
            "ceiling_pubsub_streaming_msgs_per_s": ceiling_pubsub.map(|(streaming, _)| streaming.round()),
            "ceiling_pubsub_unary_msgs_per_s": ceiling_pubsub.map(|(_, unary)| unary.round()),
            // Over the higher of the two.
            "ratio_pubsub": ceiling_pubsub.map(|(streaming, unary)| ratio(streaming.max(unary))),
            "notify": options.notify,
            "notifications_sent": stats.notifications_sent.get(),
            "notifications_failed": stats.notifications_failed.get(),
            "notifications_dropped": stats.notifications_dropped.get(),
            // With --allocations (module `allocations`).
            "allocations_per_message": allocated.map(|a| per_message(a.calls, n)),
            "bytes_allocated_per_message": allocated.map(|a| per_message(a.bytes, n)),
            "peak_rss_mb": (*peak_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            "baseline_rss_mb": (run.baseline_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            // What went wrong on the way: a healthy run has no store
            // failures and no lost leases.
            "pulled": stats.pulled.get(),
            "store_failures": stats.store_failures.get(),
            "store_outages": stats.store_outages.get(),
            "leases_lost": stats.leases_lost.get(),
            "abandoned": stats.abandoned.get(),
            "deferred": stats.deferred.get(),
            "nacked": stats.nacked.get(),
        })
    );
}

/// A count over `n` messages, to a tenth.
pub(super) fn per_message(count: u64, n: usize) -> f64 {
    (count as f64 / n.max(1) as f64 * 10.0).round() / 10.0
}
