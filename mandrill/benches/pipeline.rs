//! The tutorial's workload through the real worker, measured.
//!
//! Over ~400 lines on purpose: `run` is the benchmark's script, set-up,
//! pipeline, ceilings and report in the order they happen; the parts that
//! stand alone are in `pipeline/` (options, the slow-save store, the
//! ceilings, Pub/Sub).
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
//! idle. `--db` chooses the store the same way (default: in memory).
//!
//! Each path's ceiling is measured in the same run, after the pipeline
//! (`pipeline/ceilings.rs` says what each does): (a) with broker and store in
//! memory, a one-task-per-message loop doing the same per-message work;
//! (b) with either on SQLite, one writer doing receipt, claim, outcome and
//! ack per message, a batch per transaction, with the same pragmas, and its
//! twins through sqlx (`ceiling_sqlite_sqlx_msgs_per_s` multi-row as the
//! writer writes, `ceiling_sqlite_sqlx_one_row_msgs_per_s`); (c) with
//! NATS, a bare loop that keeps pulling while its acks are in flight; (d)
//! with PostgreSQL, a bare batched `unnest` upsert loop. The line has
//! `ceiling_{memory,sqlite,nats,postgres}_msgs_per_s` and
//! `ratio_{memory,sqlite,nats,postgres}` (the pipeline's rate over the
//! ceiling), `null` where not measured.
//!
//! With `--broker pubsub://PROJECT/SUBSCRIPTION` (the service, or an
//! emulator named by `PUBSUB_EMULATOR_HOST`), the N requests are published
//! first to a topic and subscription of this run's own (the name is a
//! prefix), and `--pull` chooses how mandrill pulls. The same run measures
//! two ceilings on subscriptions of their own, with no other work: a bare
//! `StreamingPull` loop acking each chunk it takes in one call, and a bare
//! unary loop (`Pull` of 1000, one `Acknowledge` per batch);
//! `ratio_pubsub` is the pipeline's rate over the higher of the two.
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

use bytes::Bytes;
use futures::StreamExt;
use mandrill::Backoff;
use mandrill::Stats;
use mandrill::broker::nats::{Credentials, NatsBroker, NatsOptions};
use mandrill::broker::pubsub::PubSubBroker;
use mandrill::broker::sqlite::SqliteOptions;
use mandrill::broker::{AnyConsumer, Broker, MemoryBroker, Publisher as _, SqliteBroker};
use mandrill::domain::{Domain, ParseRules};
use mandrill::notify::{EventKind, Format, Notifier, NotifierSettings, NotifyEntry};
use mandrill::random_request;
use mandrill::restarter::{SimulatedRestarter, Simulation};
use mandrill::store::{AnyStore, MemoryStore, PostgresStore, SqliteStore};
use mandrill::worker::{Shutdown, Worker, WorkerConfig};
use options::{Options, parse_options};
use slow_save::SlowSaveStore;

/// The same allocator as the `mandrill` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

    // The names' streams are deleted when they are dropped, at the end.
    let nats_names = options
        .broker
        .starts_with("nats://")
        .then(|| nats_names::StreamNames::new(&options.broker, "bench"));
    let nats = nats_names.as_ref().map(nats_settings);
    let postgres = match options.db.starts_with("postgres://") {
        true => {
            Some(throwaway_postgres::TestDatabase::create_on(&options.db, "mandrill_bench").await)
        }
        false => None,
    };
    let pubsub = options
        .broker
        .starts_with("pubsub://")
        .then(|| pubsub::pubsub_options(&options.broker, &options.pull, n));
    // Each opened broker twice: to publish into, and typed as the worker's
    // consumer, as the service opens it (its calls are not boxed then).
    let (broker, consumer) = match &broker_url {
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
            both(Arc::new(broker))
        }
        None if nats.is_some() => {
            let settings = nats.clone().expect("checked just above");
            let broker = NatsBroker::connect(settings)
                .await
                .expect("nats broker opens");
            let publish_started = Instant::now();
            publish_concurrently(&broker, std::mem::take(&mut payloads)).await;
            publish_seconds = Some(publish_started.elapsed().as_secs_f64());
            both(Arc::new(broker))
        }
        None => both(Arc::new(MemoryBroker::new(
            Duration::from_secs(30),
            Duration::from_millis(100),
        ))),
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
            both(Arc::new(broker))
        }
    };
    // Typed, as the service opens it: the worker's calls are not boxed.
    let inner: AnyStore = match &db_url {
        None if postgres.is_some() => {
            let url = &postgres.as_ref().expect("checked just above").url;
            Arc::new(
                PostgresStore::connect_with(url, 16, options.writers)
                    .await
                    .expect("postgres store opens"),
            )
            .into()
        }
        None => Arc::new(MemoryStore::with_capacity(n)).into(),
        Some(url) => Arc::new(
            SqliteStore::connect(url, 4)
                .await
                .expect("sqlite store opens"),
        )
        .into(),
    };
    // Wrapped only when the save takes time: the wrapper costs a second
    // boxed future per store call, which the service does not pay.
    let store: AnyStore = if options.work.is_zero() {
        inner
    } else {
        AnyStore::Other(Arc::new(SlowSaveStore {
            inner: inner.as_dyn(),
            work: options.work,
        }))
    };
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
    let worker = Worker::new(config, consumer, store.clone(), restarter, stats.clone())
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
    // The ceilings, each in this run, after the pipeline (its memory
    // figures are taken before they start).
    let measure = options.ceilings;
    let ceiling_memory = if measure && options.broker == "memory" && options.db == "memory" {
        Some(ceilings::in_memory(n, options.work, options.fail_rate).await)
    } else {
        None
    };
    let ceiling_sqlite = match measure && (broker_url.is_some() || db_url.is_some()) {
        true => Some(ceilings::sqlite(n, dir.path()).await),
        false => None,
    };
    // (b)'s work through sqlx, multi-row as the writer and one-row as (b):
    // the writer's driver is chosen by these against (b).
    let ceiling_sqlite_sqlx = match ceiling_sqlite {
        Some(_) => Some((
            ceilings::sqlite_sqlx(n, dir.path()).await,
            ceilings::sqlite_sqlx_one_row(n, dir.path()).await,
        )),
        None => None,
    };
    let ceiling_nats = match &nats {
        Some(settings) if measure => Some(
            ceilings::nats(
                &settings.url,
                &format!("{}_CEILING", settings.stream),
                &format!("{}.ceiling", settings.subject),
                n,
            )
            .await,
        ),
        _ => None,
    };
    let ceiling_postgres = match &postgres {
        Some(_) if measure => Some(ceilings::postgres(&options.db, n, options.writers).await),
        _ => None,
    };
    let ceiling_pubsub = match &pubsub {
        Some(options) if measure => Some(pubsub::bare_pubsub_rates(options, n).await),
        _ => None,
    };
    // Drops the database, if there is one.
    drop(postgres);
    drop(nats_names);
    let acked = stats.acked.get();
    let ratio = |ceiling: f64| (msgs_per_s / ceiling * 1e3).round() / 1e3;
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
            // Each ceiling, and the pipeline's rate over it (module `ceilings`).
            "ceiling_memory_msgs_per_s": ceiling_memory.map(f64::round),
            "ratio_memory": ceiling_memory.map(ratio),
            "ceiling_sqlite_msgs_per_s": ceiling_sqlite.map(f64::round),
            "ratio_sqlite": ceiling_sqlite.map(ratio),
            "ceiling_sqlite_sqlx_msgs_per_s": ceiling_sqlite_sqlx.map(|(multi, _)| multi.round()),
            "ceiling_sqlite_sqlx_one_row_msgs_per_s": ceiling_sqlite_sqlx.map(|(_, one)| one.round()),
            "ceiling_nats_msgs_per_s": ceiling_nats.map(f64::round),
            "ratio_nats": ceiling_nats.map(ratio),
            "ceiling_postgres_msgs_per_s": ceiling_postgres.map(f64::round),
            "ratio_postgres": ceiling_postgres.map(ratio),
            "pull": pubsub.as_ref().map(|_| options.pull.clone()),
            "ceiling_pubsub_streaming_msgs_per_s": ceiling_pubsub.map(|(streaming, _)| streaming.round()),
            "ceiling_pubsub_unary_msgs_per_s": ceiling_pubsub.map(|(_, unary)| unary.round()),
            // Over the higher of the two.
            "ratio_pubsub": ceiling_pubsub.map(|(streaming, unary)| ratio(streaming.max(unary))),
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
/// A broker as the benchmark publishes into it, and as the worker's typed
/// consumer.
fn both<B: Broker>(broker: Arc<B>) -> (Arc<dyn Broker>, AnyConsumer) {
    (broker.clone(), broker.into())
}

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

/// The broker's settings on this run's own names.
fn nats_settings(names: &nats_names::StreamNames) -> NatsOptions {
    NatsOptions {
        url: names.url.clone(),
        stream: names.stream.clone(),
        subject: names.subject.clone(),
        consumer: names.consumer.clone(),
        dead_letter_subject: names.dead_letter_subject.clone(),
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

#[path = "pipeline/ceilings.rs"]
mod ceilings;
#[path = "pipeline/options.rs"]
mod options;
#[path = "pipeline/pubsub.rs"]
mod pubsub;
#[path = "pipeline/slow_save.rs"]
mod slow_save;

/// NATS names of this run's own (the tests' helper).
#[path = "../tests/services/nats_names.rs"]
mod nats_names;

/// A throwaway PostgreSQL database (the tests' helper).
#[path = "../tests/services/postgres.rs"]
mod throwaway_postgres;
