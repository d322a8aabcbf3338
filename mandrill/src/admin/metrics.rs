//! `/metrics`: the counters of [`Stats`] in Prometheus's text format.
//!
//! The hot path keeps its atomics; a scrape copies them into a local (never
//! global) `metrics` recorder and renders it. Labels are a handful of fixed
//! words: never a message id or a host name.

use metrics::{Unit, counter, describe_counter, describe_gauge, gauge, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use std::fmt::Write as _;

use crate::diagnostics::RuntimeMetrics;
use crate::domain::Rejection;
use crate::stats::{BUCKETS, DeadLetterReason, Histogram, Stats, StatsSnapshot, Timings};

/// Requests by final outcome: (label, counter) pairs.
fn outcomes(s: &StatsSnapshot) -> [(&'static str, u64); 7] {
    [
        ("restarted", s.restarted),
        ("restart_failed", s.restart_failures),
        ("unrecovered", s.unrecovered),
        ("denied", s.denied),
        ("dry_run", s.dry_runs),
        ("duplicate", s.duplicates),
        ("given_up", s.given_up),
    ]
}

/// Counters by a fixed set of reasons: (name, reason, value).
pub(crate) fn reasons(stats: &Stats) -> Vec<(&'static str, &'static str, u64)> {
    let dead_letters = DeadLetterReason::ALL.iter().map(|reason| {
        let value = stats.dead_letter_reasons[*reason as usize].get();
        ("mandrill_dead_letters_total", reason.label(), value)
    });
    let rejections = Rejection::KINDS.iter().enumerate().map(|(i, kind)| {
        let value = stats.rejection_reasons[i].get();
        ("mandrill_rejections_total", *kind, value)
    });
    dead_letters.chain(rejections).collect()
}

/// Plain counters: (name, help, value).
fn counters(s: &StatsSnapshot) -> [(&'static str, &'static str, u64); 12] {
    [
        (
            "mandrill_pulled_total",
            "Deliveries received from the broker.",
            s.pulled,
        ),
        ("mandrill_acked_total", "Deliveries acked.", s.acked),
        (
            "mandrill_retries_total",
            "Deliveries nacked for a retry.",
            s.nacked,
        ),
        (
            "mandrill_lease_extensions_total",
            "Lease extensions sent.",
            s.lease_extensions,
        ),
        (
            "mandrill_leases_lost_total",
            "Leases found lost (expired or settled elsewhere).",
            s.leases_lost,
        ),
        (
            "mandrill_panics_total",
            "Panics caught in message handling or the pull loop.",
            s.panics,
        ),
        (
            "mandrill_pull_failures_total",
            "Times the pull loop failed and was restarted.",
            s.pull_failures,
        ),
        (
            "mandrill_store_failures_total",
            "Failed store operations (each try counts).",
            s.store_failures,
        ),
        (
            "mandrill_store_outages_total",
            "Times pulling paused because the store was unreachable.",
            s.store_outages,
        ),
        (
            "mandrill_settle_failures_total",
            "Settlements the broker refused.",
            s.settle_failures,
        ),
        (
            "mandrill_stalls_total",
            "Times the runtime was found stalled by blocking code.",
            s.stalls,
        ),
        (
            "mandrill_deferred_total",
            "Deliveries held off while a restart of the same request may be in flight.",
            s.deferred,
        ),
    ]
}

/// A recorder that renders what the last scrape copied into it.
pub(crate) struct Exposition {
    recorder: PrometheusRecorder,
}

impl Exposition {
    pub(crate) fn new() -> Self {
        let recorder = PrometheusBuilder::new().build_recorder();
        with_local_recorder(&recorder, || {
            describe_counter!("mandrill_requests_total", "Requests finished, by outcome.");
            describe_counter!(
                "mandrill_dead_letters_total",
                "Deliveries dead-lettered, by reason: malformed, given_up, restart_failed, \
                 panicked, store_refused, other."
            );
            describe_counter!(
                "mandrill_rejections_total",
                "Payloads rejected as malformed, by what was wrong."
            );
            describe_counter!(
                "mandrill_notifications_total",
                "Notifications by result: sent, failed (after every try), dropped (queue full \
                 or shutdown's flush bound over)."
            );
            describe_counter!(
                "mandrill_replies_total",
                "Verdicts published to a request's reply_to, by result: sent, failed."
            );
            for (name, help, _) in counters(&StatsSnapshot::default()) {
                describe_counter!(name, help);
            }
            describe_gauge!(
                "mandrill_in_flight",
                Unit::Count,
                "Deliveries being handled now."
            );
            describe_gauge!(
                "mandrill_store_down",
                "1 while the store is unreachable and pulling is paused."
            );
            describe_gauge!(
                "mandrill_leashed",
                "1 when restarts are recorded as dry runs, not issued."
            );
            describe_gauge!("mandrill_shutting_down", "1 once shutdown was requested.");
            describe_gauge!("mandrill_build_info", "Always 1; the version as a label.");
            describe_gauge!(
                "mandrill_runtime_workers",
                "The tokio runtime's worker threads."
            );
            describe_gauge!(
                "mandrill_runtime_alive_tasks",
                "Tasks spawned on the runtime and not yet finished."
            );
            describe_gauge!(
                "mandrill_runtime_global_queue_depth",
                "Tasks waiting in the runtime's shared queue for a worker."
            );
        });
        Self { recorder }
    }

    /// The exposition for `stats`.
    pub(crate) fn render(
        &self,
        stats: &StatsSnapshot,
        reasons: &[(&'static str, &'static str, u64)],
        runtime: &RuntimeMetrics,
        leashed: bool,
        shutting_down: bool,
    ) -> String {
        with_local_recorder(&self.recorder, || {
            for (outcome, value) in outcomes(stats) {
                counter!("mandrill_requests_total", "outcome" => outcome).absolute(value);
            }
            for (name, _, value) in counters(stats) {
                counter!(name).absolute(value);
            }
            for (name, reason, value) in reasons {
                counter!(*name, "reason" => *reason).absolute(*value);
            }
            for (result, value) in [
                ("sent", stats.notifications_sent),
                ("failed", stats.notifications_failed),
                ("dropped", stats.notifications_dropped),
            ] {
                counter!("mandrill_notifications_total", "result" => result).absolute(value);
            }
            for (result, value) in [
                ("sent", stats.replies_sent),
                ("failed", stats.replies_failed),
            ] {
                counter!("mandrill_replies_total", "result" => result).absolute(value);
            }
            gauge!("mandrill_in_flight").set(stats.in_flight as f64);
            gauge!("mandrill_store_down").set(stats.store_down as f64);
            gauge!("mandrill_leashed").set(f64::from(u8::from(leashed)));
            gauge!("mandrill_shutting_down").set(f64::from(u8::from(shutting_down)));
            gauge!("mandrill_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            gauge!("mandrill_runtime_workers").set(runtime.workers as f64);
            gauge!("mandrill_runtime_alive_tasks").set(runtime.alive_tasks as f64);
            gauge!("mandrill_runtime_global_queue_depth").set(runtime.global_queue_depth as f64);
        });
        let mut text = self.recorder.handle().render();
        // Written here: the exporter's counters are whole numbers.
        let name = "mandrill_runtime_busy_seconds_total";
        let _ = writeln!(
            text,
            "# HELP {name} Time the runtime's workers spent running tasks, summed over workers.\n\
             # TYPE {name} counter\n{name} {:.6}",
            runtime.busy_seconds
        );
        text
    }
}

/// The inventory's state: how old the copy in force is, how many reads
/// failed, how many hosts it lists. Written here, as the groups are: read
/// from the handle at scrape time.
pub(crate) fn render_inventory(inventory: &crate::inventory::InventoryHandle) -> String {
    let mut text = String::new();
    let current = inventory.current();
    if let Some(snapshot) = &current {
        let _ = writeln!(
            text,
            "# HELP mandrill_inventory_age_seconds Age of the inventory copy in force.\n\
             # TYPE mandrill_inventory_age_seconds gauge\n\
             mandrill_inventory_age_seconds {:.3}",
            snapshot.age().as_secs_f64()
        );
    }
    let _ = writeln!(
        text,
        "# HELP mandrill_inventory_refresh_failures_total Reads of the inventory that failed \
         (the last good copy was kept).\n\
         # TYPE mandrill_inventory_refresh_failures_total counter\n\
         mandrill_inventory_refresh_failures_total {}",
        inventory.failures()
    );
    let _ = writeln!(
        text,
        "# HELP mandrill_inventory_hosts Hosts the inventory in force lists.\n\
         # TYPE mandrill_inventory_hosts gauge\n\
         mandrill_inventory_hosts {}",
        current.map_or(0, |s| s.inventory.len())
    );
    text
}

/// The histograms in the same text format, written here because the
/// exporter takes observations one by one, while `Stats` keeps buckets.
/// Each group's use of its limits, from the store's restart journal: low
/// cardinality (a group is a set of hosts, never one host or request).
pub(crate) fn render_groups(
    usage: &std::collections::BTreeMap<String, crate::store::GroupUsage>,
    budget: impl Fn(&str) -> Option<u32>,
) -> String {
    let escape = |group: &str| {
        group
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let mut text = String::new();
    let mut family = |name: &str, help: &str, values: Vec<(&String, Option<u32>)>| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (group, value) in values {
            if let Some(value) = value {
                let _ = writeln!(text, "{name}{{group=\"{}\"}} {value}", escape(group));
            }
        }
    };
    family(
        "mandrill_group_restarts_in_window",
        "Restarts of a group claimed within safety.rate.window.",
        usage.iter().map(|(g, u)| (g, Some(u.restarts))).collect(),
    );
    family(
        "mandrill_group_disrupted_hosts",
        "Hosts of a group disrupted now (restarting, or not verified recovered).",
        usage.iter().map(|(g, u)| (g, Some(u.disrupted))).collect(),
    );
    family(
        "mandrill_group_disruption_budget",
        "Hosts of a group that may be disrupted at once (absent: unlimited).",
        usage.keys().map(|g| (g, budget(g))).collect(),
    );
    text
}

pub(crate) fn render_histograms(timings: &Timings) -> String {
    let mut text = String::new();
    for (name, help, histogram) in [
        (
            "mandrill_handling_seconds",
            "Time from pulled to settled, per delivery.",
            &timings.handling,
        ),
        (
            "mandrill_restart_seconds",
            "Time of a restart call, verification included.",
            &timings.restart,
        ),
        (
            "mandrill_recovery_seconds",
            "Time a verified host took to come back.",
            &timings.recovery,
        ),
    ] {
        write_histogram(&mut text, name, help, histogram);
    }
    text
}

fn write_histogram(text: &mut String, name: &str, help: &str, histogram: &Histogram) {
    let (cumulative, sum) = histogram.read();
    // Writing to a String cannot fail.
    let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, count) in BUCKETS.iter().zip(&cumulative) {
        let _ = writeln!(text, "{name}_bucket{{le=\"{bound}\"}} {count}");
    }
    let count = cumulative.last().copied().unwrap_or(0);
    let _ = writeln!(
        text,
        "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
    );
}

/// Everything `/metrics` can show, for one group and a current inventory,
/// with every counter at zero: what docs/operating.md's list is read from.
pub(crate) fn exposition_sample() -> String {
    let stats = Stats::default();
    let mut text = Exposition::new().render(
        &stats.snapshot(),
        &reasons(&stats),
        &RuntimeMetrics::default(),
        false,
        false,
    );
    text.push_str(&render_histograms(&stats.timings));
    let usage = [("GROUP".to_owned(), crate::store::GroupUsage::default())].into();
    text.push_str(&render_groups(&usage, |_| Some(1)));
    let inventory = crate::inventory::InventoryHandle::new(
        crate::inventory::Inventory::default(),
        &crate::inventory::Source::File("hosts.toml".into()),
        &crate::inventory::InventorySettings::default(),
    );
    text.push_str(&render_inventory(&inventory));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_by_convention_with_fixed_labels() {
        let stats = StatsSnapshot {
            restarted: 3,
            dead_lettered: 2,
            in_flight: 1,
            ..StatsSnapshot::default()
        };
        let runtime = RuntimeMetrics {
            workers: 2,
            alive_tasks: 9,
            global_queue_depth: 0,
            busy_seconds: 1.5,
        };
        let live = Stats::default();
        live.dead_letter_reasons[DeadLetterReason::Malformed as usize].inc();
        live.rejection_reasons[2].inc();
        let text = Exposition::new().render(&stats, &reasons(&live), &runtime, true, false);
        for line in [
            "mandrill_requests_total{outcome=\"restarted\"} 3",
            "mandrill_requests_total{outcome=\"unrecovered\"} 0",
            "mandrill_dead_letters_total{reason=\"malformed\"} 1",
            "mandrill_dead_letters_total{reason=\"store_refused\"} 0",
            "mandrill_rejections_total{reason=\"bad_json\"} 1",
            "mandrill_in_flight 1",
            "mandrill_leashed 1",
            "mandrill_runtime_workers 2",
            "mandrill_runtime_alive_tasks 9",
            "mandrill_runtime_busy_seconds_total 1.500000",
            "# TYPE mandrill_requests_total counter",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(text.contains("mandrill_build_info{version=\""), "{text}");
        let timings = Timings::default();
        timings
            .restart
            .observe(std::time::Duration::from_millis(300));
        let text = render_histograms(&timings);
        for line in [
            "# TYPE mandrill_restart_seconds histogram",
            "mandrill_restart_seconds_bucket{le=\"0.25\"} 0",
            "mandrill_restart_seconds_bucket{le=\"0.5\"} 1",
            "mandrill_restart_seconds_bucket{le=\"+Inf\"} 1",
            "mandrill_restart_seconds_count 1",
            "mandrill_recovery_seconds_count 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
