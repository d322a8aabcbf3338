//! The tutorial's save, timed: a store whose claim waits the simulated work.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::Timestamp;
use crate::domain::{Outcome, RestartRequest, Status};
use crate::store::{Claim, ClaimTerms, HistoryEntry, Recorded, Store, StoreError};
use async_trait::async_trait;
use uuid::Uuid;

/// A store, with `save` taking the simulated work time.
pub(super) struct SlowSaveStore {
    pub inner: Arc<dyn Store>,
    pub work: Duration,
}

#[async_trait]
impl Store for SlowSaveStore {
    async fn lookup(&self, id: Uuid) -> Result<Option<Status>, StoreError> {
        self.inner.lookup(id).await
    }
    async fn claim_restart(
        &self,
        r: &RestartRequest,
        terms: ClaimTerms,
        token: crate::store::ClaimToken,
    ) -> Result<Claim, StoreError> {
        // The tutorial's save: now the claim, recorded before the restart.
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        self.inner.claim_restart(r, terms, token).await
    }
    async fn record_outcome(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        self.inner.record_outcome(r, attempt, outcome).await
    }
    async fn record_outcome_acking(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<crate::domain::JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        // Forwarded: the trait's default would record and leave the ack to
        // the caller, so a SQLite run would never measure the joint ack.
        self.inner
            .record_outcome_acking(r, attempt, outcome, ack)
            .await
    }
    async fn release_claim(
        &self,
        r: &RestartRequest,
        attempt: u32,
        token: crate::store::ClaimToken,
    ) -> Result<(), StoreError> {
        self.inner.release_claim(r, attempt, token).await
    }
    async fn record_rejection(
        &self,
        asked: &crate::domain::Asked,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.inner.record_rejection(asked, reason, payload).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.inner.history(limit).await
    }
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: crate::store::Decision<'_>,
    ) -> Result<crate::store::Recorded, StoreError> {
        self.inner.record_decision(request, attempt, decision).await
    }
    async fn story(&self, message_id: Uuid) -> Result<Option<crate::store::Story>, StoreError> {
        self.inner.story(message_id).await
    }
    async fn group_usage(
        &self,
        starts: crate::store::UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError> {
        self.inner.group_usage(starts).await
    }
    async fn first_received(
        &self,
        request: &crate::domain::RestartRequest,
    ) -> Result<crate::domain::Timestamp, StoreError> {
        self.inner.first_received(request).await
    }
    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.inner.deferrals(message_id).await
    }
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.inner.prune(before, max_rows).await
    }
    async fn switch(&self) -> Result<crate::store::Switch, StoreError> {
        self.inner.switch().await
    }
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        self.inner.set_switch(paused, by, reason).await
    }

    async fn set_switch_if(
        &self,
        expected: crate::store::SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        self.inner.set_switch_if(expected, paused, by, reason).await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}
