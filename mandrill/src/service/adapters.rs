//! The adapters a configuration names: the store, the broker (or just its
//! publishing or dead-letter side), the restarter with its decorators.

use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};

use crate::broker::nats::{NatsBroker, NatsOptions, NatsPublisher};
use crate::broker::pubsub::{PubSubBroker, PubSubOptions, PubSubPublisher};
use crate::broker::{Broker, BrokerUrl, BrokerUrlError, DeadLetterAdmin, MemoryBroker, Publisher};
use crate::config::{
    BrokerSettings, Config, ConfigError, RestarterKind, RestarterSettings, StoreSettings,
    redact_url,
};
use crate::inventory::{Inventory, InventorySettings, Source};
use crate::restarter::hosts::HostMap;
use crate::restarter::{
    Blocking, CommandRestarter, Ec2Restarter, HttpRestarter, Journaled, Restarter,
    SimulatedBlockingRestarter, SimulatedRestarter, Simulation, SshRestarter, Verified,
};
use crate::sqlite::{SqliteBroker, SqliteOptions, SqliteStore};
use crate::store::{MemoryStore, PostgresStore, Store};

/// Opens the store `store.url` names, creating and migrating it if needed.
pub(crate) async fn open_store(config: &StoreSettings) -> anyhow::Result<Arc<dyn Store>> {
    let url = config.url.as_str();
    if url == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if url.starts_with("sqlite:") {
        let store = SqliteStore::connect_with(url, config.max_connections, config.timeout)
            .await
            .with_context(|| format!("cannot open store.url {:?}", redact_url(url)))?;
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PostgresStore::connect_with(
            url,
            config.max_connections,
            config.writers,
            config.timeout,
        )
        .await
        .with_context(|| format!("cannot open store.url {:?}", redact_url(url)))?;
        return Ok(Arc::new(store));
    }
    bail!(
        "store.url {:?} is not supported: use sqlite:PATH, postgres://… or memory",
        redact_url(url)
    )
}

/// `broker.url`, parsed.
pub(crate) fn broker_url(config: &Config) -> anyhow::Result<BrokerUrl> {
    BrokerUrl::parse(&config.broker.url).map_err(|error| match error {
        BrokerUrlError::Unsupported(_) | BrokerUrlError::SqliteInMemory(_) => {
            anyhow!("broker.url {error}")
        }
        BrokerUrlError::PubSub(_) => anyhow!(error),
    })
}

/// Opens the SQLite queue `broker.url` names (`sqlite:PATH`), creating and
/// migrating it if needed.
pub(crate) async fn open_sqlite_broker(config: &BrokerSettings) -> anyhow::Result<SqliteBroker> {
    let url = config.url.as_str();
    if !matches!(BrokerUrl::parse(url), Ok(BrokerUrl::Sqlite { .. })) {
        bail!(
            "broker.url {:?} is not a sqlite:PATH queue",
            redact_url(url)
        );
    }
    SqliteBroker::connect(&sqlite_options(config))
        .await
        .with_context(|| format!("cannot open broker.url {:?}", redact_url(url)))
}

/// The broker `broker.url` names, opened to consume (and publish into),
/// and the same broker as itself if it is the in-memory one (whose queue
/// the service reads directly).
pub(crate) async fn open_broker(
    config: &Config,
) -> anyhow::Result<(Arc<dyn Broker>, Option<Arc<MemoryBroker>>)> {
    let broker = &config.broker;
    let cannot_open = || format!("cannot open broker.url {:?}", redact_url(&broker.url));
    match broker_url(config)? {
        BrokerUrl::Memory => {
            let memory = Arc::new(MemoryBroker::new(broker.ack_deadline, broker.poll_wait));
            Ok((memory.clone(), Some(memory)))
        }
        BrokerUrl::Sqlite { .. } => {
            // A consumer reads at most the acceptable payload size plus one
            // byte of each message: an oversized one is rejected by its full
            // size without being loaded.
            let sqlite = SqliteBroker::connect_with_payload_limit(
                &sqlite_options(broker),
                config.message.max_payload_bytes,
            )
            .await
            .with_context(cannot_open)?;
            Ok((Arc::new(sqlite), None))
        }
        BrokerUrl::Nats { url, tls } => {
            let nats = NatsBroker::connect(nats_options(config, url, tls))
                .await
                .with_context(cannot_open)?;
            Ok((Arc::new(nats), None))
        }
        BrokerUrl::PubSub {
            project,
            subscription,
        } => {
            let pubsub = PubSubBroker::connect(pubsub_options(config, project, subscription))
                .await
                .with_context(cannot_open)?;
            Ok((Arc::new(pubsub), None))
        }
    }
}

/// A connection that only publishes into the queue `broker.url` names: it
/// leaves the consumer (subscription) to the consumers.
pub(crate) async fn open_publisher(config: &Config) -> anyhow::Result<Arc<dyn Publisher>> {
    match broker_url(config)? {
        BrokerUrl::Sqlite { .. } => Ok(Arc::new(open_sqlite_broker(&config.broker).await?)),
        BrokerUrl::Nats { url, tls } => {
            let nats = NatsPublisher::connect(nats_options(config, url, tls))
                .await
                .with_context(|| {
                    format!(
                        "cannot open broker.url {:?}",
                        redact_url(&config.broker.url)
                    )
                })?;
            Ok(Arc::new(nats))
        }
        BrokerUrl::PubSub { .. } => Ok(Arc::new(open_pubsub_publisher(config).await?)),
        // Only inside `mandrill run`: as a consumer.
        BrokerUrl::Memory => Ok(open_broker(config).await?.0),
    }
}

/// A Pub/Sub connection that publishes and administers dead letters.
pub(crate) async fn open_pubsub_publisher(config: &Config) -> anyhow::Result<PubSubPublisher> {
    let BrokerUrl::PubSub {
        project,
        subscription,
    } = broker_url(config)?
    else {
        bail!(
            "broker.url {:?} is not a pubsub://PROJECT/SUBSCRIPTION queue",
            redact_url(&config.broker.url)
        );
    };
    PubSubPublisher::connect(pubsub_options(config, project, subscription))
        .await
        .with_context(|| format!("cannot open broker.url {:?}", config.broker.url))
}

/// The dead-letter administration of the queue `broker.url` names: the
/// SQLite queue's table, the NATS `{stream}_DEAD` stream (through a
/// publisher: it never shapes the consumer), the Pub/Sub dead-letter
/// subscription. An in-memory queue keeps none outside its process.
pub(crate) async fn open_dead_letter_admin(
    config: &Config,
) -> anyhow::Result<Arc<dyn DeadLetterAdmin>> {
    let cannot_open = || {
        format!(
            "cannot open broker.url {:?}",
            redact_url(&config.broker.url)
        )
    };
    match broker_url(config)? {
        BrokerUrl::Sqlite { .. } => Ok(Arc::new(open_sqlite_broker(&config.broker).await?)),
        BrokerUrl::Nats { url, tls } => Ok(Arc::new(
            NatsPublisher::connect(nats_options(config, url, tls))
                .await
                .with_context(cannot_open)?,
        )),
        BrokerUrl::PubSub { .. } => Ok(Arc::new(open_pubsub_publisher(config).await?)),
        BrokerUrl::Memory => {
            bail!("an in-memory queue keeps its dead letters inside `mandrill run`")
        }
    }
}

/// The Pub/Sub broker's part of the configuration.
fn pubsub_options(config: &Config, project: String, subscription: String) -> PubSubOptions {
    let broker = &config.broker;
    PubSubOptions {
        project,
        subscription,
        settings: broker.pubsub.clone(),
        ack_deadline: broker.ack_deadline,
        poll_wait: broker.poll_wait,
        max_deliveries: broker.max_deliveries,
        max_in_flight: config.worker.max_in_flight,
    }
}

/// The SQLite queue's part of the configuration.
fn sqlite_options(broker: &BrokerSettings) -> SqliteOptions {
    SqliteOptions {
        url: broker.url.clone(),
        ack_deadline: broker.ack_deadline,
        poll_wait: broker.poll_wait,
        poll_interval: broker.sqlite.poll_interval,
    }
}

/// The NATS broker's part of the configuration.
fn nats_options(config: &Config, url: String, tls_scheme: bool) -> NatsOptions {
    let nats = &config.broker.nats;
    NatsOptions {
        url,
        stream: nats.stream.clone(),
        subject: nats.subject.clone(),
        consumer: nats.consumer.clone(),
        dead_letter_subject: nats.dead_letter_subject.clone(),
        ack_wait: config.broker.ack_deadline,
        max_ack_pending: nats.max_ack_pending,
        poll_wait: config.broker.poll_wait,
        credentials: nats.credentials(),
        tls: nats.tls || tls_scheme,
        tls_ca_file: nats.tls_ca_file.clone(),
    }
}

/// A restarter built, and the `ec2` backend inside it when it is that one.
pub(crate) struct BuiltRestarter {
    pub restarter: Arc<dyn Restarter>,
    /// Its companion starts instances a stop-start left stopped.
    pub ec2: Option<Arc<Ec2Restarter>>,
}

/// The restarter `restarter.kind` names, journalled if `restarter.journal`
/// is set.
pub(crate) fn build_restarter(config: &Config) -> anyhow::Result<BuiltRestarter> {
    let hosts = HostMap::new(&config.hosts).map_err(|why| anyhow!("hosts: {why}"))?;
    let ec2 = match config.restarter.kind {
        RestarterKind::Ec2 => Some(Arc::new(Ec2Restarter::new(&config.restarter.ec2)?)),
        _ => None,
    };
    let restarter = match &ec2 {
        Some(ec2) => ec2.clone() as Arc<dyn Restarter>,
        None => build_backend(&config.restarter, &hosts)?,
    };
    // The journal line is written before the backend is called, and
    // verification runs after it returns: journal(verify(backend)) would
    // also do, but verify(journal(backend)) keeps the journal a record of
    // restarts issued, not of probes.
    let restarter = match &config.restarter.journal {
        None => restarter,
        Some(path) => Arc::new(
            Journaled::open(restarter, path)
                .with_context(|| format!("cannot open restarter.journal {}", path.display()))?,
        ),
    };
    let restarter = Verified::wrap(restarter, &config.verify, hosts, ec2.clone())?;
    Ok(BuiltRestarter { restarter, ec2 })
}

fn build_backend(
    config: &RestarterSettings,
    hosts: &HostMap,
) -> anyhow::Result<Arc<dyn Restarter>> {
    let simulation = Simulation {
        min_latency: config.min_latency,
        max_latency: config.max_latency,
        failure_rate: config.failure_rate,
    };
    Ok(match config.kind {
        RestarterKind::Simulate => Arc::new(SimulatedRestarter(simulation)),
        RestarterKind::SimulateBlocking => Arc::new(Blocking::new(
            SimulatedBlockingRestarter(simulation),
            config.blocking_threads,
        )),
        RestarterKind::Command => Arc::new(CommandRestarter::new(&config.command, hosts.clone())?),
        RestarterKind::Ssh => Arc::new(SshRestarter::new(&config.ssh, hosts.clone())?),
        RestarterKind::Http => Arc::new(HttpRestarter::new(&config.http, hosts.clone())?),
        RestarterKind::Ec2 => Arc::new(Ec2Restarter::new(&config.ec2)?),
    })
}

/// The first load, which start-up and the commands that read the
/// inventory cannot do without: its failure is a configuration error
/// naming the source's key (exit code 2, which systemd does not retry),
/// not an outage to wait out.
pub(crate) async fn load_inventory(
    source: &Source,
    settings: &InventorySettings,
) -> Result<Inventory, ConfigError> {
    crate::inventory::load(source, settings)
        .await
        .map_err(|error| {
            ConfigError::invalid(
                source.key(),
                format!(
                    "cannot load the inventory: {}",
                    crate::causes::WithCauses(&error)
                ),
            )
        })
}
