//! The futures every in-flight message holds while it waits stay small:
//! the handler in its batch, and the boxed phase it is in (the claim, or
//! the outcome). With every message in flight, their sizes are
//! most of the worker's memory per message. (The adapters' own calls are
//! boxed by `#[async_trait]`: what is bounded here is the worker's state.)

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::broker::{Delivery, DeliveryTag, MemoryBroker};
use crate::domain::{Domain, ParseRules, RestartRequest, Restarted};
use crate::restarter::{SimulatedRestarter, Simulation};
use crate::safety::PolicyHandle;
use crate::stats::Stats;
use crate::store::MemoryStore;
use crate::worker::lease::Leased;
use crate::worker::{Worker, WorkerConfig};

fn config() -> WorkerConfig {
    let backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    WorkerConfig {
        max_in_flight: 100,
        pull_batch: 10,
        max_attempts: 3,
        max_deliveries: 10,
        retry_backoff: backoff,
        record_attempts: 3,
        record_backoff: backoff,
        restart_timeout: Duration::from_secs(120),
        shutdown_grace: Duration::from_secs(5),
        lease_extension_interval: None,
        max_pull_failures: 5,
        pull_backoff: backoff,
        parse: ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 1024,
        },
        switch_poll_interval: Duration::from_secs(1),
        store_timeout: crate::store::DEFAULT_TIMEOUT,
        policy: PolicyHandle::default(),
    }
}

#[tokio::test]
async fn a_waiting_messages_futures_stay_small() {
    let worker = Worker::new(
        config(),
        Arc::new(MemoryBroker::new(
            Duration::from_secs(10),
            Duration::from_secs(1),
        )),
        Arc::new(MemoryStore::new()),
        Arc::new(SimulatedRestarter(Simulation {
            min_latency: Duration::ZERO,
            max_latency: Duration::ZERO,
            failure_rate: 0.0,
        })),
        Arc::new(Stats::default()),
    );
    let shared = worker.shared.clone();
    let payload = crate::demo::random_request(&mut rand::rng()).to_wire();
    let request = RestartRequest::parse(&payload, &shared.config.parse).unwrap();
    let delivery = Delivery::new(DeliveryTag::number(1), Bytes::from(payload), 1);
    let leased = Leased::new(&shared, delivery, Instant::now());
    let policy = shared.config.policy.current();
    let permit = shared.flow.acquire().await;
    let handler = crate::worker::handler::message(&shared, &policy, &leased, permit);
    let prepare = crate::worker::prepare::prepare(
        &shared,
        &leased.delivery,
        &leased.progress,
        &request,
        &policy,
    );
    let conclude = crate::worker::conclude::conclude(
        &shared,
        &leased.progress,
        &leased.delivery.tag,
        &request,
        1,
        Ok(Restarted::default()),
    );
    let sizes = [
        std::mem::size_of_val(&handler),
        std::mem::size_of_val(&prepare),
        std::mem::size_of_val(&conclude),
    ];
    // Bounds over a debug build's sizes: a store or broker call's future
    // is boxed (the adapters are trait objects), so a phase holds its own
    // state and a pointer, and `prepare` the claim's terms across the claim.
    assert!(
        sizes[0] <= 400 && sizes[1] <= 856 && sizes[2] <= 832,
        "handler, prepare, conclude: {sizes:?} bytes"
    );
}
