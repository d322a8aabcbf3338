//! The game-day report (`mandrill report`): per group, the restarts and how
//! they ended, the recovery-time distribution and its percentiles against
//! the group's recovery objective, the hosts that did not come back, the
//! deferrals by guard, the denials by requester and the expiries. Dry runs
//! are counted apart from restarts in every total: they issued nothing.
//! Groups are the operator's only (the one a claim recorded, else the
//! inventory's or `safety.groups`'), never made up from a host's name.
//!
//! The store hands over plain rows ([`ReportData`]); everything here is
//! pure: [`Report::build`] aggregates (tested below), `html.rs` and
//! `markdown.rs` render, and JSON is [`Report`] serialised, its field names
//! stable.
//!
//! Percentiles are nearest-rank over a group's verified restarts: those
//! whose recovery a probe timed (recovered) or gave up on (unrecovered). An
//! unrecovered restart counts as slower than any recovered one, so a host
//! that never came back makes the percentile worse rather than vanishing
//! from it. A restart without verification has no recovery time and is
//! counted only as a restart.
//!
//! One concept, the report's model and its aggregation, so one file past
//! 400 lines; rendering is beside it.

mod html;
mod markdown;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Serialize, Serializer};
use uuid::Uuid;

use crate::domain::Status;
use crate::domain::Timestamp;
use crate::store::{ReportAttempt, ReportData};

pub(crate) use html::html;
pub(crate) use markdown::markdown;

/// How percentiles are taken, as the report states it.
pub(crate) const PERCENTILE_METHOD: &str = "nearest-rank over verified restarts; an unrecovered restart counts as slower than any recovered one";

/// A group's recovery objective, as the report judges it: the
/// `percentile`th recovery time of the period's verified restarts must be
/// at most `max`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ObjectiveView {
    /// The group it applies to.
    pub(crate) group: String,
    /// Which percentile, in (0, 100].
    pub(crate) percentile: f64,
    /// The longest recovery it allows at that percentile.
    pub(crate) max: Duration,
}

/// One verified restart's recovery: after how long, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Recovery {
    /// The probe passed this long after the restart.
    After(Duration),
    /// The probe never passed: the host ended unrecovered.
    Never,
}

/// Seconds as a number, or the string `"unrecovered"`.
impl Serialize for Recovery {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::After(duration) => serializer.serialize_f64(duration.as_secs_f64()),
            Self::Never => serializer.serialize_str("unrecovered"),
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    /// The start of the period: attempts claimed and verdicts recorded
    /// since then.
    pub(crate) since: Timestamp,
    /// When the report was made: the end of the period.
    pub(crate) until: Timestamp,
    /// How percentiles are taken.
    pub(crate) percentile_method: &'static str,
    /// Every group together.
    pub(crate) fleet: Totals,
    /// One entry per group that had a restart or a verdict, by name.
    pub(crate) groups: Vec<GroupReport>,
    /// The campaigns started in the period, oldest first, each target
    /// judged as `campaign status` judges it (filled in by the caller,
    /// which reads each target's story).
    pub(crate) campaigns: Vec<CampaignReport>,
}

/// One campaign's part of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CampaignReport {
    /// Its id.
    pub(crate) id: Uuid,
    /// The group its targets were drawn from.
    pub(crate) group: String,
    /// When it started.
    pub(crate) started_at: Timestamp,
    /// Who signed its requests.
    pub(crate) requester: Option<String>,
    /// Failed as soon as one target failed, succeeded once all did.
    pub(crate) verdict: crate::campaign::Verdict,
    /// Each target, in the order they were due.
    pub(crate) targets: Vec<CampaignTargetReport>,
}

/// One target of a campaign, as the report shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct CampaignTargetReport {
    /// The host.
    pub(crate) host: String,
    /// Where it stands, and why.
    #[serde(flatten)]
    pub(crate) standing: crate::campaign::Standing,
}

/// Counts over the whole fleet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Totals {
    /// Restarts issued (attempts claimed, less those that issued nothing:
    /// dry runs, denials and expiries after a claim).
    pub(crate) restarts: u32,
    /// Attempts recorded as dry runs: decided, nothing issued. Never
    /// counted as restarts.
    pub(crate) dry_runs: u32,
    /// Verified restarts that recovered.
    pub(crate) recovered: u32,
    /// Verified restarts that did not.
    pub(crate) unrecovered: u32,
    /// Requests a guard deferred at least once.
    pub(crate) deferred_requests: u32,
    /// Requests a guard denied.
    pub(crate) denied_requests: u32,
    /// Requests that expired (deferred past `safety.max_defer`, or
    /// older than their own deadline), before or after a claim.
    pub(crate) expired_requests: u32,
}

/// One group's part of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct GroupReport {
    /// The group's name.
    pub(crate) group: String,
    /// Restarts issued, as [`Totals::restarts`].
    pub(crate) restarts: u32,
    /// Dry runs, as [`Totals::dry_runs`].
    pub(crate) dry_runs: u32,
    /// Requests expired, as [`Totals::expired_requests`].
    pub(crate) expired_requests: u32,
    /// Every attempt claimed, by how it ended (`in-flight` while not).
    pub(crate) outcomes: BTreeMap<&'static str, u32>,
    /// The recovery-time distribution.
    pub(crate) recovery: Distribution,
    /// The group's objective and whether the period met it.
    pub(crate) objective: Option<ObjectiveVerdict>,
    /// Hosts with a restart that ended unrecovered, by name.
    pub(crate) unrecovered_hosts: Vec<String>,
    /// Requests deferred, by the guard that deferred them (a request
    /// deferred by two guards counts under each).
    pub(crate) deferrals_by_guard: BTreeMap<String, u32>,
    /// Requests denied, by who asked (`(anonymous)` when nobody said).
    pub(crate) denials_by_requester: BTreeMap<String, u32>,
    /// The latest denials, at most [`MAX_DENIALS_LISTED`], newest first.
    pub(crate) latest_denials: Vec<Denial>,
}

/// One denial, as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Denial {
    /// When.
    pub(crate) at: Timestamp,
    /// The host, if the store has it.
    pub(crate) host: Option<String>,
    /// Who asked, as [`GroupReport::denials_by_requester`] counts them.
    pub(crate) requester: String,
    /// Which guard.
    pub(crate) guard: String,
    /// Why, in the guard's words.
    pub(crate) reason: String,
}

/// A group's recovery times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Distribution {
    /// Verified restarts that recovered.
    pub(crate) recovered: u32,
    /// Verified restarts that did not.
    pub(crate) unrecovered: u32,
    /// The median; `None` without a verified restart.
    pub(crate) p50: Option<Recovery>,
    /// The 95th percentile; `None` without a verified restart.
    pub(crate) p95: Option<Recovery>,
    /// Every recovery time, in seconds, fastest first.
    pub(crate) recovered_seconds: Vec<f64>,
    /// The recovered restarts counted in equal ranges of recovery time,
    /// from zero, wide enough for the slowest and the objective's bound.
    pub(crate) buckets: Vec<Bucket>,
}

/// Recovered restarts whose recovery took from `from` up to (not
/// including) `to`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Bucket {
    /// Start of the range, in seconds.
    #[serde(rename = "from_seconds", serialize_with = "seconds")]
    pub(crate) from: Duration,
    /// End of the range, in seconds.
    #[serde(rename = "to_seconds", serialize_with = "seconds")]
    pub(crate) to: Duration,
    /// How many.
    pub(crate) count: u32,
}

/// A group's objective, and the period's recovery against it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ObjectiveVerdict {
    /// Which percentile it judges.
    pub(crate) percentile: f64,
    /// The bound, in seconds.
    #[serde(rename = "max_seconds", serialize_with = "seconds")]
    pub(crate) max: Duration,
    /// That percentile of the period's verified restarts.
    pub(crate) observed: Option<Recovery>,
    /// Whether it is within the bound; `None` without a verified restart.
    pub(crate) met: Option<bool>,
}

fn seconds<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

/// The bucket widths the chart chooses from: round numbers.
const BUCKET_WIDTHS_MS: [u64; 22] = [
    10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000,
    300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000, 86_400_000,
];

/// At most this many buckets, unless even the widest width needs more.
const MAX_BUCKETS: u64 = 12;

/// How many denials a group lists; the counts are of all.
pub(crate) const MAX_DENIALS_LISTED: usize = 20;

/// Where a request's verdicts go when no claim of it recorded a group and
/// the operator's inventory and `safety.groups` place no host of that
/// name: the report never makes a group up from a name.
pub(crate) const UNPLACED: &str = "(unplaced)";

/// Whom a denial is counted against when the request did not say.
const ANONYMOUS: &str = "(anonymous)";

/// The `p`th percentile (in (0, 100]) of `sorted` (ascending), by nearest
/// rank: the smallest value with at least `p`% of the values at or below
/// it, i.e. the value at rank ⌈p/100 · n⌉. `None` when empty.
pub(crate) fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // The small allowance keeps an exact rank (95% of 20 = 19) from
    // rounding up through floating-point error.
    let rank = (p / 100.0 * n as f64 - 1e-9).ceil();
    // Clamped to 1..=n, so the cast and the index are in range.
    let rank = (rank.max(1.0) as usize).min(n);
    Some(sorted[rank - 1])
}

/// An attempt's outcome's name, for the outcome counts: `unknown` for
/// one whose outcome was lost, `in-flight` for one still running.
fn outcome_name(attempt: &ReportAttempt) -> &'static str {
    match attempt.outcome {
        Some(status) => status.as_str(),
        None if attempt.lost => "unknown",
        None => "in-flight",
    }
}

/// What one group gathers before it is summed up.
#[derive(Default)]
struct Gathered {
    restarts: u32,
    dry_runs: u32,
    expired: BTreeSet<Uuid>,
    outcomes: BTreeMap<&'static str, u32>,
    recoveries: Vec<Recovery>,
    unrecovered_hosts: BTreeSet<String>,
    deferred: BTreeMap<String, BTreeSet<Uuid>>,
    denied: BTreeMap<String, BTreeSet<Uuid>>,
    denials: Vec<Denial>,
}

impl Report {
    /// The report of `data`, read for the period from `since` to `until`,
    /// judged against `objectives` (at most one a group is used: the
    /// first). A request no claim placed is put in the group `place`
    /// gives its host (the operator's inventory or `safety.groups`), else
    /// in [`UNPLACED`].
    pub(crate) fn build(
        data: &ReportData,
        since: Timestamp,
        until: Timestamp,
        objectives: &[ObjectiveView],
        place: &dyn Fn(&str) -> Option<String>,
    ) -> Self {
        let mut groups: BTreeMap<String, Gathered> = BTreeMap::new();
        let mut expired_requests = BTreeSet::new();
        for attempt in &data.attempts {
            let group = groups.entry(attempt.group.clone()).or_default();
            *group.outcomes.entry(outcome_name(attempt)).or_default() += 1;
            let issued = !matches!(
                attempt.outcome,
                Some(Status::DryRun | Status::Denied | Status::Expired)
            );
            if issued {
                group.restarts += 1;
            }
            match attempt.outcome {
                Some(Status::DryRun) => group.dry_runs += 1,
                // An expiry after the claim records no decision.
                Some(Status::Expired) => {
                    group.expired.insert(attempt.message_id);
                    expired_requests.insert(attempt.message_id);
                }
                _ => {}
            }
            match attempt.outcome {
                Some(Status::Restarted) => {
                    if let Some(after) = attempt.recovered_after {
                        group.recoveries.push(Recovery::After(after));
                    }
                }
                Some(Status::Unrecovered) => {
                    group.recoveries.push(Recovery::Never);
                    group
                        .unrecovered_hosts
                        .insert(attempt.instance_name.clone());
                }
                _ => {}
            }
        }
        let mut deferred_requests = BTreeSet::new();
        let mut denied_requests = BTreeSet::new();
        for decision in &data.decisions {
            let placed;
            let name = match (&decision.group, &decision.instance_name) {
                (Some(group), _) => group.as_str(),
                (None, Some(instance)) => {
                    placed = place(instance);
                    placed.as_deref().unwrap_or(UNPLACED)
                }
                (None, None) => UNPLACED,
            };
            let id = decision.message_id;
            match decision.verdict.as_str() {
                "expired" => {
                    expired_requests.insert(id);
                    let group = groups.entry(name.to_owned()).or_default();
                    group.expired.insert(id);
                }
                "deferred" => {
                    deferred_requests.insert(id);
                    let group = groups.entry(name.to_owned()).or_default();
                    let guard = decision.guard.clone();
                    group.deferred.entry(guard).or_default().insert(id);
                }
                "denied" => {
                    denied_requests.insert(id);
                    let group = groups.entry(name.to_owned()).or_default();
                    let requester = decision.requested_by.as_deref().unwrap_or(ANONYMOUS);
                    group
                        .denied
                        .entry(requester.to_owned())
                        .or_default()
                        .insert(id);
                    group.denials.push(Denial {
                        at: decision.at,
                        host: decision.instance_name.clone(),
                        requester: requester.to_owned(),
                        guard: decision.guard.clone(),
                        reason: decision.reason.clone(),
                    });
                }
                _ => {}
            }
        }
        let mut fleet = Totals {
            deferred_requests: count(deferred_requests.len()),
            denied_requests: count(denied_requests.len()),
            expired_requests: count(expired_requests.len()),
            ..Totals::default()
        };
        let groups: Vec<GroupReport> = groups
            .into_iter()
            .map(|(name, gathered)| {
                let objective = objectives.iter().find(|o| o.group == name);
                summarise(name, gathered, objective)
            })
            .collect();
        for group in &groups {
            fleet.restarts += group.restarts;
            fleet.dry_runs += group.dry_runs;
            fleet.recovered += group.recovery.recovered;
            fleet.unrecovered += group.recovery.unrecovered;
        }
        Self {
            since,
            until,
            percentile_method: PERCENTILE_METHOD,
            fleet,
            groups,
            campaigns: Vec::new(),
        }
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn summarise(name: String, gathered: Gathered, objective: Option<&ObjectiveView>) -> GroupReport {
    let mut recoveries = gathered.recoveries;
    recoveries.sort_unstable();
    let recovered: Vec<Duration> = recoveries
        .iter()
        .filter_map(|r| match r {
            Recovery::After(after) => Some(*after),
            Recovery::Never => None,
        })
        .collect();
    let slowest = recovered.last().copied().unwrap_or_default();
    let reach = slowest.max(objective.map_or(Duration::ZERO, |o| o.max));
    let verdict = objective.map(|objective| {
        let observed = nearest_rank(&recoveries, objective.percentile);
        ObjectiveVerdict {
            percentile: objective.percentile,
            max: objective.max,
            observed,
            met: observed.map(|o| o <= Recovery::After(objective.max)),
        }
    });
    let distinct = |sets: BTreeMap<String, BTreeSet<Uuid>>| {
        sets.into_iter()
            .map(|(key, ids)| (key, count(ids.len())))
            .collect()
    };
    GroupReport {
        group: name,
        restarts: gathered.restarts,
        dry_runs: gathered.dry_runs,
        expired_requests: count(gathered.expired.len()),
        outcomes: gathered.outcomes,
        recovery: Distribution {
            recovered: count(recovered.len()),
            unrecovered: count(recoveries.len() - recovered.len()),
            p50: nearest_rank(&recoveries, 50.0),
            p95: nearest_rank(&recoveries, 95.0),
            recovered_seconds: recovered.iter().map(Duration::as_secs_f64).collect(),
            buckets: buckets(&recovered, reach),
        },
        objective: verdict,
        unrecovered_hosts: gathered.unrecovered_hosts.into_iter().collect(),
        deferrals_by_guard: distinct(gathered.deferred),
        denials_by_requester: distinct(gathered.denied),
        latest_denials: gathered
            .denials
            .into_iter()
            .rev()
            .take(MAX_DENIALS_LISTED)
            .collect(),
    }
}

/// `recovered` counted in equal ranges from zero past `reach`, of the
/// narrowest round width that needs at most [`MAX_BUCKETS`]; none when
/// nothing recovered.
fn buckets(recovered: &[Duration], reach: Duration) -> Vec<Bucket> {
    if recovered.is_empty() {
        return Vec::new();
    }
    let reach_ms = u64::try_from(reach.as_millis()).unwrap_or(u64::MAX);
    let width = BUCKET_WIDTHS_MS
        .into_iter()
        .find(|width| reach_ms / width < MAX_BUCKETS)
        .unwrap_or(BUCKET_WIDTHS_MS[BUCKET_WIDTHS_MS.len() - 1]);
    let n = reach_ms / width + 1;
    let mut counts = vec![0u32; usize::try_from(n).unwrap_or(usize::MAX)];
    for after in recovered {
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        let at = usize::try_from(ms / width).unwrap_or(usize::MAX);
        if let Some(slot) = counts.get_mut(at) {
            *slot += 1;
        }
    }
    counts
        .into_iter()
        .zip(0u64..)
        .map(|(count, i)| Bucket {
            from: Duration::from_millis(i * width),
            to: Duration::from_millis((i + 1) * width),
            count,
        })
        .collect()
}

/// A duration as people read it: `850ms`, `4.2s`, `2m 05s`, `1h 02m`.
pub(crate) fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        let tenths = ms / 100;
        format!("{}.{}s", tenths / 10, tenths % 10)
    } else if ms < 3_600_000 {
        let s = ms / 1_000;
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        let m = ms / 60_000;
        format!("{}h {:02}m", m / 60, m % 60)
    }
}

/// A recovery as people read it.
pub(crate) fn human_recovery(recovery: Option<Recovery>) -> String {
    match recovery {
        Some(Recovery::After(after)) => human(after),
        Some(Recovery::Never) => "unrecovered".to_owned(),
        None => "–".to_owned(),
    }
}

/// An objective's verdict in a word.
pub(crate) fn verdict_word(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "breached",
        None => "no data",
    }
}

#[cfg(test)]
mod tests;
