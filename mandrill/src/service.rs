//! Wiring: builds the adapters a configuration names, runs the worker with its
//! companions (demo publisher, stall detector, status line), and shuts down in
//! order: stop pulling, drain within the grace period, nack the rest, close
//! the broker and the store, report the counters.
//!
//! Signals are not read here: the caller passes a [`Shutdown`], so tests drive
//! the same code with their own.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::admin::Admin;
use crate::broker::nats::{NatsBroker, NatsOptions, NatsPublisher};
use crate::broker::pubsub::{PubSubBroker, PubSubOptions, PubSubPublisher};
use crate::broker::sqlite::SqliteOptions;
use crate::broker::{
    Broker, BrokerUrl, BrokerUrlError, DeadLetterAdmin, MemoryBroker, Publisher, SqliteBroker,
};
use crate::config::{
    BrokerSettings, Config, RestarterKind, RestarterSettings, StoreSettings, redact_url,
};
use crate::notify::Notifier;
use crate::restarter::hosts::HostMap;
use crate::restarter::{
    Blocking, CommandRestarter, HttpRestarter, Journaled, Restarter, SimulatedBlockingRestarter,
    SimulatedRestarter, Simulation, SshRestarter, Verified,
};
use crate::safety::PolicyHandle;
use crate::safety::pause_file::PauseFile;
use crate::stats::{Stats, StatsSnapshot};
use crate::store::{MemoryStore, PostgresStore, SqliteStore, Store, Timestamp};
use crate::worker::{FlowControl, Shutdown, Worker};
use crate::{demo, diagnostics};

/// How long closing the broker, the store or the companions may take at
/// shutdown before it is given up on.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens the store `store.url` names, creating and migrating it if needed.
pub async fn open_store(config: &StoreSettings) -> anyhow::Result<Arc<dyn Store>> {
    let url = config.url.as_str();
    if url == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if url.starts_with("sqlite:") {
        let store = SqliteStore::connect(url, config.max_connections)
            .await
            .with_context(|| format!("cannot open store.url {:?}", redact_url(url)))?;
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PostgresStore::connect_with(url, config.max_connections, config.writers)
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
pub fn broker_url(config: &Config) -> anyhow::Result<BrokerUrl> {
    BrokerUrl::parse(&config.broker.url).map_err(|error| match error {
        BrokerUrlError::Unsupported(_) => anyhow!("broker.url {error}"),
        BrokerUrlError::PubSub(_) => anyhow!(error),
    })
}

/// Opens the SQLite queue `broker.url` names (`sqlite:PATH`), creating and
/// migrating it if needed.
pub async fn open_sqlite_broker(config: &BrokerSettings) -> anyhow::Result<SqliteBroker> {
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
/// and the in-memory one if that is it.
pub async fn open_broker(
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
pub async fn open_publisher(config: &Config) -> anyhow::Result<Arc<dyn Publisher>> {
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
pub async fn open_pubsub_publisher(config: &Config) -> anyhow::Result<PubSubPublisher> {
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

/// The dead-letter administration of the queue `broker.url` names, if its
/// broker keeps dead letters where they can be read back (`None` for NATS,
/// whose dead letters are on the `{stream}_DEAD` stream, and memory).
pub async fn open_dead_letter_admin(
    config: &Config,
) -> anyhow::Result<Option<Arc<dyn DeadLetterAdmin>>> {
    match broker_url(config)? {
        BrokerUrl::Sqlite { .. } => Ok(Some(Arc::new(open_sqlite_broker(&config.broker).await?))),
        BrokerUrl::PubSub { .. } => Ok(Some(Arc::new(open_pubsub_publisher(config).await?))),
        BrokerUrl::Nats { .. } | BrokerUrl::Memory => Ok(None),
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

/// The restarter `restarter.kind` names, journalled if `restarter.journal` is set.
pub fn build_restarter(config: &Config) -> anyhow::Result<Arc<dyn Restarter>> {
    let hosts = HostMap::new(&config.hosts).map_err(|why| anyhow!("hosts: {why}"))?;
    let restarter = build_backend(&config.restarter, &hosts)?;
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
    Verified::wrap(restarter, &config.verify, hosts).map_err(|why| anyhow!(why))
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
        RestarterKind::Command => Arc::new(
            CommandRestarter::new(&config.command, hosts.clone()).map_err(|why| anyhow!(why))?,
        ),
        RestarterKind::Ssh => {
            Arc::new(SshRestarter::new(&config.ssh, hosts.clone()).map_err(|why| anyhow!(why))?)
        }
        RestarterKind::Http => Arc::new(
            HttpRestarter::new(&config.http, hosts.clone())
                .map_err(|why| anyhow!("restarter.http.{why}"))?,
        ),
    })
}

/// What a configuration reload can change in a running service.
#[derive(Clone)]
pub struct Controls {
    flow: Arc<FlowControl>,
    simulate_rate: Arc<watch::Sender<f64>>,
    policy: PolicyHandle,
}

impl Controls {
    /// Applies the reloadable settings of `config`.
    pub fn apply(&self, config: &Config) {
        if self.flow.limit() != config.worker.max_in_flight {
            self.flow.set_limit(config.worker.max_in_flight);
            info!(
                max_in_flight = config.worker.max_in_flight,
                "flow control limit changed"
            );
        }
        self.simulate_rate.send_if_modified(|rate| {
            let changed = *rate != config.simulate.rate;
            *rate = config.simulate.rate;
            changed
        });
    }

    /// Puts the safety policy of `config` in force for every decision made
    /// from now on, if it is valid; else logs why, naming the key, and
    /// keeps the policy in force. `config` is the running configuration
    /// with the reloaded `[safety]`: the policy's defaults depend on the
    /// backend (`restarter.kind`), and that is only changed by a restart.
    pub fn apply_policy(&self, config: &Config) -> bool {
        let policy = match config.validate().and_then(|()| config.policy()) {
            Ok(policy) => policy,
            Err(error) => {
                error!(%error, "safety policy not reloaded; keeping the one in force");
                return false;
            }
        };
        let leashed = policy.dry_run;
        let old = self.policy.replace(policy);
        if old.dry_run != leashed {
            if leashed {
                warn!(
                    "LEASHED (dry run) by reload: restarts are decided and recorded, none is issued"
                );
            } else {
                warn!("UNLEASHED by reload: restarts of real hosts will be issued");
            }
        }
        info!("safety policy reloaded");
        true
    }
}

/// A service ready to run. See the module docs.
pub struct Service {
    config: Config,
    broker: Arc<dyn Broker>,
    memory_broker: Option<Arc<MemoryBroker>>,
    store: Arc<dyn Store>,
    worker: Worker,
    stats: Arc<Stats>,
    simulate_rate: Arc<watch::Sender<f64>>,
    /// Request shutdown once the broker's backlog is empty (`--until-idle`).
    until_idle: bool,
    /// The admin server, bound; `None` if `admin.listen` is `""`.
    admin: Option<Admin>,
    /// The watch on `safety.pause_file`, if set.
    pause_file: Option<PauseFile>,
    /// The `[[notify]]` endpoints' queue and sender; `None` without any.
    notifier: Option<Arc<Notifier>>,
}

impl Service {
    /// Connects everything `config` names. Fails naming the key at fault.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        // First, so that a port in use fails start-up before anything opens.
        let admin = Admin::bind(&config.admin).await?;
        let (broker, memory_broker) = open_broker(&config).await?;
        let store = open_store(&config.store).await?;
        let restarter = build_restarter(&config)?;
        let pause_file = match &config.safety.pause_file {
            Some(path) => Some(
                PauseFile::watch(path)
                    .map_err(|why| anyhow!("safety.pause_file {}: {why}", path.display()))?,
            ),
            None => None,
        };
        let stats = Arc::new(Stats::default());
        // Last, so that a failure above leaves no sending task behind.
        let notifier = Notifier::start(&config.notify, &config.notifier, stats.clone())?;
        let worker = Worker::new(
            config.worker_config(),
            broker.clone(),
            store.clone(),
            restarter,
            stats.clone(),
        )
        .with_notifier(notifier.clone());
        let (simulate_rate, _) = watch::channel(config.simulate.rate);
        Ok(Self {
            config,
            broker,
            memory_broker,
            store,
            worker,
            stats,
            simulate_rate: Arc::new(simulate_rate),
            until_idle: false,
            admin,
            pause_file,
            notifier,
        })
    }

    /// Makes [`Service::run`] request its own shutdown once the queue has
    /// nothing visible, delayed or in flight (for batch use and tests).
    pub fn stop_when_idle(mut self) -> Self {
        self.until_idle = true;
        self
    }

    /// Handles for applying a reload while running.
    pub fn controls(&self) -> Controls {
        Controls {
            flow: self.worker.flow_control(),
            simulate_rate: self.simulate_rate.clone(),
            policy: self.worker.policy(),
        }
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Where the admin server listens, if it does.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().and_then(Admin::local_addr)
    }

    /// The broker, e.g. to publish into an in-memory one.
    pub fn broker(&self) -> Arc<dyn Broker> {
        self.broker.clone()
    }

    /// Runs until `shutdown`, then shuts down in order. Returns the final
    /// counters, or an error if the service had to stop by itself.
    pub async fn run(mut self, shutdown: Shutdown) -> anyhow::Result<StatsSnapshot> {
        let companions = TaskTracker::new();
        let stop_companions = CancellationToken::new();
        // Serves through the drain (`/readyz` says 503 from the request on),
        // and stops with the other companions once the worker has stopped.
        if let Some(admin) = self.admin.take() {
            companions.spawn(admin.serve(
                self.stats.clone(),
                self.broker.clone(),
                self.store.clone(),
                shutdown.clone(),
                self.worker.policy(),
                self.notifier.clone(),
                stop_companions.clone(),
            ));
        }
        if self.config.simulate.enabled {
            let stop = stop_companions.clone();
            let requested = shutdown.clone();
            companions.spawn(demo::publish(
                self.broker.clone(),
                self.simulate_rate.subscribe(),
                self.config.simulate.malformed_rate,
                // Publishing stops first, as soon as shutdown is requested
                // (or when the worker stops by itself), even mid-burst.
                async move {
                    tokio::select! {
                        () = requested.requested() => {}
                        () = stop.cancelled() => {}
                    }
                },
            ));
        }
        if let Some(mut pause_file) = self.pause_file.take() {
            if let Err(error) = pause_file.apply(&*self.store).await {
                error!(%error, "could not apply the pause file at start-up; will try again");
            }
            companions.spawn(pause_file.run(
                self.store.clone(),
                self.config.safety.poll_interval,
                stop_companions.clone(),
            ));
        }
        if self.until_idle {
            companions.spawn(request_shutdown_when_idle(
                self.broker.clone(),
                self.stats.clone(),
                shutdown.clone(),
                // As often as the SQLite queue polls: `--until-idle` is
                // mostly used with it, and refused on Pub/Sub.
                self.config.broker.sqlite.poll_interval,
                stop_companions.clone(),
            ));
        }
        if !self.config.store.retention.is_zero() {
            companions.spawn(prune_history(
                self.store.clone(),
                self.config.store.retention,
                Duration::from_secs(60),
                stop_companions.clone(),
            ));
        }
        if self.config.debug.enabled {
            warn!(
                stall_threshold = ?self.config.debug.stall_threshold(),
                status_interval = ?self.config.debug.status_interval(),
                "DEBUG MODE: stalls, runtime metrics and per-message step timings are logged; \
                 not for production throughput"
            );
        }
        companions.spawn(diagnostics::watch_for_stalls(
            self.config.debug.stall_threshold(),
            self.stats.clone(),
            stop_companions.clone(),
        ));
        companions.spawn(diagnostics::report_status(
            self.config.debug.status_interval(),
            self.stats.clone(),
            stop_companions.clone(),
        ));
        info!(
            broker = %redact_url(&self.config.broker.url),
            store = %redact_url(&self.config.store.url),
            max_in_flight = self.config.worker.max_in_flight,
            simulate = self.config.simulate.enabled,
            restarter = ?self.config.restarter.kind,
            "mandrill started"
        );
        // Said loudly, whichever it is: an operator must never wonder.
        if self.config.dry_run() {
            warn!(
                "LEASHED (dry run): restarts are decided and recorded as dry-run, none is issued; \
                 `mandrill run --unleash` (or safety.dry_run = false) acts"
            );
        } else if self.config.restarter.kind.is_real() {
            warn!(
                restarter = ?self.config.restarter.kind,
                allow = ?self.config.safety.allow,
                deny = ?self.config.safety.deny,
                "UNLEASHED: restarts of real hosts will be issued"
            );
        }
        if let Ok(Some(calendar)) = self.config.calendar() {
            warn!(
                calendar = %calendar.describe(),
                "restarts only inside the calendar; outside it requests are deferred"
            );
        }

        let outcome = self.worker.run(shutdown).await;

        stop_companions.cancel();
        companions.close();
        // Every companion stops at its next step; bounded all the same.
        if tokio::time::timeout(CLOSE_TIMEOUT, companions.wait())
            .await
            .is_err()
        {
            warn!(timeout = ?CLOSE_TIMEOUT, "companion tasks did not stop in time; leaving them");
        }
        // After the drain and the admin server, whose events it sends;
        // bounded by notifier.flush_timeout.
        if let Some(notifier) = &self.notifier {
            notifier.close().await;
        }
        if let Some(memory) = &self.memory_broker {
            let depth = memory.depth();
            let unhandled = depth.ready + depth.delayed;
            if unhandled > 0 {
                warn!(
                    unhandled,
                    "the in-memory broker's queued messages are lost with the process"
                );
            }
        }
        // Bounded, so that a broker or store that stopped answering cannot
        // hold the exit: whatever they did not settle is redelivered.
        if tokio::time::timeout(CLOSE_TIMEOUT, self.broker.close())
            .await
            .is_err()
        {
            warn!(timeout = ?CLOSE_TIMEOUT, "the broker did not close in time");
        }
        if tokio::time::timeout(CLOSE_TIMEOUT, self.store.close())
            .await
            .is_err()
        {
            warn!(timeout = ?CLOSE_TIMEOUT, "the store did not close in time");
        }
        info!("store closed");
        let stats = self.stats.snapshot();
        info!(
            pulled = stats.pulled,
            acked = stats.acked,
            nacked = stats.nacked,
            dead_lettered = stats.dead_lettered,
            rejected = stats.rejected,
            restarted = stats.restarted,
            restart_failures = stats.restart_failures,
            duplicates = stats.duplicates,
            panics = stats.panics,
            lease_extensions = stats.lease_extensions,
            stalls = stats.stalls,
            settle_failures = stats.settle_failures,
            pull_failures = stats.pull_failures,
            store_failures = stats.store_failures,
            notifications_sent = stats.notifications_sent,
            notifications_failed = stats.notifications_failed,
            notifications_dropped = stats.notifications_dropped,
            "final stats"
        );
        outcome.context("the worker stopped by itself")?;
        Ok(stats)
    }
}

/// Rows deleted per pruning statement: small enough that the store's writer
/// (and so the pipeline) is never held for long.
const PRUNE_BATCH: u32 = 5_000;

/// Deletes finished requests older than `retention`, `first_after` start and
/// then every hour, in bounded batches with a pause between them.
async fn prune_history(
    store: Arc<dyn Store>,
    retention: Duration,
    first_after: Duration,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + first_after,
        Duration::from_secs(3600),
    );
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let cutoff = Timestamp::from_millis(
            Timestamp::now()
                .as_millis()
                .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)),
        );
        let mut pruned = 0u64;
        loop {
            match store.prune(cutoff, PRUNE_BATCH).await {
                Ok(rows) => {
                    pruned += rows;
                    if rows < u64::from(PRUNE_BATCH) {
                        break;
                    }
                }
                Err(error) => {
                    warn!(%error, "could not prune the history; will try again");
                    break;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = stop.cancelled() => return,
            }
        }
        if pruned > 0 {
            info!(
                pruned,
                ?retention,
                "pruned finished requests past their retention"
            );
        }
    }
}

/// Requests shutdown once the broker reports an empty backlog and no
/// delivery is being handled. Checks every `every`.
async fn request_shutdown_when_idle(
    broker: Arc<dyn Broker>,
    stats: Arc<Stats>,
    shutdown: Shutdown,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        // Raced against the stop, so that a broker that stopped answering
        // cannot hold the shutdown.
        let backlog = tokio::select! {
            backlog = broker.backlog() => backlog,
            () = stop.cancelled() => return,
        };
        match backlog {
            Ok(Some(0)) if stats.in_flight.get() == 0 => {
                info!("queue is idle: nothing visible, delayed or in flight; shutting down");
                shutdown.request();
                return;
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                warn!("this broker cannot report its backlog; --until-idle has no effect");
                return;
            }
            Err(error) => {
                warn!(error = %error.with_causes(), "could not read the broker's backlog")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Domain, Outcome, ParseRules, RestartRequest};

    fn request() -> RestartRequest {
        let payload = format!(
            r#"{{"message_id":"{}","instance_name":"cattle-old"}}"#,
            uuid::Uuid::new_v4()
        );
        let rules = ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 1024,
        };
        RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
    }

    #[tokio::test]
    async fn history_past_its_retention_is_pruned_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("h.db").display());
        let store: Arc<dyn Store> = Arc::new(SqliteStore::connect(&url, 2).await.unwrap());
        // More than one batch's worth would take long; two rows prove the rule.
        let (old, open) = (request(), request());
        store
            .record_outcome(&old, 1, &Outcome::restarted())
            .await
            .unwrap();
        store
            .claim_restart(
                &open,
                crate::store::ClaimTerms {
                    max_attempts: 1,
                    hold: Duration::from_secs(60),
                    limits: crate::safety::Limits::NONE,
                },
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stop = CancellationToken::new();
        let pruning = tokio::spawn(prune_history(
            store.clone(),
            Duration::from_millis(10),
            Duration::ZERO,
            stop.clone(),
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while store.history(10).await.unwrap().len() != 1 {
            assert!(tokio::time::Instant::now() < deadline, "never pruned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The request still in progress is kept, whatever its age.
        let kept = store.history(10).await.unwrap();
        assert_eq!(kept[0].message_id, Some(open.message_id));
        stop.cancel();
        pruning.await.unwrap();
        store.close().await;
    }
}
