//! `/metrics`: the counters of [`Stats`] in Prometheus's text format.
//!
//! The hot path keeps its atomics; a scrape copies them into a local (never
//! global) `metrics` recorder and renders it. Labels are a handful of fixed
//! words: never a message id or a host name.
//!
//! Every family `/metrics` serves is named and written here, so that the
//! names the alert rules and dashboards depend on live in one file: one
//! piece past 400 lines.

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
            "Deliveries nacked for redelivery: deferrals (mandrill_deferred_total) and retries after a failure.",
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
            "Deliveries deferred: a guard said not yet, or a restart of the same request may be in flight.",
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
                "Deliveries dead-lettered, by reason: malformed, refused, given_up, \
                 restart_failed, panicked, store_refused, other."
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
                "1 when restarts are recorded as dry runs, not issued: the leash recorded in the store (mandrill leash, unleash), else the instance's own (safety.dry_run, --unleash)."
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

/// The kill switch and the group pauses (`paused`: whether the switch is
/// on, `None` if the store did not answer) and each recovery objective
/// judged: every family's help and type always written, so that alerting
/// rules find their names whatever the state.
pub(crate) fn render_recovery(
    paused: Option<bool>,
    pauses: &[crate::store::GroupPause],
    judged: &[crate::safety::objectives::Judged],
) -> String {
    let escape = |group: &str| {
        group
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let number = |value: f64| {
        if value.is_infinite() {
            "+Inf".to_owned()
        } else {
            format!("{value:.3}")
        }
    };
    let mut groups: std::collections::BTreeMap<&str, bool> =
        judged.iter().map(|j| (j.group.as_str(), false)).collect();
    for pause in pauses {
        groups.insert(&pause.group, true);
    }
    let mut recovery = Vec::new();
    let mut samples = Vec::new();
    let mut objective = Vec::new();
    let mut met = Vec::new();
    for judged in judged {
        let group = escape(&judged.group);
        // `percentile`, not `quantile`: that label is a summary's own.
        // One series when the objective's percentile is the median.
        let mut ranks = vec![(50, judged.p50)];
        if judged.percentile != 50 {
            ranks.push((judged.percentile, judged.at_percentile));
        }
        for (p, value) in ranks {
            if let Some(value) = value {
                recovery.push(format!(
                    "{{group=\"{group}\",percentile=\"{p}\"}} {}",
                    number(value.seconds())
                ));
            }
        }
        samples.push(format!("{{group=\"{group}\"}} {}", judged.samples));
        objective.push(format!(
            "{{group=\"{group}\"}} {}",
            number(judged.max.as_secs_f64())
        ));
        if let Some(is_met) = judged.met {
            met.push(format!("{{group=\"{group}\"}} {}", u8::from(is_met)));
        }
    }
    let families = [
        (
            "mandrill_paused",
            "1 while the kill switch pauses every restart (absent: the store did not answer).",
            paused
                .map(|p| format!(" {}", u8::from(p)))
                .into_iter()
                .collect(),
        ),
        (
            "mandrill_group_paused",
            "1 while a group's restarts are paused (mandrill pause --group, or a breached \
             recovery objective); 0 for a group with an objective that is not.",
            groups
                .iter()
                .map(|(group, p)| format!("{{group=\"{}\"}} {}", escape(group), u8::from(*p)))
                .collect(),
        ),
        (
            "mandrill_group_recovery_seconds",
            "A group's recovery time over its objective's last verified restarts, at the \
             median and at the objective's percentile (nearest rank; +Inf: a host never came \
             back).",
            recovery,
        ),
        (
            "mandrill_group_recovery_samples",
            "Verified restarts a group's recovery objective is judged over.",
            samples,
        ),
        (
            "mandrill_recovery_objective_seconds",
            "A group's recovery objective: the longest its percentile may be.",
            objective,
        ),
        (
            "mandrill_recovery_objective_met",
            "1 while a group meets its recovery objective, 0 once breached (absent: no \
             verified restart yet).",
            met,
        ),
    ];
    let mut text = String::new();
    for (name, help, lines) in families {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for line in lines {
            let _ = writeln!(text, "{name}{line}");
        }
    }
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
    let objective = crate::safety::objectives::RecoveryObjective {
        group: "GROUP".into(),
        max: std::time::Duration::from_secs(120),
        ..Default::default()
    };
    let judged = crate::safety::objectives::judge(&objective, &[Some(std::time::Duration::ZERO)]);
    text.push_str(&render_recovery(Some(false), &[], &[judged]));
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

    #[test]
    fn recovery_families_are_written_whole_with_infinity_for_a_host_never_back() {
        use crate::safety::objectives::{RecoveryObjective, judge};
        let objective = |group: &str| RecoveryObjective {
            group: group.into(),
            max: std::time::Duration::from_secs(120),
            ..RecoveryObjective::default()
        };
        let secs = std::time::Duration::from_secs;
        let judged = [
            judge(&objective("web"), &[Some(secs(10)), None]),
            judge(&objective("db"), &[Some(secs(10)), Some(secs(30))]),
            judge(&objective("new"), &[]),
        ];
        let pause = crate::store::GroupPause {
            group: "web".into(),
            by: "recovery-objective".into(),
            reason: "breached".into(),
            since: crate::domain::Timestamp::from_millis(1),
        };
        let text = render_recovery(Some(false), &[pause], &judged);
        for line in [
            "mandrill_paused 0",
            "mandrill_group_paused{group=\"web\"} 1",
            "mandrill_group_paused{group=\"db\"} 0",
            "mandrill_group_recovery_seconds{group=\"web\",percentile=\"95\"} +Inf",
            "mandrill_group_recovery_seconds{group=\"db\",percentile=\"50\"} 10.000",
            "mandrill_group_recovery_seconds{group=\"db\",percentile=\"95\"} 30.000",
            "mandrill_recovery_objective_seconds{group=\"new\"} 120.000",
            "mandrill_recovery_objective_met{group=\"web\"} 0",
            "mandrill_recovery_objective_met{group=\"db\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // No verdict without a verified restart; each family one block.
        assert!(!text.contains("mandrill_recovery_objective_met{group=\"new\"}"));
        assert_eq!(
            text.matches("# TYPE mandrill_group_paused gauge").count(),
            1
        );
    }
}
