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
        token: crate::store::ClaimToken,
    ) -> Result<Claim, StoreError> {
        self.0.claim_restart(r, terms, token).await
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
    async fn release_claim(
        &self,
        r: &RestartRequest,
        attempt: u32,
        token: crate::store::ClaimToken,
    ) -> Result<(), StoreError> {
        self.0.release_claim(r, attempt, token).await
    }
    async fn record_rejection(
        &self,
        asked: &crate::domain::Asked,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.0.record_rejection(asked, reason, payload).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.0.history(limit).await
    }
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: crate::store::Decision<'_>,
    ) -> Result<crate::store::Recorded, StoreError> {
        self.0.record_decision(request, attempt, decision).await
    }
    async fn story(&self, message_id: Uuid) -> Result<Option<crate::store::Story>, StoreError> {
        self.0.story(message_id).await
    }
    async fn group_usage(
        &self,
        starts: crate::store::UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError> {
        self.0.group_usage(starts).await
    }
    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        self.0.first_received(request).await
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

    async fn set_switch_if(
        &self,
        expected: crate::store::SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        self.0.set_switch_if(expected, paused, by, reason).await
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
        // Its only delivery: the panic is recorded as a give-up at once
        // (a panic with deliveries left records nothing once the restart
        // is issued), and recording it panics.
        max_deliveries: 1,
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

/// A worker whose restarts wait for `gate`'s permits, and one batch of
/// two deliveries pulled and restarting; `before_publish` runs first.
async fn one_batch_of_two_restarting(
    before_publish: impl FnOnce(&Harness),
) -> (Harness, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let restarter = Arc::new(ScriptedRestarter {
        gate: Some(gate.clone()),
        ..Default::default()
    });
    let config = WorkerConfig {
        pull_batch: 2,
        ..config()
    };
    let h = start(config, Arc::new(MemoryStore::new()), restarter.clone());
    before_publish(&h);
    // Published before the worker pulls: one batch of two.
    h.publish("cattle-0001").await;
    h.publish("cattle-0002").await;
    wait_until("both restarts started", || {
        restarter.running.load(Ordering::Acquire) == 2
    })
    .await;
    (h, gate)
}

#[tokio::test(start_paused = true)]
async fn a_batch_extends_the_leases_of_its_deliveries_still_working_only() {
    let (h, gate) = one_batch_of_two_restarting(|_| {}).await;
    // One finishes at once; the other works for 25 s.
    gate.add_permits(1);
    let stats = h.stats.clone();
    wait_until("the first acked", || stats.acked.get() == 1).await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    gate.add_permits(1);
    wait_until("the second acked", || stats.acked.get() == 2).await;
    // 25 s of work with a 10 s deadline: extended every 10/3 s, 7 times,
    // and only the delivery still working.
    let extended: Vec<String> = h
        .broker
        .timeline
        .events()
        .into_iter()
        .map(|(_, event)| event)
        .filter(|event| event.starts_with("extend"))
        .collect();
    assert_eq!(extended.len(), 7, "{extended:?}");
    assert!(
        extended.iter().all(|event| *event == extended[0]),
        "{extended:?}"
    );
    // Never redelivered: no lease lapsed.
    assert_eq!(stats.pulled.get(), 2);
    assert_eq!(stats.leases_lost.get(), 0);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_extension_never_answered_does_not_keep_the_batch_from_its_next_round() {
    let (h, gate) = one_batch_of_two_restarting(|h| {
        // The first extension the broker is asked for never comes back.
        h.broker.unanswered_extensions.store(1, Ordering::Release);
    })
    .await;
    let stats = h.stats.clone();
    both_kept_their_leases_for_25_s(h, gate).await;
    assert!(
        stats.lease_extensions.get() >= 12,
        "{}",
        stats.lease_extensions.get()
    );
}

/// A broker adapter that panics extending one lease fails that extension
/// only: it must not end the batch's task, which would drop both handlers
/// with their restarts under way.
#[tokio::test(start_paused = true)]
async fn an_extension_that_panics_does_not_end_its_batch() {
    let (h, gate) = one_batch_of_two_restarting(|h| {
        h.broker.panicking_extensions.store(1, Ordering::Release);
    })
    .await;
    both_kept_their_leases_for_25_s(h, gate).await;
}

/// Lets the batch of two work for 25 s (with a 10 s deadline: well past one
/// lease), then checks both were acked with each lease kept: nothing
/// redelivered, nothing lost.
async fn both_kept_their_leases_for_25_s(h: Harness, gate: Arc<Semaphore>) {
    tokio::time::sleep(Duration::from_secs(25)).await;
    gate.add_permits(2);
    let stats = h.stats.clone();
    wait_until("both acked", || stats.acked.get() == 2).await;
    assert_eq!(stats.pulled.get(), 2);
    assert_eq!(stats.leases_lost.get(), 0);
    h.stop().await.unwrap();
}

/// Panics on leaving a `message` span after it logged "acked": a panic that
/// escapes a handler after it settled and gave back its permit.
#[derive(Default)]
struct PanicsAfterTheAck {
    acked: AtomicBool,
}

impl<S> tracing_subscriber::Layer<S> for PanicsAfterTheAck
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct IsAcked(bool);
        impl tracing::field::Visit for IsAcked {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}") == "acked" {
                    self.0 = true;
                }
            }
        }
        let mut acked = IsAcked(false);
        event.record(&mut acked);
        if acked.0 {
            self.acked.store(true, Ordering::Release);
        }
    }

    fn on_exit(&self, id: &tracing::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let leaving_message = ctx.span(id).is_some_and(|span| span.name() == "message");
        if leaving_message && self.acked.swap(false, Ordering::AcqRel) {
            panic!("subscriber bug after the ack");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_escaping_a_handler_after_it_settled_counts_it_out_once() {
    use tracing_subscriber::layer::SubscriberExt;
    // The test's runtime is this thread: every handler logs here.
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(PanicsAfterTheAck::default()),
    );
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = WorkerConfig {
        max_in_flight: 1,
        ..config()
    };
    let h = start(config, Arc::new(MemoryStore::new()), restarter);
    h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("the panic caught", || stats.panics.get() == 1).await;
    assert_eq!(stats.acked.get(), 1);
    // Counted out once: by the handler, not again by the batch.
    assert_eq!(stats.in_flight.get(), 0);
    // Its one flow-control permit came back: the next message is handled.
    h.publish("cattle-0002").await;
    wait_until("the next acked", || stats.acked.get() == 2).await;
    assert_eq!(stats.in_flight.get(), 0);
    h.stop().await.unwrap();
}
