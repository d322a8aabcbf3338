//! An in-process store, for tests with paused time and for the pipeline
//! benchmark. Nothing survives the process.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use uuid::Uuid;

use super::{HistoryEntry, Recorded, Store, StoreError, Timestamp};
use crate::domain::{Outcome, RestartRequest, Status};

/// See the module docs.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// A `std::sync::Mutex`: critical sections are short and never await.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    by_id: HashMap<Uuid, HistoryEntry>,
    /// Rejected payloads without a readable id.
    anonymous: Vec<HistoryEntry>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every entry recorded with a message id.
    pub fn entries(&self) -> Vec<HistoryEntry> {
        self.lock().by_id.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // No critical section here can panic halfway through an update.
        self.state.lock().expect("memory store state poisoned")
    }
}

fn new_entry(request: &RestartRequest, status: Status, now: Timestamp) -> HistoryEntry {
    HistoryEntry {
        message_id: Some(request.message_id),
        instance_name: Some(request.instance_name.to_string()),
        hostname: Some(request.hostname.to_string()),
        status,
        attempts: 0,
        last_error: None,
        received_at: now,
        updated_at: now,
        completed_at: None,
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        Ok(self.lock().by_id.get(&message_id).map(|e| e.status))
    }

    async fn record_received(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let now = Timestamp::now();
        let mut state = self.lock();
        let entry = state
            .by_id
            .entry(request.message_id)
            .or_insert_with(|| new_entry(request, Status::Received, now));
        entry.attempts = entry.attempts.max(attempt);
        entry.updated_at = now;
        if !entry.status.is_final() {
            entry.status = Status::Received;
        }
        Ok(())
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let now = Timestamp::now();
        let mut state = self.lock();
        let entry = state
            .by_id
            .entry(request.message_id)
            .or_insert_with(|| new_entry(request, Status::Received, now));
        if entry.status.is_final() {
            return Ok(Recorded::AlreadyFinal(entry.status));
        }
        entry.status = outcome.status();
        entry.attempts = entry.attempts.max(attempt);
        entry.last_error = outcome.error().map(str::to_owned);
        entry.updated_at = now;
        entry.completed_at = outcome.status().is_final().then_some(now);
        Ok(Recorded::Recorded)
    }

    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        _payload: &[u8],
    ) -> Result<(), StoreError> {
        let now = Timestamp::now();
        let entry = HistoryEntry {
            message_id,
            instance_name: None,
            hostname: None,
            status: Status::Rejected,
            attempts: 1,
            last_error: Some(reason.to_owned()),
            received_at: now,
            updated_at: now,
            completed_at: Some(now),
        };
        let mut state = self.lock();
        match message_id {
            Some(id) => {
                state.by_id.entry(id).or_insert(entry);
            }
            None => state.anonymous.push(entry),
        }
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let state = self.lock();
        let mut entries: Vec<_> = state
            .by_id
            .values()
            .chain(&state.anonymous)
            .cloned()
            .collect();
        entries.sort_by(|a, b| b.updated_at.cmp(&a.updated_at));
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
