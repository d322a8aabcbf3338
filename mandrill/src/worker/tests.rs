//! The worker's behaviour, with paused time on the in-memory adapters.
//! Scripted wrappers around them inject latency, failures and panics and keep
//! a timeline of what happened.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::*;
use crate::broker::{BrokerError, Close, Consumer, Delivery, DeliveryTag, MemoryBroker, Publisher};
use crate::domain::{Domain, Outcome, RestartRequest, Restarted, Status};
use crate::restarter::{Reservation, Reserving, RestartError};
use crate::safety::{Eligibility, Policy, PolicyHandle};
use crate::store::{
    Claim, ClaimTerms, HistoryEntry, MemoryStore, Recorded, Store, StoreError, Timestamp,
};

const ACK_DEADLINE: Duration = Duration::from_secs(10);

fn config() -> WorkerConfig {
    WorkerConfig {
        max_in_flight: 100,
        pull_batch: 10,
        max_attempts: 3,
        max_deliveries: 10,
        retry_backoff: Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        },
        record_attempts: 3,
        record_backoff: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        },
        restart_timeout: Duration::from_secs(120),
        shutdown_grace: Duration::from_secs(5),
        lease_extension_interval: None,
        max_pull_failures: 5,
        pull_backoff: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        },
        parse: ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 1024,
        },
        switch_poll_interval: Duration::from_secs(1),
        policy: PolicyHandle::default(),
    }
}

/// The test configuration under `policy`.
fn with_policy(policy: Policy) -> WorkerConfig {
    WorkerConfig {
        policy: PolicyHandle::new(policy),
        ..config()
    }
}

/// What happened, when, in order.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<Vec<(Instant, String)>>>);

impl Timeline {
    fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push((Instant::now(), event.into()));
    }

    fn events(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().clone()
    }

    fn when(&self, prefix: &str) -> Vec<Instant> {
        self.events()
            .into_iter()
            .filter(|(_, e)| e.starts_with(prefix))
            .map(|(t, _)| t)
            .collect()
    }

    fn count(&self, prefix: &str) -> usize {
        self.when(prefix).len()
    }
}

/// The memory broker, logging every settlement and extension.
struct LoggedBroker {
    inner: MemoryBroker,
    timeline: Timeline,
    /// Pull fails this many more times before working.
    failing_pulls: AtomicU32,
    /// Dead-lettering fails this many more times before working.
    failing_dead_letters: AtomicU32,
    /// Acks fail (broker briefly unavailable) this many more times.
    failing_acks: AtomicU32,
    /// While set, every extension finds the lease gone.
    leases_gone: AtomicBool,
    /// This many more extensions never get an answer.
    unanswered_extensions: AtomicU32,
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

impl Close for LoggedBroker {}

#[async_trait]
impl Publisher for LoggedBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.inner.publish(payload).await
    }
}

#[async_trait]
impl Consumer for LoggedBroker {
    fn lease(&self) -> Option<Duration> {
        self.inner.lease()
    }
    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        if self
            .failing_pulls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            self.timeline.push("pull-failed");
            return Err(BrokerError::Unavailable("connection refused".into()));
        }
        self.inner.pull(max).await
    }
    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        if take_one(&self.failing_acks) {
            self.timeline.push("ack-failed");
            return Err(BrokerError::Unavailable("connection reset".into()));
        }
        self.timeline.push(format!("ack {tag}"));
        self.inner.ack(tag).await
    }
    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        self.timeline.push(format!("nack {}", delay.as_millis()));
        self.inner.nack(tag, delay).await
    }
    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.timeline.push(format!("extend {tag}"));
        if take_one(&self.unanswered_extensions) {
            return std::future::pending().await;
        }
        if self.leases_gone.load(Ordering::Acquire) {
            return Err(BrokerError::LeaseLost(tag.clone()));
        }
        self.inner.extend(tag).await
    }
    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        if self
            .failing_dead_letters
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            self.timeline.push("dead-letter-failed");
            return Err(BrokerError::Unavailable(
                "dead-letter stream unreachable".into(),
            ));
        }
        self.timeline.push(format!("dead-letter {reason}"));
        self.inner.dead_letter(tag, reason).await
    }
}

/// The memory store with injected latency and faults.
#[derive(Default)]
struct ScriptedStore {
    inner: Arc<MemoryStore>,
    timeline: Timeline,
    claim_delay: Duration,
    /// While set, recording an outcome fails with a transient error.
    outcome_fails: AtomicBool,
    /// While set, recording an outcome fails with a permanent error (as
    /// PostgreSQL refusing a value it cannot store).
    outcome_refused: AtomicBool,
    /// While set, every operation fails with a transient error (the
    /// database is unreachable).
    down: AtomicBool,
    /// When set, claims wait for a permit (never released: they hang).
    claim_gate: Option<Semaphore>,
    /// When set, a claim is committed after `claim_delay` whether or not
    /// its caller still waits, as a writer that queued it commits it.
    queued_claims: bool,
}

impl ScriptedStore {
    fn unreachable(&self, what: &str) -> Result<(), StoreError> {
        if self.down.load(Ordering::Acquire) {
            self.timeline.push(format!("{what}-unreachable"));
            let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            return Err(StoreError::Database(sqlx::Error::Io(refused)));
        }
        Ok(())
    }
}

#[async_trait]
impl Store for ScriptedStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        self.unreachable("lookup")?;
        self.inner.lookup(message_id).await
    }
    async fn claim_restart(
        &self,
        r: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        self.unreachable("claim")?;
        if let Some(gate) = &self.claim_gate {
            self.timeline.push("claim-waiting");
            let _permit = gate.acquire().await.unwrap();
        }
        let claim = if self.queued_claims {
            self.timeline.push("claim-queued");
            let (inner, r, delay) = (self.inner.clone(), r.clone(), self.claim_delay);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                inner.claim_restart(&r, terms).await
            })
            .await
            .expect("the claim's task")
        } else {
            tokio::time::sleep(self.claim_delay).await;
            self.inner.claim_restart(r, terms).await
        };
        self.timeline.push(format!("claim {claim:?}"));
        claim
    }
    async fn record_outcome(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        self.unreachable("record")?;
        if self.outcome_fails.load(Ordering::Acquire) {
            self.timeline.push("record-failed");
            return Err(StoreError::Database(sqlx::Error::PoolTimedOut));
        }
        if self.outcome_refused.load(Ordering::Acquire) {
            self.timeline.push("record-refused");
            let refused = "invalid byte sequence for encoding UTF8: 0x00";
            return Err(StoreError::Database(sqlx::Error::Encode(refused.into())));
        }
        self.timeline.push(format!("recorded {}", outcome.status()));
        self.inner.record_outcome(r, attempt, outcome).await
    }
    async fn release_claim(&self, r: &RestartRequest, attempt: u32) -> Result<(), StoreError> {
        self.unreachable("release")?;
        self.timeline.push(format!("released {attempt}"));
        self.inner.release_claim(r, attempt).await
    }
    async fn record_rejection(
        &self,
        id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.unreachable("reject")?;
        self.inner.record_rejection(id, reason, payload).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.inner.history(limit).await
    }
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: crate::store::Decision<'_>,
    ) -> Result<(), StoreError> {
        self.inner.record_decision(request, attempt, decision).await
    }
    async fn story(&self, message_id: Uuid) -> Result<Option<crate::store::Story>, StoreError> {
        self.inner.story(message_id).await
    }
    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError> {
        self.inner.group_usage(window_start, memory_start).await
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
        self.timeline.push(format!("switch {paused} {reason}"));
        self.inner.set_switch(paused, by, reason).await
    }
}

/// Decides a scripted restart's result.
type Script = fn(&RestartRequest) -> Result<Restarted, RestartError>;

/// A restarter with scripted latency, failures, panics and a gate.
#[derive(Default)]
struct ScriptedRestarter {
    timeline: Timeline,
    delay: Duration,
    /// Every restart fails.
    always_fails: bool,
    /// When set, decides each restart's result.
    script: Option<Script>,
    /// Restarts of hosts starting with this panic.
    panics_on: Option<&'static str>,
    /// When set, each restart waits for a permit (released by the test).
    gate: Option<Arc<Semaphore>>,
    /// When set, reserving capacity waits for a permit (never released).
    reserve_gate: Option<Semaphore>,
    running: AtomicU32,
    most_running: AtomicU32,
    calls: Mutex<HashMap<String, u32>>,
}

impl ScriptedRestarter {
    fn calls(&self, host: &str) -> u32 {
        self.calls.lock().unwrap().get(host).copied().unwrap_or(0)
    }
}

#[async_trait]
impl Restarter for ScriptedRestarter {
    fn reserve<'a>(&'a self, _request: &'a RestartRequest) -> Reserving<'a> {
        let Some(gate) = &self.reserve_gate else {
            return Reserving::unlimited();
        };
        Reserving::wait(async move {
            self.timeline.push("reserve-waiting");
            gate.acquire().await.unwrap().forget();
            Ok(Reservation::unlimited())
        })
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        _: Reservation,
    ) -> Result<Restarted, RestartError> {
        let host = &request.hostname;
        *self
            .calls
            .lock()
            .unwrap()
            .entry(host.to_string())
            .or_default() += 1;
        let now_running = self.running.fetch_add(1, Ordering::AcqRel) + 1;
        self.most_running.fetch_max(now_running, Ordering::AcqRel);
        self.timeline.push("restart-started");
        if let Some(prefix) = self.panics_on
            && host.as_str().starts_with(prefix)
        {
            self.running.fetch_sub(1, Ordering::AcqRel);
            panic!("restarter bug for {host}");
        }
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        tokio::time::sleep(self.delay).await;
        self.running.fetch_sub(1, Ordering::AcqRel);
        self.timeline.push("restarted");
        if self.always_fails {
            return Err(RestartError::failed(host, "host unreachable"));
        }
        if let Some(script) = self.script {
            return script(request);
        }
        Ok(Restarted::default())
    }
}

struct Harness {
    broker: Arc<LoggedBroker>,
    stats: Arc<Stats>,
    shutdown: Shutdown,
    worker: JoinHandle<Result<(), WorkerError>>,
}

fn start(config: WorkerConfig, store: Arc<dyn Store>, restarter: Arc<dyn Restarter>) -> Harness {
    start_with(config, store, restarter, 0)
}

fn start_with(
    config: WorkerConfig,
    store: Arc<dyn Store>,
    restarter: Arc<dyn Restarter>,
    failing_pulls: u32,
) -> Harness {
    let broker = Arc::new(LoggedBroker {
        inner: MemoryBroker::new(ACK_DEADLINE, Duration::from_secs(1)),
        timeline: Timeline::default(),
        failing_pulls: AtomicU32::new(failing_pulls),
        failing_dead_letters: AtomicU32::new(0),
        failing_acks: AtomicU32::new(0),
        leases_gone: AtomicBool::new(false),
        unanswered_extensions: AtomicU32::new(0),
    });
    let stats = Arc::new(Stats::default());
    let shutdown = Shutdown::new();
    let worker = Worker::new(config, broker.clone(), store, restarter, stats.clone());
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    Harness {
        broker,
        stats,
        shutdown,
        worker,
    }
}

fn payload(instance: &str) -> (Uuid, Bytes) {
    let id = Uuid::new_v4();
    let json = format!(r#"{{"message_id":"{id}","instance_name":"{instance}"}}"#);
    (id, Bytes::from(json))
}

impl Harness {
    async fn publish(&self, instance: &str) -> Uuid {
        let (id, body) = payload(instance);
        self.broker.publish(body).await.unwrap();
        id
    }

    async fn stop(self) -> Result<(), WorkerError> {
        self.shutdown.request();
        self.worker.await.unwrap()
    }
}

/// Waits (in paused time, so instantly) until `condition` holds.
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn lease_is_extended_while_work_runs_and_not_after() {
    let restarter = Arc::new(ScriptedRestarter {
        delay: Duration::from_secs(25),
        ..Default::default()
    });
    let h = start(config(), Arc::new(MemoryStore::new()), restarter);
    h.publish("cattle-slow").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    // 25 s of work with a 10 s deadline: extended every 10/3 s, 7 times.
    let extensions = h.broker.timeline.count("extend");
    assert_eq!(extensions, 7);
    // Never redelivered: the lease never lapsed.
    assert_eq!(stats.pulled.get(), 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(h.broker.timeline.count("extend"), extensions);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn restart_is_issued_only_after_its_claim_is_recorded_and_acked_after_its_outcome() {
    let store = Arc::new(ScriptedStore {
        claim_delay: Duration::from_secs(5),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter {
        delay: Duration::from_secs(2),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    h.publish("cattle-ab12").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    let claimed_at = store.timeline.when("claim Ok(Claimed")[0];
    let started_at = restarter.timeline.when("restart-started")[0];
    let restarted_at = restarter.timeline.when("restarted")[0];
    let recorded_at = store.timeline.when("recorded restarted")[0];
    let acked_at = h.broker.timeline.when("ack")[0];
    // The audit record of the claim comes before anything touches the host.
    assert!(claimed_at <= started_at);
    assert!(restarted_at <= recorded_at && recorded_at <= acked_at);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failed_restart_is_retried_with_growing_delay_then_dead_lettered() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        always_fails: true,
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-dead").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    let events: Vec<String> = h
        .broker
        .timeline
        .events()
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let settlements: Vec<&str> = events
        .iter()
        .map(String::as_str)
        .filter(|e| !e.starts_with("extend"))
        .collect();
    assert_eq!(settlements[..2], ["nack 1000", "nack 2000"]);
    assert!(settlements[2].starts_with("dead-letter restart failed after 3 attempts"));
    // The redeliveries really waited for their delays.
    let starts = restarter.timeline.when("restart-started");
    assert!(starts[1] - starts[0] >= Duration::from_secs(1));
    assert!(starts[2] - starts[1] >= Duration::from_secs(2));
    assert_eq!(restarter.calls("cattle-dead.example.net"), 3);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    assert_eq!(h.broker.inner.dead_letters().len(), 1);
    // Counted by its reason, for `/metrics`.
    let reason = crate::stats::DeadLetterReason::RestartFailed;
    assert_eq!(stats.dead_letter_reasons[reason as usize].get(), 1);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failed_request_whose_dead_letter_failed_is_dead_lettered_on_redelivery() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        always_fails: true,
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    h.broker.failing_dead_letters.store(1, Ordering::Release);
    let id = h.publish("cattle-dead").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    // The failed dead-letter left the delivery leased; its redelivery found
    // the outcome recorded and dead-lettered it without restarting again.
    assert_eq!(h.broker.timeline.count("dead-letter-failed"), 1);
    assert_eq!(restarter.calls("cattle-dead.example.net"), 3);
    assert_eq!(stats.acked.get(), 0);
    assert_eq!(h.broker.inner.dead_letters().len(), 1);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn outcome_that_cannot_be_recorded_yet_is_retried_in_place_never_acked_never_restarted_again()
{
    let store = Arc::new(ScriptedStore::default());
    store.outcome_fails.store(true, Ordering::Release);
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-nodisk").await;
    let stats = h.stats.clone();
    wait_until("many failed tries", || {
        store.timeline.count("record-failed") >= 20
    })
    .await;
    // Minutes of failure: never acked, never nacked (a nack would cost a
    // delivery and, on redelivery, maybe a restart), lease kept meanwhile.
    assert_eq!(stats.acked.get() + stats.nacked.get(), 0);
    assert_eq!(stats.store_down.get(), 1);
    assert!(h.broker.timeline.count("extend") > 0);
    // The store recovers: the same delivery records, then acks.
    store.outcome_fails.store(false, Ordering::Release);
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(
        store.inner.lookup(id).await.unwrap(),
        Some(Status::Restarted)
    );
    assert_eq!(restarter.calls("cattle-nodisk.example.net"), 1);
    assert_eq!(stats.pulled.get(), 1);
    assert_eq!(stats.store_down.get(), 0);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn outcome_the_store_refuses_for_good_is_dead_lettered_after_one_restart() {
    let store = Arc::new(ScriptedStore::default());
    store.outcome_refused.store(true, Ordering::Release);
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    h.publish("cattle-nul").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    // Seen before: nacked, and every redelivery restarted the host again.
    assert_eq!(restarter.calls("cattle-nul.example.net"), 1);
    assert_eq!(store.timeline.count("record-refused"), 1);
    assert_eq!(stats.nacked.get(), 0);
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(
        reason.contains("could not be recorded") && reason.contains("0x00"),
        "{reason}"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn store_outage_pauses_pulling_and_costs_no_delivery_or_attempt() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    store.down.store(true, Ordering::Release);
    let first = h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("store found down", || stats.store_down.get() == 1).await;
    for n in 2..=20 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    // Four minutes of outage (it dead-lettered a whole backlog before).
    tokio::time::sleep(Duration::from_secs(240)).await;
    assert_eq!(stats.pulled.get(), 1, "no new work while the store is down");
    assert_eq!(stats.nacked.get() + stats.dead_lettered.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(h.broker.inner.depth().ready, 19);
    store.down.store(false, Ordering::Release);
    wait_until("all acked", || stats.acked.get() == 20).await;
    assert_eq!(stats.store_outages.get(), 1);
    assert_eq!(stats.pulled.get(), 20, "each delivered once");
    let entry = store
        .inner
        .entries()
        .into_iter()
        .find(|e| e.message_id == Some(first))
        .unwrap();
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn redelivery_while_another_claim_holds_is_deferred_and_the_last_delivery_given_up() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = WorkerConfig {
        max_deliveries: 1,
        ..config()
    };
    let h = start(config.clone(), store.clone(), restarter.clone());
    let (id, body) = payload("cattle-held");
    let request = RestartRequest::parse(&body, &config.parse).unwrap();
    // Another consumer claimed the restart and may still be issuing it.
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(600),
        limits: crate::safety::Limits::NONE,
    };
    store.inner.claim_restart(&request, terms).await.unwrap();
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    assert_eq!(stats.deferred.get(), 1);
    assert_eq!(stats.given_up.get(), 1);
    assert_eq!(restarter.calls("cattle-held.example.net"), 0);
    // The give-up is in the history, not only on the broker.
    let entry = store
        .inner
        .entries()
        .into_iter()
        .find(|e| e.message_id == Some(id))
        .unwrap();
    assert_eq!(entry.status, Status::Failed);
    assert!(
        entry
            .last_error
            .as_deref()
            .unwrap()
            .contains("delivered 2 times without being settled"),
        "{entry:?}"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn claims_whose_outcome_was_never_recorded_use_up_attempts_so_crashes_never_add_restarts() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let (id, body) = payload("cattle-crashy");
    let request = RestartRequest::parse(&body, &config().parse).unwrap();
    // Three deliveries claimed and (maybe) issued a restart, then died.
    let expired = ClaimTerms {
        max_attempts: 3,
        hold: Duration::ZERO,
        limits: crate::safety::Limits::NONE,
    };
    for _ in 0..3 {
        store.inner.claim_restart(&request, expired).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    assert_eq!(restarter.calls("cattle-crashy.example.net"), 0);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(reason.contains("never recorded"), "{reason}");
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn lease_lost_before_the_restart_abandons_the_delivery_without_restarting() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    store.down.store(true, Ordering::Release);
    h.broker.leases_gone.store(true, Ordering::Release);
    h.publish("cattle-lost").await;
    let stats = h.stats.clone();
    wait_until("abandoned", || stats.abandoned.get() == 1).await;
    store.down.store(false, Ordering::Release);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("claim Ok"), 0);
    assert_eq!(
        stats.acked.get() + stats.nacked.get() + stats.dead_lettered.get(),
        0
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn settling_is_retried_when_the_broker_is_briefly_unavailable() {
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), Arc::new(MemoryStore::new()), restarter.clone());
    h.broker.failing_acks.store(2, Ordering::Release);
    h.publish("cattle-flaky").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(h.broker.timeline.count("ack-failed"), 2);
    assert_eq!(stats.settle_failures.get(), 0);
    assert_eq!(h.broker.inner.depth().leased, 0);
    assert_eq!(restarter.calls("cattle-flaky.example.net"), 1);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn permanent_restart_failure_is_dead_lettered_at_once_without_retries() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::Permanent {
                host: request.hostname.clone(),
                reason: "host key mismatch".into(),
            })
        }),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-badkey").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    assert_eq!(restarter.calls("cattle-badkey.example.net"), 1);
    assert_eq!(stats.nacked.get(), 0);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(reason.contains("host key mismatch"), "{reason}");
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_backend_sets_the_redelivery_delay() {
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::Failed {
                host: request.hostname.clone(),
                reason: "503 Service Unavailable".into(),
                retry_after: Some(Duration::from_secs(42)),
            })
        }),
        ..Default::default()
    });
    let h = start(config(), Arc::new(MemoryStore::new()), restarter.clone());
    h.publish("cattle-busy").await;
    let stats = h.stats.clone();
    wait_until("nacked", || stats.nacked.get() == 1).await;
    assert_eq!(h.broker.timeline.count("nack 42000"), 1);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn host_that_does_not_come_back_is_recorded_unrecovered_and_not_restarted_again() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::Unrecovered {
                host: request.hostname.clone(),
                after: Duration::from_secs(300),
                reason: "connection refused".into(),
                output: Some("rebooting".into()),
            })
        }),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-gone").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.unrecovered.get(), 1);
    assert_eq!(restarter.calls("cattle-gone.example.net"), 1);
    let entry = store
        .inner
        .entries()
        .into_iter()
        .find(|e| e.message_id == Some(id))
        .unwrap();
    assert_eq!(entry.status, Status::Unrecovered);
    assert_eq!(entry.output.as_deref(), Some("rebooting"));
    assert!(entry.last_error.unwrap().contains("did not recover"));
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn leashed_worker_records_the_would_be_action_and_restarts_nothing() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy {
        dry_run: true,
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-leash").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.dry_runs.get(), 1);
    let entry = store
        .inner
        .entries()
        .into_iter()
        .find(|e| e.message_id == Some(id))
        .unwrap();
    assert_eq!(entry.status, Status::DryRun);
    // The claim was made (the decision is audited like a real restart) and
    // the exact action is recorded.
    assert_eq!(entry.attempts, 1);
    assert_eq!(
        entry.output.as_deref(),
        Some("restart cattle-leash.example.net (simulated)")
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ineligible_instance_is_denied_recorded_and_acked_without_a_claim() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy {
        eligibility: Eligibility::new(&["cattle-*".into()], &["cattle-db*".into()], true).unwrap(),
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let db = h.publish("cattle-db01").await;
    let pet = h.publish("pet-01").await;
    h.publish("cattle-ok").await;
    let stats = h.stats.clone();
    wait_until("all acked", || stats.acked.get() == 3).await;
    assert_eq!(stats.denied.get(), 2);
    assert_eq!(restarter.calls("cattle-ok.example.net"), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    assert_eq!(
        store.timeline.count("claim"),
        1,
        "denied requests claim nothing"
    );
    for (id, why) in [(db, "safety.deny"), (pet, "no safety.allow")] {
        let entry = store
            .inner
            .entries()
            .into_iter()
            .find(|e| e.message_id == Some(id))
            .unwrap();
        assert_eq!(entry.status, Status::Denied);
        assert!(entry.last_error.unwrap().contains(why));
    }
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn paused_store_defers_every_restart_until_resumed() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    store.set_switch(true, "sre", "incident 42").await.unwrap();
    let h = start(config(), store.clone(), restarter.clone());
    for n in 0..5 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    let stats = h.stats.clone();
    // Ten minutes paused: nothing is even pulled, so the messages wait in
    // the broker and spend no delivery (a paused backlog is never given up).
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(stats.pulled.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(h.broker.inner.depth().ready, 5);
    store.set_switch(false, "sre", "resolved").await.unwrap();
    wait_until("all acked", || stats.acked.get() == 5).await;
    assert_eq!(restarter.timeline.count("restart-started"), 5);
    assert_eq!(stats.pulled.get(), 5, "each delivered once");
    // Deferrals used no attempt.
    assert!(
        store
            .inner
            .entries()
            .iter()
            .all(|e| e.status == Status::Restarted && e.attempts == 1)
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_host_that_does_not_come_back_pauses_every_restart() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            if request.instance_name.as_str() == "cattle-gone" {
                return Err(RestartError::Unrecovered {
                    host: request.hostname.clone(),
                    after: Duration::from_secs(300),
                    reason: "connection refused".into(),
                    output: None,
                });
            }
            Ok(Restarted::default())
        }),
        ..Default::default()
    });
    let config = with_policy(Policy {
        pause_on_unrecovered: true,
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    h.publish("cattle-gone").await;
    let stats = h.stats.clone();
    wait_until("unrecovered", || stats.unrecovered.get() == 1).await;
    let switch = store.switch().await.unwrap();
    assert!(switch.paused);
    assert!(
        switch
            .reason
            .unwrap()
            .contains("cattle-gone.example.net did not recover")
    );
    h.publish("cattle-next").await;
    wait_until("deferred", || stats.deferred.get() >= 1).await;
    assert_eq!(restarter.calls("cattle-next.example.net"), 0);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn redelivered_message_already_recorded_is_acked_without_restarting() {
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let (id, body) = payload("cattle-done");
    let request = RestartRequest::parse(&body, &config().parse).unwrap();
    store
        .record_outcome(&request, 1, &Outcome::restarted())
        .await
        .unwrap();
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.duplicates.get(), 1);
    assert_eq!(restarter.calls("cattle-done.example.net"), 0);
    assert_eq!(store.lookup(id).await.unwrap(), Some(Status::Restarted));
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn panic_in_one_handler_nacks_it_and_the_service_goes_on() {
    let restarter = Arc::new(ScriptedRestarter {
        panics_on: Some("cattle-boom"),
        ..Default::default()
    });
    let h = start(config(), Arc::new(MemoryStore::new()), restarter.clone());
    h.publish("cattle-boom").await;
    h.publish("cattle-fine").await;
    let stats = h.stats.clone();
    wait_until("the good one acked and the bad one dead", || {
        stats.acked.get() == 1 && stats.dead_lettered.get() == 1
    })
    .await;
    // Panicked on each of its 3 attempts: nacked twice, then dead-lettered.
    assert_eq!(stats.panics.get(), 3);
    assert_eq!(stats.nacked.get(), 2);
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(reason.contains("panicked"), "{reason}");
    // Still serving.
    h.publish("cattle-after").await;
    wait_until("later message acked", || stats.acked.get() == 2).await;
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn flow_control_holds_at_max_in_flight() {
    let gate = Arc::new(Semaphore::new(0));
    let restarter = Arc::new(ScriptedRestarter {
        gate: Some(gate.clone()),
        ..Default::default()
    });
    let config = WorkerConfig {
        max_in_flight: 3,
        ..config()
    };
    let h = start(config, Arc::new(MemoryStore::new()), restarter.clone());
    for n in 0..10 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    let running = || restarter.running.load(Ordering::Acquire);
    wait_until("three restarts running", || running() == 3).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    // The pull loop waits for capacity instead of leasing more.
    assert_eq!(h.broker.inner.depth().leased, 3);
    assert_eq!(h.broker.inner.depth().ready, 7);
    gate.add_permits(10);
    let stats = h.stats.clone();
    wait_until("all acked", || stats.acked.get() == 10).await;
    assert_eq!(restarter.most_running.load(Ordering::Acquire), 3);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failed_pull_loop_is_restarted_by_the_supervisor() {
    let h = start_with(
        config(),
        Arc::new(MemoryStore::new()),
        Arc::new(ScriptedRestarter::default()),
        3,
    );
    h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.pull_failures.get(), 3);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn supervisor_gives_up_after_consecutive_failures() {
    let h = start_with(
        config(),
        Arc::new(MemoryStore::new()),
        Arc::new(ScriptedRestarter::default()),
        u32::MAX,
    );
    let outcome = h.worker.await.unwrap();
    assert!(
        matches!(outcome, Err(WorkerError::PullGaveUp { failures: 5, .. })),
        "{outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn malformed_message_is_dead_lettered_with_reason_and_recorded() {
    let store = Arc::new(MemoryStore::new());
    let h = start(
        config(),
        store.clone(),
        Arc::new(ScriptedRestarter::default()),
    );
    h.broker
        .publish(Bytes::from_static(b"{not json"))
        .await
        .unwrap();
    h.publish("Not_A_Label").await;
    h.publish("cattle-good").await;
    let stats = h.stats.clone();
    wait_until("settled", || {
        stats.dead_lettered.get() == 2 && stats.acked.get() == 1
    })
    .await;
    let reasons: Vec<String> = h
        .broker
        .inner
        .dead_letters()
        .into_iter()
        .map(|d| d.reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("not a valid request")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("\"Not_A_Label\"")),
        "{reasons:?}"
    );
    let history = store.history(10).await.unwrap();
    assert_eq!(
        history
            .iter()
            .filter(|e| e.status == Status::Rejected)
            .count(),
        2
    );
    // Counted by kind: a reason label never carries the payload's text.
    let malformed = crate::stats::DeadLetterReason::Malformed;
    assert_eq!(stats.dead_letter_reasons[malformed as usize].get(), 2);
    let kinds = crate::domain::Rejection::KINDS;
    let count =
        |kind| stats.rejection_reasons[kinds.iter().position(|k| *k == kind).unwrap()].get();
    assert_eq!((count("bad_json"), count("bad_instance_name")), (1, 1));
    h.stop().await.unwrap();
}

/// Blocks its thread for hosts named `cattle-blk*` until released.
struct BlockingTestRestarter {
    release: Mutex<std::sync::mpsc::Receiver<()>>,
    blocked: AtomicU32,
}

impl crate::restarter::BlockingRestart for BlockingTestRestarter {
    fn restart_blocking(&self, request: &RestartRequest) -> Result<Restarted, RestartError> {
        if request.hostname.as_str().starts_with("cattle-blk") {
            self.blocked.fetch_add(1, Ordering::AcqRel);
            // Wait for the test to release one blocked restart.
            self.release.lock().unwrap().recv().unwrap();
        }
        Ok(Restarted::default())
    }
}

/// Real time and the single-threaded runtime: if the blocking restarts ran on
/// the runtime's thread, nothing else could progress and this would time out.
#[tokio::test]
async fn blocking_restarts_do_not_stall_pulling_or_other_messages() {
    let (release, released) = std::sync::mpsc::channel();
    let blocking = Arc::new(crate::restarter::Blocking::new(
        BlockingTestRestarter {
            release: Mutex::new(released),
            blocked: AtomicU32::new(0),
        },
        4,
    ));
    let store = Arc::new(MemoryStore::new());
    let h = start(config(), store, blocking.clone());
    h.publish("cattle-blk1").await;
    h.publish("cattle-blk2").await;
    for n in 0..5 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    let stats = h.stats.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stats.acked.get() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "other messages stalled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Both blocking restarts are still in progress while the others finished.
    assert_eq!(stats.in_flight.get(), 2);
    release.send(()).unwrap();
    release.send(()).unwrap();
    while stats.acked.get() < 7 {
        assert!(
            std::time::Instant::now() < deadline,
            "released restarts never finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.stop().await.unwrap();
}

/// Every in-flight message holds one of these; the pipeline benchmark's
/// memory figure depends on it. Moving a future into a combinator inside an
/// `async fn` silently doubled it once (2184 bytes); this keeps it honest.
#[tokio::test]
async fn handler_task_stays_small() {
    let worker = Worker::new(
        config(),
        Arc::new(MemoryBroker::new(ACK_DEADLINE, Duration::from_secs(1))),
        Arc::new(MemoryStore::new()),
        Arc::new(ScriptedRestarter::default()),
        Arc::new(Stats::default()),
    );
    let shared = worker.shared.clone();
    let delivery = Delivery::new(DeliveryTag::number(1), Bytes::new(), 1);
    let permit = shared.flow.acquire().await;
    // What a batch's task holds per delivery (plus its FuturesUnordered
    // node, and the delivery with its lease state in the batch's slice).
    let leased = super::lease::Leased::new(&shared, delivery, Instant::now());
    let policy = shared.config.policy.current();
    let task = super::handler::message(&shared, &policy, &leased, permit);
    let size = std::mem::size_of_val(&task);
    // 704 bytes before the claim, the lease tracking and the settle retries
    // (issue 8) added ~110. Since issue 14 this is the future a batch's
    // FuturesUnordered holds per delivery, span and catch_unwind included
    // (784 bytes in a debug build); its node adds ~64. With the lease timer
    // and the delivery held by the batch, 520 bytes in a debug build.
    assert!(size <= 576, "a handler task is {size} bytes");
}

#[path = "guard_tests.rs"]
mod guards;

#[path = "refusal_tests.rs"]
mod refusals;

#[path = "batch_tests.rs"]
mod batches;

#[path = "shutdown_tests.rs"]
mod shutdown;
