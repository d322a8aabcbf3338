//! The worker's behaviour, with paused time on the in-memory adapters:
//! the shared fixtures (the configuration, a harness running a worker,
//! waiting on a condition) are here, the scripted adapters in
//! `tests/doubles.rs`, and the tests, by behaviour, in `tests/`.

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
use crate::domain::Timestamp;
use crate::domain::{Domain, Outcome, RestartRequest, Restarted, Status};
use crate::restarter::{Reservation, Reserving, RestartError};
use crate::safety::{Eligibility, Policy, PolicyHandle};
use crate::store::{Claim, ClaimTerms, HistoryEntry, MemoryStore, Recorded, Store, StoreError};

mod doubles;

use doubles::{LoggedBroker, ScriptedRestarter, ScriptedStore, Timeline};

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
        store_timeout: crate::store::DEFAULT_TIMEOUT,
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
    start_polling(
        config,
        store,
        restarter,
        failing_pulls,
        Duration::from_secs(1),
    )
}

/// As [`start_with`], with pulls waiting up to `poll_wait` for a message
/// (a publish or a nack's delay ending wakes them sooner): a long wait lets
/// a test simulate weeks without spinning the pull loop every second.
fn start_polling(
    config: WorkerConfig,
    store: Arc<dyn Store>,
    restarter: Arc<dyn Restarter>,
    failing_pulls: u32,
    poll_wait: Duration,
) -> Harness {
    let broker = Arc::new(LoggedBroker {
        inner: MemoryBroker::new(ACK_DEADLINE, poll_wait),
        timeline: Timeline::default(),
        failing_pulls: AtomicU32::new(failing_pulls),
        failing_dead_letters: AtomicU32::new(0),
        failing_acks: AtomicU32::new(0),
        leases_gone: AtomicBool::new(false),
        unanswered_extensions: AtomicU32::new(0),
        panicking_extensions: AtomicU32::new(0),
        replies: Mutex::default(),
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

/// A stop condition named `alerts`, healthy while `url` answers 2xx (a
/// probe the test serves).
fn http_stop_condition(url: String) -> crate::safety::StopConditions {
    let alerts = crate::safety::StopConditionSettings {
        name: "alerts".into(),
        http: Some(url),
        expect_status: None,
        command: None,
        timeout: Duration::from_secs(600),
        expect_empty_json_array: false,
    };
    crate::safety::StopConditions::new(&[alerts]).unwrap()
}

/// Reads an HTTP request's head from `socket` (a stop condition's probe,
/// served by the test), until its blank line or the end.
async fn read_http_request(socket: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = socket.read(&mut buffer).await.unwrap();
        if read == 0 {
            break;
        }
        request.extend_from_slice(&buffer[..read]);
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

mod batches;
mod deliveries;
mod guards;
mod late_checks;
mod policy;
mod pulls;
mod refusals;
mod replies;
mod restarts;
mod schedule;
mod shutdown;
mod size;
mod store;
