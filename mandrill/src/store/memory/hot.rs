//! The memory store's calls on every message (lookup, claim, release,
//! outcome), as inherent `async fn`s: the worker calls them through
//! [`crate::store::AnyStore`] without boxing a future, and the `Store` impl
//! delegates to them.

use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::MemoryStore;
use super::journal::JournalRow;
use super::row::{Extra, Millis, Row};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::safety::limits::Usage;
use crate::store::{
    Claim, ClaimState, ClaimTerms, Recorded, StoreError, Switch, claim_decision, decide_claim,
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
            .get(&message_id)
            .map(|row| row.status))
    }

    /// As [`crate::store::Store::claim_restart`], unboxed.
    pub async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        self.claim(request, &terms).await
    }

    /// As [`Self::claim_restart`], with the terms borrowed: the future then
    /// holds a reference, not their 112 bytes (see
    /// [`crate::store::AnyStore::claim_restart`]).
    pub(crate) async fn claim(
        &self,
        request: &RestartRequest,
        terms: &ClaimTerms,
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
        let mut shard = self.shard(&request.message_id);
        let row = shard
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        let state = ClaimState {
            status: row.status,
            attempts: row.attempts,
            claim_until: row.claim_until.get(),
        };
        // The journal, the one lock all claims share, is held from the
        // counting guards' read to the write, so that they count atomically;
        // without limits, the decision reads no journal, so only the insert
        // needs it (the shard's lock keeps the row consistent meanwhile).
        let mut journal = terms.limits.is_active().then(|| self.journal());
        let usage = match &journal {
            Some(journal) => journal.usage(request, &terms, now),
            None => Usage::default(),
        };
        let (claim, write) = decide_claim(request, Some(state), switch, now, terms, &usage);
        if let Some(write) = write {
            row.status = Status::Received;
            row.attempts = write.attempts;
            row.claim_until = Some(write.claim_until).into();
            if let Some(error) = write.last_error {
                row.set_last_error(Some(error.into()));
            }
            row.updated_at = now;
            // Built before taking the journal's lock: it allocates.
            let attempt = JournalRow::claimed(
                request.instance_name.as_str(),
                request.group(),
                now,
                write.verdict,
            );
            journal
                .get_or_insert_with(|| self.journal())
                .restarts
                .insert((request.message_id, write.attempts), attempt);
        } else if let Some(decision) = claim_decision(&claim) {
            journal.get_or_insert_with(|| self.journal()).decide(
                request.message_id,
                0,
                decision,
                now,
            );
        }
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
        if let Some(row) = shard.get_mut(&request.message_id)
            && !row.status.is_final()
            && row.attempts == attempt
            && attempt > 0
            && row.claim_until.get().is_some()
        {
            row.attempts -= 1;
            row.claim_until = Millis::NONE;
            row.updated_at = now;
            let mut journal = self.journal();
            if journal
                .restarts
                .get(&(request.message_id, attempt))
                .is_some_and(|row| row.outcome.is_none())
            {
                journal.restarts.remove(&(request.message_id, attempt));
            }
        }
        Ok(())
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
        let row = shard
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        if row.status.is_final() {
            return Ok(Recorded::AlreadyFinal(row.status));
        }
        row.status = outcome.status();
        if attempt >= row.attempts {
            row.claim_until = Millis::NONE;
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
        if let Some(attempt) = self
            .journal()
            .restarts
            .get_mut(&(request.message_id, attempt))
            .filter(|attempt| attempt.outcome.is_none())
        {
            attempt.outcome = Some(outcome.status());
            attempt.settled_at = Some(now).into();
        }
        Ok(Recorded::Recorded)
    }
}
