//! The tutorial's workload through the real worker, measured.
//!
//! `cargo bench -p mandrill --bench pipeline -- --messages N --work-ms W --fail-rate F
//!  [--broker memory|sqlite:PATH|nats://HOST:PORT|pubsub://PROJECT/SUBSCRIPTION]
//!  [--pull unary|streaming] [--db memory|sqlite:PATH|postgres://…] [--writers N]`
//!
//! With the in-memory broker (the default), publishes N requests as fast as
//! possible while the worker handles them with `max_in_flight` = N (the
//! tutorial bounds nothing). Save and restart each wait W ms and restarts
//! fail with probability F; failures are not retried (max_attempts 1), as in
//! the tutorial, so they are dead-lettered. Prints one JSON line; `seconds`
//! runs from the first publish to the last settlement.
//!
//! With `--broker sqlite:PATH` (a real file; `sqlite` alone means a file in a
//! fresh temporary directory) the N requests are published first, in one
//! transaction, and `seconds` runs from the worker's start until the queue is
//! idle. `--db` chooses the store the same way (default: in memory). With
//! either on SQLite, the same run also measures the ceiling: a raw loop that
//! inserts N rows and deletes them again, batched like the broker's writer,
//! through sqlx with the same pragmas; `ratio` is the pipeline's rate over it.
//!
//! With `--broker pubsub://PROJECT/SUBSCRIPTION` (the service, or an
//! emulator named by `PUBSUB_EMULATOR_HOST`), the N requests are published
//! first to a topic and subscription of this run's own (the name is a
//! prefix), and `--pull` chooses how mandrill pulls. The same run measures
//! two ceilings on subscriptions of their own, with no other work: a bare
//! `StreamingPull` loop acking each chunk it takes in one call, and a bare
//! unary loop (`Pull` of 1000, one `Acknowledge` per batch);
//! `pubsub_ratio` is the pipeline's rate over the higher of the two.
//!
//! `--notify slow|down|URL` adds a `[[notify]]` endpoint wanting every
//! restarted and failed request (one event per message, the worst case):
//! `slow` is a receiver in this process that answers after 10 s, `down` a
//! port nothing listens on. The notification counts are in the line.
//! With `--db postgres://…`, a fresh database on that server is used (and
//! dropped), with a pool of 16 connections and `--writers` writer tasks
//! (default: the store's default).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use mandrill::backoff::Backoff;
use mandrill::broker::nats::{Credentials, NatsBroker, NatsOptions};
use mandrill::broker::pubsub::{PubSubBroker, PubSubOptions, PubSubSettings, PullMode};
use mandrill::broker::sqlite::SqliteOptions;
use mandrill::broker::{Broker, MemoryBroker, Publisher as _, SqliteBroker};
use mandrill::domain::{Domain, Outcome, ParseRules, RestartRequest, Status};
use mandrill::notify::{EventKind, Format, Notifier, NotifierSettings, NotifyEntry};
use mandrill::restarter::{SimulatedRestarter, Simulation};
use mandrill::simulate::random_request;
use mandrill::stats::Stats;
use mandrill::store::{
    Claim, ClaimTerms, HistoryEntry, MemoryStore, PostgresStore, Recorded, SqliteStore, Store,
    StoreError, Timestamp,
};
use mandrill::worker::{Shutdown, Worker, WorkerConfig};
use uuid::Uuid;

/// The same allocator as the `mandrill` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Options {
    messages: usize,
    work: Duration,
    fail_rate: f64,
    broker: String,
    pull: String,
    db: String,
    notify: Option<String>,
    writers: u32,
}

fn parse_options() -> Options {
    let mut options = Options {
        messages: 100_000,
        work: Duration::ZERO,
        fail_rate: 0.0,
        broker: "memory".into(),
        pull: "unary".into(),
        db: "memory".into(),
        notify: None,
        writers: mandrill::store::postgres::DEFAULT_WRITERS,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match arg.as_str() {
            "--messages" => options.messages = value("--messages").parse().expect("--messages N"),
            "--work-ms" => {
                options.work =
                    Duration::from_millis(value("--work-ms").parse().expect("--work-ms W"))
            }
            "--fail-rate" => {
                options.fail_rate = value("--fail-rate").parse().expect("--fail-rate F")
            }
            "--broker" => options.broker = value("--broker"),
            "--db" => options.db = value("--db"),
            "--pull" => options.pull = value("--pull"),
            "--notify" => options.notify = Some(value("--notify")),
            "--writers" => options.writers = value("--writers").parse().expect("--writers N"),
            // `cargo bench` passes --bench to harness-less benchmarks.
            "--bench" => {}
            other => {
                panic!(
                    "unknown argument {other:?}; expected --messages, --work-ms, --fail-rate, --broker, --pull, --db, --notify, --writers"
                )
            }
        }
    }
    options
}

/// A store, with `save` taking the simulated work time.
struct SlowSaveStore {
    inner: Arc<dyn Store>,
    work: Duration,
}

#[async_trait]
impl Store for SlowSaveStore {
    async fn lookup(&self, id: Uuid) -> Result<Option<Status>, StoreError> {
        self.inner.lookup(id).await
    }
    async fn claim_restart(
        &self,
        r: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        // The tutorial's save: now the claim, recorded before the restart.
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        self.inner.claim_restart(r, terms).await
    }
    async fn record_outcome(
        &self,
        r: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        self.inner.record_outcome(r, attempt, outcome).await
    }
    async fn release_claim(&self, r: &RestartRequest, attempt: u32) -> Result<(), StoreError> {
        self.inner.release_claim(r, attempt).await
    }
    async fn record_rejection(
        &self,
        id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.inner.record_rejection(id, reason, payload).await
    }
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.inner.history(limit).await
    }
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: mandrill::store::Decision<'_>,
    ) -> Result<(), StoreError> {
        self.inner.record_decision(request, attempt, decision).await
    }
    async fn story(&self, message_id: Uuid) -> Result<Option<mandrill::store::Story>, StoreError> {
        self.inner.story(message_id).await
    }
    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, mandrill::store::GroupUsage>, StoreError> {
        self.inner.group_usage(window_start, memory_start).await
    }
    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.inner.deferrals(message_id).await
    }
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.inner.prune(before, max_rows).await
    }
    async fn switch(&self) -> Result<mandrill::store::Switch, StoreError> {
        self.inner.switch().await
    }
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        self.inner.set_switch(paused, by, reason).await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let options = parse_options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime starts");
    runtime.block_on(run(options));
}

async fn run(options: Options) {
    let n = options.messages;
    // Payloads are made before the clock starts: the benchmark measures the
    // pipeline, not the random generator.
    let payloads: Vec<Bytes> = {
        let mut rng = rand::rng();
        (0..n)
            .map(|_| Bytes::from(random_request(&mut rng).to_wire()))
            .collect()
    };
    let baseline_kib = rss_kib("VmRSS:");
    // Kept until the end: the SQLite files live here.
    let dir = tempfile::tempdir().expect("temporary directory");
    let broker_url = sqlite_url(&options.broker, dir.path());
    let mut publish_seconds: Option<f64> = None;
    let mut payloads = payloads;
    let db_url = sqlite_url(&options.db, dir.path());

    let nats = options
        .broker
        .starts_with("nats://")
        .then(|| nats_settings(&options.broker));
    let postgres = match options.db.starts_with("postgres://") {
        true => {
            Some(throwaway_postgres::TestDatabase::create_on(&options.db, "mandrill_bench").await)
        }
        false => None,
    };
    let pubsub = options
        .broker
        .starts_with("pubsub://")
        .then(|| pubsub_options(&options.broker, &options.pull, n));
    let broker: Arc<dyn Broker> = match &broker_url {
        None if pubsub.is_some() => {
            let options = pubsub.clone().expect("checked just above");
            let broker = PubSubBroker::connect(options)
                .await
                .expect("pubsub broker opens");
            let publish_started = Instant::now();
            broker
                .publish_all(std::mem::take(&mut payloads))
                .await
                .expect("pubsub publish");
            publish_seconds = Some(publish_started.elapsed().as_secs_f64());
            Arc::new(broker)
        }
        None if nats.is_some() => {
            let settings = nats.clone().expect("checked just above");
            let broker = NatsBroker::connect(settings)
                .await
                .expect("nats broker opens");
            let publish_started = Instant::now();
            publish_concurrently(&broker, std::mem::take(&mut payloads)).await;
            publish_seconds = Some(publish_started.elapsed().as_secs_f64());
            Arc::new(broker)
        }
        None => Arc::new(MemoryBroker::new(
            Duration::from_secs(30),
            Duration::from_millis(100),
        )),
        Some(url) => {
            let config = SqliteOptions {
                url: url.clone(),
                ack_deadline: Duration::from_secs(30),
                poll_wait: Duration::from_millis(100),
                poll_interval: Duration::from_millis(10),
            };
            let broker = SqliteBroker::connect(&config)
                .await
                .expect("sqlite broker opens");
            // A durable queue is filled first, in one transaction, as
            // `mandrill publish` does, and timed on its own; the in-memory one
            // is fed while the worker runs.
            let publish_started = Instant::now();
            broker
                .publish_all(std::mem::take(&mut payloads))
                .await
                .expect("sqlite publish");
            publish_seconds = Some(publish_started.elapsed().as_secs_f64());
            Arc::new(broker)
        }
    };
    let inner: Arc<dyn Store> = match &db_url {
        None if postgres.is_some() => {
            let url = &postgres.as_ref().expect("checked just above").url;
            Arc::new(
                PostgresStore::connect_with(url, 16, options.writers)
                    .await
                    .expect("postgres store opens"),
            )
        }
        None => Arc::new(MemoryStore::with_capacity(n)),
        Some(url) => Arc::new(
            SqliteStore::connect(url, 4)
                .await
                .expect("sqlite store opens"),
        ),
    };
    let store = Arc::new(SlowSaveStore {
        inner,
        work: options.work,
    });
    let restarter = Arc::new(SimulatedRestarter(Simulation {
        min_latency: options.work,
        max_latency: options.work,
        failure_rate: options.fail_rate,
    }));
    let stats = Arc::new(Stats::default());
    let config = WorkerConfig {
        max_in_flight: n.max(1),
        pull_batch: 256,
        max_attempts: 1,
        max_deliveries: 10,
        retry_backoff: Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(1),
        },
        record_attempts: 1,
        record_backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
        restart_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(10),
        lease_extension_interval: None,
        max_pull_failures: 3,
        pull_backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
        parse: ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 4096,
        },
        switch_poll_interval: Duration::from_secs(1),
        policy: mandrill::safety::PolicyHandle::default(),
    };
    let shutdown = Shutdown::new();
    let notifier = match &options.notify {
        None => None,
        Some(target) => {
            let url = match target.as_str() {
                "slow" => slow_receiver().await,
                "down" => {
                    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
                    format!("http://{}/down", listener.local_addr().expect("bound"))
                }
                url => url.to_owned(),
            };
            let entry = NotifyEntry {
                url: mandrill::settings::Secret(url),
                format: Format::Json,
                events: vec![EventKind::Restarted, EventKind::Failed],
                timeout: Duration::from_secs(30),
            };
            Notifier::start(&[entry], &NotifierSettings::default(), stats.clone())
                .expect("notifier starts")
        }
    };
    let worker = Worker::new(
        config,
        broker.clone(),
        store.clone(),
        restarter,
        stats.clone(),
    )
    .with_notifier(notifier.clone());
    let started = Instant::now();
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    let publisher = tokio::spawn({
        let broker = broker.clone();
        async move {
            for payload in payloads {
                broker.publish(payload).await.expect("memory publish");
            }
        }
    });
    let n64 = n as u64;
    let mut reported = Instant::now();
    loop {
        let done = stats.acked.get() + stats.dead_lettered.get();
        if done >= n64 {
            break;
        }
        // A slow run says where it stands, so that a stall can be told
        // from a slow tail.
        if reported.elapsed() >= Duration::from_secs(30) {
            reported = Instant::now();
            eprintln!(
                "{:.0}s: {done} of {n} done; pulled {}, store failures {}, leases lost {}, \
                 abandoned {}, deferred {}, nacked {}",
                started.elapsed().as_secs_f64(),
                stats.pulled.get(),
                stats.store_failures.get(),
                stats.leases_lost.get(),
                stats.abandoned.get(),
                stats.deferred.get(),
                stats.nacked.get(),
            );
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    publisher.await.expect("publisher finishes");
    let peak_kib = rss_kib("VmHWM:");
    shutdown.request();
    worker
        .await
        .expect("worker task")
        .expect("worker stops cleanly");
    if let Some(notifier) = &notifier {
        notifier.close().await;
    }
    let backlog = broker.backlog().await.expect("backlog");
    assert!(
        matches!(backlog, Some(0) | None),
        "the queue is idle at the end"
    );
    broker.close().await;
    store.close().await;

    let msgs_per_s = n as f64 / seconds;
    let raw = if broker_url.is_some() || db_url.is_some() {
        Some(raw_sqlite_rate(n, dir.path()).await)
    } else {
        None
    };
    let bare_nats = match &nats {
        Some(settings) => Some(bare_nats_rate(settings, n).await),
        None => None,
    };
    let bare_pubsub = match &pubsub {
        Some(options) => Some(bare_pubsub_rates(options, n).await),
        None => None,
    };
    // Drops the database, if there is one.
    drop(postgres);
    if let Some(settings) = &nats {
        delete_streams(settings).await;
    }
    let acked = stats.acked.get();
    println!(
        "{}",
        serde_json::json!({
            "messages": n,
            "acked": acked,
            "seconds": (seconds * 1e4).round() / 1e4,
            "msgs_per_s": msgs_per_s.round(),
            // As given: `sqlite` alone is broker and store in one file.
            "broker": options.broker,
            "db": options.db,
            "writers": options.db.starts_with("postgres://").then_some(options.writers),
            "publish_seconds": publish_seconds.map(|s| (s * 1e4).round() / 1e4),
            "raw_sqlite_msgs_per_s": raw.map(f64::round),
            "ratio": raw.map(|raw| (msgs_per_s / raw * 1e3).round() / 1e3),
            "bare_nats_msgs_per_s": bare_nats.map(f64::round),
            "nats_ratio": bare_nats.map(|bare| (msgs_per_s / bare * 1e3).round() / 1e3),
            "pull": pubsub.as_ref().map(|_| options.pull.clone()),
            "bare_pubsub_streaming_msgs_per_s": bare_pubsub.map(|(streaming, _)| streaming.round()),
            "bare_pubsub_unary_msgs_per_s": bare_pubsub.map(|(_, unary)| unary.round()),
            "pubsub_ratio": bare_pubsub.map(|(streaming, unary)| {
                (msgs_per_s / streaming.max(unary) * 1e3).round() / 1e3
            }),
            "notify": options.notify,
            "notifications_sent": stats.notifications_sent.get(),
            "notifications_failed": stats.notifications_failed.get(),
            "notifications_dropped": stats.notifications_dropped.get(),
            "peak_rss_mb": (peak_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            "baseline_rss_mb": (baseline_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            // What went wrong on the way: a healthy run has no store
            // failures and no lost leases.
            "pulled": stats.pulled.get(),
            "store_failures": stats.store_failures.get(),
            "store_outages": stats.store_outages.get(),
            "leases_lost": stats.leases_lost.get(),
            "abandoned": stats.abandoned.get(),
            "deferred": stats.deferred.get(),
            "nacked": stats.nacked.get(),
        })
    );
}

/// A webhook receiver on this runtime that answers every POST after 10 s.
async fn slow_receiver() -> String {
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "ok"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/slow")
}

/// `memory` → `None`; `sqlite` → a file in `dir`; `sqlite:PATH` as given.
fn sqlite_url(option: &str, dir: &std::path::Path) -> Option<String> {
    match option {
        "memory" => None,
        // Broker and store share one file, as `mandrill run` does by default.
        "sqlite" => Some(format!("sqlite:{}", dir.join("mandrill.db").display())),
        url if url.starts_with("sqlite:") => Some(url.to_owned()),
        url if url.starts_with("nats://")
            || url.starts_with("postgres://")
            || url.starts_with("pubsub://") =>
        {
            None
        }
        other => {
            panic!("{other:?}: expected memory, sqlite, sqlite:PATH, nats://… or postgres://…")
        }
    }
}

/// The ceiling: inserting `n` rows into a queue-shaped table and deleting
/// them again, in transactions of the broker writer's batch size with one
/// statement per 500 inserts and one per batch of deletes, through sqlx with
/// the same pragmas. Messages per second.
async fn raw_sqlite_rate(n: usize, dir: &std::path::Path) -> f64 {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use sqlx::{ConnectOptions as _, Connection as _, QueryBuilder, Sqlite};

    const BATCH: usize = 1024;
    let mut conn = SqliteConnectOptions::new()
        .filename(dir.join("raw.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await
        .expect("raw database opens");
    sqlx::raw_sql(
        "CREATE TABLE q (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL,
                         published_at INTEGER NOT NULL, visible_at INTEGER NOT NULL,
                         deliveries INTEGER NOT NULL DEFAULT 0, lease INTEGER) STRICT;
         CREATE INDEX q_visible_at ON q (visible_at);",
    )
    .execute(&mut conn)
    .await
    .expect("raw table");
    let payload = Bytes::from(random_request(&mut rand::rng()).to_wire());
    let started = Instant::now();
    let mut ids = Vec::with_capacity(n);
    let mut left = n;
    while left > 0 {
        let count = left.min(BATCH);
        left -= count;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        for chunk_start in (0..count).step_by(500) {
            let rows = (count - chunk_start).min(500);
            let mut insert: QueryBuilder<Sqlite> =
                QueryBuilder::new("INSERT INTO q (payload, published_at, visible_at) ");
            insert.push_values(0..rows, |mut row, _| {
                row.push_bind(payload.as_ref())
                    .push_bind(0i64)
                    .push_bind(0i64);
            });
            insert.push(" RETURNING id");
            let inserted: Vec<i64> = insert
                .build_query_scalar()
                .fetch_all(&mut *tx)
                .await
                .expect("insert");
            ids.extend(inserted);
        }
        tx.commit().await.expect("commit");
    }
    for chunk in ids.chunks(BATCH) {
        let ids = serde_json::to_string(chunk).expect("ids serialise");
        sqlx::query("DELETE FROM q WHERE id IN (SELECT value FROM json_each(?1))")
            .bind(ids)
            .execute(&mut conn)
            .await
            .expect("delete");
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    conn.close().await.expect("raw database closes");
    rate
}

/// Private topic and subscription names for one run on
/// `pubsub://PROJECT/PREFIX`.
fn pubsub_options(url: &str, pull: &str, n: usize) -> PubSubOptions {
    let (project, prefix) = mandrill::broker::pubsub::settings::parse_url(url).expect("pubsub url");
    let id = &Uuid::new_v4().simple().to_string()[..12];
    PubSubOptions {
        project,
        subscription: format!("{prefix}-{id}"),
        settings: PubSubSettings {
            topic: format!("{prefix}-{id}-requests"),
            dead_letter_topic: format!("{prefix}-{id}-dead"),
            dead_letter_subscription: format!("{prefix}-{id}-dead"),
            pull: match pull {
                "unary" => PullMode::Unary,
                "streaming" => PullMode::Streaming,
                other => panic!("--pull {other:?}: expected unary or streaming"),
            },
            poll_interval: Duration::from_millis(10),
            ..PubSubSettings::default()
        },
        ack_deadline: Duration::from_secs(60),
        poll_wait: Duration::from_millis(100),
        max_deliveries: 10,
        max_in_flight: n.max(1),
    }
}

/// The ceilings: bare loops on subscriptions of their own, each taking `n`
/// messages and acking them in batches, with no other work. Returns
/// (streaming, unary) in messages per second.
async fn bare_pubsub_rates(options: &PubSubOptions, n: usize) -> (f64, f64) {
    use gcloud_pubsub::client::{Client, ClientConfig};
    use gcloud_pubsub::subscriber::SubscriberConfig;
    use gcloud_pubsub::subscription::{SubscribeConfig, SubscriptionConfig};

    let config = ClientConfig {
        project_id: Some(options.project.clone()),
        ..ClientConfig::default()
    };
    let client = Client::new(config).await.expect("pubsub client");
    let mut rng = rand::rng();
    let payloads: Vec<Bytes> = (0..n)
        .map(|_| Bytes::from(random_request(&mut rng).to_wire()))
        .collect();
    let mut rates = Vec::new();
    for mode in ["streaming", "unary"] {
        let topic_id = format!("{}-bare-{mode}", options.subscription);
        let topic = client
            .create_topic(&topic_id, None, None)
            .await
            .expect("bare topic");
        let subscription = client
            .create_subscription(
                &topic_id,
                &topic_id,
                SubscriptionConfig {
                    ack_deadline_seconds: 60,
                    ..SubscriptionConfig::default()
                },
                None,
            )
            .await
            .expect("bare subscription");
        let publisher = topic.new_publisher(None);
        for chunk in payloads.chunks(1000) {
            let messages = chunk
                .iter()
                .map(|payload| gcloud_googleapis::pubsub::v1::PubsubMessage {
                    data: payload.to_vec(),
                    ..Default::default()
                })
                .collect();
            publisher
                .publish_immediately(messages, None)
                .await
                .expect("bare publish");
        }
        let started = Instant::now();
        let mut acked = 0;
        if mode == "streaming" {
            let config = SubscribeConfig::default().with_subscriber_config(SubscriberConfig {
                max_outstanding_messages: 1000,
                ..SubscriberConfig::default()
            });
            let mut stream = subscription
                .subscribe(Some(config))
                .await
                .expect("bare stream")
                .ready_chunks(1000);
            while acked < n {
                let chunk = stream.next().await.expect("stream open");
                acked += chunk.len();
                let ids = chunk.into_iter().map(|m| m.ack_id).collect();
                subscription.ack(ids).await.expect("bare ack");
            }
            stream.into_inner().dispose().await;
        } else {
            while acked < n {
                let batch = subscription.pull(1000, None).await.expect("bare pull");
                acked += batch.len();
                let ids = batch.into_iter().map(|m| m.ack_id).collect();
                subscription.ack(ids).await.expect("bare ack");
            }
        }
        rates.push(n as f64 / started.elapsed().as_secs_f64());
        let _ = subscription.delete(None).await;
        let _ = topic.delete(None).await;
    }
    (rates[0], rates[1])
}

/// Private stream and consumer names for one run on `url`.
fn nats_settings(url: &str) -> NatsOptions {
    let id = Uuid::new_v4().simple().to_string();
    NatsOptions {
        url: url.to_owned(),
        stream: format!("MANDRILL_BENCH_{id}"),
        subject: format!("mandrill.bench.{id}.requests"),
        consumer: format!("mandrill-bench-{id}"),
        dead_letter_subject: format!("mandrill.bench.{id}.dead"),
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 100_000,
        poll_wait: Duration::from_millis(100),
        credentials: Credentials::None,
        tls: false,
        tls_ca_file: None,
    }
}

/// Publishes with up to 512 confirmations outstanding.
async fn publish_concurrently(broker: &NatsBroker, payloads: Vec<Bytes>) {
    futures::stream::iter(payloads)
        .map(|payload| broker.publish(payload))
        .buffer_unordered(512)
        .for_each(|published| async move { published.expect("nats publish") })
        .await;
}

async fn delete_streams(settings: &NatsOptions) {
    let client = async_nats::connect(settings.url.as_str())
        .await
        .expect("nats");
    let js = async_nats::jetstream::new(client);
    for stream in [
        settings.stream.clone(),
        format!("{}_DEAD", settings.stream),
        format!("{}_BARE", settings.stream),
    ] {
        let _ = js.delete_stream(stream).await;
    }
}

/// The ceiling: a bare async-nats loop that pulls the same number of
/// messages from a stream of its own and acks each (confirmed, as mandrill
/// acks, and concurrently, as mandrill's handlers do), with no other work.
async fn bare_nats_rate(settings: &NatsOptions, n: usize) -> f64 {
    use async_nats::jetstream::consumer::{PullConsumer, pull};
    use async_nats::jetstream::{AckKind, stream};

    let client = async_nats::connect(settings.url.as_str())
        .await
        .expect("nats");
    let js = async_nats::jetstream::new(client);
    let subject = format!("{}.bare", settings.subject);
    let stream = js
        .create_stream(stream::Config {
            name: format!("{}_BARE", settings.stream),
            subjects: vec![subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .expect("bare stream");
    let mut rng = rand::rng();
    let payloads: Vec<Bytes> = (0..n)
        .map(|_| Bytes::from(random_request(&mut rng).to_wire()))
        .collect();
    futures::stream::iter(payloads)
        .map(|payload| {
            let js = js.clone();
            let subject = subject.clone();
            async move {
                js.publish(subject, payload)
                    .await
                    .expect("publish")
                    .await
                    .expect("confirmed")
            }
        })
        .buffer_unordered(512)
        .for_each(|_| async {})
        .await;
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bare".into()),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 100_000,
            ..Default::default()
        })
        .await
        .expect("bare consumer");
    let started = Instant::now();
    let mut acked = 0;
    while acked < n {
        let mut batch = consumer
            .fetch()
            .max_messages(256)
            .messages()
            .await
            .expect("fetch");
        let mut acks = Vec::new();
        while let Some(message) = batch.next().await {
            let message = message.expect("message");
            acks.push(async move { message.double_ack_with(AckKind::Ack).await.expect("ack") });
        }
        acked += acks.len();
        futures::future::join_all(acks).await;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// A throwaway PostgreSQL database (the tests' helper).
#[path = "../tests/services/postgres.rs"]
mod throwaway_postgres;
