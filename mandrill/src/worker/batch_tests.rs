//! Handlers share a task per pulled batch: a panic that escapes one
//! handler's own guards fails that message only.

use super::*;

/// The memory store, panicking when asked to record a handler's panic: so
/// the panic escapes the handler's guard and its recovery both.
struct PanicsOnPanicRecords(MemoryStore);

#[async_trait]
impl Store for PanicsOnPanicRecords {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        self.0.lookup(message_id).await
    }
    async fn claim_restart(
        &self,
        r: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        self.0.claim_restart(r, terms).await
    }
    async fn record_outcome(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        if let Outcome::Retrying { error } | Outcome::Failed { error } = outcome {
            assert!(!error.contains("panicked"), "store bug for {}", r.hostname);
        }
        self.0.record_outcome(r, attempt, outcome).await
    }
    async fn release_claim(&self, r: &RestartRequest, attempt: u32) -> Result<(), StoreError> {
        self.0.release_claim(r, attempt).await
    }
    async fn record_rejection(
        &self,
        id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.0.record_rejection(id, reason, payload).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.0.history(limit).await
    }
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: crate::store::Decision<'_>,
    ) -> Result<(), StoreError> {
        self.0.record_decision(request, attempt, decision).await
    }
    async fn story(&self, message_id: Uuid) -> Result<Option<crate::store::Story>, StoreError> {
        self.0.story(message_id).await
    }
    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError> {
        self.0.group_usage(window_start, memory_start).await
    }
    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.0.deferrals(message_id).await
    }
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.0.prune(before, max_rows).await
    }
    async fn switch(&self) -> Result<crate::store::Switch, StoreError> {
        self.0.switch().await
    }
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        self.0.set_switch(paused, by, reason).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_escaping_a_handler_fails_its_message_not_its_batch() {
    let restarter = Arc::new(ScriptedRestarter {
        panics_on: Some("cattle-boom"),
        // Long enough for the whole batch to be in flight together.
        delay: Duration::from_secs(1),
        ..Default::default()
    });
    let store = Arc::new(PanicsOnPanicRecords(MemoryStore::new()));
    let config = WorkerConfig {
        max_in_flight: 5,
        pull_batch: 5,
        ..config()
    };
    // Published before the worker pulls: one batch of five.
    let h = start_with(config, store, restarter.clone(), 0);
    h.publish("cattle-boom").await;
    for n in 0..4 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    let stats = h.stats.clone();
    wait_until("the rest of the batch acked", || stats.acked.get() == 4).await;
    // The restarter's panic (caught by the handler's guard) and the
    // store's (escaping it, caught for that message alone).
    assert_eq!(stats.panics.get(), 2);
    assert_eq!(stats.in_flight.get(), 0);
    // Its flow-control permit came back: five more fill every slot.
    for n in 4..9 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    wait_until("the next five acked", || stats.acked.get() == 9).await;
    assert_eq!(restarter.most_running.load(Ordering::Acquire), 5);
    h.stop().await.unwrap();
}
