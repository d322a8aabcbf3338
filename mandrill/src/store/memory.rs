//! An in-process store, for tests with paused time and for the pipeline
//! benchmark. Nothing survives the process.
//!
//! Rows are kept compact (the instance name is derived from the hostname,
//! times are milliseconds) because the benchmark holds one per message.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use uuid::Uuid;

use super::{HistoryEntry, Recorded, Store, StoreError, Timestamp};
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
    /// Rejected payloads without a readable id.
    anonymous: Mutex<Vec<Row>>,
}

#[derive(Debug)]
struct Row {
    /// `None` for rejected payloads.
    hostname: Option<Box<str>>,
    status: Status,
    attempts: u32,
    last_error: Option<Box<str>>,
    received_at: i64,
    updated_at: i64,
    completed_at: Option<i64>,
}

impl Row {
    fn new(hostname: Option<&str>, status: Status, now: i64) -> Self {
        Self {
            hostname: hostname.map(Box::from),
            status,
            attempts: 0,
            last_error: None,
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
            last_error: self.last_error.as_deref().map(str::to_owned),
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
            anonymous: Mutex::default(),
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

    async fn record_received(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let now = Timestamp::now().as_millis();
        let mut shard = self.shard(&request.message_id);
        let row = shard
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        row.attempts = row.attempts.max(attempt);
        row.updated_at = now;
        if !row.status.is_final() {
            row.status = Status::Received;
        }
        Ok(())
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let now = Timestamp::now().as_millis();
        let mut shard = self.shard(&request.message_id);
        let row = shard
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        if row.status.is_final() {
            return Ok(Recorded::AlreadyFinal(row.status));
        }
        row.status = outcome.status();
        row.attempts = row.attempts.max(attempt);
        row.last_error = outcome.error().map(Box::from);
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
        let now = Timestamp::now().as_millis();
        let mut row = Row::new(None, Status::Rejected, now);
        row.attempts = 1;
        row.last_error = Some(Box::from(reason));
        row.completed_at = Some(now);
        match message_id {
            Some(id) => {
                self.shard(&id).entry(id).or_insert(row);
            }
            None => self
                .anonymous
                .lock()
                .expect("memory store poisoned")
                .push(row),
        }
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let mut entries = self.entries();
        entries.extend(
            self.anonymous
                .lock()
                .expect("memory store poisoned")
                .iter()
                .map(|row| row.entry(None)),
        );
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.updated_at));
        entries.truncate(limit);
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::*;

    #[tokio::test]
    async fn memory_store_keeps_the_store_contract() {
        let store = MemoryStore::new();
        contract::final_outcome_is_never_overwritten(&store).await;
        contract::outcome_without_received_creates_row(&store).await;
        contract::rejections_are_listed(&store).await;
    }
}
