//! Against a private Pub/Sub emulator (see `emulator.rs`); every test uses
//! its own topics and subscriptions.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use uuid::Uuid;

use super::emulator::{self, Emulator};
use super::leases::Lease;
use super::publisher::ensure_topic;
use super::*;
use crate::broker::contract::{self as c, Harness, Queue, StaleAck, Tolerance, broker_contract};

const POLL_WAIT: Duration = Duration::from_millis(200);

/// Options with names unique to one test, on the emulator at `host`.
pub(crate) fn options(host: &str, ack_deadline: Duration) -> PubSubOptions {
    let id = Uuid::new_v4().simple().to_string();
    PubSubOptions {
        project: "mandrill-test".into(),
        subscription: format!("requests-{id}"),
        settings: PubSubSettings {
            topic: format!("requests-{id}"),
            dead_letter_topic: format!("dead-{id}"),
            dead_letter_subscription: format!("dead-{id}"),
            endpoint: Some(format!("http://{host}")),
            credentials_file: None,
            pull: PullMode::Unary,
            poll_interval: Duration::from_millis(20),
        },
        ack_deadline,
        poll_wait: POLL_WAIT,
        max_deliveries: 10,
        max_in_flight: 100,
    }
}

/// The contract, pulling as the mode says.
struct PubSub(PullMode);

/// The emulator honours leases shorter than the service's 10 s minimum,
/// which keeps the contract quick; mandrill's configuration refuses them.
const ACK_DEADLINE: Duration = Duration::from_secs(2);

#[async_trait::async_trait]
impl Harness for PubSub {
    fn tolerance(&self) -> Tolerance {
        Tolerance {
            ack_deadline: ACK_DEADLINE,
            // Deadlines are whole seconds, rounded up: never early, but the
            // emulator releases a message on its own timer.
            nack_early: Duration::from_millis(500),
            counts_attempts: true,
            stale_ack: StaleAck::Refused,
            pull_bound: PULL_MARGIN + Duration::from_secs(5),
        }
    }

    async fn open(&self, stoppable: bool) -> Queue {
        let private = stoppable.then(|| tokio::task::block_in_place(Emulator::start));
        let host = match &private {
            Some(emulator) => emulator.host.clone(),
            None => emulator::shared().to_owned(),
        };
        let mut options = options(&host, ACK_DEADLINE);
        options.settings.pull = self.0;
        let consumer = Arc::new(PubSubBroker::connect(options.clone()).await.unwrap());
        let other = Arc::new(PubSubBroker::connect(options.clone()).await.unwrap());
        let admin = Arc::new(PubSubPublisher::connect(options).await.unwrap());
        let reader = consumer.clone();
        let dead_letters: c::DeadLetters = Box::new(move || {
            let reader = reader.clone();
            Box::pin(async move {
                let dead = reader.publisher.pull_dead_letters(100).await.unwrap();
                // Left leased, so that each read sees them once: nack them
                // back for the next read.
                let ids = dead.iter().map(|d| d.ack_id.clone()).collect::<Vec<_>>();
                for id in ids {
                    let _ = reader
                        .consumer
                        .settler
                        .settle(Settlement::Deadline(0), id)
                        .await;
                }
                dead.into_iter().map(|d| (d.payload, d.reason)).collect()
            })
        });
        let (stop_server, keep): (
            Option<Box<dyn FnOnce() + Send>>,
            Box<dyn std::any::Any + Send + Sync>,
        ) = match private {
            Some(emulator) => {
                let emulator = Arc::new(std::sync::Mutex::new(emulator));
                let stopper = emulator.clone();
                (
                    Some(Box::new(move || stopper.lock().unwrap().stop())),
                    Box::new(emulator),
                )
            }
            None => (None, Box::new(())),
        };
        Queue {
            consumer,
            other,
            dead_letters,
            admin: Some(admin),
            stop_server,
            keep,
        }
    }
}

broker_contract!(PubSub(PullMode::Unary), POLL_WAIT);

mod streaming {
    use super::*;

    broker_contract!(PubSub(PullMode::Streaming), POLL_WAIT);
}

#[tokio::test]
async fn existing_subscription_with_other_settings_is_refused_naming_each_difference() {
    let options = options(emulator::shared(), Duration::from_secs(30));
    PubSubBroker::connect(options.clone()).await.unwrap();
    let mut changed = options.clone();
    changed.ack_deadline = Duration::from_secs(20);
    changed.settings.topic = format!("{}-other", options.settings.topic);
    let error = PubSubBroker::connect(changed)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("ack_deadline is 30s (configured broker.ack_deadline 20s)"),
        "{error}"
    );
    assert!(
        error.contains("topic is projects/mandrill-test/topics/requests-"),
        "{error}"
    );
    assert!(error.contains("-other)"), "{error}");
}

#[tokio::test]
async fn publisher_never_creates_the_subscription_and_says_why() {
    let options = options(emulator::shared(), Duration::from_secs(10));
    let error = PubSubPublisher::connect(options.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("does not exist"), "{error}");
    assert!(error.contains("drops messages"), "{error}");
    // Still missing: the publisher changed nothing. A consumer creates it,
    // and then publishing works.
    let consumer = PubSubBroker::connect(options.clone()).await.unwrap();
    // A publisher cannot pull at all: `PubSubPublisher` is no `Consumer`.
    let publisher = PubSubPublisher::connect(options).await.unwrap();
    let payloads: Vec<Bytes> = (0..2500).map(|i| Bytes::from(format!("p{i}"))).collect();
    publisher.publish_all(payloads).await.unwrap();
    let got = c::pull_n(&consumer, 2500).await;
    assert_eq!(got.len(), 2500);
    // Together, as the worker's handlers do: they share a few calls.
    let acks = got.iter().map(|delivery| consumer.ack(&delivery.tag));
    for acked in futures::future::join_all(acks).await {
        acked.unwrap();
    }
}

#[tokio::test]
async fn published_requests_carry_their_message_id_and_dead_letters_their_origin() {
    let options = options(emulator::shared(), Duration::from_secs(10));
    let broker = PubSubBroker::connect(options).await.unwrap();
    let id = Uuid::new_v4();
    let payload = Bytes::from(format!(
        r#"{{"message_id":"{id}","instance_name":"cattle-1"}}"#
    ));
    broker.publish(payload.clone()).await.unwrap();
    let delivery = c::pull_n(&broker, 1).await.remove(0);
    let reason = "é".repeat(2000);
    broker.dead_letter(&delivery.tag, &reason).await.unwrap();
    let dead = broker.publisher.pull_dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, payload);
    assert!(dead[0].reason.len() <= crate::broker::MAX_REASON_BYTES);
    assert!(dead[0].reason.ends_with('…'));
}

#[tokio::test]
async fn a_lease_past_its_deadline_is_lost_not_extended() {
    let options = options(emulator::shared(), Duration::from_secs(1));
    let broker = PubSubBroker::connect(options).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = c::pull_n(&broker, 1).await.remove(0);
    // Redelivered once the lease ran out: the first lease is gone for good.
    let again = c::pull_n(&broker, 1).await.remove(0);
    assert_eq!(again.attempt, 2);
    let error = broker.extend(&delivery.tag).await.unwrap_err();
    assert!(matches!(error, BrokerError::LeaseLost(_)), "{error:?}");
    let error = broker.dead_letter(&delivery.tag, "late").await.unwrap_err();
    assert!(matches!(error, BrokerError::LeaseLost(_)), "{error:?}");
    broker.ack(&again.tag).await.unwrap();
}

#[tokio::test]
async fn deadlines_round_up_to_whole_seconds_within_the_service_maximum() {
    assert_eq!(deadline_seconds(Duration::ZERO), 0);
    assert_eq!(deadline_seconds(Duration::from_millis(1)), 1);
    assert_eq!(deadline_seconds(Duration::from_millis(2500)), 3);
    assert_eq!(deadline_seconds(Duration::from_secs(3600)), 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulator_restarted_mid_run_is_recovered_from() {
    let mut emulator = tokio::task::block_in_place(Emulator::start);
    let options = options(&emulator.host, Duration::from_secs(10));
    let broker = PubSubBroker::connect(options.clone()).await.unwrap();
    tokio::task::block_in_place(|| emulator.restart());
    // The emulator keeps nothing across a restart: its subscription is gone,
    // which pulling says (and a consumer started now creates it again).
    let give_up = std::time::Instant::now() + c::PATIENCE;
    loop {
        match broker.pull(1).await {
            Err(error @ BrokerError::Fatal(_)) => {
                let message = error.with_causes().to_string();
                assert!(message.contains("NotFound"), "{message}");
                break;
            }
            Err(BrokerError::Unavailable(_)) | Ok(_) => {
                assert!(std::time::Instant::now() < give_up, "never reconnected");
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let again = PubSubBroker::connect(options).await.unwrap();
    again.publish(Bytes::from_static(b"after")).await.unwrap();
    let delivery = c::pull_n(&again, 1).await.remove(0);
    assert_eq!(delivery.payload, Bytes::from_static(b"after"));
    again.ack(&delivery.tag).await.unwrap();
}

#[tokio::test]
async fn dead_letters_are_listed_then_requeued_by_id() {
    let options = options(emulator::shared(), Duration::from_secs(10));
    let broker = PubSubBroker::connect(options.clone()).await.unwrap();
    for payload in [&b"first"[..], b"second"] {
        broker.publish(Bytes::from(payload)).await.unwrap();
    }
    for delivery in c::pull_n(&broker, 2).await {
        broker.dead_letter(&delivery.tag, "bad").await.unwrap();
    }
    let admin = PubSubPublisher::connect(options).await.unwrap();
    // Listing leaves them in place.
    let listed = admin.pull_dead_letters(100).await.unwrap();
    assert_eq!(listed.len(), 2);
    admin
        .release_dead_letters(listed.iter().map(|d| d.ack_id.clone()).collect())
        .await
        .unwrap();
    let first = listed
        .iter()
        .find(|d| d.payload == Bytes::from_static(b"first"))
        .unwrap();
    let requeued = admin
        .requeue(Some(std::slice::from_ref(&first.message_id)))
        .await
        .unwrap();
    assert_eq!(requeued, [DeadLetterId::Message(first.message_id.clone())]);
    let delivery = c::pull_n(&broker, 1).await.remove(0);
    assert_eq!(delivery.payload, Bytes::from_static(b"first"));
    broker.ack(&delivery.tag).await.unwrap();
    let left = admin.pull_dead_letters(100).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].payload, Bytes::from_static(b"second"));
}

#[tokio::test]
async fn subscription_whose_dead_letter_policy_would_forward_first_is_refused() {
    let options = options(emulator::shared(), Duration::from_secs(10));
    // As an operator might have made it: Pub/Sub's own dead-lettering after
    // 5 deliveries, below the worker's limit of 10.
    let admin = PubSubPublisher::connect_clients(options.clone())
        .await
        .unwrap();
    ensure_topic(&admin.requests).await.unwrap();
    ensure_topic(&admin.dead_letters).await.unwrap();
    let mut existing = admin.wanted(&admin.subscription, admin.requests.fully_qualified_name());
    existing.dead_letter_policy = Some(DeadLetterPolicy {
        dead_letter_topic: admin.dead_letters.fully_qualified_name().to_owned(),
        max_delivery_attempts: 5,
    });
    admin
        .subscriber
        .create_subscription(existing, None)
        .await
        .unwrap();
    let error = PubSubBroker::connect(options)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("after 5 deliveries, not above broker.max_deliveries (10)"),
        "{error}"
    );
}

#[tokio::test]
async fn an_ack_id_the_service_refuses_fails_alone_as_a_lost_lease() {
    let options = options(emulator::shared(), Duration::from_secs(10));
    let broker = PubSubBroker::connect(options).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let good = c::pull_n(&broker, 1).await.remove(0);
    // A lease this process believes in but the service refuses, as an
    // exactly-once subscription refuses an expired ack id.
    let consumer = &broker.consumer;
    consumer.leases.lock().unwrap().insert(
        Arc::from("not-an-ack-id"),
        Lease {
            deadline: Instant::now() + Duration::from_secs(60),
            message_id: "0".into(),
            payload: Bytes::new(),
        },
    );
    let bad = DeliveryTag::text("not-an-ack-id");
    // Both in one batch: the refused id must not fail the good one.
    let (good_acked, bad_acked) = tokio::join!(broker.ack(&good.tag), broker.ack(&bad));
    good_acked.unwrap();
    assert!(
        matches!(bad_acked, Err(BrokerError::LeaseLost(_))),
        "{bad_acked:?}"
    );
    let again = broker.pull(10).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
}

/// A verdict goes to the topic its request named, in the broker's
/// project; a topic that does not exist is an error for the worker to
/// count, never a topic created on a requester's word.
#[tokio::test]
async fn a_reply_is_published_to_the_named_topic_and_to_no_other() {
    let options = options(emulator::shared(), Duration::from_secs(10));
    let broker = PubSubBroker::connect(options.clone()).await.unwrap();
    let id = Uuid::new_v4().simple().to_string();
    let client = &broker.publisher.client;
    let topic = client.topic(&format!("verdicts-{id}"));
    ensure_topic(&topic).await.unwrap();
    let subscription = format!("projects/{}/subscriptions/verdicts-{id}", options.project);
    broker
        .publisher
        .ensure_subscription(&subscription, topic.fully_qualified_name(), true)
        .await
        .unwrap();
    let verdict = Bytes::from_static(br#"{"status":"restarted"}"#);
    broker
        .reply(&format!("verdicts-{id}"), verdict.clone())
        .await
        .unwrap();
    let reader = client.subscription(&format!("verdicts-{id}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let heard = loop {
        let pulled = reader.pull(10, None).await.unwrap();
        if !pulled.is_empty() || tokio::time::Instant::now() > deadline {
            break pulled;
        }
    };
    assert_eq!(heard.len(), 1);
    assert_eq!(heard[0].message.data, verdict.to_vec());
    let missing = broker
        .reply(&format!("missing-{id}"), verdict)
        .await
        .unwrap_err()
        .to_string();
    assert!(missing.contains(&format!("missing-{id}")), "{missing}");
    assert!(
        !client
            .topic(&format!("missing-{id}"))
            .exists(None)
            .await
            .unwrap()
    );
}
