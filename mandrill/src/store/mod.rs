//! The `Store` seam: the durable record of what was requested and what was done.
//!
//! The store, not the process, carries the guarantees: the worker acks a
//! message only after [`Store::record_outcome`] returned, and a request whose
//! outcome is final is never restarted again ([`Store::lookup`]).

pub mod memory;
pub mod postgres;
pub mod sqlite;
mod story;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::Serialize;
use uuid::Uuid;

use crate::domain::{Outcome, RestartRequest, Status};
use crate::safety::limits::{self, Limits, Usage};

pub use memory::MemoryStore;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// What went wrong talking to a store. The worker branches on
/// [`StoreError::is_transient`]: a transient error is retried in place (and
/// pauses pulling), a permanent one gives the message up with the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database refused or failed the operation.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not make sense (e.g. an unknown status).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A batched operation failed; every caller of the batch is told, and
    /// none of a failed write batch was committed.
    #[error("database batch failed: {0}")]
    Batch(#[source] Arc<sqlx::Error>),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// A fault injected on purpose (tests, benchmarks).
    #[error("injected fault: {what}")]
    Injected {
        /// Whether it is to be treated as transient.
        transient: bool,
        /// What it pretends to be.
        what: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed: the database
    /// was unreachable, busy, locked or out of space. Encoding errors,
    /// constraint violations and values too long are permanent: retrying
    /// (or redelivering) would fail the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(error) => sqlx_error_is_transient(error),
            Self::Batch(error) => sqlx_error_is_transient(error),
            Self::Migrate(_) | Self::Corrupt(_) | Self::Closed => false,
            Self::Injected { transient, .. } => *transient,
        }
    }
}

/// Classifies a driver error; see [`StoreError::is_transient`]. What is not
/// known to be permanent is treated as transient: retrying in place costs
/// time, never a restart.
pub(crate) fn sqlx_error_is_transient(error: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match error {
        E::Database(db) => {
            use sqlx::error::ErrorKind;
            if matches!(
                db.kind(),
                ErrorKind::UniqueViolation
                    | ErrorKind::ForeignKeyViolation
                    | ErrorKind::NotNullViolation
                    | ErrorKind::CheckViolation
            ) {
                return false;
            }
            let code = db.code().unwrap_or_default();
            if db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                // SQLSTATE classes: 22 data exception (invalid byte sequence,
                // string too long), 23 integrity, 42 syntax or access rule,
                // 54 program limit exceeded.
                !matches!(code.get(..2), Some("22" | "23" | "42" | "54"))
            } else {
                // SQLite's primary result code is the low byte: 18 TOOBIG,
                // 19 CONSTRAINT, 20 MISMATCH, 25 RANGE, 1 ERROR (bad SQL).
                let primary = code.parse::<i64>().map_or(-1, |c| c & 0xff);
                !matches!(primary, 1 | 18 | 19 | 20 | 25)
            }
        }
        E::Configuration(_)
        | E::InvalidArgument(_)
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Encode(_)
        | E::Decode(_)
        | E::TypeNotFound { .. }
        | E::RowNotFound
        | E::PoolClosed
        | E::Migrate(_) => false,
        _ => true,
    }
}

/// What a delivery may do about a restart: [`Store::claim_restart`] decides
/// it and records the claim in one atomic step, before the restart is issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Restart attempt `attempt` (1-based, counted in the store) is claimed
    /// and recorded: issue it.
    Claimed {
        /// This attempt's number.
        attempt: u32,
        /// An earlier attempt that was claimed (so possibly issued) but whose
        /// outcome was never recorded, and whose hold had expired: counted as
        /// a used attempt.
        unknown: Option<u32>,
    },
    /// Attempt `attempt` was claimed by another delivery that may still be
    /// issuing it: do not restart before its hold expires, in `wait`.
    InFlight {
        /// The attempt in flight.
        attempt: u32,
        /// Until its hold expires, by the store's clock.
        wait: Duration,
    },
    /// The request already has a final outcome.
    Final(Status),
    /// The kill switch is on: nothing may be restarted now. Nothing was
    /// claimed.
    Paused {
        /// Who paused, and why, as recorded.
        reason: String,
    },
    /// A counting guard (rate limit, host cooldown, disruption budget)
    /// says not yet. Nothing was claimed; the decision was recorded.
    Deferred {
        /// Which guard.
        guard: &'static str,
        /// Why, in plain words, with when it could pass.
        reason: String,
        /// Until it could pass.
        wait: Duration,
    },
    /// Every allowed attempt was claimed; none is left. The caller records
    /// the request as failed.
    Exhausted {
        /// Attempts claimed.
        attempts: u32,
        /// The last of them, if its outcome was never recorded.
        unknown: Option<u32>,
    },
}

/// The terms of a claim, from the worker's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTerms {
    /// Restart attempts a request may use in all.
    pub max_attempts: u32,
    /// How long a claim holds off other deliveries: long enough for the
    /// restart to time out and its outcome to be recorded.
    pub hold: Duration,
    /// The counting guards, resolved for the request's group
    /// ([`RestartRequest::group`]); checked in the claim's transaction.
    pub limits: Limits,
}

/// The part of a stored row that decides a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimState {
    pub status: Status,
    /// Attempts claimed so far.
    pub attempts: u32,
    /// When the hold of the last claim expires; `None` once its outcome is
    /// recorded.
    pub claim_until: Option<i64>,
}

/// The kill switch, as a store keeps it for every instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Switch {
    /// Whether restarts are paused.
    pub paused: bool,
    /// Who last turned it.
    pub by: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// When.
    pub since: Option<Timestamp>,
}

impl Switch {
    /// The words a paused claim records.
    pub fn paused_reason(&self) -> String {
        format!(
            "paused by {} ({}) since {}",
            self.by.as_deref().unwrap_or("someone"),
            self.reason.as_deref().unwrap_or("no reason given"),
            self.since.map_or_else(|| "-".to_owned(), |t| t.to_string())
        )
    }
}

/// What a store writes for a claim that succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimWrite {
    pub attempts: u32,
    pub claim_until: i64,
    /// Set when an earlier attempt's outcome is unknown, so history says so.
    pub last_error: Option<String>,
    /// What the counting guards said, for the restart journal.
    pub verdict: String,
}

/// What the counting guards read in the claim's transaction, in one
/// statement: `?1` group, `?2` instance, `?3` start of the rate window,
/// `?4` start of the budget's memory, `?5` now. (PostgreSQL takes it with
/// `$` for `?`.) The claim being decided has no journal row yet.
pub(crate) const USAGE_SQL: &str = "SELECT
    (SELECT COUNT(*) FROM restarts WHERE grp = ?1 AND claimed_at > ?3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MIN(claimed_at) FROM restarts WHERE grp = ?1 AND claimed_at > ?3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT COUNT(*) FROM restarts WHERE claimed_at > ?3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MIN(claimed_at) FROM restarts WHERE claimed_at > ?3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MAX(claimed_at) FROM restarts WHERE instance_name = ?2 AND claimed_at <= ?5
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT COUNT(DISTINCT r.instance_name) FROM restarts r
      WHERE r.grp = ?1 AND r.instance_name <> ?2 AND r.claimed_at > ?4
        AND r.claimed_at = (SELECT MAX(x.claimed_at) FROM restarts x
                            WHERE x.instance_name = r.instance_name)
        AND (r.outcome IS NULL OR r.outcome NOT IN ('restarted', 'dry-run', 'expired', 'denied')))";

/// The bind values of [`USAGE_SQL`] for a claim.
pub(crate) fn usage_binds(limits: &Limits, now: i64) -> (i64, i64) {
    let back = |d: Duration| now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    (back(limits.window), back(limits.forget_after))
}

/// [`Usage`] from [`USAGE_SQL`]'s row.
pub(crate) fn usage_from(
    (group_claims, group_oldest, global_claims, global_oldest, host_last, disrupted): (
        i64,
        Option<i64>,
        i64,
        Option<i64>,
        Option<i64>,
        i64,
    ),
) -> Usage {
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    Usage {
        group_claims: count(group_claims),
        group_oldest,
        global_claims: count(global_claims),
        global_oldest,
        host_last,
        disrupted: count(disrupted),
    }
}

/// The one place the claim rule lives; each store reads the row (and, when
/// a counting guard is on, the journal's [`Usage`]), calls this, and writes
/// the result in the same transaction.
pub(crate) fn decide_claim(
    request: &RestartRequest,
    state: Option<ClaimState>,
    switch: &Switch,
    now: i64,
    terms: ClaimTerms,
    usage: &Usage,
) -> (Claim, Option<ClaimWrite>) {
    let state = state.unwrap_or(ClaimState {
        status: Status::Received,
        attempts: 0,
        claim_until: None,
    });
    if state.status.is_final() {
        return (Claim::Final(state.status), None);
    }
    if switch.paused {
        let reason = switch.paused_reason();
        return (Claim::Paused { reason }, None);
    }
    let unknown = match state.claim_until {
        Some(until) if now < until => {
            let claim = Claim::InFlight {
                attempt: state.attempts,
                wait: Duration::from_millis(until.saturating_sub(now).unsigned_abs()),
            };
            return (claim, None);
        }
        Some(_) => Some(state.attempts),
        None => None,
    };
    if state.attempts >= terms.max_attempts {
        let claim = Claim::Exhausted {
            attempts: state.attempts,
            unknown,
        };
        return (claim, None);
    }
    let verdict = if terms.limits.is_active() {
        let checked = limits::check(
            &terms.limits,
            request.group(),
            request.instance_name.as_str(),
            usage,
            now,
        );
        match checked {
            Ok(verdict) => verdict,
            Err(refusal) => {
                let claim = Claim::Deferred {
                    guard: refusal.guard,
                    reason: refusal.reason,
                    wait: refusal.wait,
                };
                return (claim, None);
            }
        }
    } else {
        String::new()
    };
    let attempt = state.attempts + 1;
    let hold = i64::try_from(terms.hold.as_millis()).unwrap_or(i64::MAX);
    let write = ClaimWrite {
        attempts: attempt,
        claim_until: now.saturating_add(hold),
        last_error: unknown.map(unknown_outcome),
        verdict,
    };
    (Claim::Claimed { attempt, unknown }, Some(write))
}

/// The history's words for an attempt whose outcome was never recorded.
pub fn unknown_outcome(attempt: u32) -> String {
    format!(
        "restart attempt {attempt} was issued but its outcome was never recorded \
         (the handler stopped or lost its lease); counted as failed"
    )
}

/// A guard's verdict that held a request back, for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'a> {
    /// `deferred`, `denied`, `expired`, `dry-run`.
    pub verdict: &'a str,
    /// Which guard (`calendar`, `rate limit`, `kill switch`, ...).
    pub guard: &'a str,
    /// In plain words.
    pub reason: &'a str,
}

/// Records a decision unless it repeats the request's latest one (a
/// request deferred a hundred times by the same closed window tells it
/// once), and at most 100 per request. `?1` message id, `?2` at, `?3`
/// attempt, `?4` verdict, `?5` guard, `?6` reason.
pub(crate) const DECISION_SQL: &str = "INSERT INTO decisions
        (message_id, at, attempt, verdict, guard, reason)
    SELECT ?1, ?2, ?3, ?4, ?5, ?6
    WHERE NOT EXISTS (
            SELECT 1 FROM (SELECT verdict, guard, reason FROM decisions
                           WHERE message_id = ?1 ORDER BY id DESC LIMIT 1) AS latest
            WHERE latest.verdict = ?4 AND latest.guard = ?5 AND latest.reason = ?6)
      AND (SELECT COUNT(*) FROM decisions WHERE message_id = ?1) < 100";

/// Counts one deferred delivery of a request: `?1` message id.
pub(crate) const DEFERRAL_SQL: &str = "INSERT INTO deferrals (message_id, count) VALUES (?1, 1)
    ON CONFLICT (message_id) DO UPDATE SET count = deferrals.count + 1";

/// The decision a refused claim records.
pub(crate) fn claim_decision(claim: &Claim) -> Option<Decision<'_>> {
    match claim {
        Claim::Deferred { guard, reason, .. } => Some(Decision {
            verdict: "deferred",
            guard,
            reason,
        }),
        Claim::Paused { reason } => Some(Decision {
            verdict: "deferred",
            guard: "kill switch",
            reason,
        }),
        _ => None,
    }
}

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
}

/// A verdict that held a request back, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecisionRecord {
    /// When.
    pub at: Timestamp,
    /// The attempt it concerned (0: before any claim).
    pub attempt: u32,
    /// `deferred`, `denied`, `expired`, `dry-run`.
    pub verdict: String,
    /// Which guard.
    pub guard: String,
    /// Why, in plain words.
    pub reason: String,
}

/// Everything recorded about one request: what `mandrill explain` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Story {
    /// The request as it stands.
    pub entry: HistoryEntry,
    /// Its restart attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// The verdicts that held it back, oldest first.
    pub decisions: Vec<DecisionRecord>,
}

/// Restarts per group since `?1`, for [`Store::group_usage`].
pub(crate) const GROUP_RESTARTS_SQL: &str = "SELECT grp, COUNT(*) FROM restarts
    WHERE claimed_at > ?1 AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))
    GROUP BY grp";

/// Disrupted hosts per group (as [`USAGE_SQL`] counts them) among the
/// journal rows since `?1`.
pub(crate) const GROUP_DISRUPTED_SQL: &str = "SELECT r.grp, COUNT(DISTINCT r.instance_name)
    FROM restarts r
    WHERE r.claimed_at > ?1
      AND r.claimed_at = (SELECT MAX(x.claimed_at) FROM restarts x
                          WHERE x.instance_name = r.instance_name)
      AND (r.outcome IS NULL OR r.outcome NOT IN ('restarted', 'dry-run', 'expired', 'denied'))
    GROUP BY r.grp";

/// What each group has used of its limits right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GroupUsage {
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

/// A request's journal rows, for [`Story`]: `?1` message id.
pub(crate) const STORY_ATTEMPTS_SQL: &str = "SELECT CAST(attempt AS BIGINT), grp, claimed_at,
        verdict, outcome, settled_at
    FROM restarts WHERE message_id = ?1 ORDER BY attempt";

/// A request's decisions, for [`Story`]: `?1` message id.
pub(crate) const STORY_DECISIONS_SQL: &str = "SELECT at, CAST(attempt AS BIGINT), verdict, guard,
        reason
    FROM decisions WHERE message_id = ?1 ORDER BY id";

/// A row of [`STORY_ATTEMPTS_SQL`].
pub(crate) type AttemptRow = (i64, String, i64, String, Option<String>, Option<i64>);

/// A row of [`STORY_DECISIONS_SQL`].
pub(crate) type DecisionRow = (i64, i64, String, String, String);

/// A story from its rows.
pub(crate) fn story_from(
    entry: HistoryEntry,
    attempts: Vec<AttemptRow>,
    decisions: Vec<DecisionRow>,
) -> Story {
    let number = |n: i64| u32::try_from(n).unwrap_or(0);
    Story {
        entry,
        attempts: attempts
            .into_iter()
            .map(
                |(attempt, group, claimed_at, verdict, outcome, settled_at)| AttemptRecord {
                    attempt: number(attempt),
                    group,
                    claimed_at: Timestamp::from_millis(claimed_at),
                    verdict,
                    outcome: outcome.as_deref().and_then(Status::from_name),
                    settled_at: settled_at.map(Timestamp::from_millis),
                },
            )
            .collect(),
        decisions: decisions
            .into_iter()
            .map(|(at, attempt, verdict, guard, reason)| DecisionRecord {
                at: Timestamp::from_millis(at),
                attempt: number(attempt),
                verdict,
                guard,
                reason,
            })
            .collect(),
    }
}

/// Whether [`Store::record_outcome`] recorded anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The outcome is now recorded.
    Recorded,
    /// A final outcome was already recorded (by an earlier delivery or
    /// another instance); it was left as it was.
    AlreadyFinal(Status),
}

/// A point in time, shown as RFC 3339 and stored as milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(SystemTime);

impl Timestamp {
    /// Now, by the wall clock.
    pub fn now() -> Self {
        Self(SystemTime::now())
    }

    /// From milliseconds since the Unix epoch.
    pub fn from_millis(millis: i64) -> Self {
        Self(UNIX_EPOCH + Duration::from_millis(millis.max(0).unsigned_abs()))
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> i64 {
        let millis = self
            .0
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        i64::try_from(millis).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.0))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
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

/// The kill switch from its stored columns.
pub(crate) fn switch_from(
    paused: bool,
    by: Option<String>,
    reason: Option<String>,
    updated_at: i64,
) -> Switch {
    Switch {
        paused,
        by,
        reason,
        since: (updated_at > 0).then(|| Timestamp::from_millis(updated_at)),
    }
}

/// The durable record of requests and outcomes. See the module docs.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The recorded status of a request, if it was ever recorded.
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError>;

    /// Claims the next restart attempt of a request, recording the claim
    /// (the audit record of a restart about to be issued) before the caller
    /// issues anything; see [`Claim`]. Creates the row if need be. Atomic:
    /// two deliveries of one request, on any number of instances, never both
    /// claim while a claim holds.
    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError>;

    /// Records the outcome of restart attempt `attempt`, unless a final
    /// outcome is already recorded, and releases that attempt's claim.
    /// Creates the row if no claim did.
    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError>;

    /// As [`Store::record_outcome`], and, if the outcome was recorded and
    /// `ack` is for this store's own database, the ack in the same
    /// transaction: both commit or neither. Returns whether the ack was
    /// committed; when not (the default: a store that cannot), the caller
    /// acks as usual.
    async fn record_outcome_acking(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<crate::sqlite::JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        let _ = ack;
        Ok((self.record_outcome(request, attempt, outcome).await?, false))
    }

    /// Gives back restart attempt `attempt`, claimed but never issued (a
    /// guard closed between the claim and the restart): the attempt is
    /// uncounted and its hold lifted, so the redelivery claims it again.
    /// Does nothing unless `attempt` is the latest claim and still held.
    async fn release_claim(&self, request: &RestartRequest, attempt: u32)
    -> Result<(), StoreError>;

    /// Records a payload that was dead-lettered as malformed. `message_id`
    /// is what could be salvaged from it: shown in the history, but never
    /// taken as the request's own record (a later valid request with that id
    /// is handled as new).
    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError>;

    /// The most recently updated entries, newest first.
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError>;

    /// Records a guard's verdict on a request that the claim did not
    /// decide (eligibility, the calendar, stop conditions, a dry run), for
    /// [`Store::story`]. Claims record their own refusals.
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<(), StoreError>;

    /// Everything recorded about one request, if anything is.
    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError>;

    /// Each group's use of its limits: restarts since `window_start`, and
    /// hosts disrupted now among those restarted since `memory_start`.
    /// For `mandrill status`, the dashboard and `/metrics`.
    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError>;

    /// How many deliveries of a request a guard deferred (each recorded
    /// `deferred` decision counts, repeated or not): the worker does not
    /// count them against `broker.max_deliveries`.
    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError>;

    /// The kill switch, as every instance sharing this store sees it.
    async fn switch(&self) -> Result<Switch, StoreError>;

    /// Turns the kill switch on (`paused`) or off. Once this returns, no
    /// instance claims another restart until it is turned off.
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError>;

    /// Deletes at most `max_rows` final entries completed before `before`,
    /// oldest first; returns how many went. Bounded, so that pruning a large
    /// history never holds the database for long.
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError>;

    /// Closes connections; called once, after the last write.
    async fn close(&self) {}
}

/// How much of a rejected payload is kept for diagnosis.
pub const REJECTED_PAYLOAD_EXCERPT: usize = 1024;

/// A lossy, bounded excerpt of a rejected payload.
pub fn payload_excerpt(payload: &[u8]) -> String {
    let cut = &payload[..payload.len().min(REJECTED_PAYLOAD_EXCERPT)];
    String::from_utf8_lossy(cut).into_owned()
}

#[cfg(test)]
pub(crate) mod contract {
    //! Behaviour every `Store` must have; each implementation's tests call these.

    use super::*;
    use crate::domain::{Domain, ParseRules};

    pub use crate::domain::testing::request;

    const TERMS: ClaimTerms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(3600),
        limits: crate::safety::Limits::NONE,
    };

    /// Every contract behaviour, in order, on one store.
    pub async fn all(store: &dyn Store) {
        final_outcome_is_never_overwritten(store).await;
        outcome_without_claim_creates_row(store).await;
        claim_holds_and_unknown_outcomes_count(store).await;
        a_released_claim_is_not_a_used_attempt(store).await;
        rejections_are_listed_but_never_count_as_the_request(store).await;
        outcome_details_are_kept(store).await;
        the_kill_switch_stops_every_claim_until_resumed(store).await;
        counting_guards_are_decided_in_the_claim_and_journaled(store).await;
        prune_removes_old_final_entries_only_and_in_bounded_passes(store).await;
    }

    pub async fn final_outcome_is_never_overwritten(store: &dyn Store) {
        let request = request("cattle-0001");
        assert_eq!(store.lookup(request.message_id).await.unwrap(), None);
        let claimed = store.claim_restart(&request, TERMS).await.unwrap();
        assert_eq!(
            claimed,
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
        assert_eq!(
            store.lookup(request.message_id).await.unwrap(),
            Some(Status::Received)
        );
        let failed = Outcome::Retrying {
            error: "boom".into(),
        };
        assert_eq!(
            store.record_outcome(&request, 1, &failed).await.unwrap(),
            Recorded::Recorded
        );
        assert_eq!(
            store.claim_restart(&request, TERMS).await.unwrap(),
            Claim::Claimed {
                attempt: 2,
                unknown: None
            }
        );
        assert_eq!(
            store
                .record_outcome(&request, 2, &Outcome::restarted())
                .await
                .unwrap(),
            Recorded::Recorded
        );
        // A late duplicate neither claims nor overwrites the final outcome.
        assert_eq!(
            store.claim_restart(&request, TERMS).await.unwrap(),
            Claim::Final(Status::Restarted)
        );
        assert_eq!(
            store
                .record_outcome(&request, 3, &Outcome::Failed { error: "x".into() })
                .await
                .unwrap(),
            Recorded::AlreadyFinal(Status::Restarted)
        );
        assert_eq!(
            store.lookup(request.message_id).await.unwrap(),
            Some(Status::Restarted)
        );
        let entry = entry(store, request.message_id).await;
        assert_eq!(entry.status, Status::Restarted);
        assert_eq!(entry.attempts, 2);
        assert_eq!(entry.hostname.as_deref(), Some("cattle-0001.example.net"));
        assert!(entry.completed_at.is_some());
    }

    pub async fn outcome_without_claim_creates_row(store: &dyn Store) {
        let request = request("cattle-0002");
        let outcome = Outcome::Failed {
            error: "gave up".into(),
        };
        assert_eq!(
            store.record_outcome(&request, 5, &outcome).await.unwrap(),
            Recorded::Recorded
        );
        let entry = entry(store, request.message_id).await;
        assert_eq!(entry.status, Status::Failed);
        assert_eq!(entry.last_error.as_deref(), Some("gave up"));
    }

    pub async fn claim_holds_and_unknown_outcomes_count(store: &dyn Store) {
        let request = request("cattle-0003");
        let first = store.claim_restart(&request, TERMS).await.unwrap();
        assert_eq!(
            first,
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
        // While the claim holds, no other delivery may restart.
        let Claim::InFlight { attempt: 1, wait } =
            store.claim_restart(&request, TERMS).await.unwrap()
        else {
            panic!("a held claim must block a second one");
        };
        assert!(wait > Duration::ZERO && wait <= TERMS.hold);
        // A claim that never got its outcome, once its hold is over, counts
        // as a used attempt: a crash never buys a request extra restarts.
        let expired = ClaimTerms {
            hold: Duration::ZERO,
            limits: crate::safety::Limits::NONE,
            ..TERMS
        };
        let other = self::request("cattle-0004");
        assert_eq!(
            store.claim_restart(&other, expired).await.unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            store.claim_restart(&other, expired).await.unwrap(),
            Claim::Claimed {
                attempt: 2,
                unknown: Some(1)
            }
        );
        let entry = entry(store, other.message_id).await;
        assert!(
            entry
                .last_error
                .as_deref()
                .unwrap_or("")
                .contains("attempt 1"),
            "{entry:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            store.claim_restart(&other, expired).await.unwrap(),
            Claim::Claimed {
                attempt: 3,
                unknown: Some(2)
            }
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            store.claim_restart(&other, expired).await.unwrap(),
            Claim::Exhausted {
                attempts: 3,
                unknown: Some(3)
            }
        );
        // Recording the last attempt's outcome releases its claim.
        store
            .record_outcome(&request, 1, &Outcome::Retrying { error: "e".into() })
            .await
            .unwrap();
        assert_eq!(
            store.claim_restart(&request, TERMS).await.unwrap(),
            Claim::Claimed {
                attempt: 2,
                unknown: None
            }
        );
    }

    pub async fn a_released_claim_is_not_a_used_attempt(store: &dyn Store) {
        let request = request("cattle-0005");
        let claim = |expected: u32| {
            let request = request.clone();
            async move {
                assert_eq!(
                    store.claim_restart(&request, TERMS).await.unwrap(),
                    Claim::Claimed {
                        attempt: expected,
                        unknown: None
                    }
                );
            }
        };
        claim(1).await;
        // Given back (a guard closed before the restart): the hold is lifted
        // at once and the attempt is claimed again, with nothing unknown.
        store.release_claim(&request, 1).await.unwrap();
        claim(1).await;
        // Only the latest, still-held claim is given back.
        store.release_claim(&request, 2).await.unwrap();
        assert!(matches!(
            store.claim_restart(&request, TERMS).await.unwrap(),
            Claim::InFlight { attempt: 1, .. }
        ));
        store
            .record_outcome(&request, 1, &Outcome::Retrying { error: "e".into() })
            .await
            .unwrap();
        store.release_claim(&request, 1).await.unwrap();
        claim(2).await;
        assert_eq!(entry(store, request.message_id).await.attempts, 2);
        // A final request stays final.
        store
            .record_outcome(&request, 2, &Outcome::restarted())
            .await
            .unwrap();
        store.release_claim(&request, 2).await.unwrap();
        assert_eq!(entry(store, request.message_id).await.attempts, 2);
        assert_eq!(
            store.lookup(request.message_id).await.unwrap(),
            Some(Status::Restarted)
        );
    }

    pub async fn rejections_are_listed_but_never_count_as_the_request(store: &dyn Store) {
        store
            .record_rejection(None, "payload is not a valid request", b"garbage")
            .await
            .unwrap();
        let valid = request("cattle-0005");
        let id = valid.message_id;
        store
            .record_rejection(Some(id), "instance_name \"X\" is bad", b"{}")
            .await
            .unwrap();
        let history = store.history(100).await.unwrap();
        let rejected: Vec<_> = history
            .iter()
            .filter(|e| e.status == Status::Rejected)
            .collect();
        assert_eq!(rejected.len(), 2);
        assert!(rejected.iter().any(|e| e.message_id == Some(id)));
        // A malformed payload that carried this id does not make a later
        // valid request with the same id count as done.
        assert_eq!(store.lookup(id).await.unwrap(), None);
        assert_eq!(
            store.claim_restart(&valid, TERMS).await.unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
    }

    pub async fn prune_removes_old_final_entries_only_and_in_bounded_passes(store: &dyn Store) {
        let before = store.history(1000).await.unwrap();
        let finals = before.iter().filter(|e| e.status.is_final()).count();
        let open = before.len() - finals;
        assert!(
            finals >= 3,
            "the earlier contract steps leave final entries"
        );
        // Nothing completed a day ago or earlier: nothing to prune.
        let yesterday = Timestamp::from_millis(Timestamp::now().as_millis() - 86_400_000);
        assert_eq!(store.prune(yesterday, 1000).await.unwrap(), 0);
        let tomorrow = Timestamp::from_millis(Timestamp::now().as_millis() + 86_400_000);
        assert_eq!(store.prune(tomorrow, 2).await.unwrap(), 2);
        let rest = u64::try_from(finals - 2).unwrap();
        assert_eq!(store.prune(tomorrow, 1000).await.unwrap(), rest);
        let after = store.history(1000).await.unwrap();
        assert_eq!(after.len(), open);
        assert!(after.iter().all(|e| !e.status.is_final()));
    }

    pub async fn outcome_details_are_kept(store: &dyn Store) {
        let payload = format!(
            r#"{{"message_id":"{}","instance_name":"cattle-0006","requested_by":"sre","reason":"game day"}}"#,
            Uuid::new_v4()
        );
        let rules = ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 1024,
        };
        let request = RestartRequest::parse(payload.as_bytes(), &rules).unwrap();
        store.claim_restart(&request, TERMS).await.unwrap();
        let restarted = Outcome::Restarted(crate::domain::Restarted {
            recovered_after: Some(Duration::from_millis(12_345)),
            output: Some("app restarted".into()),
        });
        store.record_outcome(&request, 1, &restarted).await.unwrap();
        let entry = entry(store, request.message_id).await;
        assert_eq!(entry.recovered_after, Some(Duration::from_millis(12_345)));
        assert_eq!(entry.output.as_deref(), Some("app restarted"));
        assert_eq!(entry.requested_by.as_deref(), Some("sre"));
        assert_eq!(entry.reason.as_deref(), Some("game day"));
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["recovered_after"], serde_json::json!(12.345));
    }

    pub async fn the_kill_switch_stops_every_claim_until_resumed(store: &dyn Store) {
        assert!(!store.switch().await.unwrap().paused);
        let request = request("cattle-0007");
        store
            .set_switch(true, "sre-on-call", "incident 42")
            .await
            .unwrap();
        let switch = store.switch().await.unwrap();
        assert!(switch.paused);
        assert_eq!(switch.by.as_deref(), Some("sre-on-call"));
        assert_eq!(switch.reason.as_deref(), Some("incident 42"));
        assert!(switch.since.is_some());
        let Claim::Paused { reason } = store.claim_restart(&request, TERMS).await.unwrap() else {
            panic!("a paused store must refuse the claim");
        };
        assert!(
            reason.contains("sre-on-call") && reason.contains("incident 42"),
            "{reason}"
        );
        // Nothing was claimed: no attempt used.
        assert_eq!(
            store
                .lookup(request.message_id)
                .await
                .unwrap()
                .unwrap_or(Status::Received),
            Status::Received
        );
        store
            .set_switch(false, "sre-on-call", "resolved")
            .await
            .unwrap();
        assert!(!store.switch().await.unwrap().paused);
        assert_eq!(
            store.claim_restart(&request, TERMS).await.unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
    }

    pub async fn counting_guards_are_decided_in_the_claim_and_journaled(store: &dyn Store) {
        let limited = ClaimTerms {
            limits: Limits {
                group_max: Some(2),
                global_max: None,
                window: Duration::from_secs(3600),
                host_cooldown: None,
                budget: Some(1),
                forget_after: Duration::from_secs(3600),
                budget_retry: limits::BUDGET_RETRY,
            },
            ..TERMS
        };
        let first = request("herd-0001");
        let second = request("herd-0002");
        let third = request("herd-0003");
        assert_eq!(
            store.claim_restart(&first, limited).await.unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
        // herd-0001's restart is in flight: the group's one disruption.
        let Claim::Deferred { guard, wait, .. } =
            store.claim_restart(&second, limited).await.unwrap()
        else {
            panic!("the budget must hold while another host of the group is disrupted");
        };
        assert_eq!((guard, wait), ("disruption budget", limits::BUDGET_RETRY));
        store
            .record_outcome(&first, 1, &Outcome::restarted())
            .await
            .unwrap();
        assert!(matches!(
            store.claim_restart(&second, limited).await.unwrap(),
            Claim::Claimed { attempt: 1, .. }
        ));
        store
            .record_outcome(&second, 1, &Outcome::restarted())
            .await
            .unwrap();
        // Two restarts of group herd in the window: the third waits for a
        // slot, about an hour.
        let Claim::Deferred {
            guard,
            wait,
            reason,
        } = store.claim_restart(&third, limited).await.unwrap()
        else {
            panic!("the rate limit must hold");
        };
        assert_eq!(guard, "rate limit");
        assert!(wait > Duration::from_secs(3000), "{wait:?}");
        assert!(reason.contains("group herd had 2 of its 2"), "{reason}");
        // Another group is not limited by herd's use...
        let mut other = request("herd-0004");
        other.group = Some("flock".into());
        assert!(matches!(
            store.claim_restart(&other, limited).await.unwrap(),
            Claim::Claimed { attempt: 1, .. }
        ));
        // ...and a claim given back leaves nothing in the journal.
        store.release_claim(&other, 1).await.unwrap();
        // The host cooldown counts restarts of the host by any request.
        let cooling = ClaimTerms {
            limits: Limits {
                host_cooldown: Some(Duration::from_secs(600)),
                ..Limits::NONE
            },
            ..TERMS
        };
        let again = request("herd-0001");
        let Claim::Deferred { guard, .. } = store.claim_restart(&again, cooling).await.unwrap()
        else {
            panic!("the host cooldown must hold");
        };
        assert_eq!(guard, "host cooldown");

        // A dry run (no restart issued) uses up nothing once settled.
        let mut leashed = request("lamb-0001");
        leashed.group = Some("lamb".into());
        let once = ClaimTerms {
            limits: Limits {
                group_max: Some(1),
                ..limited.limits
            },
            ..TERMS
        };
        store.claim_restart(&leashed, once).await.unwrap();
        let dry = Outcome::DryRun {
            action: "run [\"true\"]".into(),
        };
        store.record_outcome(&leashed, 1, &dry).await.unwrap();
        let mut next = request("lamb-0002");
        next.group = Some("lamb".into());
        assert!(
            matches!(
                store.claim_restart(&next, once).await.unwrap(),
                Claim::Claimed { attempt: 1, .. }
            ),
            "a dry run must not use up the group's one restart"
        );

        // The story: the journal and the decisions, oldest first.
        let story = store.story(second.message_id).await.unwrap().unwrap();
        assert_eq!(story.entry.status, Status::Restarted);
        assert_eq!(story.attempts.len(), 1);
        assert_eq!(story.attempts[0].outcome, Some(Status::Restarted));
        assert_eq!(story.attempts[0].group, "herd");
        assert!(
            story.attempts[0].verdict.contains("restart 2 of 2"),
            "{:?}",
            story.attempts[0]
        );
        assert_eq!(story.decisions.len(), 1, "{:?}", story.decisions);
        assert_eq!(story.decisions[0].guard, "disruption budget");
        assert_eq!(story.decisions[0].verdict, "deferred");
        let story = store.story(third.message_id).await.unwrap().unwrap();
        assert!(story.attempts.is_empty());
        assert_eq!(story.decisions[0].guard, "rate limit");
        // A repeated verdict is told once.
        store.claim_restart(&third, limited).await.unwrap();
        assert_eq!(
            store
                .story(third.message_id)
                .await
                .unwrap()
                .unwrap()
                .decisions
                .len(),
            1
        );
        let story = store.story(other.message_id).await.unwrap().unwrap();
        assert!(story.attempts.is_empty(), "{:?}", story.attempts);
        // Decisions the worker records (eligibility, calendar, ...).
        let decision = Decision {
            verdict: "denied",
            guard: "eligibility",
            reason: "denied by safety.deny",
        };
        store.record_decision(&third, 0, decision).await.unwrap();
        let story = store.story(third.message_id).await.unwrap().unwrap();
        assert_eq!(story.decisions.len(), 2);
        assert_eq!(story.decisions[1].reason, "denied by safety.deny");
        assert_eq!(store.story(Uuid::new_v4()).await.unwrap(), None);
        // Every deferred delivery counts, told once or not; other verdicts
        // do not.
        assert_eq!(store.deferrals(third.message_id).await.unwrap(), 2);
        assert_eq!(store.deferrals(second.message_id).await.unwrap(), 1);
        assert_eq!(store.deferrals(first.message_id).await.unwrap(), 0);
        // Use per group: herd-0001 and -0002 restarted (recovered), nothing
        // of herd disrupted; herd-0004's claim was given back.
        let hour_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 3_600_000);
        let usage = store.group_usage(hour_ago, hour_ago).await.unwrap();
        assert_eq!(
            usage.get("herd"),
            Some(&GroupUsage {
                restarts: 2,
                disrupted: 0
            }),
            "{usage:?}"
        );
        assert!(!usage.contains_key("flock"), "{usage:?}");
        store.claim_restart(&third, TERMS).await.unwrap();
        let usage = store.group_usage(hour_ago, hour_ago).await.unwrap();
        assert_eq!(usage["herd"].disrupted, 1, "in flight: {usage:?}");
    }

    async fn entry(store: &dyn Store, id: Uuid) -> HistoryEntry {
        let history = store.history(1000).await.unwrap();
        history
            .into_iter()
            .find(|e| e.message_id == Some(id))
            .unwrap()
    }
}
