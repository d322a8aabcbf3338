//! Dead letters on JetStream: the original terminated and one copy kept
//! with its reason, cut to fit `max_payload`; and the worker's retries then
//! dead letter, end to end.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::backoff::Backoff;
use crate::broker::nats::dead_letter::{dead_letter_copy, headers_len};
use crate::broker::nats::publisher::dedup_id;
use crate::domain::{Domain, ParseRules, RestartRequest, Restarted, Status};
use crate::restarter::{Reservation, RestartError, Restarter};
use crate::stats::Stats;
use crate::store::{MemoryStore, Store as _};
use crate::worker::{Shutdown, Worker, WorkerConfig};

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

#[tokio::test]
async fn dead_letter_of_a_payload_near_max_payload_fits_truncated() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let max_payload = broker.publisher.client.max_payload();
    // Room for the header the publisher adds: a digest as `Nats-Msg-Id`.
    let mut dedup = HeaderMap::new();
    dedup.insert(async_nats::header::NATS_MESSAGE_ID, dedup_id(b"").as_str());
    let original: Bytes = (0..max_payload - headers_len(&dedup) - 16)
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
    // Listed as cut, and never requeued: its first bytes are not the request.
    let admin = &broker.publisher;
    let listed = admin.dead_letters().await.unwrap();
    assert!(listed[0].truncated);
    assert_eq!(listed[0].payload_size, original.len() as u64);
    let id = listed[0].id.to_string();
    let refused = admin.requeue(Some(&[id])).await.unwrap_err().to_string();
    assert!(refused.contains("kept only the first bytes"), "{refused}");
    assert!(admin.requeue(None).await.unwrap().is_empty());
    assert_eq!(admin.dead_letters().await.unwrap().len(), 1);
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
        store_timeout: crate::store::DEFAULT_TIMEOUT,
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
