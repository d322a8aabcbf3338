//! What a store tells about the past: history entries, the story of a
//! request, each group's use of its limits, and what a report reads.
//!
//! The rows read back and their conversions from both SQL stores' rows,
//! together so that a column added is added in one place; one file past
//! 400 lines.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use super::StoreError;
use super::sql::{AttemptRow, DecisionRow, EntryRow, ReportAttemptRow, ReportDecisionRow};
use crate::domain::{Status, Timestamp, unverified};

/// One claimed restart attempt, from the restart journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    /// The attempt's number.
    pub attempt: u32,
    /// The group it counted against.
    pub group: String,
    /// When it was claimed: the restart was issued right after.
    pub claimed_at: Timestamp,
    /// What the counting guards said when they allowed it.
    pub verdict: String,
    /// How it ended; `None` while in flight, or if it was never recorded.
    pub outcome: Option<Status>,
    /// When its outcome was recorded.
    pub settled_at: Option<Timestamp>,
    /// The requester whose signature was verified for it; `None` when it
    /// was unsigned (its `requested_by` is then only what it said).
    pub requester: Option<String>,
}

/// A guard's verdict on a request, as recorded: one that held it back, or
/// the stop conditions' results right before its restart (`checked`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecisionRecord {
    /// When.
    pub at: Timestamp,
    /// The attempt it concerned (0: before any claim).
    pub attempt: u32,
    /// `deferred`, `denied`, `expired`, `dry-run`, or `checked` (held
    /// nothing back: see [`DecisionRecord::held_back`]).
    pub verdict: String,
    /// Which guard.
    pub guard: String,
    /// Why, in plain words.
    pub reason: String,
}

impl DecisionRecord {
    /// Whether it held the request back (every verdict but the stop
    /// conditions' `checked`).
    pub(crate) fn held_back(&self) -> bool {
        self.verdict != "checked"
    }
}

/// Everything recorded about one request: what `mandrill explain` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Story {
    /// The request as it stands.
    pub entry: HistoryEntry,
    /// Its restart attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// The guards' verdicts, oldest first.
    pub decisions: Vec<DecisionRecord>,
}

/// What each group has used of its limits right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct GroupUsage {
    /// Restarts claimed within the rate window.
    pub restarts: u32,
    /// Hosts disrupted now: restarting, or not verified recovered.
    pub disrupted: u32,
}

/// Folds [`GROUP_RESTARTS_SQL`] and [`GROUP_DISRUPTED_SQL`] rows.
pub(crate) fn group_usage_from(
    restarts: Vec<(String, i64)>,
    disrupted: Vec<(String, i64)>,
) -> std::collections::BTreeMap<String, GroupUsage> {
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    let mut usage = std::collections::BTreeMap::<String, GroupUsage>::new();
    for (group, n) in restarts {
        usage.entry(group).or_default().restarts = count(n);
    }
    for (group, n) in disrupted {
        usage.entry(group).or_default().disrupted = count(n);
    }
    usage
}

/// A story from its rows. `None` only when nothing at all is recorded
/// under `message_id`.
pub(crate) fn story_from(
    message_id: Uuid,
    entry: Option<HistoryEntry>,
    attempts: Vec<AttemptRow>,
    decisions: Vec<DecisionRow>,
) -> Option<Story> {
    let number = |n: i64| u32::try_from(n).unwrap_or(0);
    story_of(
        message_id,
        entry,
        attempts
            .into_iter()
            .map(
                |(attempt, group, claimed_at, verdict, outcome, settled_at, requester)| {
                    AttemptRecord {
                        attempt: number(attempt),
                        group,
                        claimed_at: Timestamp::from_millis(claimed_at),
                        verdict,
                        outcome: outcome.as_deref().and_then(Status::from_name),
                        settled_at: settled_at.map(Timestamp::from_millis),
                        requester,
                    }
                },
            )
            .collect(),
        decisions_from(decisions),
    )
}

/// A request's story, every store's one rule: its entry when it has one;
/// else, when guards recorded verdicts about it (a request deferred and
/// never claimed has no row), an entry made of those alone: never final,
/// nothing attempted, nothing known of the host or who asked. `None` when
/// nothing at all is recorded.
pub(crate) fn story_of(
    message_id: Uuid,
    entry: Option<HistoryEntry>,
    attempts: Vec<AttemptRecord>,
    decisions: Vec<DecisionRecord>,
) -> Option<Story> {
    let entry = match entry {
        Some(entry) => entry,
        None => {
            let first = decisions.first()?.at;
            let last = decisions.last().map_or(first, |decision| decision.at);
            HistoryEntry {
                message_id: Some(message_id),
                instance_name: None,
                hostname: None,
                status: Status::Received,
                attempts: count_of(attempts.len()),
                requested_by: None,
                verified: false,
                reason: None,
                last_error: None,
                output: None,
                recovered_after: None,
                received_at: first,
                updated_at: last,
                completed_at: None,
            }
        }
    };
    Some(Story {
        entry,
        attempts,
        decisions,
    })
}

fn count_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The restart attempts an entry tells: none for a rejected payload, which
/// was never claimed (rows written before this rule say 1).
pub(crate) fn attempts_made(status: Status, stored: u32) -> u32 {
    if status == Status::Rejected {
        0
    } else {
        stored
    }
}

/// Decision records from their rows.
pub(crate) fn decisions_from(decisions: Vec<DecisionRow>) -> Vec<DecisionRecord> {
    decisions.into_iter().map(decision_from).collect()
}

pub(crate) fn decision_from((at, attempt, verdict, guard, reason): DecisionRow) -> DecisionRecord {
    DecisionRecord {
        at: Timestamp::from_millis(at),
        attempt: u32::try_from(attempt).unwrap_or(0),
        verdict,
        guard,
        reason,
    }
}

/// Whether [`Store::record_outcome`] recorded anything.
#[derive(Debug, Clone, PartialEq, Eq)]
// `Recorded::Recorded` reads as the answer it is, at every call site.
#[allow(clippy::enum_variant_names)]
pub(crate) enum Recorded {
    /// The outcome is now recorded.
    Recorded,
    /// A final outcome was already recorded (by an earlier delivery or
    /// another instance); it was left as it was.
    AlreadyFinal(Status),
    /// The `message_id` is recorded for another request
    /// ([`identity_conflict`](super::identity_conflict)): nothing was
    /// written; the payload is to be refused and recorded apart.
    Conflict(String),
}

/// One request as recorded, for `mandrill history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// The request's id; `None` for a rejected payload without a readable one.
    pub message_id: Option<Uuid>,
    /// The instance, if the request was valid.
    pub instance_name: Option<String>,
    /// The host, if the request was valid.
    pub hostname: Option<String>,
    /// Where it stands.
    pub status: Status,
    /// Restart attempts claimed (1 for a rejected payload).
    pub attempts: u32,
    /// Who asked, if the publisher said.
    pub requested_by: Option<String>,
    /// Whether `requested_by` is a requester whose signature was verified;
    /// when not, it is only what the payload said (shown as unverified).
    pub verified: bool,
    /// Why, if the publisher said.
    pub reason: Option<String>,
    /// The last error, or the rejection reason.
    pub last_error: Option<String>,
    /// What the backend printed or answered, truncated.
    pub output: Option<String>,
    /// How long the host took to come back after the restart, in seconds
    /// in JSON; `None` when not verified.
    #[serde(serialize_with = "seconds")]
    pub recovered_after: Option<Duration>,
    /// First seen.
    pub received_at: Timestamp,
    /// Last changed.
    pub updated_at: Timestamp,
    /// When it became final.
    pub completed_at: Option<Timestamp>,
}

impl HistoryEntry {
    /// Who asked, as every display shows it: a name that no verified
    /// signature vouches for is marked `(unverified)`, so that free text
    /// never reads like a verified requester.
    pub(crate) fn requested_by_shown(&self) -> Option<String> {
        self.requested_by.as_deref().map(|name| {
            if self.verified {
                name.to_owned()
            } else {
                unverified(name)
            }
        })
    }
}

fn seconds<S: serde::Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(duration) => serializer.serialize_some(&duration.as_secs_f64()),
        None => serializer.serialize_none(),
    }
}

/// A recovery time as stored: milliseconds.
pub(crate) fn millis_of(duration: Option<Duration>) -> Option<i64> {
    duration.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A recovery time from storage.
pub(crate) fn duration_of(millis: Option<i64>) -> Option<Duration> {
    millis.map(|m| Duration::from_millis(m.max(0).unsigned_abs()))
}

/// How much of a rejected payload is kept for diagnosis.
pub(crate) const REJECTED_PAYLOAD_EXCERPT: usize = 1024;

/// A lossy, bounded excerpt of a rejected payload.
pub(crate) fn payload_excerpt(payload: &[u8]) -> String {
    let cut = &payload[..payload.len().min(REJECTED_PAYLOAD_EXCERPT)];
    String::from_utf8_lossy(cut).into_owned()
}

/// A stored status, or [`StoreError::Corrupt`] if no status has that name.
pub(crate) fn status_from_name(name: &str) -> Result<Status, StoreError> {
    Status::from_name(name).ok_or_else(|| StoreError::Corrupt(format!("status {name:?}")))
}

/// A history entry from its row, as both SQL stores read it.
pub(crate) fn entry_from(row: EntryRow) -> Result<HistoryEntry, StoreError> {
    let (
        message_id,
        instance_name,
        hostname,
        requested_by,
        reason,
        status,
        attempts,
        last_error,
        output,
        recovered_after_ms,
        received_at,
        updated_at,
        completed_at,
        requester,
    ) = row;
    let message_id = message_id
        .map(|id| {
            Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("message_id {id:?}")))
        })
        .transpose()?;
    Ok(HistoryEntry {
        message_id,
        instance_name,
        hostname,
        attempts: attempts_made(
            status_from_name(&status)?,
            u32::try_from(attempts).unwrap_or(u32::MAX),
        ),
        status: status_from_name(&status)?,
        requested_by,
        verified: requester.is_some(),
        reason,
        last_error,
        output,
        recovered_after: duration_of(recovered_after_ms),
        received_at: Timestamp::from_millis(received_at),
        updated_at: Timestamp::from_millis(updated_at),
        completed_at: completed_at.map(Timestamp::from_millis),
    })
}

/// What `mandrill report` reads from a store: the restart journal's rows
/// and the recorded verdicts since a moment, as plain rows; the report
/// aggregates them itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportData {
    /// Restart attempts claimed since then, oldest first.
    pub attempts: Vec<ReportAttempt>,
    /// Verdicts recorded since then that held a request back, oldest first.
    pub decisions: Vec<ReportDecision>,
    /// Campaigns started since then, oldest first.
    pub campaigns: Vec<super::Campaign>,
}

/// One claimed restart attempt, with what its request's row adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportAttempt {
    /// The request's id.
    pub message_id: Uuid,
    /// The attempt's number.
    pub attempt: u32,
    /// The host.
    pub instance_name: String,
    /// The group it counted against.
    pub group: String,
    /// The verified requester, else the request's `requested_by`.
    pub requester: Option<String>,
    /// When it was claimed.
    pub claimed_at: Timestamp,
    /// How it ended; `None` while in flight or never recorded.
    pub outcome: Option<Status>,
    /// When its outcome was recorded.
    pub settled_at: Option<Timestamp>,
    /// How long the host took to come back: the request's, on its latest
    /// attempt only (the row keeps one).
    pub recovered_after: Option<Duration>,
    /// The request's last error, on its latest attempt only.
    pub last_error: Option<String>,
    /// No outcome recorded, yet the request went on (to a later attempt,
    /// or to its end): the outcome was lost, and the restart may have run.
    /// Not in flight.
    pub lost: bool,
}

/// One recorded verdict, with what is known of its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportDecision {
    /// The request's id.
    pub message_id: Uuid,
    /// When.
    pub at: Timestamp,
    /// `deferred`, `denied`, `expired`, `dry-run`.
    pub verdict: String,
    /// Which guard.
    pub guard: String,
    /// Why, in plain words.
    pub reason: String,
    /// The host, if the request has a row.
    pub instance_name: Option<String>,
    /// The group of the request's latest claimed attempt, if it has one.
    pub group: Option<String>,
    /// Who asked, if the request has a row and said, as shown: marked
    /// unverified unless its signature was.
    pub requested_by: Option<String>,
}

/// Report rows from their SQL rows; a row whose id is not a uuid is
/// corrupt.
pub(crate) fn report_from(
    attempts: Vec<ReportAttemptRow>,
    decisions: Vec<ReportDecisionRow>,
) -> Result<ReportData, StoreError> {
    let id = |id: String| {
        Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("message_id {id:?}")))
    };
    let attempts = attempts
        .into_iter()
        .map(
            |(
                message_id,
                attempt,
                instance_name,
                group,
                requester,
                claimed_at,
                outcome,
                settled_at,
                recovered_ms,
                last_error,
                lost,
            )| {
                Ok(ReportAttempt {
                    message_id: id(message_id)?,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    instance_name,
                    group,
                    requester,
                    claimed_at: Timestamp::from_millis(claimed_at),
                    outcome: outcome.as_deref().map(status_from_name).transpose()?,
                    settled_at: settled_at.map(Timestamp::from_millis),
                    recovered_after: duration_of(recovered_ms),
                    last_error,
                    lost,
                })
            },
        )
        .collect::<Result<_, StoreError>>()?;
    let decisions = decisions
        .into_iter()
        .map(
            |(message_id, at, verdict, guard, reason, instance_name, said, group, requester)| {
                Ok(ReportDecision {
                    message_id: id(message_id)?,
                    at: Timestamp::from_millis(at),
                    verdict,
                    guard,
                    reason,
                    instance_name,
                    group,
                    requested_by: requester.or_else(|| said.as_deref().map(unverified)),
                })
            },
        )
        .collect::<Result<_, StoreError>>()?;
    Ok(ReportData {
        attempts,
        decisions,
        campaigns: Vec::new(),
    })
}
