//! An in-process store, for tests with paused time and for the pipeline
//! benchmark. Nothing survives the process.
//!
//! Rows are kept compact (the instance name is derived from the hostname,
//! times are milliseconds) because the benchmark holds one per message
//! (`row.rs`); the journal the counting guards read is in `journal.rs`.
//! Maps hash with foldhash, not SipHash: they are hit on every message, and
//! their keys are random ids (issue 14).

mod journal;
mod row;

use std::sync::Mutex;

use async_trait::async_trait;
use foldhash::{HashMap, HashMapExt};
use uuid::Uuid;

use self::journal::{Journal, JournalRow};
use self::row::{Clock, Extra, Row};
use super::{
    Claim, ClaimState, ClaimTerms, Decision, GroupUsage, HistoryEntry, Recorded, Store, StoreError,
    Story, Switch, Timestamp, claim_decision, decide_claim,
};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::safety::limits::Usage;

/// Independent shards, so that handlers on different threads rarely wait
/// for each other.
const SHARDS: usize = 16;

/// See the module docs.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// Rows by message id, sharded by id. A `std::sync::Mutex`: critical
    /// sections are short and never await.
    shards: [Mutex<HashMap<Uuid, Row>>; SHARDS],
    /// Rejected payloads, with the id salvaged from them if any. Kept
    /// apart: a rejection never counts as the record of a request.
    rejected: Mutex<Vec<(Option<Uuid>, Row)>>,
    /// Its notion of now.
    clock: Clock,
    /// The kill switch.
    switch: Mutex<Switch>,
    /// The restart journal and the decisions. Locked after a shard, never
    /// before: a claim holds both while the counting guards decide.
    journal: Mutex<Journal>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store with room for `requests` requests before it grows.
    pub fn with_capacity(requests: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| {
                Mutex::new(HashMap::with_capacity(requests / SHARDS + 1))
            }),
            rejected: Mutex::default(),
            clock: Clock::default(),
            switch: Mutex::default(),
            journal: Mutex::new(Journal::with_capacity(requests)),
        }
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().expect("memory store journal poisoned")
    }

    /// Every entry recorded with a message id.
    pub fn entries(&self) -> Vec<HistoryEntry> {
        (0..SHARDS)
            .flat_map(|n| {
                let shard = self.shards[n].lock().expect("memory store shard poisoned");
                shard
                    .iter()
                    .map(|(id, row)| row.entry(Some(*id)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn shard(&self, id: &Uuid) -> std::sync::MutexGuard<'_, HashMap<Uuid, Row>> {
        // UUIDs are random: their last byte spreads ids evenly. No critical
        // section here can panic halfway through an update.
        self.shards[usize::from(id.as_bytes()[15]) % SHARDS]
            .lock()
            .expect("memory store shard poisoned")
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        Ok(self
            .shard(&message_id)
            .get(&message_id)
            .map(|row| row.status))
    }

    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        let now = self.clock.now();
        let switch = self.switch.lock().expect("memory store poisoned").clone();
        let mut shard = self.shard(&request.message_id);
        let row = shard
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        let state = ClaimState {
            status: row.status,
            attempts: row.attempts,
            claim_until: row.claim_until,
        };
        let mut journal = self.journal();
        let usage = if terms.limits.is_active() {
            journal.usage(request, &terms, now)
        } else {
            Usage::default()
        };
        let (claim, write) = decide_claim(request, Some(state), &switch, now, terms, &usage);
        if let Some(write) = write {
            row.status = Status::Received;
            row.attempts = write.attempts;
            row.claim_until = Some(write.claim_until);
            if let Some(error) = write.last_error {
                row.last_error = Some(error.into());
            }
            row.updated_at = now;
            journal.restarts.insert(
                (request.message_id, write.attempts),
                JournalRow {
                    instance: request.instance_name.as_str().into(),
                    group: request.group().into(),
                    claimed_at: now,
                    verdict: write.verdict,
                    outcome: None,
                    settled_at: None,
                },
            );
        } else if let Some(decision) = claim_decision(&claim) {
            journal.decide(request.message_id, 0, decision, now);
        }
        Ok(claim)
    }

    async fn release_claim(
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
            && row.claim_until.is_some()
        {
            row.attempts -= 1;
            row.claim_until = None;
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

    async fn record_outcome(
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
            row.claim_until = None;
        }
        row.attempts = row.attempts.max(attempt);
        row.last_error = outcome.error().map(Box::from);
        let has_extra = request.requested_by.is_some()
            || request.reason.is_some()
            || outcome.output().is_some()
            || outcome.recovered_after().is_some();
        if has_extra {
            row.extra = Some(Box::new(Extra {
                requested_by: request.requested_by.clone(),
                reason: request.reason.clone(),
                output: outcome.output().map(str::to_owned),
                recovered_after: outcome.recovered_after(),
            }));
        }
        row.updated_at = now;
        row.completed_at = outcome.status().is_final().then_some(now);
        if let Some(attempt) = self
            .journal()
            .restarts
            .get_mut(&(request.message_id, attempt))
            .filter(|attempt| attempt.outcome.is_none())
        {
            attempt.outcome = Some(outcome.status());
            attempt.settled_at = Some(now);
        }
        Ok(Recorded::Recorded)
    }

    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        _payload: &[u8],
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut row = Row::new(None, Status::Rejected, now);
        row.attempts = 1;
        row.last_error = Some(Box::from(reason));
        row.completed_at = Some(now);
        self.rejected
            .lock()
            .expect("memory store poisoned")
            .push((message_id, row));
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let mut entries = self.entries();
        entries.extend(
            self.rejected
                .lock()
                .expect("memory store poisoned")
                .iter()
                .map(|(id, row)| row.entry(*id)),
        );
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.updated_at));
        entries.truncate(limit);
        Ok(entries)
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        self.journal()
            .decide(request.message_id, attempt, decision, now);
        Ok(())
    }

    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError> {
        Ok(self.journal().group_usage(window_start, memory_start))
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        Ok(self
            .journal()
            .deferrals
            .get(&message_id)
            .copied()
            .unwrap_or(0))
    }

    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        let Some(entry) = self
            .shard(&message_id)
            .get(&message_id)
            .map(|row| row.entry(Some(message_id)))
        else {
            return Ok(None);
        };
        let journal = self.journal();
        let attempts = journal.attempts_of(message_id);
        let decisions = journal
            .decisions
            .get(&message_id)
            .cloned()
            .unwrap_or_default();
        Ok(Some(Story {
            entry,
            attempts,
            decisions,
        }))
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        Ok(self.switch.lock().expect("memory store poisoned").clone())
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        *self.switch.lock().expect("memory store poisoned") = Switch {
            paused,
            by: Some(by.to_owned()),
            reason: Some(reason.to_owned()),
            since: Some(Timestamp::from_millis(self.clock.now())),
        };
        Ok(())
    }

    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        let before = before.as_millis();
        let budget = u64::from(max_rows);
        let mut removed = 0;
        let mut keep = |row: &Row| {
            let old = row.completed_at.is_some_and(|at| at < before);
            if old && removed < budget {
                removed += 1;
                false
            } else {
                true
            }
        };
        self.rejected
            .lock()
            .expect("memory store poisoned")
            .retain(|(_, row)| keep(row));
        let mut gone = Vec::new();
        for shard in &self.shards {
            shard
                .lock()
                .expect("memory store shard poisoned")
                .retain(|id, row| {
                    keep(row) || {
                        gone.push(*id);
                        false
                    }
                });
        }
        let mut journal = self.journal();
        for id in &gone {
            journal.decisions.remove(id);
            journal.deferrals.remove(id);
        }
        journal
            .restarts
            .retain(|(id, _), row| row.claimed_at >= before && !gone.contains(id));
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::*;

    #[tokio::test]
    async fn memory_store_keeps_the_store_contract() {
        let store = MemoryStore::new();
        contract::all(&store).await;
    }
}
