//! Set-up per broker and store: this run's own names and databases, then
//! the broker (filled first where it is durable or remote) and the store,
//! each opened as the service opens it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::nats::{Credentials, NatsBroker, NatsOptions};
use crate::broker::pubsub::{PubSubBroker, PubSubOptions};
use crate::broker::{Broker, MemoryBroker, Publisher as _};
use crate::sqlite::{SqliteBroker, SqliteOptions, SqliteStore};
use crate::store::{MemoryStore, PostgresStore, Store};
use bytes::Bytes;
use futures::StreamExt;

use crate::bench::options::Options;
use crate::bench::slow_save::SlowSaveStore;
use crate::bench::{nats_names, pubsub, throwaway_postgres};

/// Where the run's broker and store live, and the names and database of
/// this run's own. Kept until the ceilings are measured (they use the same
/// servers); dropping it drops the database, then deletes the streams.
pub(super) struct Resources {
    /// The SQLite broker's URL; `None` when the broker is not SQLite.
    pub broker_url: Option<String>,
    /// The SQLite store's URL; `None` when the store is not SQLite.
    pub db_url: Option<String>,
    /// The NATS broker's settings, on this run's own names.
    pub nats: Option<NatsOptions>,
    /// The Pub/Sub broker's options, on this run's own topic and
    /// subscription.
    pub pubsub: Option<PubSubOptions>,
    /// A fresh database on the `--db postgres://…` server.
    pub postgres: Option<throwaway_postgres::TestDatabase>,
    // Only kept, to be dropped: declared last, so the streams are deleted
    // after the database is dropped.
    _nats_names: Option<nats_names::StreamNames>,
}

impl Resources {
    /// The names, and the database if there is one, for `options`; the
    /// SQLite files go in `dir`.
    pub(super) async fn create(options: &Options, dir: &Path) -> Self {
        let broker_url = sqlite_url(&options.broker, dir);
        let db_url = sqlite_url(&options.db, dir);
        let nats_names = options
            .broker
            .starts_with("nats://")
            .then(|| nats_names::StreamNames::new(&options.broker, "bench"));
        let nats = nats_names.as_ref().map(nats_settings);
        let postgres = match options.db.starts_with("postgres://") {
            true => Some(
                throwaway_postgres::TestDatabase::create_on(&options.db, "mandrill_bench").await,
            ),
            false => None,
        };
        let pubsub = options
            .broker
            .starts_with("pubsub://")
            .then(|| pubsub::pubsub_options(&options.broker, &options.pull, options.messages));
        Self {
            broker_url,
            db_url,
            nats,
            pubsub,
            postgres,
            _nats_names: nats_names,
        }
    }
}

/// The pipeline's broker and store, opened.
pub(super) struct Opened {
    /// The broker, as the benchmark publishes into it and the worker
    /// consumes from it.
    pub broker: Arc<dyn Broker>,
    /// The store.
    pub store: Arc<dyn Store>,
    /// What is left to publish while the worker runs: everything with the
    /// in-memory broker, nothing with the others, which are filled first.
    pub unpublished: Vec<Bytes>,
    /// How long filling the broker took, where it was filled first.
    pub publish_seconds: Option<f64>,
}

/// Opens the broker (publishing `payloads` into it first unless it is in
/// memory), then the store.
pub(super) async fn open(
    options: &Options,
    resources: &Resources,
    mut payloads: Vec<Bytes>,
) -> Opened {
    let (broker, publish_seconds) = open_broker(resources, &mut payloads).await;
    let store = open_store(options, resources).await;
    Opened {
        broker,
        store,
        unpublished: payloads,
        publish_seconds,
    }
}

/// The opened broker. A durable or remote broker takes `payloads` and is
/// filled (timed: the seconds returned); the in-memory one leaves them, to
/// be fed while the worker runs.
async fn open_broker(
    resources: &Resources,
    payloads: &mut Vec<Bytes>,
) -> (Arc<dyn Broker>, Option<f64>) {
    match &resources.broker_url {
        None if resources.pubsub.is_some() => {
            let options = resources.pubsub.clone().expect("checked just above");
            let broker = PubSubBroker::connect(options)
                .await
                .expect("pubsub broker opens");
            let publish_started = Instant::now();
            broker
                .publish_all(std::mem::take(payloads))
                .await
                .expect("pubsub publish");
            let publish_seconds = publish_started.elapsed().as_secs_f64();
            (Arc::new(broker), Some(publish_seconds))
        }
        None if resources.nats.is_some() => {
            let settings = resources.nats.clone().expect("checked just above");
            let broker = NatsBroker::connect(settings)
                .await
                .expect("nats broker opens");
            let publish_started = Instant::now();
            publish_concurrently(&broker, std::mem::take(payloads)).await;
            let publish_seconds = publish_started.elapsed().as_secs_f64();
            (Arc::new(broker), Some(publish_seconds))
        }
        None => (
            // Its queue sized for every message, as ceiling (a)'s is.
            Arc::new(MemoryBroker::with_capacity(
                Duration::from_secs(30),
                Duration::from_millis(100),
                payloads.len(),
            )),
            None,
        ),
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
            // `mandrill publish` does, and timed on its own.
            let publish_started = Instant::now();
            broker
                .publish_all(std::mem::take(payloads))
                .await
                .expect("sqlite publish");
            let publish_seconds = publish_started.elapsed().as_secs_f64();
            (Arc::new(broker), Some(publish_seconds))
        }
    }
}

/// The store, as the service opens it.
async fn open_store(options: &Options, resources: &Resources) -> Arc<dyn Store> {
    let inner: Arc<dyn Store> = match &resources.db_url {
        None if resources.postgres.is_some() => {
            let url = &resources.postgres.as_ref().expect("checked just above").url;
            Arc::new(
                PostgresStore::connect_with(
                    url,
                    16,
                    options.writers,
                    crate::store::DEFAULT_TIMEOUT,
                )
                .await
                .expect("postgres store opens"),
            )
        }
        None => Arc::new(MemoryStore::with_capacity(options.messages)),
        Some(url) => Arc::new(
            SqliteStore::connect(url, 4)
                .await
                .expect("sqlite store opens"),
        ),
    };
    // Wrapped only when the save takes time: the wrapper costs a second
    // boxed future per store call, which the service does not pay.
    if options.work.is_zero() {
        inner
    } else {
        Arc::new(SlowSaveStore {
            inner,
            work: options.work,
        })
    }
}

/// `memory` → `None`; `sqlite` → a file in `dir`; `sqlite:PATH` as given.
fn sqlite_url(option: &str, dir: &Path) -> Option<String> {
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
