//! The ceilings (issue 14, "honest ceilings"): for each path, a bare loop
//! doing the work the pipeline must do on that path and nothing else,
//! measured in the same run as the pipeline. Each returns messages per
//! second, timed from its first message to its last, after an untimed
//! set-up (payloads generated, queue or stream filled, schema created).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use mandrill::domain::{Domain, ParseRules, RestartRequest, Status};
use mandrill::simulate::random_request;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// `n` fresh payloads, as the pipeline's.
pub fn payloads(n: usize) -> Vec<Bytes> {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| Bytes::from(random_request(&mut rng).to_wire()))
        .collect()
}

/// The parse rules the benchmark's worker uses.
pub fn parse_rules() -> ParseRules {
    ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 4096,
    }
}

pub(super) fn parse(payload: &[u8], rules: &ParseRules) -> RestartRequest {
    RestartRequest::parse(payload, rules).expect("the benchmark's payloads are valid")
}

pub(super) fn now_millis() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds fit in i64")
}

/// (a) In memory: one spawned task per message (into a `TaskTracker`, as
/// the worker tracks its handlers) that parses the payload into a
/// `RestartRequest`, waits `work` (the save), claims it in a map (attempt
/// counted), waits `work` (the restart, failing with probability
/// `fail_rate`) and records the outcome in the map. No broker, no leases,
/// no flow control: what is left of the pipeline's per-message work.
pub async fn in_memory(n: usize, work: Duration, fail_rate: f64) -> f64 {
    let payloads = payloads(n);
    let rules = Arc::new(parse_rules());
    let store: Arc<Mutex<HashMap<Uuid, (u32, Status)>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(n)));
    let tasks = TaskTracker::new();
    let started = Instant::now();
    for payload in payloads {
        let rules = rules.clone();
        let store = store.clone();
        tasks.spawn(async move {
            let request = parse(&payload, &rules);
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            let attempt = {
                // A panic elsewhere would have ended the benchmark already.
                let mut store = store.lock().expect("not poisoned");
                let entry = store
                    .entry(request.message_id)
                    .or_insert((0, Status::Received));
                entry.0 += 1;
                entry.0
            };
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            let status = if fail_rate > 0.0 && rand::random::<f64>() < fail_rate {
                Status::Failed
            } else {
                Status::Restarted
            };
            store
                .lock()
                .expect("not poisoned")
                .insert(request.message_id, (attempt, status));
        });
    }
    tasks.close();
    tasks.wait().await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    assert_eq!(store.lock().expect("not poisoned").len(), n);
    rate
}

/// (c) NATS: a bare async-nats loop on a stream of its own (filled first,
/// untimed) that pulls continuously (batches of 256, as the worker's
/// `pull_batch`) and acks each message with a confirmed ack, up to
/// `max_in_flight` acks outstanding: it keeps pulling while acks are in
/// flight, as mandrill does. No other work.
pub async fn nats(url: &str, stream_name: &str, subject: &str, n: usize) -> f64 {
    use async_nats::jetstream::consumer::{PullConsumer, pull};
    use async_nats::jetstream::{AckKind, stream};

    let client = async_nats::connect(url).await.expect("nats");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .create_stream(stream::Config {
            name: stream_name.to_owned(),
            subjects: vec![subject.to_owned()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .expect("ceiling stream");
    futures::stream::iter(payloads(n))
        .map(|payload| {
            let js = js.clone();
            async move {
                js.publish(subject.to_owned(), payload)
                    .await
                    .expect("publish")
                    .await
                    .expect("confirmed")
            }
        })
        .buffer_unordered(512)
        .for_each(|_| async {})
        .await;
    let max_in_flight = 100_000;
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("ceiling".into()),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: max_in_flight as i64,
            ..Default::default()
        })
        .await
        .expect("ceiling consumer");
    let started = Instant::now();
    let messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await
        .expect("pull stream");
    messages
        .take(n)
        .map(|message| async move {
            message
                .expect("message")
                .double_ack_with(AckKind::Ack)
                .await
                .expect("ack")
        })
        .buffer_unordered(max_in_flight)
        .for_each(|()| async {})
        .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = js.delete_stream(stream_name).await;
    rate
}

#[path = "ceilings/postgres.rs"]
mod postgres;
#[path = "ceilings/sqlite.rs"]
mod sqlite;

pub use postgres::postgres;
pub use sqlite::sqlite;
