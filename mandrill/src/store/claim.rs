//! The claim rule: what a delivery may do about a restart, decided once
//! ([`decide_claim`]) and applied by every store in its own transaction.
//!
//! The one claim rule and the types it decides over, so one file past 400
//! lines.

use std::time::Duration;

use serde::Serialize;

use super::Timestamp;
use crate::domain::{RestartRequest, Status};
use crate::safety::LeashRecord;
use crate::safety::limits::{self, Limits, Usage};

/// What a delivery may do about a restart: [`Store::claim_restart`] decides
/// it and records the claim in one atomic step, before the restart is issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Restart attempt `attempt` (1-based, counted in the store) is claimed
    /// and recorded: issue it.
    Claimed {
        /// This attempt's number.
        attempt: u32,
        /// An earlier attempt that was claimed (so possibly issued) but whose
        /// outcome was never recorded, and whose hold had expired: counted as
        /// a used attempt.
        unknown: Option<u32>,
        /// The leash as the store's record said in the claim's own
        /// transaction: `None` while no operator has turned it (the
        /// instance's own decides; see `safety::leash`).
        leashed: Option<bool>,
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
    /// Another request's restart of the host is still held (`host busy`),
    /// or a counting guard (rate limit, host cooldown, disruption budget)
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
    /// The request is a target of a stopped campaign (`mandrill campaign
    /// stop`) that was in flight when it stopped: nothing was claimed;
    /// the caller records it `cancelled` with these words.
    Cancelled {
        /// Which campaign, who stopped it and why.
        reason: String,
    },
    /// The `message_id` is recorded for another request (another
    /// requester, instance or reason; see [`identity_conflict`]): nothing
    /// was claimed or written. The caller refuses the payload, records it
    /// apart and dead-letters it.
    Conflict {
        /// The conflict, in words.
        reason: String,
    },
}

/// The terms of a claim, from the worker's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimTerms {
    /// Restart attempts a request may use in all.
    pub max_attempts: u32,
    /// How long a claim holds off other deliveries: long enough for the
    /// restart to time out and its outcome to be recorded.
    pub hold: Duration,
    /// The counting guards, resolved for the request's group
    /// ([`RestartRequest::group`]); checked in the claim's transaction.
    pub limits: Limits,
}

/// Names one call that claims, kept with the claim it made: the caller
/// passes the same token again when it retries that call, so that a claim
/// committed whose answer never reached it (a connection cut after the
/// commit, a caller that stopped waiting) is answered again rather than
/// taken for another delivery's claim in flight. A caller mints one per
/// claim it means to make, never one per try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClaimToken(u64);

impl ClaimToken {
    /// A new token: 64 random bits, so that no two claims of a request, on
    /// any number of instances, carry the same one.
    pub(crate) fn new() -> Self {
        Self(rand::random())
    }

    /// The token as the SQL stores keep it (`BIGINT`): the same 64 bits.
    pub(crate) fn to_stored(self) -> i64 {
        i64::from_ne_bytes(self.0.to_ne_bytes())
    }

    /// A token the SQL stores kept ([`ClaimToken::to_stored`]).
    pub(crate) fn from_stored(stored: i64) -> Self {
        Self(u64::from_ne_bytes(stored.to_ne_bytes()))
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

/// The part of a stored row that decides a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimState {
    pub status: Status,
    /// Attempts claimed so far.
    pub attempts: u32,
    /// When the hold of the last claim expires; `None` once its outcome is
    /// recorded.
    pub claim_until: Option<i64>,
    /// The token of the call that made the last claim (`None` for a claim
    /// written before tokens were kept); read only while that claim's
    /// outcome is not in (`claim_until` set).
    pub token: Option<ClaimToken>,
    /// The earlier attempt the last claim counted as issued with its
    /// outcome unknown, as that claim answered.
    pub unknown: Option<u32>,
    /// Who asked and for what, as the row records it; `None` for a row
    /// the deciding transaction created from the request in hand.
    pub identity: Option<Identity>,
    /// A stop's words on a target that was in flight when its campaign
    /// stopped (`cancel_reason`): no claim is made again.
    pub cancelled: Option<String>,
}

impl ClaimState {
    /// A request never claimed: received, no attempt, the row written from
    /// the request in hand.
    pub(crate) const NEW: Self = Self {
        status: Status::Received,
        attempts: 0,
        claim_until: None,
        token: None,
        unknown: None,
        identity: None,
        cancelled: None,
    };
}

/// Who asked, and for what, as a request's row records it: what a payload
/// under a recorded `message_id` must repeat to be that request. The
/// message id is only the publisher's word (anyone who reads the queue
/// sees it); who signed, which host and why are what was asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The instance to restart.
    pub instance: String,
    /// Who asked: the verified signer's name for a signed request, else
    /// the publisher's free text.
    pub requested_by: Option<String>,
    /// The verified signer; `None` for an unsigned request.
    pub requester: Option<String>,
    /// Why.
    pub reason: Option<String>,
}

/// Whether `request` is the request these recorded parts describe: the
/// comparison [`identity_conflict`] words, made on borrowed parts so that
/// a store holding its rows in memory allocates nothing for the common
/// case (the first delivery, or a redelivery of the same request).
pub(crate) fn same_request(
    instance: &str,
    requested_by: Option<&str>,
    requester: Option<&str>,
    reason: Option<&str>,
    request: &RestartRequest,
) -> bool {
    instance == request.instance_name.as_str()
        && requester == request.requester.as_deref()
        && requested_by == request.requested_by.as_deref()
        && reason == request.reason.as_deref()
}

/// The one identity rule: `None` when `request` is the request `recorded`
/// describes (same verified requester, or unsigned the same
/// `requested_by`, and a signed request never matches an unsigned one;
/// same instance; same reason), else the conflict in words. Every write a
/// payload can reach under its `message_id` (a claim, an outcome, a
/// decision) asks this first, in its own transaction, and writes nothing
/// onto a row of another request.
pub(crate) fn identity_conflict(recorded: &Identity, request: &RestartRequest) -> Option<String> {
    fn who(requested_by: Option<&str>, requester: Option<&str>) -> String {
        match (requester, requested_by) {
            (Some(signer), _) => format!("{signer} (verified)"),
            (None, Some(name)) => crate::domain::unverified(name),
            (None, None) => crate::domain::unverified("nobody named"),
        }
    }
    fn why(reason: Option<&str>) -> String {
        reason.map_or_else(|| "none given".to_owned(), |reason| format!("{reason:?}"))
    }
    if same_request(
        &recorded.instance,
        recorded.requested_by.as_deref(),
        recorded.requester.as_deref(),
        recorded.reason.as_deref(),
        request,
    ) {
        return None;
    }
    let mut differences = Vec::new();
    if recorded.instance != request.instance_name.as_str() {
        differences.push(format!(
            "instance {} (this payload: {})",
            recorded.instance, request.instance_name
        ));
    }
    if recorded.requester.as_deref() != request.requester.as_deref()
        || recorded.requested_by.as_deref() != request.requested_by.as_deref()
    {
        differences.push(format!(
            "requested by {} (this payload: {})",
            who(
                recorded.requested_by.as_deref(),
                recorded.requester.as_deref()
            ),
            who(
                request.requested_by.as_deref(),
                request.requester.as_deref()
            ),
        ));
    }
    if recorded.reason.as_deref() != request.reason.as_deref() {
        differences.push(format!(
            "reason {} (this payload: {})",
            why(recorded.reason.as_deref()),
            why(request.reason.as_deref())
        ));
    }
    (!differences.is_empty()).then(|| {
        format!(
            "message_id {} is recorded for another request: {}; refused, the recorded \
             request is left as it was",
            request.message_id,
            differences.join(", ")
        )
    })
}

/// What [`Store::set_switch_if`](super::Store::set_switch_if) must find
/// for the switch to turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SwitchExpected<'a> {
    /// Restarts are not paused.
    Running,
    /// Paused, last turned by exactly this name.
    PausedBy(&'a str),
}

/// The kill switch, as a store keeps it for every instance, and the leash
/// kept beside it in the same row (read with it, at no extra cost, by
/// every claim and every poll of the switch).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Switch {
    /// Whether restarts are paused.
    pub paused: bool,
    /// Who last turned it.
    pub by: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// When.
    pub since: Option<Timestamp>,
    /// The leash as an operator last turned it; `None` until one did. Not
    /// part of the switch's turns (nor of its JSON): served apart.
    #[serde(skip)]
    pub leash: Option<LeashRecord>,
}

impl Switch {
    /// Whether `other` is the same turn of the kill switch (the leash
    /// aside).
    pub(crate) fn same_turn(&self, other: &Switch) -> bool {
        (self.paused, &self.by, &self.reason, self.since)
            == (other.paused, &other.by, &other.reason, other.since)
    }

    /// The leash as the store's record says it, as a claim carries it.
    pub(crate) fn leashed(&self) -> Option<bool> {
        self.leash.as_ref().map(|record| record.leashed)
    }

    /// The words a paused claim records.
    pub(crate) fn paused_reason(&self) -> String {
        format!(
            "paused by {} ({}) since {}",
            self.by.as_deref().unwrap_or("someone"),
            self.reason.as_deref().unwrap_or("no reason given"),
            self.since.map_or_else(|| "-".to_owned(), |t| t.to_string())
        )
    }
}

/// A group's restarts paused, as a store keeps it for every instance: by an
/// operator (`mandrill pause --group`) or by a breached recovery objective.
/// It never lifts by itself; `mandrill resume --group` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GroupPause {
    /// The group (the operator's, as [`RestartRequest::group`] says).
    pub group: String,
    /// Who paused it.
    pub by: String,
    /// Why: the cause, in words.
    pub reason: String,
    /// When.
    pub since: Timestamp,
}

impl GroupPause {
    /// The words a claim deferred by this pause records.
    pub(crate) fn deferred_reason(&self) -> String {
        format!(
            "restarts of group {} paused by {} ({}) since {}",
            self.group, self.by, self.reason, self.since
        )
    }
}

/// How long a request deferred by a group pause waits before it is
/// redelivered: the pause lifts only when an operator says so, so as
/// soon after as the kill switch's recheck.
pub(crate) const GROUP_PAUSE_RECHECK: Duration = Duration::from_secs(5);

/// What a store writes for a claim that succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimWrite {
    pub attempts: u32,
    pub claim_until: i64,
    /// The claiming call's token, kept with the claim.
    pub token: ClaimToken,
    /// The earlier attempt counted as issued with its outcome unknown.
    pub unknown: Option<u32>,
    /// Set when an earlier attempt's outcome is unknown, so history says so.
    pub last_error: Option<String>,
    /// What the counting guards said, for the restart journal.
    pub verdict: String,
    /// Only the hold of the caller's own claim, renewed: the journal keeps
    /// the row its claim wrote.
    pub renewal: bool,
}

/// The moments a claim's read of the journal counts from, by its limits
/// and `now`: the bind values of [`USAGE_SQL`] and
/// [`USAGE_SUBJECT_SQL`](super::sql::USAGE_SUBJECT_SQL), and what the
/// memory store compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UsageBinds {
    /// Start of the rate window.
    pub window_start: i64,
    /// Start of the budgets' memory (`forget_after`).
    pub memory_start: i64,
    /// A host whose latest restart ended `restarted` after this still
    /// counts as disrupted: `now - settle`, or never (`i64::MAX`) with no
    /// settle, so that a row another instance's clock stamped later than
    /// `now` does not count either.
    pub settled_after: i64,
    /// Start of the requester quota's window.
    pub requester_start: i64,
}

/// The [`UsageBinds`] of a claim.
pub(crate) fn usage_binds(limits: &Limits, now: i64) -> UsageBinds {
    let back = |d: Duration| now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    UsageBinds {
        window_start: back(limits.window),
        memory_start: back(limits.forget_after),
        settled_after: if limits.settle.is_zero() {
            i64::MAX
        } else {
            back(limits.settle)
        },
        requester_start: back(limits.requester_window),
    }
}

/// A row of [`USAGE_SQL`].
pub(crate) type UsageRow = (i64, Option<i64>, i64, Option<i64>, Option<i64>, i64);

/// A row of [`USAGE_SUBJECT_SQL`](super::sql::USAGE_SUBJECT_SQL): the
/// columns of [`UsageRow`], then the zone's disrupted hosts, the
/// requester's claims and the oldest of them.
pub(crate) type UsageSubjectRow = (
    i64,
    Option<i64>,
    i64,
    Option<i64>,
    Option<i64>,
    i64,
    i64,
    i64,
    Option<i64>,
);

fn count(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// [`Usage`] from [`USAGE_SQL`]'s row.
pub(crate) fn usage_from(
    (group_claims, group_oldest, global_claims, global_oldest, host_last, disrupted): UsageRow,
) -> Usage {
    Usage {
        group_claims: count(group_claims),
        group_oldest,
        global_claims: count(global_claims),
        global_oldest,
        host_last,
        disrupted: count(disrupted),
        ..Usage::default()
    }
}

/// [`Usage`] from [`USAGE_SUBJECT_SQL`](super::sql::USAGE_SUBJECT_SQL)'s
/// row.
pub(crate) fn usage_subject_from(
    (
        group_claims,
        group_oldest,
        global_claims,
        global_oldest,
        host_last,
        disrupted,
        zone_disrupted,
        requester_claims,
        requester_oldest,
    ): UsageSubjectRow,
) -> Usage {
    Usage {
        zone_disrupted: count(zone_disrupted),
        requester_claims: count(requester_claims),
        requester_oldest,
        ..usage_from((
            group_claims,
            group_oldest,
            global_claims,
            global_oldest,
            host_last,
            disrupted,
        ))
    }
}

/// The answer to a claim of a request whose latest attempt another call
/// holds until `until`.
fn in_flight(state: &ClaimState, until: i64, now: i64) -> Claim {
    Claim::InFlight {
        attempt: state.attempts,
        wait: Duration::from_millis(until.saturating_sub(now).unsigned_abs()),
    }
}

/// [`ClaimState::NEW`], for a claim that found no row to borrow.
static NEW_STATE: ClaimState = ClaimState::NEW;

/// The one place the claim rule lives; each store reads the row, the claim
/// of another request that holds the same host, if any
/// ([`Usage::host_held`], on every claim) and, when a counting guard is on,
/// the rest of the journal's [`Usage`]; calls this, and writes the result
/// in the same transaction.
///
/// A claim still held that `token`'s own call made (its answer was lost,
/// and the call is retried) is answered as it was, and nothing is written:
/// before the kill switch is read, as that claim was decided before any
/// pause that came since. Once its hold expired (the retries outlasted
/// it), the switch decides as for any claim; if it lets claims through,
/// the answer is the same and only the hold is renewed. A pause of the
/// request's group (`group_pause`, read in the same transaction as the
/// switch) defers it as the switch does, for that group only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide_claim(
    request: &RestartRequest,
    state: Option<ClaimState>,
    switch: &Switch,
    group_pause: Option<&GroupPause>,
    now: i64,
    terms: ClaimTerms,
    token: ClaimToken,
    usage: &Usage,
) -> (Claim, Option<ClaimWrite>) {
    // Read in place: the state is as large as a cache line or three, and
    // moving it out of the option was a copy per claim.
    let state = state.as_ref().unwrap_or(&NEW_STATE);
    // Before anything else, a final status included: another request's
    // record is neither joined nor answered for.
    if let Some(reason) = state
        .identity
        .as_ref()
        .and_then(|recorded| identity_conflict(recorded, request))
    {
        return (Claim::Conflict { reason }, None);
    }
    if state.status.is_final() {
        return (Claim::Final(state.status), None);
    }
    if state.token == Some(token) && state.claim_until.is_some_and(|until| now < until) {
        let claim = Claim::Claimed {
            attempt: state.attempts,
            unknown: state.unknown,
            leashed: switch.leashed(),
        };
        return (claim, None);
    }
    // After the answer to a claim made before the stop (its restart is
    // in flight), before anything else: a stopped campaign's target is
    // never claimed again. Another delivery waits for that attempt while
    // it is held: answered cancelled, its caller would record the request
    // cancelled, final, while the restart runs, and the restart's outcome
    // would find it so.
    if let Some(reason) = &state.cancelled {
        if let Some(until) = state.claim_until.filter(|until| now < *until) {
            return (in_flight(state, until, now), None);
        }
        let reason = reason.clone();
        return (Claim::Cancelled { reason }, None);
    }
    if switch.paused {
        let reason = switch.paused_reason();
        return (Claim::Paused { reason }, None);
    }
    if let Some(pause) = group_pause.filter(|pause| pause.group == request.group()) {
        let claim = Claim::Deferred {
            guard: "group pause",
            reason: pause.deferred_reason(),
            wait: GROUP_PAUSE_RECHECK,
        };
        return (claim, None);
    }
    let hold = i64::try_from(terms.hold.as_millis()).unwrap_or(i64::MAX);
    let unknown = match state.claim_until {
        Some(until) if now < until => return (in_flight(state, until, now), None),
        Some(_) if state.token == Some(token) => {
            // The caller's own claim, its answer lost and its hold run out
            // while it tried again: nothing was issued, and nobody claimed
            // since (the token would be theirs). The same attempt, held
            // anew; the journal keeps the row it has. Another request may
            // have claimed the host meanwhile: then not yet.
            if let Err(refusal) = host_busy(request, &terms, usage, now) {
                return (refusal, None);
            }
            let claim = Claim::Claimed {
                attempt: state.attempts,
                unknown: state.unknown,
                leashed: switch.leashed(),
            };
            let write = ClaimWrite {
                attempts: state.attempts,
                claim_until: now.saturating_add(hold),
                token,
                unknown: state.unknown,
                last_error: None,
                verdict: String::new(),
                renewal: true,
            };
            return (claim, Some(write));
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
    if let Err(refusal) = host_busy(request, &terms, usage, now) {
        return (refusal, None);
    }
    let subject = limits::Subject::of(request);
    let verdict = if terms.limits.is_active_for(subject) {
        let checked = limits::check(&terms.limits, subject, usage, now);
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
    let write = ClaimWrite {
        attempts: attempt,
        claim_until: now.saturating_add(hold),
        token,
        unknown,
        last_error: unknown.map(unknown_outcome),
        verdict,
        renewal: false,
    };
    let claim = Claim::Claimed {
        attempt,
        unknown,
        leashed: switch.leashed(),
    };
    (claim, Some(write))
}

/// The hosts held by claims (instance name → the claim), as an SQL store
/// read them at the start of its claims' transaction and keeps them as
/// its claims go: the latest hold of each host.
#[derive(Debug, Default)]
pub(crate) struct HeldHosts(std::collections::HashMap<String, limits::HostHold>);

impl HeldHosts {
    /// Adds a claim read from the journal (a row of
    /// [`HELD_HOSTS_SQL`](super::sql::HELD_HOSTS_SQL) or its SQLite twin).
    pub(crate) fn read(&mut self, instance: String, message_id: &str, until: i64) {
        // The store writes only ids it parsed.
        if let Ok(message_id) = uuid::Uuid::parse_str(message_id) {
            self.hold(instance, message_id, until);
        }
    }

    /// The claim that holds `instance`, if any.
    pub(crate) fn get(&self, instance: &str) -> Option<limits::HostHold> {
        self.0.get(instance).copied()
    }

    /// Notes a claim of `request` that `write` holds, made in this
    /// transaction: the next claim of its host finds it.
    pub(crate) fn claimed(&mut self, request: &RestartRequest, write: &ClaimWrite) {
        self.hold(
            request.machine().to_owned(),
            request.message_id,
            write.claim_until,
        );
    }

    fn hold(&mut self, instance: String, message_id: uuid::Uuid, until: i64) {
        let hold = limits::HostHold { message_id, until };
        let entry = self.0.entry(instance).or_insert(hold);
        if until >= entry.until {
            *entry = hold;
        }
    }
}

/// [`limits::check_host_busy`] for `request`, as the claim's refusal.
fn host_busy(
    request: &RestartRequest,
    terms: &ClaimTerms,
    usage: &Usage,
    now: i64,
) -> Result<(), Claim> {
    limits::check_host_busy(
        request.machine(),
        request.message_id,
        usage.host_held,
        terms.limits.budget_retry,
        now,
    )
    .map_err(|refusal| Claim::Deferred {
        guard: refusal.guard,
        reason: refusal.reason,
        wait: refusal.wait,
    })
}

/// The history's words for an attempt whose outcome was never recorded.
pub(crate) fn unknown_outcome(attempt: u32) -> String {
    format!(
        "restart attempt {attempt} was issued but its outcome was never recorded \
         (the handler stopped, panicked or lost its lease); counted as failed"
    )
}

/// A guard's verdict that held a request back, for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision<'a> {
    /// `deferred`, `denied`, `expired`, `dry-run`; `checked`: the stop
    /// conditions' results, which held nothing back.
    pub verdict: &'a str,
    /// Which guard (`calendar`, `rate limit`, `kill switch`, ...).
    pub guard: &'a str,
    /// In plain words.
    pub reason: &'a str,
}

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

/// A group pause from its stored columns.
pub(crate) fn group_pause_from(
    (group, by, reason, since): crate::store::sql::GroupPauseRow,
) -> GroupPause {
    GroupPause {
        group,
        by,
        reason,
        since: Timestamp::from_millis(since),
    }
}

/// The kill switch and the leash from their stored columns.
pub(crate) fn switch_from(
    (paused, by, reason, updated_at, leashed, leash_by, leash_reason, leash_at): super::sql::SwitchRow,
) -> Switch {
    Switch {
        paused,
        by,
        reason,
        since: (updated_at > 0).then(|| Timestamp::from_millis(updated_at)),
        leash: leashed.map(|leashed| LeashRecord {
            leashed,
            by: leash_by.unwrap_or_else(|| "someone".into()),
            reason: leash_reason.unwrap_or_else(|| "no reason given".into()),
            since: Timestamp::from_millis(leash_at),
        }),
    }
}
