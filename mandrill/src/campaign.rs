//! Campaigns over a group (`mandrill campaign start`), pure: how many
//! targets, which (at random among the eligible), when each is due, each
//! request's id; and what a target's record says about where it stands
//! (`campaign status`, `wait`), read from the store by `standings.rs`.
//! The CLI (`cli/campaign.rs`, `cli/wait.rs`) does the rest of the I/O. A
//! campaign publishes ordinary signed requests: the worker and every guard
//! decide them; nothing here restarts anything.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use rand::seq::IndexedRandom as _;
use serde::Serialize;
use uuid::Uuid;

use crate::domain::Status;
use crate::store::{DecisionRecord, Story};

mod standings;

pub(crate) use standings::{Judged, judge, recent, standings};

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
}

impl Verdict {
    /// A campaign's: failed as soon as one target failed, succeeded once
    /// every target did.
    pub(crate) fn of_all(targets: impl IntoIterator<Item = Self>) -> Self {
        let mut all = Self::Succeeded;
        for verdict in targets {
            match verdict {
                Self::Failed => return Self::Failed,
                Self::InProgress => all = Self::InProgress,
                Self::Succeeded => {}
            }
        }
        all
    }

    /// Its name in output.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in-progress",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
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

    #[test]
    fn a_campaign_fails_on_one_failure_and_succeeds_only_when_all_did() {
        use Verdict::*;
        assert_eq!(Verdict::of_all([Succeeded, InProgress, Failed]), Failed);
        assert_eq!(Verdict::of_all([Succeeded, InProgress]), InProgress);
        assert_eq!(Verdict::of_all([Succeeded, Succeeded]), Succeeded);
        assert_eq!(standing(None, &[]).verdict, InProgress);
    }
}
