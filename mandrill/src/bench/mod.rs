//! The tutorial's workload through the real worker, measured.
//!
//! `run` is the benchmark's script: set-up, pipeline, ceilings and report
//! in the order they happen, each in its module beside this file. It lives
//! in the crate, behind the `bench` feature, because it drives the worker
//! below the crate's API (a store that saves slowly, the simulation), as
//! unit tests do; the crate exports nothing for it alone.
//!
//! `cargo bench -p mandrill --features bench --bench pipeline -- --messages N --work-ms W --fail-rate F
//!  [--broker memory|sqlite:PATH|nats://HOST:PORT|pubsub://PROJECT/SUBSCRIPTION]
//!  [--pull unary|streaming] [--db memory|sqlite:PATH|postgres://…] [--writers N]
//!  [--ids ordered|random] [--no-ceilings] [--allocations] [--budget FILE]`
//!
//! `--allocations` counts the pipeline's allocations and bytes allocated
//! per message (`allocations.rs`); `--budget FILE` counts them and exits 1
//! when this run's path (memory, or sqlite) allocates more per message than
//! the file allows (CI runs it with `mandrill/bench/budget.toml`).
//!
//! Payloads carry time-ordered (version 7) message ids, as mandrill's own
//! publishers mint them; `--ids random` gives version 4 ids, as another
//! publisher may send.
//!
//! With the in-memory broker (the default), publishes N requests as fast as
//! possible while the worker handles them with `max_in_flight` = N (the
//! tutorial bounds nothing). Save and restart each wait W ms and restarts
//! fail with probability F; failures are not retried (max_attempts 1), as in
//! the tutorial, so they are dead-lettered. Prints one JSON line; `seconds`
//! runs from the first publish to the last settlement.
//!
//! With `--broker sqlite:PATH` (a real file; `sqlite` alone means a file in a
//! fresh temporary directory) the N requests are published first, in one
//! transaction, and `seconds` runs from the worker's start until the queue is
//! idle. `--db` chooses the store the same way (default: in memory).
//!
//! Each path's ceiling is measured in the same run, after the pipeline
//! (`pipeline/ceilings.rs` says what each does): (a) with broker and store in
//! memory, a one-task-per-message loop doing the same per-message work;
//! (b) with either on SQLite, one writer doing receipt, claim, outcome and
//! ack per message, a batch per transaction, with the same pragmas (and
//! `ceiling_sqlite_durable_msgs_per_s`, the same loop committing each
//! batch's lease, claims, and outcomes with acks in turn, as the pipeline
//! must), and its twins through sqlx (`ceiling_sqlite_sqlx_msgs_per_s`
//! multi-row as the writer writes, `ceiling_sqlite_sqlx_one_row_msgs_per_s`);
//! (c) with
//! NATS, a bare loop that keeps pulling while its acks are in flight; (d)
//! with PostgreSQL, a bare batched `unnest` upsert loop. The line has
//! `ceiling_{memory,sqlite,nats,postgres}_msgs_per_s` and
//! `ratio_{memory,sqlite,nats,postgres}` (the pipeline's rate over the
//! ceiling), `null` where not measured.
//!
//! With `--broker pubsub://PROJECT/SUBSCRIPTION` (the service, or an
//! emulator named by `PUBSUB_EMULATOR_HOST`), the N requests are published
//! first to a topic and subscription of this run's own (the name is a
//! prefix), and `--pull` chooses how mandrill pulls. The same run measures
//! two ceilings on subscriptions of their own, with no other work: a bare
//! `StreamingPull` loop acking each chunk it takes in one call, and a bare
//! unary loop (`Pull` of 1000, one `Acknowledge` per batch);
//! `ratio_pubsub` is the pipeline's rate over the higher of the two.
//!
//! `--notify slow|down|URL` adds a `[[notify]]` endpoint wanting every
//! restarted and failed request (one event per message, the worst case):
//! `slow` is a receiver in this process that answers after 10 s, `down` a
//! port nothing listens on. The notification counts are in the line.
//! With `--db postgres://…`, a fresh database on that server is used (and
//! dropped), with a pool of 16 connections and `--writers` writer tasks
//! (default: the store's default).

use bytes::Bytes;
use options::{Options, parse_options};
use setup::Resources;

pub use allocations::CountingAllocator;

/// Runs the benchmark with the process's arguments; `benches/pipeline.rs`
/// is this and the binary's allocator.
pub fn main() {
    let options = parse_options();
    ceilings::RANDOM_IDS.store(options.random_ids, std::sync::atomic::Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime starts");
    runtime.block_on(run(options));
}

async fn run(options: Options) {
    // Payloads are made before the clock starts: the benchmark measures the
    // pipeline, not the random generator.
    let payloads: Vec<Bytes> = ceilings::payloads(options.messages, options.signed);
    let baseline_kib = report::rss_kib("VmRSS:");
    // Kept until the end: the SQLite files live here.
    let dir = tempfile::tempdir().expect("temporary directory");
    let resources = Resources::create(&options, dir.path()).await;
    let opened = setup::open(&options, &resources, payloads).await;
    let run = report::Run {
        publish_seconds: opened.publish_seconds,
        baseline_kib,
    };
    let pipeline = drive::run(&options, opened).await;
    let ceilings = ceilings::measure(&options, &resources, dir.path()).await;
    // Drops the database and deletes the streams, if there are any.
    drop(resources);
    report::print(&options, &run, &pipeline, &ceilings);
    if let Some(file) = &options.budget
        && let Err(why) = within_budget(&options, file, &pipeline)
    {
        eprintln!("error: {why}");
        std::process::exit(1);
    }
}

/// `--budget`: the pipeline's allocations per message against the file's
/// figures for this run's path.
fn within_budget(
    options: &Options,
    file: &std::path::Path,
    pipeline: &drive::Pipeline,
) -> Result<(), String> {
    let path = allocations::path_name(&options.broker, &options.db).ok_or_else(|| {
        format!(
            "--budget: no budgeted path for --broker {} --db {} (memory, or both on sqlite)",
            options.broker, options.db
        )
    })?;
    let budget = std::fs::read_to_string(file)
        .map_err(|error| format!("--budget {}: {error}", file.display()))?;
    // Set with --budget, which implies counting.
    let allocated = pipeline.allocated.expect("allocations counted");
    let n = options.messages;
    allocations::check(
        &budget,
        file,
        path,
        report::per_message(allocated.calls, n),
        report::per_message(allocated.bytes, n),
    )
}

mod allocations;
mod ceilings;
mod drive;
mod notify;
mod options;
mod pubsub;
mod report;
mod setup;
mod slow_save;

/// NATS names of this run's own (the tests' helper).
#[allow(unreachable_pub)]
#[cfg_attr(test, allow(clippy::duplicate_mod))]
#[path = "../../tests/services/nats_names.rs"]
mod nats_names;

/// A throwaway PostgreSQL database (the tests' helper).
#[allow(unreachable_pub)]
#[cfg_attr(test, allow(clippy::duplicate_mod))]
#[path = "../../tests/services/postgres.rs"]
mod throwaway_postgres;
