//! The memory store's calls on every message (lookup, claim, release,
//! outcome), as inherent `async fn`s: the worker calls them through
//! [`crate::store::AnyStore`] without boxing a future, and the `Store` impl
//! delegates to them.

use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::journal::{self, JournalRow};
use super::row::{Extra, Millis, Row};
use super::{MemoryStore, Shard};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::safety::limits::Usage;
use crate::store::{
    Claim, ClaimState, ClaimTerms, ClaimToken, GroupPause, Recorded, StoreError, Switch,
    claim_decision, decide_claim,
};

/// The switch as a claim sees it while restarts are not paused: only
/// `paused` is read then, so no lock and no clone of the real one.
static NOT_PAUSED: Switch = Switch {
    paused: false,
    by: None,
    reason: None,
    since: None,
};

impl MemoryStore {
    /// As [`crate::store::Store::lookup`], unboxed.
    pub async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        Ok(self
            .shard(&message_id)
            .rows
            .get(&message_id)
            .map(|row| row.status))
    }

    /// As [`crate::store::Store::claim_restart`], unboxed.
    pub async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        self.claim(request, &terms, token)
    }

    /// As [`Self::claim_restart`], with the terms borrowed, and at once:
    /// it never waits, so [`crate::store::AnyStore::claim_restart`] holds no
    /// future of it (nor its arguments) in every handler waiting on a claim.
    pub(crate) fn claim(
        &self,
        request: &RestartRequest,
        terms: &ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        let terms = *terms;
        let now = self.clock.now();
        // The flag is written under the switch's lock before `set_switch`
        // returns, so a claim that starts after it sees the pause. Only a
        // paused switch is cloned (its words go into the refusal).
        let paused;
        let switch = if self.paused.load(Ordering::Acquire) {
            paused = self.switch.lock().expect("memory store poisoned").clone();
            &paused
        } else {
            &NOT_PAUSED
        };
        let group_pause = if self.groups_paused.load(Ordering::Acquire) {
            self.group_pauses
                .lock()
                .expect("memory store poisoned")
                .iter()
                .find(|pause| pause.group == request.group())
                .cloned()
        } else {
            None
        };
        let group_pause = group_pause.as_ref();
        let id = request.message_id;
        // With counting guards, every shard is held from their read of the
        // journal to the claim's write, so that they count atomically;
        // without them, the decision reads no journal, and the request's
        // shard alone keeps its row and its attempts consistent.
        // A refusal's decision is recorded while the shard is still held, as
        // the SQL stores record it in the claim's transaction.
        let decided = |(claim, refused): (Claim, bool), now: i64| {
            if refused && let Some(decision) = claim_decision(&claim) {
                self.decisions().decide(id, 0, decision, now);
            }
            claim
        };
        let instance = request.instance_name.as_str();
        let claim = if terms
            .limits
            .is_active_for(crate::safety::limits::Subject::of(request))
        {
            let mut shards = self.all_shards();
            // Read with every shard held, as the SQL stores read theirs
            // once their locks are held: the stamp is never earlier than
            // the claim takes effect.
            let now = self.clock.now();
            let usage = journal::usage(
                shards.iter().map(|shard| &shard.attempts),
                request,
                &terms,
                now,
            );
            let shard = &mut shards[Self::shard_of(&id)];
            let mut held = self.held(instance);
            let decision = claim_in(
                shard,
                request,
                &terms,
                token,
                (switch, group_pause),
                now,
                usage,
                &mut held,
            );
            drop(held);
            decided(decision, now)
        } else {
            let mut shard = self.shard(&id);
            let mut held = self.held(instance);
            let decision = claim_in(
                &mut shard,
                request,
                &terms,
                token,
                (switch, group_pause),
                now,
                Usage::default(),
                &mut held,
            );
            drop(held);
            decided(decision, now)
        };
        Ok(claim)
    }

    /// As [`crate::store::Store::release_claim`], unboxed.
    pub async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut shard = self.shard(&request.message_id);
        let Shard { rows, attempts } = &mut *shard;
        if let Some(row) = rows.get_mut(&request.message_id)
            && !row.status.is_final()
            && row.attempts == attempt
            && attempt > 0
            && row.claim_until.get().is_some()
        {
            row.attempts -= 1;
            row.claim_until = Millis::NONE;
            row.updated_at = now;
            attempts.release(row.latest, attempt);
            self.unhold(request);
        }
        Ok(())
    }

    /// Lifts `request`'s hold of its host, if it still has it (a claim of
    /// another request may have replaced it once its hold was over).
    fn unhold(&self, request: &RestartRequest) {
        let instance = request.instance_name.as_str();
        let mut held = self.held(instance);
        if held
            .get(instance)
            .is_some_and(|hold| hold.message_id == request.message_id)
        {
            held.remove(instance);
        }
    }

    /// As [`crate::store::Store::record_outcome`], unboxed.
    pub async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let now = self.clock.now();
        let mut shard = self.shard(&request.message_id);
        let Shard { rows, attempts } = &mut *shard;
        let row = rows
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        if row.status.is_final() {
            return Ok(Recorded::AlreadyFinal(row.status));
        }
        row.status = outcome.status();
        if attempt >= row.attempts {
            row.claim_until = Millis::NONE;
            self.unhold(request);
        }
        row.attempts = row.attempts.max(attempt);
        let last_error = outcome.error().map(Box::from);
        let has_extra = request.requested_by.is_some()
            || request.reason.is_some()
            || outcome.output().is_some()
            || outcome.recovered_after().is_some();
        if has_extra {
            row.extra = Some(Box::new(Extra {
                last_error,
                requested_by: request.requested_by.as_deref().map(Box::from),
                reason: request.reason.as_deref().map(Box::from),
                output: outcome.output().map(Box::from),
                recovered_after: outcome.recovered_after(),
            }));
        } else {
            row.set_last_error(last_error);
        }
        row.updated_at = now;
        row.completed_at = outcome.status().is_final().then_some(now).into();
        if let Some(attempt) = attempts
            .find_mut(row.latest, attempt)
            .filter(|attempt| attempt.outcome.is_none())
        {
            attempt.outcome = Some(outcome.status());
            attempt.settled_at = Some(now).into();
        }
        Ok(Recorded::Recorded)
    }
}

/// The claim's decision and write in the request's shard, given what the
/// counting guards read and the hosts held (`held`, its host's shard,
/// which a claim that holds the host updates); says whether the caller must
/// record a decision (the claim refused, no attempt written).
#[allow(clippy::too_many_arguments)]
fn claim_in(
    shard: &mut Shard,
    request: &RestartRequest,
    terms: &ClaimTerms,
    token: ClaimToken,
    (switch, group_pause): (&Switch, Option<&GroupPause>),
    now: i64,
    mut usage: Usage,
    held: &mut super::HeldHosts,
) -> (Claim, bool) {
    let instance = request.instance_name.as_str();
    usage.host_held = held.get(instance).copied();
    let Shard { rows, attempts } = shard;
    let row = rows
        .entry(request.message_id)
        .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
    let claim_until = row.claim_until.get();
    // The claim's token is kept in its journal entry, not in the row (which
    // stays compact): looked up only while a claim's outcome is not in,
    // which a new request's claim never meets.
    let (token_held, unknown) = match claim_until {
        Some(_) => attempts
            .find_mut(row.latest, row.attempts)
            .map_or((None, None), |entry| {
                (Some(entry.token), entry.unknown.then(|| row.attempts - 1))
            }),
        None => (None, None),
    };
    let state = ClaimState {
        status: row.status,
        attempts: row.attempts,
        claim_until,
        token: token_held,
        unknown,
    };
    let (claim, write) = decide_claim(
        request,
        Some(state),
        switch,
        group_pause,
        now,
        *terms,
        token,
        &usage,
    );
    let Some(write) = write else {
        return (claim, true);
    };
    let hold = crate::safety::limits::HostHold {
        message_id: request.message_id,
        until: write.claim_until,
    };
    match held.get_mut(instance) {
        Some(entry) => *entry = hold,
        None => {
            held.insert(instance.into(), hold);
        }
    }
    row.status = Status::Received;
    row.attempts = write.attempts;
    row.claim_until = Some(write.claim_until).into();
    if let Some(error) = write.last_error {
        row.set_last_error(Some(error.into()));
    }
    row.updated_at = now;
    if write.renewal {
        return (claim, false);
    }
    let attempt = JournalRow::claimed(
        request,
        now,
        write.verdict,
        write.token,
        write.unknown.is_some(),
    );
    row.latest = attempts.push(request.message_id, write.attempts, row.latest, attempt);
    (claim, false)
}
