//! The broker contract, written once and run on every broker (like the
//! stores' contract tests). Each broker's test module implements [`Harness`]
//! and calls [`broker_contract!`]; where a broker cannot keep a clause
//! exactly, its [`Tolerance`] says by how much, and docs/pubsub.md says why.
//!
//! Times here are the contract's own timeline (a lease of a second or two,
//! extended every third of it), never synchronisation: every wait for
//! something to happen is a pull loop with a generous deadline.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;

use super::{Broker, BrokerError, Consumer, DeadLetterAdmin, Delivery};

mod dead_letters;
pub(crate) use dead_letters::{dead_letter_keeps_the_reason, dead_letters_are_listed_and_requeued};

/// How long to wait for something that should happen; reached only when it
/// does not.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// What an ack of a delivery whose lease ran out (and which was redelivered)
/// does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaleAck {
    /// Refused with `LeaseLost`.
    Refused,
    /// Accepted or refused, but harmless: the current holder still settles
    /// the message.
    Harmless,
}

/// Where a broker departs from the contract's exact terms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tolerance {
    /// The lease the tests use (the broker's shortest practical one).
    pub ack_deadline: Duration,
    /// How much earlier than its delay a nacked message may be redelivered.
    pub nack_early: Duration,
    /// Whether redeliveries to the same consumer count up `attempt`.
    pub counts_attempts: bool,
    /// See [`StaleAck`].
    pub stale_ack: StaleAck,
    /// How long a pull may take while the server is down, beyond the poll
    /// wait.
    pub pull_bound: Duration,
}

/// The dead letters so far, as payload and reason.
pub(crate) type DeadLetters =
    Box<dyn Fn() -> BoxFuture<'static, Vec<(Bytes, String)>> + Send + Sync>;

/// A fresh, empty queue for one test.
pub(crate) struct Queue {
    /// A consumer.
    pub consumer: Arc<dyn Broker>,
    /// A second consumer of the same queue (another instance).
    pub other: Arc<dyn Broker>,
    /// Reads the dead letters.
    pub dead_letters: DeadLetters,
    /// What `mandrill dead-letters` and `requeue` open on this queue; `None`
    /// for the in-process queue, which keeps its dead letters to itself.
    pub admin: Option<Arc<dyn DeadLetterAdmin>>,
    /// Stops the server, if the broker has one and the test asked for it.
    pub stop_server: Option<Box<dyn FnOnce() + Send>>,
    /// Whatever must live as long as the queue (directories, streams).
    pub keep: Box<dyn Any + Send + Sync>,
}

/// One broker under test.
#[async_trait]
pub(crate) trait Harness: Send + Sync {
    /// Its tolerances.
    fn tolerance(&self) -> Tolerance;
    /// A fresh queue; with `stoppable`, one whose server the test may stop
    /// (`stop_server` is `None` if the broker has no server of its own).
    async fn open(&self, stoppable: bool) -> Queue;
}

/// Pulls from `broker` until `want` deliveries came, or fails after [`PATIENCE`].
pub(crate) async fn pull_n(broker: &dyn Consumer, want: usize) -> Vec<Delivery> {
    let give_up = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    while got.len() < want {
        assert!(
            Instant::now() < give_up,
            "only {} of {want} deliveries within {PATIENCE:?}",
            got.len()
        );
        got.extend(broker.pull(want - got.len()).await.expect("pull"));
    }
    got
}

/// Pulls from `broker` for `period`, and returns what came.
pub(crate) async fn pull_during(broker: &dyn Consumer, period: Duration) -> Vec<Delivery> {
    let until = Instant::now() + period;
    let mut got = Vec::new();
    while Instant::now() < until {
        got.extend(broker.pull(10).await.expect("pull"));
    }
    got
}

/// Pulls from both consumers until one is handed a redelivery, and says
/// which. Either may be: a streaming broker (Pub/Sub) can send it down the
/// stream the first consumer still holds open. What the contract promises is
/// that the message comes back, not to whom.
async fn redelivery(queue: &Queue) -> (Delivery, &Arc<dyn Broker>) {
    let give_up = Instant::now() + PATIENCE;
    loop {
        assert!(
            Instant::now() < give_up,
            "not redelivered within {PATIENCE:?}"
        );
        for by in [&queue.other, &queue.consumer] {
            if let Some(delivery) = by.pull(1).await.expect("pull").pop() {
                return (delivery, by);
            }
        }
    }
}

pub(crate) async fn delivers_what_was_published(harness: &dyn Harness) {
    let tolerance = harness.tolerance();
    let queue = harness.open(false).await;
    let sent: Vec<Bytes> = (0..3).map(|i| Bytes::from(format!("m{i}"))).collect();
    for payload in &sent {
        queue.consumer.publish(payload.clone()).await.unwrap();
    }
    let got = pull_n(&*queue.consumer, 3).await;
    let mut payloads: Vec<Bytes> = got.iter().map(|d| d.payload.clone()).collect();
    payloads.sort();
    assert_eq!(payloads, sent);
    for delivery in &got {
        assert_eq!(delivery.attempt, 1);
        assert_eq!(delivery.full_size, delivery.payload.len());
        queue.consumer.ack(&delivery.tag).await.unwrap();
    }
    let again = pull_during(&*queue.other, tolerance.ack_deadline * 2).await;
    assert!(again.is_empty(), "redelivered after ack: {again:?}");
    drop(queue.keep);
}

pub(crate) async fn extended_lease_keeps_a_slow_message(harness: &dyn Harness) {
    let tolerance = harness.tolerance();
    let queue = harness.open(false).await;
    queue
        .consumer
        .publish(Bytes::from_static(b"slow"))
        .await
        .unwrap();
    let delivery = pull_n(&*queue.consumer, 1).await.remove(0);
    // Three leases long, extended every third of one, as the worker does:
    // on a cadence of its own, so that the other consumer's pulls (each may
    // wait for the broker's poll) never delay an extension.
    let every = tolerance.ack_deadline / 3;
    let until = Instant::now() + tolerance.ack_deadline * 3;
    let extending = async {
        while Instant::now() < until {
            tokio::time::sleep(every).await;
            queue.consumer.extend(&delivery.tag).await.unwrap();
        }
    };
    let watching = async {
        while Instant::now() < until {
            let stolen = queue.other.pull(10).await.unwrap();
            assert!(stolen.is_empty(), "redelivered while leased: {stolen:?}");
        }
    };
    tokio::join!(extending, watching);
    queue.consumer.ack(&delivery.tag).await.unwrap();
    drop(queue.keep);
}

pub(crate) async fn expired_lease_redelivers(harness: &dyn Harness) {
    let queue = harness.open(false).await;
    queue
        .consumer
        .publish(Bytes::from_static(b"m"))
        .await
        .unwrap();
    let first = pull_n(&*queue.consumer, 1).await.remove(0);
    let (again, by) = redelivery(&queue).await;
    assert_eq!(again.payload, first.payload);
    by.ack(&again.tag).await.unwrap();
    drop(queue.keep);
}

pub(crate) async fn nack_delays_redelivery(harness: &dyn Harness) {
    let tolerance = harness.tolerance();
    let queue = harness.open(false).await;
    queue
        .consumer
        .publish(Bytes::from_static(b"m"))
        .await
        .unwrap();
    let delivery = pull_n(&*queue.consumer, 1).await.remove(0);
    let delay = Duration::from_secs(3);
    let nacked = Instant::now();
    queue.consumer.nack(&delivery.tag, delay).await.unwrap();
    let again = pull_n(&*queue.consumer, 1).await.remove(0);
    let after = nacked.elapsed();
    assert!(
        after + tolerance.nack_early >= delay,
        "redelivered {after:?} after a nack of {delay:?} (tolerance {:?})",
        tolerance.nack_early
    );
    // An immediate nack comes back without waiting for the lease.
    let nacked = Instant::now();
    queue
        .consumer
        .nack(&again.tag, Duration::ZERO)
        .await
        .unwrap();
    let third = pull_n(&*queue.consumer, 1).await.remove(0);
    assert!(
        nacked.elapsed() < tolerance.ack_deadline * 10,
        "an immediate nack took {:?}",
        nacked.elapsed()
    );
    queue.consumer.ack(&third.tag).await.unwrap();
    drop(queue.keep);
}

pub(crate) async fn stale_ack_is_refused_or_harmless(harness: &dyn Harness) {
    let tolerance = harness.tolerance();
    let queue = harness.open(false).await;
    queue
        .consumer
        .publish(Bytes::from_static(b"m"))
        .await
        .unwrap();
    let stale = pull_n(&*queue.consumer, 1).await.remove(0);
    let (current, holder) = redelivery(&queue).await;
    assert_ne!(current.tag, stale.tag, "a redelivery reused its tag");
    let outcome = queue.consumer.ack(&stale.tag).await;
    match (tolerance.stale_ack, &outcome) {
        (_, Err(BrokerError::LeaseLost(_))) | (StaleAck::Harmless, Ok(())) => {}
        _ => panic!("a stale ack gave {outcome:?}"),
    }
    holder.ack(&current.tag).await.unwrap();
    let period = tolerance.ack_deadline * 2;
    let (again, again_other) = tokio::join!(
        pull_during(&*queue.consumer, period),
        pull_during(&*queue.other, period)
    );
    assert!(
        again.is_empty() && again_other.is_empty(),
        "redelivered after ack: {again:?} {again_other:?}"
    );
    drop(queue.keep);
}

pub(crate) async fn attempts_are_counted(harness: &dyn Harness) {
    let tolerance = harness.tolerance();
    let queue = harness.open(false).await;
    queue
        .consumer
        .publish(Bytes::from_static(b"m"))
        .await
        .unwrap();
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let delivery = pull_n(&*queue.consumer, 1).await.remove(0);
        attempts.push(delivery.attempt);
        queue
            .consumer
            .nack(&delivery.tag, Duration::ZERO)
            .await
            .unwrap();
    }
    if tolerance.counts_attempts {
        assert_eq!(attempts, [1, 2, 3]);
    } else {
        assert!(attempts.iter().all(|&a| a >= 1), "{attempts:?}");
    }
    drop(queue.keep);
}

pub(crate) async fn pull_is_bounded_while_the_server_is_down(
    harness: &dyn Harness,
    poll_wait: Duration,
) {
    let tolerance = harness.tolerance();
    let mut queue = harness.open(true).await;
    let Some(stop) = queue.stop_server.take() else {
        // No server of its own (memory, SQLite), or covered elsewhere.
        return;
    };
    stop();
    let bound = poll_wait + tolerance.pull_bound;
    for _ in 0..2 {
        let started = Instant::now();
        let pulled = tokio::time::timeout(bound * 2, queue.consumer.pull(10)).await;
        assert!(pulled.is_ok(), "a pull took over {:?}", bound * 2);
        assert!(
            matches!(pulled, Ok(Err(BrokerError::Unavailable(_)) | Ok(_))),
            "{pulled:?}"
        );
        assert!(started.elapsed() <= bound * 2);
    }
    drop(queue.keep);
}

/// Defines the contract's tests for a harness expression, and the poll
/// wait its brokers use.
macro_rules! broker_contract {
    ($harness:expr, $poll_wait:expr) => {
        mod contract {
            #[allow(unused_imports)]
            use super::*;
            use $crate::broker::contract as c;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivers_what_was_published() {
                c::delivers_what_was_published(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn extended_lease_keeps_a_slow_message() {
                c::extended_lease_keeps_a_slow_message(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_lease_redelivers() {
                c::expired_lease_redelivers(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nack_delays_redelivery() {
                c::nack_delays_redelivery(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dead_letter_keeps_the_reason() {
                c::dead_letter_keeps_the_reason(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dead_letters_are_listed_and_requeued() {
                c::dead_letters_are_listed_and_requeued(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stale_ack_is_refused_or_harmless() {
                c::stale_ack_is_refused_or_harmless(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn attempts_are_counted() {
                c::attempts_are_counted(&$harness).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pull_is_bounded_while_the_server_is_down() {
                c::pull_is_bounded_while_the_server_is_down(&$harness, $poll_wait).await;
            }
        }
    };
}
pub(crate) use broker_contract;
