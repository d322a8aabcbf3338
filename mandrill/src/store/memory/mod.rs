//! An in-process store, for tests with paused time and for the pipeline
//! benchmark. Nothing survives the process.
//!
//! Everything sits behind one lock: every call is a short critical section
//! that never awaits, and a claim reads the journal, decides and writes in
//! one step under it, as the SQL stores' claim transaction does. Each
//! request keeps its own attempts (its part of the restart journal, the SQL
//! stores' `restarts`); the counting guards read all of them.
//!
//! The store as a whole, the `Store` contract kept in memory, so one file
//! past 400 lines.

use std::collections::BTreeMap;
use std::collections::hash_map::Entry;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
// Maps hashed with foldhash, not SipHash: the requests' map is hit several
// times for every message, and its keys are random ids.
use foldhash::{HashMap, HashMapExt, HashSet};
use smallvec::SmallVec;
use uuid::Uuid;

use super::campaigns::CampaignRow;
use super::sql::NOT_ISSUED;
use super::{
    AttemptRecord, Campaign, Claim, ClaimState, ClaimTerms, ClaimToken, Decision, DecisionRecord,
    GroupPause, GroupUsage, HistoryEntry, Identity, Recorded, ReportAttempt, ReportData,
    ReportDecision, Store, StoreError, Story, Switch, SwitchExpected, Timestamp, UsageBinds,
    UsageStarts, claim_decision, decide_claim, group_usage_from, identity_conflict, same_request,
    usage_binds,
};
use crate::domain::{Asked, Outcome, RestartRequest, Status};
use crate::safety::limits::{HostHold, Subject, Usage};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct MemoryStore {
    /// A `std::sync::Mutex`, not tokio's: no critical section awaits, and
    /// none panics halfway through an update.
    state: Mutex<State>,
    /// Its notion of now.
    clock: Clock,
}

/// Everything the store records.
#[derive(Debug, Default)]
struct State {
    /// Boxed: the table's buckets (an eighth or more of them empty, all
    /// of them touched) stay 24 bytes, where a row inline made them 300 and
    /// the table most of the store's memory.
    requests: HashMap<Uuid, Box<Request>>,
    /// Rejected payloads, each with the id salvaged from it if any. Kept
    /// apart: a rejection never counts as the record of a request.
    rejected: Vec<(Option<Uuid>, Request)>,
    /// Each request's decisions, oldest first (what the SQL stores keep in
    /// `decisions`), whether or not it has a record of its own.
    decisions: HashMap<Uuid, Vec<DecisionRecord>>,
    /// Each request's deferrals, counted.
    deferrals: HashMap<Uuid, u32>,
    /// Instance name → the claim that holds it; removed when that claim's
    /// outcome is recorded or the claim given back, replaced by the next
    /// claim once its hold is over (a handler that died records nothing).
    held: HashMap<String, HostHold>,
    switch: Switch,
    group_pauses: Vec<GroupPause>,
    /// Campaigns by id, as the SQL stores' rows (times to the millisecond).
    campaigns: HashMap<Uuid, CampaignRow>,
    /// A stop's words on each target in flight when its campaign stopped.
    /// Apart from the rows: a field on every row cost 24 bytes per request
    /// held (14 MB for the benchmark's 300,000) for a rare mark.
    cancel_reasons: HashMap<Uuid, String>,
}

/// One request as recorded.
#[derive(Debug)]
struct Request {
    /// `None` for a rejected payload.
    hostname: Option<String>,
    /// A rejected payload's instance, if it named one (a request's is
    /// its hostname's first label).
    instance: Option<String>,
    requested_by: Option<String>,
    /// The verified signer; `None` unsigned (or unverified).
    requester: Option<String>,
    reason: Option<String>,
    status: Status,
    /// Attempts claimed so far.
    attempts: u32,
    /// When the hold of the last claim expires; none once its outcome is in.
    claim_until: Option<i64>,
    /// The token of the call that made the last claim.
    claim_token: Option<ClaimToken>,
    /// The earlier attempt the last claim counted as issued with its
    /// outcome unknown.
    unknown: Option<u32>,
    last_error: Option<String>,
    output: Option<String>,
    recovered_after: Option<Duration>,
    received_at: i64,
    updated_at: i64,
    completed_at: Option<i64>,
    /// Its claimed attempts, in claim order. A claim given back is removed,
    /// as the SQL stores delete its row.
    /// The first inline: the row is boxed already, and most requests are
    /// claimed once, so the journal costs no allocation of its own.
    journal: SmallVec<[Attempt; 1]>,
}

/// One claimed attempt: a row of the restart journal.
#[derive(Debug)]
struct Attempt {
    attempt: u32,
    instance: String,
    group: String,
    zone: Option<String>,
    requester: Option<String>,
    claimed_at: i64,
    /// What the counting guards said.
    verdict: String,
    outcome: Option<Status>,
    settled_at: Option<i64>,
}

impl Attempt {
    /// A claim of `request`'s machine, its number, time and verdict still
    /// to be set.
    fn claimed(request: &RestartRequest) -> Self {
        Self {
            attempt: 0,
            instance: request.machine().to_owned(),
            group: request.group().to_owned(),
            zone: request.zone.clone(),
            requester: request.requester.clone(),
            claimed_at: 0,
            verdict: String::new(),
            outcome: None,
            settled_at: None,
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// An empty store whose clock reads `wall` (milliseconds since the
    /// epoch) now and advances with tokio's: tests whose guards' clock
    /// follows tokio from a fixed instant read the same time here.
    #[cfg(test)]
    pub(crate) fn with_clock_at(wall: i64) -> Self {
        Self {
            clock: Clock::at(wall),
            ..Self::default()
        }
    }

    #[cfg(feature = "bench")]
    /// An empty store with room for `requests` requests before it grows
    /// (growing copies every request recorded so far).
    pub(crate) fn with_capacity(requests: usize) -> Self {
        let state = State {
            requests: HashMap::with_capacity(requests),
            ..State::default()
        };
        Self {
            state: Mutex::new(state),
            clock: Clock::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Poisoned only by a panic under the lock, and no critical section
        // here panics.
        self.state.lock().expect("memory store poisoned")
    }

    /// Every entry recorded with a message id.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<HistoryEntry> {
        self.lock()
            .requests
            .iter()
            .map(|(id, request)| request.entry(Some(*id)))
            .collect()
    }
}

impl Request {
    /// The instance a request's hostname names.
    fn instance_of_host(&self) -> Option<&str> {
        self.hostname
            .as_deref()
            .and_then(|host| host.split('.').next())
    }

    /// Who asked and for what, as recorded.
    fn identity(&self) -> Identity {
        Identity {
            instance: self.instance_of_host().unwrap_or_default().to_owned(),
            requested_by: self.requested_by.clone(),
            requester: self.requester.clone(),
            reason: self.reason.clone(),
        }
    }

    /// The conflict, if `request` is not the request this row records
    /// ([`identity_conflict`]).
    fn conflict(&self, request: &RestartRequest) -> Option<String> {
        let same = same_request(
            self.instance_of_host().unwrap_or_default(),
            self.requested_by.as_deref(),
            self.requester.as_deref(),
            self.reason.as_deref(),
            request,
        );
        // The recorded identity is copied only to word a conflict (rare).
        (!same)
            .then(|| identity_conflict(&self.identity(), request))
            .flatten()
    }

    /// A request received at `now`, not yet claimed.
    fn received(request: &RestartRequest, now: i64) -> Self {
        Self {
            hostname: Some(request.hostname.as_str().to_owned()),
            requested_by: request.requested_by.clone(),
            requester: request.requester.clone(),
            reason: request.reason.clone(),
            ..Self::empty(now)
        }
    }

    /// A row received at `now` that says nothing yet.
    fn empty(now: i64) -> Self {
        Self {
            hostname: None,
            instance: None,
            requested_by: None,
            requester: None,
            reason: None,
            status: Status::Received,
            attempts: 0,
            claim_until: None,
            claim_token: None,
            unknown: None,
            last_error: None,
            output: None,
            recovered_after: None,
            received_at: now,
            updated_at: now,
            completed_at: None,
            journal: SmallVec::new(),
        }
    }

    fn entry(&self, message_id: Option<Uuid>) -> HistoryEntry {
        HistoryEntry {
            message_id,
            instance_name: self
                .instance
                .clone()
                .or_else(|| self.instance_of_host().map(str::to_owned)),
            hostname: self.hostname.clone(),
            status: self.status,
            attempts: super::history::attempts_made(self.status, self.attempts),
            requested_by: self.requested_by.clone(),
            verified: self.requester.is_some(),
            reason: self.reason.clone(),
            last_error: self.last_error.clone(),
            output: self.output.clone(),
            recovered_after: self.recovered_after,
            received_at: Timestamp::from_millis(self.received_at),
            updated_at: Timestamp::from_millis(self.updated_at),
            completed_at: self.completed_at.map(Timestamp::from_millis),
        }
    }
}

impl State {
    /// Every attempt in the journal.
    fn journal(&self) -> impl Iterator<Item = (&Uuid, &Request, &Attempt)> {
        self.requests.iter().flat_map(|(id, request)| {
            request
                .journal
                .iter()
                .map(move |attempt| (id, &**request, attempt))
        })
    }

    /// The instances whose latest issued claims (every one claimed at its
    /// host's latest time of an issued claim, as [`super::USAGE_SQL`] reads
    /// them) `counts`, among those claimed after `since`, each with the
    /// claim that counted. A dry run, a denial or an expiry issued nothing
    /// and never hides an earlier restart.
    fn latest_counted(&self, since: i64, counts: impl Fn(&Attempt) -> bool) -> Vec<&Attempt> {
        let mut latest: HashMap<&str, i64> = HashMap::new();
        for (_, _, attempt) in self.journal().filter(|(_, _, a)| issued(a.outcome)) {
            let at = latest
                .entry(&attempt.instance)
                .or_insert(attempt.claimed_at);
            *at = (*at).max(attempt.claimed_at);
        }
        self.journal()
            .map(|(_, _, attempt)| attempt)
            .filter(|attempt| {
                attempt.claimed_at > since
                    && latest.get(attempt.instance.as_str()) == Some(&attempt.claimed_at)
                    && counts(attempt)
            })
            .collect()
    }

    /// What [`super::USAGE_SQL`] (and `USAGE_SUBJECT_SQL`) read for a claim
    /// of `request` at `now`.
    fn usage(&self, request: &RestartRequest, terms: &ClaimTerms, now: i64) -> Usage {
        let UsageBinds {
            window_start,
            memory_start,
            settled_after,
            requester_start,
        } = usage_binds(&terms.limits, now);
        let group = request.group();
        let instance = request.machine();
        // Only what the limits use, as the SQL stores read it.
        let subject = Subject::of(request);
        let zone = subject.zone.filter(|_| terms.limits.counts_zone(subject));
        let requester = subject
            .requester
            .filter(|_| terms.limits.counts_requester(subject));
        let oldest = |oldest: Option<i64>, at: i64| Some(oldest.map_or(at, |o| o.min(at)));
        let mut usage = Usage::default();
        for (_, _, attempt) in self.journal().filter(|(_, _, a)| issued(a.outcome)) {
            let at = attempt.claimed_at;
            if at > window_start {
                usage.global_claims += 1;
                usage.global_oldest = oldest(usage.global_oldest, at);
                if attempt.group == group {
                    usage.group_claims += 1;
                    usage.group_oldest = oldest(usage.group_oldest, at);
                }
            }
            // Every claim of the host, even one stamped after `now` (see
            // `USAGE_SQL`).
            if attempt.instance == instance {
                usage.host_last = usage.host_last.max(Some(at));
            }
            if requester.is_some()
                && at > requester_start
                && attempt.requester.as_deref() == requester
            {
                usage.requester_claims += 1;
                usage.requester_oldest = oldest(usage.requester_oldest, at);
            }
        }
        let disrupting = self.latest_counted(memory_start, |attempt| {
            attempt.instance != instance && is_disrupting(attempt, settled_after)
        });
        let hosts = |matches: &dyn Fn(&Attempt) -> bool| {
            let hosts: HashSet<&str> = disrupting
                .iter()
                .filter(|attempt| matches(attempt))
                .map(|attempt| attempt.instance.as_str())
                .collect();
            u32::try_from(hosts.len()).unwrap_or(u32::MAX)
        };
        usage.disrupted = hosts(&|attempt| attempt.group == group);
        if zone.is_some() {
            usage.zone_disrupted = hosts(&|attempt| attempt.zone.as_deref() == zone);
        }
        usage
    }

    /// Records a guard's verdict on `message_id`, counting a deferral; a
    /// verdict the same as the last one is not repeated.
    fn decide(&mut self, message_id: Uuid, attempt: u32, decision: Decision<'_>, now: i64) {
        if decision.verdict == "deferred" {
            *self.deferrals.entry(message_id).or_default() += 1;
        }
        let list = self.decisions.entry(message_id).or_default();
        let repeat = list.last().is_some_and(|last| {
            last.verdict == decision.verdict
                && last.guard == decision.guard
                && last.reason == decision.reason
        });
        if !repeat && list.len() < 100 {
            list.push(DecisionRecord {
                at: Timestamp::from_millis(now),
                attempt,
                verdict: decision.verdict.to_owned(),
                guard: decision.guard.to_owned(),
                reason: decision.reason.to_owned(),
            });
        }
    }

    /// Lifts `request`'s hold of its host, if it still has it (a claim of
    /// another request may have replaced it once its hold was over).
    fn unhold(&mut self, request: &RestartRequest) {
        let instance = request.machine();
        if self
            .held
            .get(instance)
            .is_some_and(|hold| hold.message_id == request.message_id)
        {
            self.held.remove(instance);
        }
    }

    fn set_switch(&mut self, paused: bool, by: &str, reason: &str, now: i64) {
        self.switch = Switch {
            paused,
            by: Some(by.to_owned()),
            reason: Some(reason.to_owned()),
            since: Some(Timestamp::from_millis(now)),
            leash: self.switch.leash.take(),
        };
    }
}

/// Whether an attempt that ended so issued a restart (or may have): the
/// in-memory form of the rule in [`super::USAGE_SQL`].
fn issued(outcome: Option<Status>) -> bool {
    !outcome.is_some_and(|status| NOT_ISSUED.contains(&status))
}

/// Whether a host whose latest attempt is `attempt` still counts as
/// disrupted: in flight or ended without a verified recovery, or ended
/// `restarted` after `settled_after` (see [`UsageBinds`]). The in-memory
/// form of the rule in [`super::USAGE_SQL`].
fn is_disrupting(attempt: &Attempt, settled_after: i64) -> bool {
    match attempt.outcome {
        Some(Status::Restarted) => attempt.settled_at.is_some_and(|at| at > settled_after),
        outcome => issued(outcome),
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        Ok(self
            .lock()
            .requests
            .get(&message_id)
            .map(|request| request.status))
    }

    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        let id = request.message_id;
        let instance = request.machine();
        // Every handler takes this one lock twice per message: what a first
        // claim writes is allocated before it is taken, so that the critical
        // section is a probe and some stores (another thread's claim waited
        // for the allocator, and slept on the lock, when it was built
        // inside). Unused (a refusal, a row already there) it is dropped
        // after the lock is released.
        let mut fresh = Some(Box::new(Request::received(request, 0)));
        let claimed = Attempt::claimed(request);
        let held_key = instance.to_owned();
        let mut state = self.lock();
        let state = &mut *state;
        // Read with the lock held, as the SQL stores read theirs once their
        // locks are held: the stamp is never earlier than the claim takes
        // effect.
        let now = self.clock.now();
        let mut usage = if terms.limits.is_active_for(Subject::of(request)) {
            state.usage(request, &terms, now)
        } else {
            Usage::default()
        };
        usage.host_held = state.held.get(instance).copied();
        let group_pause = state
            .group_pauses
            .iter()
            .find(|pause| pause.group == request.group());
        let cancelled = state.cancel_reasons.get(&id).cloned();
        // One probe of the table. The recorded identity is copied only when
        // it is not this request's (decide_claim words the conflict); a row
        // created here is this request's.
        let (row, recorded) = match state.requests.entry(id) {
            Entry::Occupied(row) => {
                let row = row.into_mut();
                let recorded = row.conflict(request).is_some().then(|| row.identity());
                (row, recorded)
            }
            Entry::Vacant(vacant) => {
                let mut row = fresh.take().expect("taken only here");
                row.received_at = now;
                row.updated_at = now;
                (vacant.insert(row), None)
            }
        };
        let found = ClaimState {
            status: row.status,
            attempts: row.attempts,
            claim_until: row.claim_until,
            token: row.claim_token,
            unknown: row.unknown,
            identity: recorded,
            cancelled,
        };
        let (claim, write) = decide_claim(
            request,
            Some(found),
            &state.switch,
            group_pause,
            now,
            terms,
            token,
            &usage,
        );
        let Some(write) = write else {
            // Recorded under the same lock, as the SQL stores record a
            // refusal in the claim's transaction.
            if let Some(decision) = claim_decision(&claim) {
                state.decide(id, 0, decision, now);
            }
            return Ok(claim);
        };
        let hold = HostHold {
            message_id: id,
            until: write.claim_until,
        };
        match state.held.get_mut(instance) {
            Some(held) => *held = hold,
            None => {
                state.held.insert(held_key, hold);
            }
        }
        row.status = Status::Received;
        row.attempts = write.attempts;
        row.claim_until = Some(write.claim_until);
        row.claim_token = Some(write.token);
        row.unknown = write.unknown;
        if let Some(error) = write.last_error {
            row.last_error = Some(error);
        }
        row.updated_at = now;
        // A renewal keeps the journal's row of the claim it renews.
        if !write.renewal {
            row.journal.push(Attempt {
                attempt: write.attempts,
                claimed_at: now,
                verdict: write.verdict,
                ..claimed
            });
        }
        Ok(claim)
    }

    async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
        token: ClaimToken,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        if let Some(row) = state.requests.get_mut(&request.message_id)
            && !row.status.is_final()
            && row.attempts == attempt
            && attempt > 0
            && row.claim_until.is_some()
            && row.claim_token == Some(token)
        {
            row.attempts -= 1;
            row.claim_until = None;
            row.updated_at = now;
            row.journal
                .retain(|claimed| claimed.attempt != attempt || claimed.outcome.is_some());
            state.unhold(request);
        }
        Ok(())
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        // Copied before the lock is taken, as a claim's row is.
        let last_error = outcome.error().map(str::to_owned);
        let output = outcome.output().map(str::to_owned);
        let now = self.clock.now();
        let mut state = self.lock();
        let row = state
            .requests
            .entry(request.message_id)
            .or_insert_with(|| Box::new(Request::received(request, now)));
        if let Some(conflict) = row.conflict(request) {
            return Ok(Recorded::Conflict(conflict));
        }
        if row.status.is_final() {
            return Ok(Recorded::AlreadyFinal(row.status));
        }
        let status = outcome.status();
        let latest = attempt >= row.attempts;
        row.status = status;
        row.attempts = row.attempts.max(attempt);
        if latest {
            row.claim_until = None;
        }
        row.last_error = last_error;
        row.output = output;
        row.recovered_after = outcome.recovered_after();
        row.updated_at = now;
        row.completed_at = status.is_final().then_some(now);
        if let Some(settled) = row
            .journal
            .iter_mut()
            .rev()
            .find(|claimed| claimed.attempt == attempt && claimed.outcome.is_none())
        {
            settled.outcome = Some(status);
            settled.settled_at = Some(now);
        }
        if latest {
            state.unhold(request);
        }
        Ok(Recorded::Recorded)
    }

    async fn record_rejection(
        &self,
        asked: &Asked,
        reason: &str,
        _payload: &[u8],
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let message_id = asked.message_id;
        let rejected = Request {
            instance: asked.instance_name.clone(),
            requested_by: asked.requested_by.clone(),
            requester: asked.requester.clone(),
            reason: asked.reason.clone(),
            status: Status::Rejected,
            attempts: 1,
            last_error: Some(reason.to_owned()),
            completed_at: Some(now),
            ..Request::empty(now)
        };
        self.lock().rejected.push((message_id, rejected));
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let state = self.lock();
        let recorded = state.requests.iter().map(|(id, row)| row.entry(Some(*id)));
        let rejected = state.rejected.iter().map(|(id, row)| row.entry(*id));
        let mut entries: Vec<HistoryEntry> = recorded.chain(rejected).collect();
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.updated_at));
        entries.truncate(limit);
        Ok(entries)
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<Recorded, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        // The row too, as the SQL stores create it: who asked is bound
        // from the first record.
        let row = state
            .requests
            .entry(request.message_id)
            .or_insert_with(|| Box::new(Request::received(request, now)));
        if let Some(conflict) = row.conflict(request) {
            return Ok(Recorded::Conflict(conflict));
        }
        state.decide(request.message_id, attempt, decision, now);
        Ok(Recorded::Recorded)
    }

    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        let state = self.lock();
        let row = state.requests.get(&message_id);
        // Else the latest rejected payload that gave this id.
        let entry = row.map(|row| row.entry(Some(message_id))).or_else(|| {
            state
                .rejected
                .iter()
                .rev()
                .find(|(id, _)| *id == Some(message_id))
                .map(|(id, row)| row.entry(*id))
        });
        let mut attempts: Vec<AttemptRecord> = row
            .into_iter()
            .flat_map(|row| &row.journal)
            .map(|claimed| AttemptRecord {
                attempt: claimed.attempt,
                group: claimed.group.clone(),
                claimed_at: Timestamp::from_millis(claimed.claimed_at),
                verdict: claimed.verdict.clone(),
                outcome: claimed.outcome,
                settled_at: claimed.settled_at.map(Timestamp::from_millis),
                requester: claimed.requester.clone(),
            })
            .collect();
        attempts.sort_by_key(|attempt| attempt.attempt);
        let decisions = state
            .decisions
            .get(&message_id)
            .cloned()
            .unwrap_or_default();
        Ok(super::history::story_of(
            message_id, entry, attempts, decisions,
        ))
    }

    async fn group_usage(
        &self,
        starts: UsageStarts,
    ) -> Result<BTreeMap<String, GroupUsage>, StoreError> {
        let state = self.lock();
        let mut restarts: HashMap<&str, i64> = HashMap::new();
        for (_, _, attempt) in state.journal() {
            if attempt.claimed_at > starts.window.as_millis() && issued(attempt.outcome) {
                *restarts.entry(attempt.group.as_str()).or_default() += 1;
            }
        }
        let settled_after = starts.settled_after.as_millis();
        let disrupting = state.latest_counted(starts.memory.as_millis(), |attempt| {
            is_disrupting(attempt, settled_after)
        });
        let hosts: HashSet<(&str, &str)> = disrupting
            .iter()
            .map(|attempt| (attempt.group.as_str(), attempt.instance.as_str()))
            .collect();
        let mut disrupted: HashMap<&str, i64> = HashMap::new();
        for (group, _) in hosts {
            *disrupted.entry(group).or_default() += 1;
        }
        let owned = |counts: HashMap<&str, i64>| {
            counts
                .into_iter()
                .map(|(group, n)| (group.to_owned(), n))
                .collect()
        };
        Ok(group_usage_from(owned(restarts), owned(disrupted)))
    }

    async fn report(&self, since: Timestamp) -> Result<ReportData, StoreError> {
        let since = since.as_millis();
        let state = self.lock();
        let mut attempts: Vec<ReportAttempt> = state
            .journal()
            .filter(|(_, _, attempt)| attempt.claimed_at >= since)
            .map(|(id, row, attempt)| {
                // The request's recovery and last error are its latest
                // attempt's.
                let latest = row.attempts == attempt.attempt;
                ReportAttempt {
                    message_id: *id,
                    attempt: attempt.attempt,
                    // The instance asked for; the journal knows its machine.
                    instance_name: row
                        .hostname
                        .as_deref()
                        .and_then(|host| host.split('.').next())
                        .map_or_else(|| attempt.instance.clone(), str::to_owned),
                    group: attempt.group.clone(),
                    requester: attempt
                        .requester
                        .clone()
                        .or_else(|| row.requested_by.clone()),
                    claimed_at: Timestamp::from_millis(attempt.claimed_at),
                    outcome: attempt.outcome,
                    settled_at: attempt.settled_at.map(Timestamp::from_millis),
                    recovered_after: row.recovered_after.filter(|_| latest),
                    last_error: row.last_error.clone().filter(|_| latest),
                    lost: attempt.outcome.is_none() && (!latest || row.completed_at.is_some()),
                }
            })
            .collect();
        attempts.sort_by_key(|a| (a.claimed_at, a.message_id, a.attempt));
        let mut decisions = Vec::new();
        for (id, list) in &state.decisions {
            let row = state.requests.get(id);
            let entry = row.map(|row| row.entry(Some(*id)));
            let group = row
                .and_then(|row| row.journal.iter().max_by_key(|a| a.attempt))
                .map(|attempt| attempt.group.clone());
            for decision in list.iter().filter(|d| d.at.as_millis() >= since) {
                decisions.push(ReportDecision {
                    message_id: *id,
                    at: decision.at,
                    verdict: decision.verdict.clone(),
                    guard: decision.guard.clone(),
                    reason: decision.reason.clone(),
                    instance_name: entry.as_ref().and_then(|e| e.instance_name.clone()),
                    group: group.clone(),
                    requested_by: entry.as_ref().and_then(HistoryEntry::requested_by_shown),
                });
            }
        }
        // Recorded in order per request; across requests, by time (the
        // SQL stores' insertion order breaks ties there, the id here).
        decisions.sort_by_key(|d| (d.at, d.message_id));
        let campaigns = campaigns_since(&state.campaigns, since)?;
        Ok(ReportData {
            attempts,
            decisions,
            campaigns,
        })
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        Ok(self.lock().deferrals.get(&message_id).copied().unwrap_or(0))
    }

    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let row = state
            .requests
            .entry(request.message_id)
            .or_insert_with(|| Box::new(Request::received(request, now)));
        Ok(Timestamp::from_millis(row.received_at))
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        Ok(self.lock().switch.clone())
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        let now = self.clock.now();
        self.lock().set_switch(paused, by, reason, now);
        Ok(())
    }

    async fn set_leash(&self, leashed: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        let since = Timestamp::from_millis(self.clock.now());
        self.lock().switch.leash = Some(crate::safety::LeashRecord {
            leashed,
            by: by.to_owned(),
            reason: reason.to_owned(),
            since,
        });
        Ok(())
    }

    async fn set_switch_if(
        &self,
        expected: SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let switch = &state.switch;
        let found = match expected {
            SwitchExpected::Running => !switch.paused,
            SwitchExpected::PausedBy(name) => switch.paused && switch.by.as_deref() == Some(name),
        };
        if found {
            state.set_switch(paused, by, reason, now);
        }
        Ok(found)
    }

    async fn group_pauses(&self) -> Result<Vec<GroupPause>, StoreError> {
        let mut pauses = self.lock().group_pauses.clone();
        pauses.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(pauses)
    }

    async fn set_group_pause(
        &self,
        group: &str,
        pause: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let pauses = &mut state.group_pauses;
        let found = pauses.iter().position(|paused| paused.group == group);
        Ok(match (pause, found) {
            (Some((by, reason)), None) => {
                pauses.push(GroupPause {
                    group: group.to_owned(),
                    by: by.to_owned(),
                    reason: reason.to_owned(),
                    since: Timestamp::from_millis(now),
                });
                true
            }
            (None, Some(at)) => {
                pauses.swap_remove(at);
                true
            }
            _ => false,
        })
    }

    async fn recent_recoveries(
        &self,
        group: &str,
        limit: u32,
    ) -> Result<Vec<Option<Duration>>, StoreError> {
        let state = self.lock();
        // As `RECOVERIES_SQL`: the verified restarts, each one's recovery
        // time from its request's row (`None`: unrecovered).
        let mut found: Vec<(i64, Option<Duration>)> = state
            .journal()
            .filter(|(_, _, attempt)| attempt.group == group)
            .filter_map(|(_, row, attempt)| match attempt.outcome {
                Some(Status::Unrecovered) => Some((attempt.claimed_at, None)),
                Some(Status::Restarted) => Some((attempt.claimed_at, Some(row.recovered_after?))),
                _ => None,
            })
            .collect();
        found.sort_by_key(|(claimed_at, _)| std::cmp::Reverse(*claimed_at));
        Ok(found
            .into_iter()
            .take(limit as usize)
            .map(|(_, after)| after)
            .collect())
    }

    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        let before = before.as_millis();
        let budget = u64::from(max_rows);
        let mut removed = 0;
        let mut keep = |row: &Request| {
            let old = row.completed_at.is_some_and(|at| at < before);
            if old && removed < budget {
                removed += 1;
                false
            } else {
                true
            }
        };
        let mut state = self.lock();
        let state = &mut *state;
        state.rejected.retain(|(_, row)| keep(row));
        let mut gone = Vec::new();
        state.requests.retain(|id, row| {
            keep(row) || {
                gone.push(*id);
                false
            }
        });
        // As the SQL stores: the counting guards look back far less.
        for row in state.requests.values_mut() {
            row.journal.retain(|attempt| attempt.claimed_at >= before);
        }
        for id in &gone {
            state.decisions.remove(id);
            state.deferrals.remove(id);
            state.cancel_reasons.remove(id);
        }
        Ok(removed)
    }

    async fn record_campaign(&self, campaign: &Campaign) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.campaigns.contains_key(&campaign.id) {
            return Err(StoreError::Corrupt(format!(
                "campaign {} is recorded already",
                campaign.id
            )));
        }
        state.campaigns.insert(campaign.id, campaign.to_row());
        Ok(())
    }

    async fn decisions(&self, message_id: Uuid) -> Result<Vec<DecisionRecord>, StoreError> {
        Ok(self
            .lock()
            .decisions
            .get(&message_id)
            .cloned()
            .unwrap_or_default())
    }

    async fn campaign(&self, id: Uuid) -> Result<Option<Campaign>, StoreError> {
        let row = self.lock().campaigns.get(&id).cloned();
        row.map(Campaign::from_row).transpose()
    }

    async fn usage(
        &self,
        request: &RestartRequest,
        limits: &crate::safety::Limits,
    ) -> Result<Usage, StoreError> {
        let terms = ClaimTerms {
            max_attempts: 1,
            hold: Duration::ZERO,
            limits: *limits,
        };
        let now = self.clock.now();
        Ok(self.lock().usage(request, &terms, now))
    }

    async fn stop_campaign(
        &self,
        id: Uuid,
        by: &str,
        reason: &str,
    ) -> Result<Option<(Campaign, Vec<Uuid>)>, StoreError> {
        let now = self.clock.now();
        // Under the one lock, as a claim decides: a claim after this finds
        // the cancelled targets final.
        let mut state = self.lock();
        let state = &mut *state;
        let Some(row) = state.campaigns.get_mut(&id) else {
            return Ok(None);
        };
        if row.5.is_none() {
            (row.5, row.6, row.7) = (Some(now), Some(by.to_owned()), Some(reason.to_owned()));
        }
        let campaign = Campaign::from_row(row.clone())?;
        let Some(stop) = &campaign.stopped else {
            return Err(StoreError::Corrupt(format!(
                "campaign {id} was not stopped"
            )));
        };
        let words = super::campaigns::cancellation(id, stop);
        let mut cancelled = Vec::new();
        for (index, target) in campaign.targets.iter().enumerate() {
            let row = state.requests.entry(target.message_id).or_insert_with(|| {
                let identity = super::campaigns::target_identity(&campaign, index);
                Box::new(Request {
                    // Its instance is its hostname's first label here.
                    hostname: Some(identity.instance),
                    requested_by: identity.requested_by,
                    requester: identity.requester,
                    reason: identity.reason,
                    ..Request::empty(now)
                })
            });
            // Final, or another request's that took the target's id first.
            if row.status.is_final()
                || row.identity() != super::campaigns::target_identity(&campaign, index)
            {
                continue;
            }
            state
                .cancel_reasons
                .insert(target.message_id, words.clone());
            if row.claim_until.is_some_and(|until| until > now) {
                continue;
            }
            row.status = Status::Cancelled;
            row.last_error = Some(words.clone());
            row.updated_at = now;
            row.completed_at = Some(now);
            cancelled.push(target.message_id);
        }
        Ok(Some((campaign, cancelled)))
    }

    async fn campaigns_since(&self, since: Timestamp) -> Result<Vec<Campaign>, StoreError> {
        campaigns_since(&self.lock().campaigns, since.as_millis())
    }
}

/// The campaigns started at or after `since` (milliseconds), oldest first,
/// as [`super::campaigns::CAMPAIGNS_SINCE_SQL`] orders them.
fn campaigns_since(
    campaigns: &HashMap<Uuid, CampaignRow>,
    since: i64,
) -> Result<Vec<Campaign>, StoreError> {
    let mut found = campaigns
        .values()
        .filter(|row| row.2 >= since)
        .cloned()
        .map(Campaign::from_row)
        .collect::<Result<Vec<_>, _>>()?;
    found.sort_by_key(|c| (c.created_at, c.id));
    Ok(found)
}

/// The wall clock at creation, advanced by tokio's clock: the same as the
/// wall clock in a running service, and paused with the rest of a test that
/// pauses time, so that claim holds expire in step with leases there.
#[derive(Debug)]
struct Clock {
    wall_at_start: i64,
    start: tokio::time::Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            wall_at_start: Timestamp::now().as_millis(),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock {
    /// Reads `wall` now, then advances with tokio's clock.
    #[cfg(test)]
    fn at(wall: i64) -> Self {
        Self {
            wall_at_start: wall,
            start: tokio::time::Instant::now(),
        }
    }

    fn now(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.wall_at_start.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests;
