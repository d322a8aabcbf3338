//! Against the NATS server on this machine (`MANDRILL_TEST_NATS` overrides
//! the address). Every test uses its own stream, subjects and consumer, and
//! deletes its streams afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use uuid::Uuid;

use super::consumer::delivery;
use super::dead_letter::{dead_letter_copy, headers_len};
use super::*;
use crate::backoff::Backoff;
use crate::domain::{Domain, ParseRules, RestartRequest, Restarted, Status};
use crate::restarter::{Reservation, RestartError, Restarter};
use crate::stats::Stats;
use crate::store::MemoryStore;
use crate::worker::{Shutdown, Worker, WorkerConfig};

pub(crate) fn server_url() -> String {
    std::env::var("MANDRILL_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// Names unique to one test; the streams are deleted on drop.
pub(crate) struct TestStreams {
    pub settings: NatsOptions,
    /// Deletes the streams when dropped.
    _names: nats_names::StreamNames,
}

impl TestStreams {
    pub fn new(ack_wait: Duration) -> Self {
        let names = nats_names::StreamNames::new(&server_url(), "test");
        Self {
            settings: NatsOptions {
                url: names.url.clone(),
                stream: names.stream.clone(),
                subject: names.subject.clone(),
                consumer: names.consumer.clone(),
                dead_letter_subject: names.dead_letter_subject.clone(),
                ack_wait,
                max_ack_pending: 1000,
                poll_wait: Duration::from_millis(200),
                credentials: Credentials::None,
                tls: false,
                tls_ca_file: None,
            },
            _names: names,
        }
    }
}

/// NATS names of a test's own (shared with the integration tests and the
/// benchmark).
#[path = "../../../tests/services/nats_names.rs"]
mod nats_names;

async fn pull_within(broker: &NatsBroker, deadline: Duration) -> Vec<Delivery> {
    let until = Instant::now() + deadline;
    loop {
        let batch = broker.pull(10).await.unwrap();
        if !batch.is_empty() || Instant::now() >= until {
            return batch;
        }
    }
}

#[tokio::test]
async fn extended_lease_keeps_a_slow_message_from_redelivery() {
    let streams = TestStreams::new(Duration::from_secs(1));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let other_instance = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"slow")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    assert_eq!(delivery.attempt, 1);
    // Three ack waits long, extended every third of one.
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(330)).await;
        broker.extend(&delivery.tag).await.unwrap();
        assert!(
            other_instance.pull(10).await.unwrap().is_empty(),
            "redelivered while leased"
        );
    }
    broker.ack(&delivery.tag).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        other_instance.pull(10).await.unwrap().is_empty(),
        "redelivered after ack"
    );
}

#[tokio::test]
async fn unextended_lease_expires_and_the_message_is_redelivered() {
    let streams = TestStreams::new(Duration::from_secs(1));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let first = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    let again = pull_within(&broker, Duration::from_secs(10)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    assert_eq!(again[0].payload, first.payload);
}

#[tokio::test]
async fn nack_delay_is_honoured() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    broker
        .nack(&delivery.tag, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        broker.pull(10).await.unwrap().is_empty(),
        "redelivered before its delay"
    );
    let again = pull_within(&broker, Duration::from_secs(20)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
}

#[tokio::test]
async fn dead_letter_terminates_and_copies_the_message_with_its_reason() {
    let streams = TestStreams::new(Duration::from_secs(1));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"poison")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    broker
        .dead_letter(&delivery.tag, "payload is not a valid request")
        .await
        .unwrap();
    // Terminated: not redelivered even after the ack wait.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(broker.pull(10).await.unwrap().is_empty());
    let dead = dead_letters(&streams.settings).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0, Bytes::from_static(b"poison"));
    assert_eq!(dead[0].1, "payload is not a valid request");
}

/// A message dead-lettered twice (a redelivery after a settle that was
/// lost, as a loaded CI machine produced: the copy published, the original
/// not yet terminated) leaves one copy: the copy's `Nats-Msg-Id` is the
/// original's sequence, and JetStream drops the repeat.
#[tokio::test]
async fn dead_lettering_a_message_twice_keeps_one_copy() {
    let streams = TestStreams::new(Duration::from_secs(1));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    for reason in ["first", "again"] {
        let (headers, payload) =
            dead_letter_copy(Bytes::from_static(b"poison"), reason, 42, 1 << 20);
        let message = async_nats::jetstream::message::PublishMessage::build()
            .payload(payload)
            .headers(headers);
        broker
            .publisher
            .publish_confirmed(streams.settings.dead_letter_subject.clone(), message)
            .await
            .unwrap();
    }
    let dead = dead_letters(&streams.settings).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1, "first");
}

/// The dead-letter stream's messages: payload and reason.
pub(crate) async fn dead_letters(settings: &NatsOptions) -> Vec<(Bytes, String)> {
    dead_letter_messages(settings)
        .await
        .into_iter()
        .map(|(payload, headers)| {
            let reason = headers
                .get(DEAD_LETTER_REASON_HEADER)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            (payload, reason)
        })
        .collect()
}

/// The dead-letter stream's messages: payload and headers.
async fn dead_letter_messages(settings: &NatsOptions) -> Vec<(Bytes, HeaderMap)> {
    let client = async_nats::connect(settings.url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    let stream = js
        .get_stream(format!("{}_DEAD", settings.stream))
        .await
        .unwrap();
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config::default())
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1000)
        .messages()
        .await
        .unwrap();
    let mut found = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.unwrap();
        found.push((
            message.payload.clone(),
            message.headers.clone().unwrap_or_default(),
        ));
    }
    found
}

#[tokio::test]
async fn publishing_the_same_message_id_twice_stores_it_once() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let payload = Bytes::from(format!(
        r#"{{"message_id":"{}","instance_name":"cattle-dupe"}}"#,
        Uuid::new_v4()
    ));
    broker.publish(payload.clone()).await.unwrap();
    broker.publish(payload).await.unwrap();
    let first = pull_within(&broker, Duration::from_secs(10)).await;
    assert_eq!(first.len(), 1);
    broker.ack(&first[0].tag).await.unwrap();
    assert!(broker.pull(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn existing_consumer_with_other_settings_is_reported() {
    let streams = TestStreams::new(Duration::from_secs(30));
    NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let mut changed = streams.settings.clone();
    changed.ack_wait = Duration::from_secs(10);
    let error = NatsBroker::connect(changed).await.unwrap_err().to_string();
    assert!(
        error.contains("ack_wait is 30s (configured 10s)"),
        "{error}"
    );
}

#[tokio::test]
async fn consumer_with_a_delivery_limit_is_reported() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let settings = &streams.settings;
    NatsPublisher::connect(settings.clone()).await.unwrap();
    // As an older mandrill created it: JetStream's own delivery limit.
    let client = async_nats::connect(settings.url.as_str()).await.unwrap();
    let stream = jetstream::new(client)
        .get_stream(&settings.stream)
        .await
        .unwrap();
    stream
        .create_consumer(pull::Config {
            durable_name: Some(settings.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: 10,
            max_ack_pending: settings.max_ack_pending,
            filter_subject: settings.subject.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let error = NatsBroker::connect(settings.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("max_deliver is 10 (configured -1)"),
        "{error}"
    );
}

#[tokio::test]
async fn consumer_redelivers_past_the_old_delivery_limit() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let info = broker.consumer().unwrap().cached_info();
    assert_eq!(info.config.max_deliver, -1);
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    // JetStream used to stop at broker.max_deliveries (10 by default) and
    // leave the message in the stream; now the worker decides.
    for attempt in 1..=12 {
        let delivery = pull_within(&broker, Duration::from_secs(10))
            .await
            .remove(0);
        assert_eq!(delivery.attempt, attempt);
        broker.nack(&delivery.tag, Duration::ZERO).await.unwrap();
    }
}

#[tokio::test]
async fn dead_letter_of_a_payload_near_max_payload_fits_truncated() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let max_payload = broker.publisher.client.max_payload();
    let original: Bytes = (0..max_payload - 16)
        .map(|i| b'a' + (i % 26) as u8)
        .collect::<Vec<u8>>()
        .into();
    broker.publish(original.clone()).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    let reason = "too big\r\n".repeat(1000);
    broker.dead_letter(&delivery.tag, &reason).await.unwrap();
    let dead = dead_letter_messages(&streams.settings).await;
    assert_eq!(dead.len(), 1);
    let (payload, headers) = &dead[0];
    let header = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    assert!(original.starts_with(payload), "a prefix of the original");
    assert!(payload.len() < original.len());
    assert_eq!(
        header(DEAD_LETTER_TRUNCATED_HEADER).as_deref(),
        Some("true")
    );
    assert_eq!(
        header(DEAD_LETTER_SIZE_HEADER),
        Some(original.len().to_string())
    );
    let (_, sequence) = delivery.tag.as_text_and_number().unwrap();
    assert_eq!(
        header(DEAD_LETTER_SEQUENCE_HEADER),
        Some(sequence.to_string())
    );
    let kept_reason = header(DEAD_LETTER_REASON_HEADER).unwrap();
    assert!(kept_reason.starts_with("too big  too big"), "{kept_reason}");
    assert!(kept_reason.len() <= crate::broker::MAX_REASON_BYTES);
    // Terminated, not redelivered.
    assert!(broker.pull(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn settling_a_delivery_that_is_gone_is_a_lost_lease() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    broker.ack(&delivery.tag).await.unwrap();
    // Acked (by us here; by another consumer after our lease ran out, in
    // real life): the message is gone from the work queue.
    let late = broker.dead_letter(&delivery.tag, "too late").await;
    assert!(matches!(late, Err(BrokerError::LeaseLost(_))), "{late:?}");
    assert!(dead_letters(&streams.settings).await.is_empty());
    // A tag that is no JetStream reply names no lease either.
    let foreign = DeliveryTag::text("not.a.reply");
    let refused = broker.dead_letter(&foreign, "x").await;
    assert!(
        matches!(refused, Err(BrokerError::LeaseLost(_))),
        "{refused:?}"
    );
}

#[test]
fn dead_letter_copy_fits_max_payload_with_its_headers() {
    let wire = |headers: &HeaderMap, payload: &Bytes| headers_len(headers) + payload.len();
    // Small: whole, not marked.
    let (headers, payload) = dead_letter_copy(Bytes::from_static(b"abc"), "bad", 7, 1024);
    assert_eq!(payload, "abc");
    assert!(headers.get(DEAD_LETTER_TRUNCATED_HEADER).is_none());
    assert_eq!(headers.get(DEAD_LETTER_SIZE_HEADER).unwrap().as_str(), "3");
    // One copy per original, however often it is dead-lettered.
    assert_eq!(
        headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .unwrap()
            .as_str(),
        "dead-letter-7"
    );
    // Around the limit, whatever the reason: never over it.
    for max_payload in [400, 1500, 4096, 1024 * 1024] {
        for size in [
            max_payload - 300,
            max_payload - 1,
            max_payload,
            max_payload + 1,
        ] {
            for reason in ["", "short", &"long reason ".repeat(500)] {
                let original = Bytes::from(vec![b'x'; size]);
                let (headers, payload) =
                    dead_letter_copy(original.clone(), reason, 42, max_payload);
                assert!(
                    wire(&headers, &payload) <= max_payload,
                    "{size} bytes over {max_payload}"
                );
                let truncated = headers.get(DEAD_LETTER_TRUNCATED_HEADER).is_some();
                assert_eq!(truncated, payload.len() < size);
            }
        }
    }
    // Exactly at the limit: kept whole; a byte more, truncated. (The probe's
    // size header has as many digits as the real one's.)
    let probe = dead_letter_copy(Bytes::from(vec![0; 1000]), "r", 1, 10_000).0;
    let size = 10_000 - headers_len(&probe);
    let (headers, payload) = dead_letter_copy(Bytes::from(vec![0; size]), "r", 1, 10_000);
    assert_eq!(payload.len(), size);
    assert_eq!(wire(&headers, &payload), 10_000);
    assert!(headers.get(DEAD_LETTER_TRUNCATED_HEADER).is_none());
    let (headers, payload) = dead_letter_copy(Bytes::from(vec![0; size + 1]), "r", 1, 10_000);
    assert!(payload.len() < size);
    assert!(headers.get(DEAD_LETTER_TRUNCATED_HEADER).is_some());
}

#[tokio::test]
async fn stream_sequence_is_read_from_both_reply_formats() {
    let settings = TestStreams::new(Duration::from_secs(30)).settings.clone();
    let client = async_nats::connect(settings.url.as_str()).await.unwrap();
    let context = jetstream::new(client);
    let stream_sequence = |reply: &str| {
        let message = jetstream::Message {
            message: async_nats::Message {
                subject: "s".into(),
                reply: Some(reply.into()),
                payload: Bytes::new(),
                headers: None,
                status: None,
                description: None,
                length: 0,
            },
            context: context.clone(),
        };
        delivery(&message)
            .unwrap()
            .tag
            .as_text_and_number()
            .map(|(_, sequence)| sequence)
    };
    assert_eq!(stream_sequence("$JS.ACK.S.C.1.42.7.1700000000.0"), Some(42));
    assert_eq!(
        stream_sequence("$JS.ACK.domain.hash.S.C.1.42.7.1700000000.0.token"),
        Some(42)
    );
    assert_eq!(stream_sequence("not.a.reply"), None);
}

#[test]
fn secrets_never_show_in_debug_output() {
    let credentials = Credentials::UserPassword {
        user: "mandrill".into(),
        password: Secret("hunter2".into()),
    };
    let printed = format!("{credentials:?}");
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("****"));
}

/// Fails every restart.
struct AlwaysFails(AtomicU32);

#[async_trait]
impl Restarter for AlwaysFails {
    async fn restart(
        &self,
        request: &RestartRequest,
        _: Reservation,
    ) -> Result<Restarted, RestartError> {
        self.0.fetch_add(1, Ordering::AcqRel);
        Err(RestartError::failed(&request.hostname, "host unreachable"))
    }
}

/// The worker's retry-then-dead-letter behaviour holds on JetStream: naks
/// with backoff, then term and a copy on the dead-letter subject.
#[tokio::test]
async fn worker_on_nats_retries_then_dead_letters_with_reason() {
    let streams = TestStreams::new(Duration::from_secs(5));
    let broker = Arc::new(NatsBroker::connect(streams.settings.clone()).await.unwrap());
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(AlwaysFails(AtomicU32::new(0)));
    let stats = Arc::new(Stats::default());
    let config = WorkerConfig {
        max_in_flight: 10,
        pull_batch: 10,
        max_attempts: 3,
        max_deliveries: 10,
        retry_backoff: Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(1),
        },
        record_attempts: 2,
        record_backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
        restart_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::from_secs(5),
        lease_extension_interval: None,
        max_pull_failures: 5,
        pull_backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        },
        parse: ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 4096,
        },
        switch_poll_interval: Duration::from_secs(1),
        policy: crate::safety::PolicyHandle::default(),
    };
    let shutdown = Shutdown::new();
    let worker = Worker::new(
        config,
        broker.clone(),
        store.clone(),
        restarter.clone(),
        stats.clone(),
    );
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let id = Uuid::new_v4();
    broker
        .publish(Bytes::from(format!(
            r#"{{"message_id":"{id}","instance_name":"cattle-gone"}}"#
        )))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while stats.dead_lettered.get() < 1 {
        assert!(
            Instant::now() < deadline,
            "never dead-lettered; restarts tried {}, counters {:?}",
            restarter.0.load(Ordering::Acquire),
            stats.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.request();
    running.await.unwrap().unwrap();
    assert_eq!(restarter.0.load(Ordering::Acquire), 3);
    assert_eq!(stats.nacked.get(), 2);
    assert_eq!(store.lookup(id).await.unwrap(), Some(Status::Failed));
    let dead = dead_letters(&streams.settings).await;
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].1.starts_with("restart failed after 3 attempts"),
        "{}",
        dead[0].1
    );
}

#[tokio::test]
async fn settling_after_the_consumer_is_deleted_is_a_lost_lease() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    let client = async_nats::connect(streams.settings.url.as_str())
        .await
        .unwrap();
    jetstream::new(client)
        .get_stream(&streams.settings.stream)
        .await
        .unwrap()
        .delete_consumer(&streams.settings.consumer)
        .await
        .unwrap();
    // Nobody answers for the consumer any more: retrying cannot help.
    let acked = broker.ack(&delivery.tag).await;
    assert!(matches!(acked, Err(BrokerError::LeaseLost(_))), "{acked:?}");
}

mod contract_harness {
    use std::sync::Arc;

    use super::*;
    use crate::broker::contract::{Harness, Queue, StaleAck, Tolerance, broker_contract};

    const POLL_WAIT: Duration = Duration::from_millis(200);

    struct Nats;

    #[async_trait]
    impl Harness for Nats {
        fn tolerance(&self) -> Tolerance {
            Tolerance {
                ack_deadline: Duration::from_secs(1),
                nack_early: Duration::ZERO,
                counts_attempts: true,
                // The server answers a late ack of a redelivered message
                // without acting on it.
                stale_ack: StaleAck::Harmless,
                pull_bound: PULL_MARGIN,
            }
        }

        /// The shared server is not stopped here: `tests/scale_out.rs`
        /// stops and restarts a private one mid-run.
        async fn open(&self, _stoppable: bool) -> Queue {
            let streams = TestStreams::new(Duration::from_secs(1));
            let mut settings = streams.settings.clone();
            settings.poll_wait = POLL_WAIT;
            let consumer = Arc::new(NatsBroker::connect(settings.clone()).await.unwrap());
            let other = Arc::new(NatsBroker::connect(settings.clone()).await.unwrap());
            Queue {
                consumer,
                other,
                dead_letters: Box::new(move || {
                    let settings = settings.clone();
                    Box::pin(async move { dead_letters(&settings).await })
                }),
                stop_server: None,
                keep: Box::new(streams),
            }
        }
    }

    broker_contract!(Nats, POLL_WAIT);
}
