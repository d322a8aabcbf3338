//! Campaigns over a group (`mandrill campaign start`), pure: how many
//! targets, which (at random among the eligible), when each is due, each
//! request's id; and what a target's record says about where it stands
//! (`campaign status`, `wait`), read from the store by `standings.rs`.
//! The CLI (`cli/campaign.rs`, `cli/wait.rs`) does the rest of the I/O. A
//! campaign publishes ordinary signed requests: the worker and every guard
//! decide them; nothing here restarts anything.
//!
//! A campaign from its choice to its verdict, so one file past 400 lines.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use rand::seq::IndexedRandom as _;
use serde::Serialize;
use uuid::Uuid;

use crate::domain::Status;
use crate::store::{Campaign, CampaignTarget, DecisionRecord, Story};

mod standings;

pub(crate) use standings::{AskedFor, Judged, judge, recent, standings};

/// How many of the group a campaign targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    /// `--count N`.
    Count(usize),
    /// `--percent P` of the group's size in the inventory.
    Percent(u32),
}

impl Size {
    /// The number of targets in a group of `group_size` hosts: a percentage
    /// is rounded down, but is at least one host (as AWS FIS's PERCENT).
    pub(crate) fn of(self, group_size: usize) -> usize {
        match self {
            Self::Count(count) => count,
            Self::Percent(percent) => (group_size.saturating_mul(percent as usize) / 100).max(1),
        }
    }
}

/// Whether `count` targets are a majority (more than half) of a group of
/// `group_size` hosts.
pub(crate) fn is_majority(count: usize, group_size: usize) -> bool {
    count.saturating_mul(2) > group_size
}

/// `count` of `eligible`, drawn at random without repeats, in the order
/// drawn (the order they will be due in). All of them when there are fewer.
pub(crate) fn choose(eligible: &[String], count: usize, rng: &mut impl rand::Rng) -> Vec<String> {
    eligible.choose_multiple(rng, count).cloned().collect()
}

/// When each of `count` targets is due: target `i` at `start + i·spread/count`,
/// the first at once.
pub(crate) fn due_times(start: Timestamp, spread: Duration, count: usize) -> Vec<Timestamp> {
    (0..count)
        .map(|index| {
            let offset = spread.mul_f64(index as f64 / count as f64);
            let offset = SignedDuration::try_from(offset).unwrap_or(SignedDuration::MAX);
            start.saturating_add(offset).unwrap_or(start)
        })
        .collect()
}

/// A target's message id: UUIDv5 of the campaign's id (the namespace) and
/// the host's name, so that the same campaign never asks twice for a host.
pub(crate) fn message_id(campaign: Uuid, instance_name: &str) -> Uuid {
    crate::schedule::uuid_v5(campaign, instance_name.as_bytes())
}

/// Whether a target (or a campaign) is done, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Verdict {
    /// Not decided yet: still to be received, deferred, or restarting.
    InProgress,
    /// Restarted (and, with a verification probe, recovered).
    Succeeded,
    /// Failed, unrecovered, denied, rejected, expired, or a dry run.
    Failed,
    /// Cancelled: its campaign was stopped before it was issued
    /// (`mandrill campaign stop`). A campaign's verdict once it was
    /// stopped, nothing failed and nothing is still running.
    Cancelled,
}

impl Verdict {
    /// A campaign's: failed as soon as one target failed; else in
    /// progress while one is; else cancelled if one was (it was stopped);
    /// succeeded once every target did.
    pub(crate) fn of_all(targets: impl IntoIterator<Item = Self>) -> Self {
        let (mut in_progress, mut cancelled) = (false, false);
        for verdict in targets {
            match verdict {
                Self::Failed => return Self::Failed,
                Self::InProgress => in_progress = true,
                Self::Cancelled => cancelled = true,
                Self::Succeeded => {}
            }
        }
        match (in_progress, cancelled) {
            (true, _) => Self::InProgress,
            (false, true) => Self::Cancelled,
            (false, false) => Self::Succeeded,
        }
    }

    /// Its name in output.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in-progress",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Where one request stands, judged from its record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Standing {
    /// `published` (no record yet), `deferred`, `restarting`, or the
    /// request's status.
    pub state: String,
    /// Done or not, and how.
    pub verdict: Verdict,
    /// Why, in words.
    pub detail: String,
    /// How long the host took to come back, in seconds, when verified.
    pub recovered_after_seconds: Option<f64>,
}

/// Where a request stands: `story` is its record, `None` if no instance
/// has received it yet.
///
/// A restart with verification off counts as a success (the backend said
/// it was issued; nothing said otherwise). A dry run is a failure: nothing
/// was restarted, and automation waiting for restarts must not go on as if
/// there had been.
///
/// `early`: the decisions recorded about it when it has no record of its
/// own (deferred before any claim), read only then.
pub(crate) fn standing(story: Option<&Story>, early: &[DecisionRecord]) -> Standing {
    let Some(story) = story else {
        let (state, detail) = match early.last() {
            Some(decision) => (
                "deferred",
                format!("{} (at {})", said(decision), decision.at),
            ),
            None => (
                "published",
                "published; no instance has received it yet".into(),
            ),
        };
        return Standing {
            state: state.into(),
            verdict: Verdict::InProgress,
            detail,
            recovered_after_seconds: None,
        };
    };
    let entry = &story.entry;
    // The stop conditions' results held nothing back.
    let latest_decision = story.decisions.iter().rev().find(|d| d.held_back());
    let why_final = || {
        entry
            .last_error
            .clone()
            .or_else(|| latest_decision.map(said))
            .unwrap_or_else(|| "no reason recorded".into())
    };
    let (state, verdict, detail) = match entry.status {
        Status::Restarted => {
            let detail = match entry.recovered_after {
                Some(after) => format!(
                    "restarted; recovered after {}",
                    humantime::format_duration(Duration::from_millis(
                        u64::try_from(after.as_millis()).unwrap_or(u64::MAX)
                    ))
                ),
                None => "restarted (no verification probe: counted as recovered)".into(),
            };
            ("restarted".to_owned(), Verdict::Succeeded, detail)
        }
        Status::DryRun => (
            "dry-run".to_owned(),
            Verdict::Failed,
            "dry run: never issued (safety.dry_run: the service is leashed)".into(),
        ),
        status @ (Status::Failed
        | Status::Unrecovered
        | Status::Denied
        | Status::Rejected
        | Status::Expired) => (status.to_string(), Verdict::Failed, why_final()),
        // Cancelled after a restart was issued: that attempt failed (a
        // restarted one would have been final), or its outcome was lost
        // and the host may be down. Not "nothing failed".
        Status::Cancelled => match story.attempts.iter().rev().find(|attempt| {
            !attempt
                .outcome
                .is_some_and(|o| Status::NOT_ISSUED.contains(&o))
        }) {
            Some(issued) => {
                let ended = issued.outcome.map_or_else(
                    || "its outcome is unknown: the host may have been restarted".to_owned(),
                    |outcome| format!("it ended {outcome}"),
                );
                (
                    "cancelled".to_owned(),
                    Verdict::Failed,
                    format!(
                        "attempt {} was issued before the stop, and {ended}; {}",
                        issued.attempt,
                        why_final()
                    ),
                )
            }
            None => ("cancelled".to_owned(), Verdict::Cancelled, why_final()),
        },
        Status::Received | Status::Retrying => {
            let in_flight = story
                .attempts
                .last()
                .filter(|attempt| attempt.outcome.is_none());
            match (in_flight, latest_decision) {
                (Some(attempt), decision)
                    if decision.is_none_or(|d| d.at <= attempt.claimed_at) =>
                {
                    (
                        "restarting".to_owned(),
                        Verdict::InProgress,
                        format!(
                            "attempt {} claimed at {} (restarting, or being verified)",
                            attempt.attempt, attempt.claimed_at
                        ),
                    )
                }
                (_, Some(decision)) if decision.verdict == "deferred" => (
                    "deferred".to_owned(),
                    Verdict::InProgress,
                    format!("{} (at {})", said(decision), decision.at),
                ),
                _ if entry.status == Status::Retrying => (
                    "retrying".to_owned(),
                    Verdict::InProgress,
                    format!(
                        "retrying after: {}",
                        entry.last_error.as_deref().unwrap_or("an error")
                    ),
                ),
                _ => (
                    "received".to_owned(),
                    Verdict::InProgress,
                    "received; waiting for its next delivery".into(),
                ),
            }
        }
    };
    Standing {
        state,
        verdict,
        detail,
        recovered_after_seconds: entry.recovered_after.map(|d| d.as_secs_f64()),
    }
}

/// A campaign judged, as one JSON object: what `campaign status --json`
/// prints and `GET /api/campaigns/{id}` answers.
pub(crate) fn status_json(
    campaign: &Campaign,
    targets: &[(CampaignTarget, Standing)],
    verdict: Verdict,
) -> serde_json::Value {
    let targets: Vec<_> = targets
        .iter()
        .map(|(target, standing)| {
            serde_json::json!({
                "instance_name": target.instance_name,
                "message_id": target.message_id,
                "due_at": target.due_at,
                "state": standing.state,
                "verdict": standing.verdict,
                "detail": standing.detail,
                "recovered_after": standing.recovered_after_seconds,
            })
        })
        .collect();
    serde_json::json!({
        "id": campaign.id,
        "group": campaign.group,
        "created_at": campaign.created_at,
        "requester": campaign.requester,
        "stopped": campaign.stopped,
        "verdict": verdict,
        "targets": targets,
    })
}

/// What the guards say about a target now, and when it would run: what
/// `campaign start` prints for each target (and warns about, with or
/// without `--preview`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Forecast {
    /// Each guard that would hold it, in the order they would, in the
    /// guards' own words; empty when nothing holds it.
    pub held_by: Vec<String>,
    /// When it would run at the earliest; `None` while restarts are
    /// paused (only a `resume` lifts a pause).
    pub runs_at: Option<Timestamp>,
    /// Why it would never run: it would wait past its expiry
    /// (`safety.max_defer` of open calendar time) or its signed token.
    pub too_late: Option<String>,
}

/// What the counting guards read now, for [`forecast`].
pub(crate) struct Counted<'a> {
    pub limits: &'a crate::safety::Limits,
    pub subject: crate::safety::limits::Subject<'a>,
    pub usage: crate::safety::limits::Usage,
}

/// Steps a target through the guards in the order the worker asks them,
/// from the later of `now` and its `due` time: the calendar
/// ([`crate::safety::Calendar::verdict`], as `policy check` asks it), then
/// the counting guards ([`crate::safety::limits::check`], as the claim
/// asks them) on what they read now, again until neither holds it; a
/// pause (`paused`, in words) holds it until resumed. A guard with no
/// known end (a budget waiting for a host to come back) ends the steps
/// with its retry as the earliest. Then the horizon: the request expires
/// ([`Guards::expires_at`](crate::safety::Guards::expires_at), published
/// now) and its token ends (`token_ends`) at a moment it must run before.
pub(crate) fn forecast(
    guards: &crate::safety::Guards,
    counted: Option<&Counted<'_>>,
    paused: Option<String>,
    due: Timestamp,
    now: Timestamp,
    token_ends: Timestamp,
) -> Forecast {
    let local = |at: Timestamp| match &guards.calendar {
        Some(calendar) => calendar.local(at),
        None => at.to_string(),
    };
    let mut held_by = Vec::new();
    let mut at = due.max(now);
    if due > now {
        held_by.push(format!("deferred by not_before until {}", local(due)));
    }
    if let Some(paused) = paused {
        held_by.push(paused);
        return Forecast {
            held_by,
            runs_at: None,
            too_late: None,
        };
    }
    // Each step moves `at` on; a few suffice (closed, then a slot frees
    // after hours, then closed again), and the bound keeps a pathological
    // policy from looping.
    for _ in 0..8 {
        if let Some(calendar) = &guards.calendar
            && let crate::safety::Verdict::Defer { until, reason } = calendar.verdict(at)
        {
            held_by.push(reason);
            at = until;
            continue;
        }
        let Some(counted) = counted.filter(|c| c.limits.is_active_for(c.subject)) else {
            break;
        };
        let Err(refusal) = crate::safety::limits::check(
            counted.limits,
            counted.subject,
            &counted.usage,
            at.as_millisecond(),
        ) else {
            break;
        };
        // What it read now no longer holds it by then: the slot it waited
        // for has freed (the guard answers a wait of a moment).
        if refusal.wait <= std::time::Duration::from_millis(1) {
            break;
        }
        held_by.push(refusal.reason);
        let wait = SignedDuration::try_from(refusal.wait).unwrap_or(SignedDuration::MAX);
        at = at.saturating_add(wait).unwrap_or(at);
        if refusal.wait <= counted.limits.budget_retry {
            break;
        }
    }
    let expires = guards.expires_at(now);
    let too_late = if at > expires {
        Some(format!(
            "it would expire at {}, before it could run (safety.max_defer {} of open calendar \
             time)",
            local(expires),
            humantime::format_duration(guards.max_defer)
        ))
    } else if at > token_ends {
        Some(format!(
            "its signed token ends at {}, before it could run: it would be denied then",
            local(token_ends)
        ))
    } else {
        None
    };
    Forecast {
        held_by,
        runs_at: Some(at),
        too_late,
    }
}

impl Forecast {
    /// In one line: "allowed: runs at once", or what holds it and when it
    /// would run.
    pub(crate) fn said(&self, now: Timestamp, local: impl Fn(Timestamp) -> String) -> String {
        let when = match self.runs_at {
            None => "runs once resumed".to_owned(),
            Some(at) if at <= now => "runs at once".to_owned(),
            Some(at) => format!("runs {} at the earliest", local(at)),
        };
        if self.held_by.is_empty() {
            return format!("allowed now: {when}");
        }
        format!("{}; {when}", self.held_by.join("; then "))
    }
}

/// A decision in words, as `explain` tells it.
fn said(decision: &DecisionRecord) -> String {
    if decision.reason.starts_with(&decision.verdict) {
        decision.reason.clone()
    } else {
        format!(
            "{} by {}: {}",
            decision.verdict, decision.guard, decision.reason
        )
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;
    use rand::rngs::StdRng;

    use super::*;

    fn hosts(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("cattle-{i:02}")).collect()
    }

    #[test]
    fn a_percentage_rounds_down_but_names_at_least_one_host() {
        assert_eq!(Size::Percent(20).of(10), 2);
        assert_eq!(Size::Percent(25).of(10), 2);
        assert_eq!(Size::Percent(1).of(10), 1);
        assert_eq!(Size::Percent(100).of(10), 10);
        assert_eq!(Size::Count(3).of(10), 3);
    }

    #[test]
    fn a_majority_is_more_than_half() {
        assert!(!is_majority(5, 10));
        assert!(is_majority(6, 10));
        assert!(is_majority(2, 3));
        assert!(!is_majority(1, 3));
        assert!(is_majority(1, 1));
    }

    /// Distinct targets from the eligible only, never more than asked, and
    /// not always the same ones.
    #[test]
    fn targets_are_distinct_eligible_hosts_drawn_at_random() {
        let eligible = hosts(10);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..50 {
            let chosen = choose(&eligible, 3, &mut StdRng::seed_from_u64(seed));
            assert_eq!(chosen.len(), 3);
            let distinct: std::collections::BTreeSet<_> = chosen.iter().collect();
            assert_eq!(distinct.len(), 3, "{chosen:?}");
            assert!(chosen.iter().all(|host| eligible.contains(host)));
            seen.extend(chosen);
        }
        assert_eq!(seen.len(), 10, "every host can be drawn: {seen:?}");
        let few = choose(&eligible[..2], 3, &mut StdRng::seed_from_u64(1));
        assert_eq!(few.len(), 2, "never more than there are");
    }

    #[test]
    fn targets_are_due_evenly_over_the_spread_the_first_at_once() {
        let start: Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let due = due_times(start, Duration::from_secs(30 * 60), 3);
        let expected: Vec<Timestamp> = ["12:00:00", "12:10:00", "12:20:00"]
            .iter()
            .map(|t| format!("2026-11-26T{t}Z").parse().unwrap())
            .collect();
        assert_eq!(due, expected);
        assert_eq!(due_times(start, Duration::ZERO, 2), vec![start, start]);
    }

    #[test]
    fn message_ids_are_stable_per_campaign_and_host() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(message_id(a, "cattle-01"), message_id(a, "cattle-01"));
        assert_ne!(message_id(a, "cattle-01"), message_id(a, "cattle-02"));
        assert_ne!(message_id(a, "cattle-01"), message_id(b, "cattle-01"));
        assert_eq!(message_id(a, "cattle-01").get_version_num(), 5);
    }

    fn story(status: Status) -> Story {
        let at = crate::domain::Timestamp::from_millis(1_795_000_000_000);
        Story {
            entry: crate::store::HistoryEntry {
                message_id: Some(Uuid::new_v4()),
                instance_name: Some("cattle-01".into()),
                hostname: Some("cattle-01.example.net".into()),
                status,
                attempts: 1,
                requested_by: Some("chaos".into()),
                verified: false,
                reason: None,
                last_error: None,
                output: None,
                recovered_after: None,
                received_at: at,
                updated_at: at,
                completed_at: None,
            },
            attempts: Vec::new(),
            decisions: Vec::new(),
        }
    }

    fn deferral(guard: &str, at: i64) -> DecisionRecord {
        DecisionRecord {
            at: crate::domain::Timestamp::from_millis(at),
            attempt: 0,
            verdict: "deferred".into(),
            guard: guard.into(),
            reason: format!("deferred by {guard}: not yet"),
        }
    }

    /// A target cancelled by a stop after a restart of it was issued did
    /// not "fail nothing": the attempt failed (a restarted one is final),
    /// or its outcome was lost and the host may be down. Cancelled before
    /// anything was issued, or after a dry run, it stands cancelled.
    #[test]
    fn a_target_cancelled_after_its_restart_was_issued_failed() {
        let attempt = |outcome| crate::store::AttemptRecord {
            attempt: 1,
            group: "cattle".into(),
            claimed_at: crate::domain::Timestamp::from_millis(1_795_000_000_000),
            verdict: "allowed".into(),
            outcome,
            settled_at: None,
            requester: None,
        };
        for (outcome, said) in [
            (Some(Status::Retrying), "it ended retrying"),
            (None, "its outcome is unknown"),
        ] {
            let mut cancelled = story(Status::Cancelled);
            cancelled.attempts.push(attempt(outcome));
            let standing = standing(Some(&cancelled), &[]);
            assert_eq!(standing.verdict, Verdict::Failed, "{standing:?}");
            assert!(standing.detail.contains(said), "{standing:?}");
        }
        let mut leashed = story(Status::Cancelled);
        leashed.attempts.push(attempt(Some(Status::DryRun)));
        for unissued in [story(Status::Cancelled), leashed] {
            assert_eq!(standing(Some(&unissued), &[]).verdict, Verdict::Cancelled);
        }
    }

    /// What each record says: a restart without a probe succeeds, a dry
    /// run fails (nothing was restarted), a failure says why, and a
    /// request deferred before it has a record says by which guard.
    #[test]
    fn a_target_stands_as_its_record_says() {
        let restarted = standing(Some(&story(Status::Restarted)), &[]);
        assert_eq!(restarted.verdict, Verdict::Succeeded);
        assert!(
            restarted.detail.contains("no verification probe"),
            "{restarted:?}"
        );
        let mut recovered = story(Status::Restarted);
        recovered.entry.recovered_after = Some(Duration::from_millis(2500));
        let recovered = standing(Some(&recovered), &[]);
        assert_eq!(recovered.detail, "restarted; recovered after 2s 500ms");
        assert_eq!(recovered.recovered_after_seconds, Some(2.5));

        let dry_run = standing(Some(&story(Status::DryRun)), &[]);
        assert_eq!(dry_run.verdict, Verdict::Failed);
        assert!(
            dry_run.detail.starts_with("dry run: never issued"),
            "{dry_run:?}"
        );

        let mut unrecovered = story(Status::Unrecovered);
        unrecovered.entry.last_error = Some("not healthy within 1s".into());
        let unrecovered = standing(Some(&unrecovered), &[]);
        assert_eq!(
            (
                unrecovered.state.as_str(),
                unrecovered.verdict,
                unrecovered.detail.as_str()
            ),
            ("unrecovered", Verdict::Failed, "not healthy within 1s")
        );

        let early = [deferral("calendar", 1), deferral("not_before", 2)];
        let waiting = standing(None, &early);
        assert_eq!(
            (waiting.state.as_str(), waiting.verdict),
            ("deferred", Verdict::InProgress)
        );
        assert!(
            waiting.detail.starts_with("deferred by not_before"),
            "{waiting:?}"
        );
        assert_eq!(standing(None, &[]).state, "published");

        let mut held = story(Status::Received);
        held.decisions
            .push(deferral("disruption budget", 1_795_000_000_500));
        let held = standing(Some(&held), &[]);
        assert_eq!(held.state, "deferred");
        assert!(
            held.detail.starts_with("deferred by disruption budget"),
            "{held:?}"
        );
    }

    /// A target steps through the guards as the worker asks them: closed
    /// on Saturday, then a full rate window at Monday's opening, then
    /// closed again when the slot frees; a pause holds it until resumed;
    /// waiting past its token is said.
    #[test]
    fn a_forecast_steps_through_the_calendar_and_the_rate_limit_to_when_it_would_run() {
        use crate::safety::limits::{Limits, Subject, Usage};
        use crate::safety::{Calendar, Guards};
        let at = |t: &str| t.parse::<Timestamp>().unwrap();
        let guards = Guards {
            calendar: Some(Calendar::chaos_monkey()),
            max_defer: Duration::from_secs(24 * 3600),
            ..Guards::default()
        };
        let saturday = at("2026-11-28T10:00:00Z");
        let a_week = at("2026-12-05T10:00:00Z");
        let limits = Limits {
            group_max: Some(1),
            window: Duration::from_secs(24 * 3600),
            ..Limits::NONE
        };
        let counted = Counted {
            limits: &limits,
            subject: Subject {
                group: "web",
                instance: "web-01",
                zone: None,
                requester: None,
            },
            usage: Usage {
                group_claims: 1,
                group_oldest: Some(at("2026-11-30T08:00:00Z").as_millisecond()),
                ..Usage::default()
            },
        };
        let stepped = forecast(&guards, Some(&counted), None, saturday, saturday, a_week);
        assert_eq!(stepped.runs_at, Some(at("2026-12-01T09:00:00Z")));
        assert_eq!(stepped.held_by.len(), 3, "{stepped:?}");
        assert!(stepped.held_by[0].starts_with("deferred by calendar"));
        assert!(
            stepped.held_by[1].contains("a slot frees at 2026-12-01T08:00:00"),
            "{stepped:?}"
        );
        assert_eq!(stepped.too_late, None);
        let said = stepped.said(saturday, |t| t.to_string());
        assert!(
            said.ends_with("runs 2026-12-01T09:00:00Z at the earliest"),
            "{said}"
        );
        // Its token ends on Sunday: it would be denied, and says so.
        let sunday = at("2026-11-29T10:00:00Z");
        let late = forecast(&guards, None, None, saturday, saturday, sunday);
        assert!(
            late.too_late.unwrap().starts_with("its signed token ends"),
            "denied at the opening"
        );
        // Paused: only a resume lets it run.
        let paused = forecast(
            &guards,
            None,
            Some("paused".into()),
            saturday,
            saturday,
            a_week,
        );
        assert_eq!(
            (paused.runs_at, paused.held_by),
            (None, vec!["paused".to_owned()])
        );
        // Nothing holds it: at once.
        let monday = at("2026-11-30T10:00:00Z");
        let free = forecast(&guards, None, None, monday, monday, a_week);
        assert_eq!(
            free.said(monday, |t| t.to_string()),
            "allowed now: runs at once"
        );
    }

    #[test]
    fn a_campaign_fails_on_one_failure_and_succeeds_only_when_all_did() {
        use Verdict::*;
        assert_eq!(Verdict::of_all([Succeeded, InProgress, Failed]), Failed);
        assert_eq!(Verdict::of_all([Succeeded, InProgress]), InProgress);
        assert_eq!(Verdict::of_all([Succeeded, Succeeded]), Succeeded);
        // Stopped: cancelled once nothing runs, failed if one failed.
        assert_eq!(Verdict::of_all([Succeeded, Cancelled]), Cancelled);
        assert_eq!(Verdict::of_all([Cancelled, InProgress]), InProgress);
        assert_eq!(Verdict::of_all([Cancelled, Failed]), Failed);
        assert_eq!(standing(None, &[]).verdict, InProgress);
    }
}
