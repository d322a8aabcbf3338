//! The ceilings: for each path, a bare loop
//! doing the work the pipeline must do on that path and nothing else,
//! measured in the same run as the pipeline. Each returns messages per
//! second, timed from its first message to its last, after an untimed
//! set-up (payloads generated, queue or stream filled, schema created).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::demo::random_request;
use crate::domain::{
    Domain, Hostname, InstanceName, ParseRules, RestartRequest, SigningKey, Status,
};
use bytes::Bytes;
use futures::StreamExt;
use rand::Rng as _;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::bench::options::Options;
use crate::bench::setup::Resources;

/// Each path's ceiling in messages per second, `None` where not measured.
#[derive(Clone, Copy, Default)]
pub(super) struct Ceilings {
    /// (a), with broker and store in memory.
    pub memory: Option<f64>,
    /// (b), with either on SQLite.
    pub sqlite: Option<f64>,
    /// (b) committed in the pipeline's three durable steps.
    pub sqlite_durable: Option<f64>,
    /// (b)'s work through sqlx: multi-row, as the writer writes, and
    /// one-row, as (b); the writer's driver is chosen by these against (b).
    pub sqlite_sqlx: Option<(f64, f64)>,
    /// (c), with NATS.
    pub nats: Option<f64>,
    /// (d), with PostgreSQL.
    pub postgres: Option<f64>,
    /// Pub/Sub's bare loops: streaming, then unary.
    pub pubsub: Option<(f64, f64)>,
}

/// The ceilings of the paths the run took, each in this run, after the
/// pipeline (its memory figures are taken before they start); none with
/// `--no-ceilings`. The SQLite ones use files in `dir`.
pub(super) async fn measure(options: &Options, resources: &Resources, dir: &Path) -> Ceilings {
    let n = options.messages;
    let measure = options.ceilings;
    let mut ceilings = Ceilings::default();
    if measure && options.broker == "memory" && options.db == "memory" {
        ceilings.memory = Some(in_memory(n, options.work, options.fail_rate).await);
    }
    if measure && (resources.broker_url.is_some() || resources.db_url.is_some()) {
        ceilings.sqlite = Some(sqlite(n, dir, Commits::One).await);
        ceilings.sqlite_durable = Some(sqlite(n, dir, Commits::Three).await);
        ceilings.sqlite_sqlx = Some((sqlite_sqlx(n, dir).await, sqlite_sqlx_one_row(n, dir).await));
    }
    if let Some(settings) = resources.nats.as_ref().filter(|_| measure) {
        let stream = format!("{}_CEILING", settings.stream);
        let subject = format!("{}.ceiling", settings.subject);
        ceilings.nats = Some(nats(&settings.url, &stream, &subject, n).await);
    }
    if measure && resources.postgres.is_some() {
        ceilings.postgres = Some(postgres(&options.db, n, options.writers).await);
    }
    if let Some(pubsub) = resources.pubsub.as_ref().filter(|_| measure) {
        ceilings.pubsub = Some(crate::bench::pubsub::bare_pubsub_rates(pubsub, n).await);
    }
    ceilings
}

/// `--ids random`: payloads carry random (version 4) message ids, as a
/// publisher other than mandrill's may send, instead of the time-ordered
/// (version 7) ids mandrill's own publishers mint.
pub(super) static RANDOM_IDS: AtomicBool = AtomicBool::new(false);

/// `n` fresh payloads, as the pipeline's: signed by [`SIGNER`] with
/// `signed`.
pub(super) fn payloads(n: usize, signed: bool) -> Vec<Bytes> {
    let mut rng = rand::rng();
    let random_ids = RANDOM_IDS.load(Ordering::Relaxed);
    let key = signed.then(|| SigningKey::from_pem(SIGNER_KEY).expect("the benchmark's key"));
    let now = SystemTime::now();
    (0..n)
        .map(|n| {
            let mut request = random_request(&mut rng);
            // A host of its own for each message: two requests for one host
            // in flight at once are deferred (`host busy`) until the first
            // ends, a wait the pipeline's rate is not about. Random names
            // of four characters would collide by the thousand.
            request.instance_name =
                InstanceName::parse(&format!("cattle-{n:07}")).expect("a valid instance name");
            request.hostname = Hostname::new(&request.instance_name, &Domain::default());
            if random_ids {
                request.message_id = uuid::Builder::from_random_bytes(rng.random()).into_uuid();
            }
            match &key {
                None => Bytes::from(request.to_wire()),
                Some(key) => {
                    let token = key
                        .sign(
                            &request.to_wire_request(),
                            SIGNER,
                            now,
                            Duration::from_secs(3600),
                        )
                        .expect("a request signs");
                    Bytes::from(token)
                }
            }
        })
        .collect()
}

/// The requester `--signed` payloads come from, and its key pair (a
/// throwaway Ed25519 pair, as `mandrill keygen` writes them).
pub(super) const SIGNER: &str = "bench";
const SIGNER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJKZIohg0kTgT0r1qaO/WUCF0GokEli8bJBBjTpGeOvA
-----END PRIVATE KEY-----
";
pub(super) const SIGNER_PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAiXnPth0YTU/nwanl6fRVhSdyP7GowJ3i9meT7iYSEjw=
-----END PUBLIC KEY-----
";

/// The parse rules the benchmark's worker uses.
pub(super) fn parse_rules() -> ParseRules {
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

/// (a) In memory: the pipeline's per-message work with nothing around it.
/// Timed, as the pipeline is, from the first publish to the last ack: each
/// payload is published into a queue (a locked `VecDeque`, as the memory
/// broker's); one loop pulls batches of up to 256, registers each delivery
/// in a lease map and spawns one task per message (into a `TaskTracker`, as
/// the worker tracks its handlers) that parses the payload into a
/// `RestartRequest`, waits `work` (the save), claims it in a map (attempt
/// counted), waits `work` (the restart, failing with probability
/// `fail_rate`), records the outcome and acks (removes the lease). No flow
/// control, no lease extension, no shutdown, no stats, no tracing.
pub(super) async fn in_memory(n: usize, work: Duration, fail_rate: f64) -> f64 {
    type Queue = Mutex<std::collections::VecDeque<(u64, Bytes)>>;
    let payloads = payloads(n, false);
    let rules = Arc::new(parse_rules());
    let store: Arc<Mutex<HashMap<Uuid, (u32, Status)>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(n)));
    let queue: Arc<Queue> = Arc::new(Mutex::new(std::collections::VecDeque::with_capacity(n)));
    let leases: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::with_capacity(n)));
    let tasks = TaskTracker::new();
    let started = Instant::now();
    for (tag, payload) in (0u64..).zip(payloads) {
        // A panic elsewhere would have ended the benchmark already.
        queue
            .lock()
            .expect("not poisoned")
            .push_back((tag, payload));
    }
    loop {
        let batch: Vec<(u64, Bytes)> = {
            let mut queue = queue.lock().expect("not poisoned");
            let take = queue.len().min(256);
            queue.drain(..take).collect()
        };
        if batch.is_empty() {
            break;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        {
            let mut leases = leases.lock().expect("not poisoned");
            for (tag, _) in &batch {
                leases.insert(*tag, deadline);
            }
        }
        for (tag, payload) in batch {
            let rules = rules.clone();
            let store = store.clone();
            let leases = leases.clone();
            tasks.spawn(async move {
                let request = parse(&payload, &rules);
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                let attempt = {
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
                leases.lock().expect("not poisoned").remove(&tag);
            });
        }
        // As the worker's pull loop: let the tasks just spawned run.
        tokio::task::yield_now().await;
    }
    tasks.close();
    tasks.wait().await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    assert_eq!(store.lock().expect("not poisoned").len(), n);
    assert!(leases.lock().expect("not poisoned").is_empty());
    rate
}

/// (c) NATS: a bare async-nats loop on a stream of its own (filled first,
/// untimed) that pulls continuously (batches of 256, as the worker's
/// `pull_batch`) and acks each message with a confirmed ack, up to
/// `max_in_flight` acks outstanding: it keeps pulling while acks are in
/// flight, as mandrill does. No other work.
pub(super) async fn nats(url: &str, stream_name: &str, subject: &str, n: usize) -> f64 {
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
    futures::stream::iter(payloads(n, false))
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

mod postgres;
mod sqlite;
mod sqlite_sqlx;

pub(super) use postgres::postgres;
pub(super) use sqlite::{Commits, sqlite};
pub(super) use sqlite_sqlx::{sqlite_sqlx, sqlite_sqlx_one_row};
