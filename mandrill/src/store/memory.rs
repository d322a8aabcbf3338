//! An in-process store, for tests with paused time and for the pipeline
//! benchmark. Nothing survives the process.
//!
//! Rows are kept compact (the instance name is derived from the hostname,
//! times are milliseconds) because the benchmark holds one per message.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use uuid::Uuid;

use super::{
    Claim, ClaimState, ClaimTerms, HistoryEntry, Recorded, Store, StoreError, Switch, Timestamp,
    decide_claim,
};
use crate::domain::{Outcome, RestartRequest, Status};

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
    fn now(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.wall_at_start.saturating_add(elapsed)
    }
}

#[derive(Debug)]
struct Row {
    /// `None` for rejected payloads.
    hostname: Option<Box<str>>,
    status: Status,
    attempts: u32,
    /// When the hold of the last claim expires; `None` once its outcome is in.
    claim_until: Option<i64>,
    last_error: Option<Box<str>>,
    /// The rarely set fields, boxed together: the benchmark holds a row per
    /// message.
    extra: Option<Box<Extra>>,
    received_at: i64,
    updated_at: i64,
    completed_at: Option<i64>,
}

#[derive(Debug, Default)]
struct Extra {
    requested_by: Option<String>,
    reason: Option<String>,
    output: Option<String>,
    recovered_after: Option<std::time::Duration>,
}

impl Row {
    fn new(hostname: Option<&str>, status: Status, now: i64) -> Self {
        Self {
            hostname: hostname.map(Box::from),
            status,
            attempts: 0,
            claim_until: None,
            last_error: None,
            extra: None,
            received_at: now,
            updated_at: now,
            completed_at: None,
        }
    }

    fn entry(&self, message_id: Option<Uuid>) -> HistoryEntry {
        HistoryEntry {
            message_id,
            instance_name: self
                .hostname
                .as_deref()
                .and_then(|host| host.split('.').next())
                .map(str::to_owned),
            hostname: self.hostname.as_deref().map(str::to_owned),
            status: self.status,
            attempts: self.attempts,
            requested_by: self.extra.as_ref().and_then(|e| e.requested_by.clone()),
            reason: self.extra.as_ref().and_then(|e| e.reason.clone()),
            last_error: self.last_error.as_deref().map(str::to_owned),
            output: self.extra.as_ref().and_then(|e| e.output.clone()),
            recovered_after: self.extra.as_ref().and_then(|e| e.recovered_after),
            received_at: Timestamp::from_millis(self.received_at),
            updated_at: Timestamp::from_millis(self.updated_at),
            completed_at: self.completed_at.map(Timestamp::from_millis),
        }
    }
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
        }
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
        let (claim, write) = decide_claim(Some(state), &switch, now, terms);
        if let Some(write) = write {
            row.status = Status::Received;
            row.attempts = write.attempts;
            row.claim_until = Some(write.claim_until);
            if let Some(error) = write.last_error {
                row.last_error = Some(error.into());
            }
            row.updated_at = now;
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
        for shard in &self.shards {
            shard
                .lock()
                .expect("memory store shard poisoned")
                .retain(|_, row| keep(row));
        }
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
