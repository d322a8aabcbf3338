//! `mandrill policy replay --since DURATION`: re-evaluates the requests
//! recorded since then under the candidate policy (the configuration this
//! command was given) and prints each one it would have decided
//! differently: the what-if before a policy change goes live.
//!
//! Each request is judged at the moment it was first received, in the order
//! received: eligibility, the calendar, then the rate limits and host
//! cooldown, counted over the restarts the candidate itself would have
//! issued. The disruption budget is not replayed (whether a host was still
//! down depends on recovery times the history cannot replay), nor are
//! retries: a request counts as one restart.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use super::{BadInput, switch};
use crate::config::Config;
use crate::domain::Status;
use crate::domain::Timestamp;
use crate::safety::{Placement, Verdict, limits::Limits};
use crate::store::HistoryEntry;

/// What the reason of a denial for a message's group starts with
/// (`safety::group_mismatch`).
const GROUP_MISMATCH: &str = "denied by group mismatch";

/// Most requests a replay reads.
const MAX_REPLAYED: usize = 100_000;

/// What a policy does with a request, coarsely: what a replay compares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    Restart,
    DryRun,
    Deny(String),
    Defer(String),
}

impl Decision {
    fn name(&self) -> &'static str {
        match self {
            Self::Restart => "restart",
            Self::DryRun => "dry-run",
            Self::Deny(_) => "deny",
            Self::Defer(_) => "defer",
        }
    }

    fn reason(&self) -> Option<&str> {
        match self {
            Self::Deny(reason) | Self::Defer(reason) => Some(reason),
            Self::Restart | Self::DryRun => None,
        }
    }

    /// What was recorded, in the same terms; `None` for what no policy
    /// decided (rejected payloads, requests still open).
    fn recorded(entry: &HistoryEntry) -> Option<Self> {
        Some(match entry.status {
            Status::Restarted | Status::Unrecovered => Self::Restart,
            Status::Failed if entry.attempts > 0 => Self::Restart,
            Status::DryRun => Self::DryRun,
            Status::Denied => Self::Deny(entry.last_error.clone().unwrap_or_default()),
            Status::Expired => Self::Defer(entry.last_error.clone().unwrap_or_default()),
            // A cancelled target was stopped by an operator, not decided
            // by a policy.
            Status::Received
            | Status::Retrying
            | Status::Rejected
            | Status::Failed
            | Status::Cancelled => {
                return None;
            }
        })
    }
}

/// The candidate's restarts so far, for its rate limits.
#[derive(Default)]
struct Issued {
    by_group: HashMap<String, Vec<i64>>,
    by_host: HashMap<String, i64>,
    all: Vec<i64>,
}

impl Issued {
    fn check(&self, limits: &Limits, group: &str, host: &str, at: i64) -> Result<(), String> {
        let usage = crate::safety::limits::Usage {
            group_claims: count_since(self.by_group.get(group).map(Vec::as_slice), limits, at),
            group_oldest: oldest_since(self.by_group.get(group).map(Vec::as_slice), limits, at),
            global_claims: count_since(Some(&self.all), limits, at),
            global_oldest: oldest_since(Some(&self.all), limits, at),
            host_last: self.by_host.get(host).copied(),
            ..Default::default()
        };
        let without_budget = Limits {
            budget: None,
            zone_budget: None,
            ..*limits
        };
        let subject = crate::safety::limits::Subject {
            group,
            instance: host,
            zone: None,
            requester: None,
        };
        crate::safety::limits::check(&without_budget, subject, &usage, at)
            .map(drop)
            .map_err(|refusal| refusal.reason)
    }

    fn record(&mut self, group: &str, host: &str, at: i64) {
        self.by_group.entry(group.to_owned()).or_default().push(at);
        self.by_host.insert(host.to_owned(), at);
        self.all.push(at);
    }
}

fn window_start(limits: &Limits, at: i64) -> i64 {
    at.saturating_sub(i64::try_from(limits.window.as_millis()).unwrap_or(i64::MAX))
}

/// The times in `times` after the window's start: the replay records them
/// in the order received, so they are sorted and a binary search finds the
/// first (a scan per request made a replay of 100,000 quadratic).
fn since_window_start<'a>(times: Option<&'a [i64]>, limits: &Limits, at: i64) -> &'a [i64] {
    let start = window_start(limits, at);
    let times = times.unwrap_or_default();
    debug_assert!(times.is_sorted(), "recorded in the order received");
    &times[times.partition_point(|t| *t <= start)..]
}

fn count_since(times: Option<&[i64]>, limits: &Limits, at: i64) -> u32 {
    u32::try_from(since_window_start(times, limits, at).len()).unwrap_or(u32::MAX)
}

fn oldest_since(times: Option<&[i64]>, limits: &Limits, at: i64) -> Option<i64> {
    since_window_start(times, limits, at).first().copied()
}

/// Runs the replay and prints what changed.
pub(super) async fn run(config: &Config, since: &str, json: bool) -> anyhow::Result<()> {
    let since: Duration = humantime::parse_duration(since).map_err(|error| {
        BadInput(format!(
            "--since {since:?} is not a duration (e.g. 7d, 12h): {error}"
        ))
    })?;
    let store = switch::open(config).await?;
    let history = store
        .history(MAX_REPLAYED)
        .await
        .context("cannot read the history");
    // The leash every instance obeys: an operator's record in the store,
    // else the candidate's own `safety.dry_run`.
    let switch = store.switch().await.context("cannot read the leash");
    store.close().await;
    let history = history?;
    if history.len() >= MAX_REPLAYED {
        eprintln!(
            "mandrill: note: only the latest {MAX_REPLAYED} requests of the history are replayed"
        );
    }
    let leash = switch?.leash;
    let now = Timestamp::now().as_millis();
    let from = now.saturating_sub(i64::try_from(since.as_millis()).unwrap_or(i64::MAX));
    let mut entries: Vec<HistoryEntry> = history
        .into_iter()
        .filter(|e| e.received_at.as_millis() >= from && e.instance_name.is_some())
        .collect();
    entries.sort_by_key(|e| e.received_at);

    // Today's inventory, if configured: the history does not keep the
    // inventory each request was decided with.
    let policy = super::inventory::policy_with_inventory(config).await?;
    let dry_run =
        crate::safety::leash::leashed(leash.as_ref().map(|record| record.leashed), policy.dry_run);
    let rules = config.parse_rules();
    let mut issued = Issued::default();
    let mut changed = 0usize;
    let mut judged = 0usize;
    let mut tally: BTreeMap<(&'static str, &'static str), usize> = BTreeMap::new();
    let mut out = std::io::stdout().lock();
    for entry in &entries {
        let Some(recorded) = Decision::recorded(entry) else {
            continue;
        };
        let instance = entry.instance_name.as_deref().unwrap_or_default();
        let at = entry.received_at.as_millis();
        let when = jiff::Timestamp::from_millisecond(at).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        let Ok(name) = crate::domain::InstanceName::parse(instance) else {
            continue;
        };
        let mut request = super::inventory::request_for(&name, &rules);
        let placed = policy.place(&mut request);
        let group = request.group().to_owned();
        let group = group.as_str();
        let candidate = if let Decision::Deny(reason) = &recorded
            && reason.contains(GROUP_MISMATCH)
        {
            // The history does not keep the message's `group`: a request
            // denied for naming another group stays denied.
            recorded.clone()
        } else if let Err(Placement::Denied { reason, .. }) = &placed {
            Decision::Deny(reason.clone())
        } else if let Err(Placement::Deferred { reason, .. }) = &placed {
            Decision::Defer(reason.clone())
        } else if let Err(reason) = policy.eligibility.check(instance) {
            Decision::Deny(reason)
        } else if let Some(Verdict::Defer { reason, .. }) =
            policy.guards.calendar.as_ref().map(|c| c.verdict(when))
        {
            Decision::Defer(reason)
        } else {
            let checked = policy
                .limits(group)
                .and_then(|limits| issued.check(&limits, group, instance, at));
            match checked {
                Err(reason) => Decision::Defer(reason),
                // A dry run issues nothing: like the service's counts,
                // the replay's count only what would be restarted.
                Ok(()) if dry_run => Decision::DryRun,
                Ok(()) => {
                    issued.record(group, instance, at);
                    Decision::Restart
                }
            }
        };
        judged += 1;
        if candidate.name() == recorded.name() {
            continue;
        }
        changed += 1;
        *tally
            .entry((recorded.name(), candidate.name()))
            .or_default() += 1;
        let id = entry
            .message_id
            .map_or_else(|| "-".to_owned(), |id| id.to_string());
        if json {
            let line = json!({
                "message_id": id,
                "instance": instance,
                "group": group,
                "received_at": entry.received_at,
                "recorded": entry.status,
                "candidate": candidate.name(),
                "reason": candidate.reason(),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{} {instance} ({id}): recorded {}, would be {}{}",
                entry.received_at,
                entry.status,
                candidate.name(),
                candidate
                    .reason()
                    .map_or_else(String::new, |r| format!(": {r}"))
            )?;
        }
    }
    let changes: Vec<String> = tally
        .iter()
        .map(|((from, to), n)| format!("{n} {from} → {to}"))
        .collect();
    if json {
        let summary = json!({
            "since": humantime::format_duration(since).to_string(),
            "judged": judged,
            "changed": changed,
            "changes": changes,
        });
        writeln!(out, "{summary}")?;
    } else {
        writeln!(
            out,
            "{} decided in the last {} replayed: {changed} would be decided differently{}",
            crate::settings::duration::count(judged as u64, "request"),
            crate::settings::duration::per(since),
            if changes.is_empty() {
                String::new()
            } else {
                format!(" ({})", changes.join(", "))
            }
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart counts while it is inside the window ending at `at`: one
    /// exactly at the window's start has left it.
    #[test]
    fn the_window_holds_the_restarts_after_its_start() {
        let limits = Limits {
            window: Duration::from_millis(10),
            ..Limits::NONE
        };
        let times = [1, 5, 9, 14];
        assert_eq!(count_since(Some(&times), &limits, 15), 2);
        assert_eq!(oldest_since(Some(&times), &limits, 15), Some(9));
        assert_eq!(count_since(Some(&times), &limits, 19), 1);
        assert_eq!(oldest_since(Some(&times), &limits, 30), None);
        assert_eq!(count_since(None, &limits, 15), 0);
    }
}
