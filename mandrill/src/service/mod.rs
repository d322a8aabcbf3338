//! Wiring: builds the adapters a configuration names, runs the worker with its
//! companions (demo publisher, stall detector, status line, the switch's
//! notifications, the pause file), and shuts down in
//! order: stop pulling, drain within the grace period, nack the rest, close
//! the broker and the store, report the counters.
//!
//! Signals are not read here: the caller passes a [`Shutdown`], so tests drive
//! the same code with their own.
//!
//! Start-up and shutdown order is one sequence, so one file past 400 lines.

mod adapters;
mod companions;
pub(crate) mod objectives;
mod pause_file;
mod records;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::admin::Admin;
use crate::broker::{Broker, MemoryBroker};
use crate::config::{Config, ConfigError, redact_url};
use crate::inventory::{InventoryHandle, InventorySettings, Source};
use crate::notify::Notifier;
use crate::safety::requesters::RequesterSettings;
use crate::safety::{PolicyHandle, Requesters};
use crate::stats::{Stats, StatsSnapshot};
use crate::store::Store;
use crate::worker::{FlowControl, Shutdown, Worker};
use crate::{demo, diagnostics};
use pause_file::PauseFile;
pub use records::Records;

pub(crate) use adapters::{
    BuiltRestarter, broker_url, build_restarter, load_inventory, open_broker,
    open_dead_letter_admin, open_publisher, open_pubsub_publisher, open_sqlite_broker, open_store,
};
use companions::{prune_history, request_shutdown_when_idle};

/// How long closing the broker, the store or the companions may take at
/// shutdown before it is given up on.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long start-up waits for the store's leash before saying the
/// instance's own mode (the worker reads it again before its first pull).
const LEASH_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// What a configuration reload can change in a running service.
#[derive(Clone)]
pub(crate) struct Controls {
    flow: Arc<FlowControl>,
    simulate_rate: Arc<watch::Sender<f64>>,
    policy: PolicyHandle,
    inventory: InventoryHandle,
    inventory_settings: Arc<watch::Sender<InventorySettings>>,
    /// Set while a refused reload left no requester trusted.
    requesters_distrusted: Arc<AtomicBool>,
}

impl Controls {
    /// Applies the reloadable settings of `config`.
    pub(crate) fn apply(&self, config: &Config) {
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
        // The refresh task reads a changed `[inventory]` at once.
        self.inventory_settings.send_if_modified(|settings| {
            let changed = *settings != config.inventory;
            settings.clone_from(&config.inventory);
            changed
        });
    }

    /// Puts the safety policy of `config` in force for every decision made
    /// from now on, if it is valid; else logs why, naming the key, and
    /// keeps the policy in force. `config` is the running configuration
    /// with the reloaded `[safety]`: the policy's defaults depend on the
    /// backend (`restarter.kind`), and that is only changed by a restart.
    /// A requester whose key cannot be used is left out, logged naming its
    /// key: it is no longer trusted.
    pub(crate) fn apply_policy(&self, config: &Config) -> bool {
        let policy = match config
            .validate_for_reload()
            .and_then(|()| config.reloaded_policy())
        {
            Ok((policy, left_out)) => {
                for (key, why) in left_out {
                    error!(
                        key,
                        why,
                        "requester left out: its key cannot be used, so it is no longer trusted"
                    );
                }
                with_inventory(policy, config, &self.inventory)
            }
            Err(error) => {
                error!(%error, "safety policy not reloaded; keeping the one in force");
                return false;
            }
        };
        let leashed = policy.dry_run;
        let old = self.policy.replace(policy);
        // Only a change of the file's own `safety.dry_run` turns it (the
        // caller keeps the running value otherwise).
        let why = "the configuration file's own safety.dry_run changed";
        let in_force = self.policy.leash();
        match (old.dry_run != leashed, in_force.from, leashed) {
            (false, ..) => {}
            (true, crate::safety::leash::LeashFrom::Store, _) => warn!(
                why,
                own = if leashed { "leashed" } else { "unleashed" },
                in_force = %in_force.describe(),
                "this instance's own leash turned by reload, but the leash recorded in the store \
                 decides: `mandrill leash` and `mandrill unleash --reason …` turn it"
            ),
            (true, _, true) => warn!(
                why,
                "LEASHED (dry run) by reload: restarts are decided and recorded, none is issued"
            ),
            (true, _, false) => warn!(
                why,
                "UNLEASHED by reload: restarts of real hosts will be issued"
            ),
        }
        self.requesters_distrusted.store(false, Ordering::Relaxed);
        info!("safety policy reloaded");
        true
    }

    /// The mode in force, since when, by whom or what (see
    /// [`PolicyHandle::leash`]).
    pub(crate) fn leash(&self) -> crate::safety::Leash {
        self.policy.leash()
    }

    /// Records what leashed (or unleashed) the service at start-up, for
    /// `/api/status` and `mandrill status`.
    pub(crate) fn leashed_at_start_by(&self, by: &str) {
        self.policy.leashed_at_start_by(by);
    }

    /// Stops trusting every requester's key, and refuses unsigned
    /// requests, in the policy in force (the rest of it stays): what a
    /// reload refused for its `[[requesters]]` falls back to (`why`), since the edit it could not
    /// read may have been a revocation (fail closed). The next valid reload
    /// puts requesters back.
    pub(crate) fn distrust_requesters(&self, why: &ConfigError) {
        let mut policy = (*self.policy.current()).clone();
        policy.requesters = Arc::new(Requesters::refuse_unsigned());
        self.policy.replace(policy);
        self.requesters_distrusted.store(true, Ordering::Relaxed);
        error!(
            error = %why.with_causes(),
            "[[requesters]] could not be reloaded: no requester is trusted, and unsigned \
             requests are refused, until a reload succeeds"
        );
    }

    /// Stops trusting each requester whose entry `entries` (the
    /// `[[requesters]]` of a reload refused for another key) removes or
    /// changes (every one, given none: a file that cannot be read), in the
    /// policy in force; the others, and the rest of the policy, stay. A
    /// reload refused for a typo elsewhere must not keep a key the same
    /// edit revoked. Until a reload succeeds.
    pub(crate) fn revoke_changed_requesters(&self, entries: &[RequesterSettings]) {
        let mut policy = (*self.policy.current()).clone();
        let (kept, revoked) = policy.requesters.keeping_unchanged(entries);
        if revoked.is_empty() {
            return;
        }
        policy.requesters = Arc::new(kept);
        self.policy.replace(policy);
        self.requesters_distrusted.store(true, Ordering::Relaxed);
        for requester in revoked {
            error!(
                requester,
                "requester revoked: the refused reload removes or changes its entry (or its file \
                 cannot be read), so it is no longer trusted until a reload succeeds"
            );
        }
    }

    /// Whether [`distrust_requesters`](Self::distrust_requesters) is in
    /// force: the next reload must then rebuild the policy, though its
    /// configuration may not differ from the running one.
    pub(crate) fn requesters_distrusted(&self) -> bool {
        self.requesters_distrusted.load(Ordering::Relaxed)
    }
}

/// `policy` deciding with `inventory` when `config` names one.
fn with_inventory(
    mut policy: crate::safety::Policy,
    config: &Config,
    inventory: &InventoryHandle,
) -> crate::safety::Policy {
    policy.inventory = config.inventory.is_configured().then(|| inventory.clone());
    policy
}

/// A service ready to run. See the module docs.
pub(crate) struct Service {
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
    /// The inventory in force (empty without `[inventory]`).
    inventory: InventoryHandle,
    /// `[inventory]` as the refresh task reads it; a reload sends the new one.
    inventory_settings: Arc<watch::Sender<InventorySettings>>,
    /// The refresh task's end of `inventory_settings`, made with it: a
    /// reload sent before the task first runs is still a change to it.
    inventory_reloads: watch::Receiver<InventorySettings>,
    /// `[[schedule]]`, ready to run beside the worker.
    schedules: Vec<crate::schedule::Scheduled>,
    /// The `ec2` restarter, whose companion starts instances a stop-start
    /// left stopped.
    ec2: Option<Arc<crate::restarter::Ec2Restarter>>,
}

impl Service {
    /// Connects everything `config` names. Fails naming the key at fault.
    pub(crate) async fn build(config: Config) -> anyhow::Result<Self> {
        // First, so that a port in use fails start-up before anything opens.
        let admin = Admin::bind(
            &config.admin,
            config.admin_token_file().as_deref(),
            config.admin_instances_dir().as_deref(),
        )
        .await?;
        let (broker, memory_broker) = open_broker(&config).await?;
        let store = open_store(&config.store).await?;
        // Building a backend reads only its settings and the files they
        // name: a failure is the configuration's (exit code 2, not retried).
        let BuiltRestarter { restarter, ec2 } = build_restarter(&config)
            .map_err(|error| ConfigError::invalid("restarter", format!("{error:#}")))?;
        // Temporary AWS credentials are fetched once here, so that a
        // machine without any fails at start-up rather than at its first
        // restart.
        if let Some(ec2) = &ec2 {
            ec2.check_credentials()
                .await
                .map_err(|why| ConfigError::invalid("restarter.ec2", why))?;
        }
        let pause_file = match &config.safety.pause_file {
            Some(path) => Some(PauseFile::watch(path).map_err(|error| {
                ConfigError::invalid(
                    "safety.pause_file",
                    format!("{}: {}", path.display(), crate::causes::WithCauses(&error)),
                )
            })?),
            None => None,
        };
        // A first load that fails stops start-up, naming the source: an
        // operator who configured an inventory is told at once, rather than
        // finding every request deferred.
        let inventory = match Source::of(&config.inventory) {
            Some(source) => {
                let loaded = load_inventory(&source, &config.inventory).await?;
                info!(
                    source = %source,
                    hosts = loaded.len(),
                    groups = loaded.groups().len(),
                    skipped = loaded.skipped.len(),
                    "inventory loaded"
                );
                InventoryHandle::new(loaded, &source, &config.inventory)
            }
            None => {
                let handle = InventoryHandle::default();
                handle.set_limits(&config.inventory);
                handle
            }
        };
        let schedules = config.schedules()?;
        crate::config::schedule_groups_known(&schedules, &inventory)?;
        let stats = Arc::new(Stats::default());
        // Last, so that a failure above leaves no sending task behind.
        let notifier = Notifier::start(&config.notify, &config.notifier, stats.clone())?;
        let worker_config = config.worker_config();
        let policy = with_inventory(
            (*worker_config.policy.current()).clone(),
            &config,
            &inventory,
        );
        worker_config.policy.replace(policy);
        let worker = Worker::new(
            worker_config,
            broker.clone(),
            store.clone(),
            restarter,
            stats.clone(),
        )
        .with_notifier(notifier.clone());
        let (simulate_rate, _) = watch::channel(config.simulate.rate);
        let (inventory_settings, inventory_reloads) = watch::channel(config.inventory.clone());
        Ok(Self {
            schedules,
            ec2,
            inventory,
            inventory_settings: Arc::new(inventory_settings),
            inventory_reloads,
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
    pub(crate) fn stop_when_idle(mut self) -> Self {
        self.until_idle = true;
        self
    }

    /// Handles for applying a reload while running.
    pub(crate) fn controls(&self) -> Controls {
        Controls {
            flow: self.worker.flow_control(),
            simulate_rate: self.simulate_rate.clone(),
            policy: self.worker.policy(),
            inventory: self.inventory.clone(),
            inventory_settings: self.inventory_settings.clone(),
            requesters_distrusted: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Runs until `shutdown`, then shuts down in order. Returns the final
    /// counters, or an error if the service had to stop by itself.
    pub(crate) async fn run(mut self, shutdown: Shutdown) -> anyhow::Result<StatsSnapshot> {
        // Before the pause file is applied: a pause it makes now is a change.
        let started = crate::domain::Timestamp::now();
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
                crate::schedule::Outlook::new(
                    self.schedules.clone(),
                    self.config.parse_rules().domain,
                ),
                self.config.redactor(),
                stop_companions.clone(),
            ));
        }
        companions.spawn(crate::inventory::refresh_task(
            self.inventory.clone(),
            self.inventory_reloads.clone(),
            stop_companions.clone(),
        ));
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
        // Whoever turns the switch (`mandrill pause`, the pause file,
        // another instance), `paused` and `resumed` are told.
        if let Some(notifier) = self.notifier.clone().filter(|n| n.wants_switch()) {
            companions.spawn(crate::notify::watch_switch(
                notifier,
                self.store.clone(),
                self.config.safety.poll_interval,
                started,
                stop_companions.clone(),
            ));
        }
        if let Some(mut pause_file) = self.pause_file.take() {
            if let Err(error) = pause_file.apply(&*self.store).await {
                error!(error = %error.with_causes(), "could not apply the pause file at start-up; will try again");
            }
            companions.spawn(pause_file.run(
                self.store.clone(),
                self.config.safety.poll_interval,
                stop_companions.clone(),
            ));
        }
        let domain = self.config.parse_rules().domain;
        for scheduled in std::mem::take(&mut self.schedules) {
            info!(
                schedule = %scheduled.plan.name,
                group = %scheduled.plan.group,
                mean_time_between = %humantime::format_duration(scheduled.plan.mean_time_between),
                "schedule running: restarts planned over the calendar's open time"
            );
            companions.spawn(crate::schedule::run(
                scheduled,
                self.worker.policy(),
                self.broker.clone(),
                self.store.clone(),
                self.worker.policy().current().guards.clock.clone(),
                domain.clone(),
                stop_companions.clone(),
            ));
        }
        companions.spawn(objectives::watch(
            self.store.clone(),
            self.worker.policy(),
            self.notifier.clone(),
            self.config.safety.poll_interval,
            stop_companions.clone(),
        ));
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
        // Even leashed or paused: starting an instance a crashed stop-start
        // left stopped only undoes what mandrill did.
        if let Some(ec2) = self.ec2.clone().filter(|ec2| ec2.stops_instances()) {
            let stop = stop_companions.clone();
            companions.spawn(async move { ec2.start_left_stopped(stop).await });
        }
        if !self.config.store.retention.is_zero() {
            companions.spawn(prune_history(
                self.store.clone(),
                self.config.store.retention,
                self.worker.policy(),
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
        // Said loudly, whichever it is: an operator must never wonder. The
        // leash an operator turned in the store decides over this
        // instance's own, so it is read first (bounded: a store that does
        // not answer now leaves the instance's own to be said, and the
        // worker's first read of the switch tells the record).
        let policy = self.worker.policy();
        if let Ok(Ok(switch)) = tokio::time::timeout(LEASH_READ_TIMEOUT, self.store.switch()).await
        {
            policy.observe(switch.leash.as_ref());
        }
        let leash = policy.leash();
        if leash.from == crate::safety::leash::LeashFrom::Store {
            warn!(
                by = %leash.by,
                reason = leash.reason.as_deref().unwrap_or_default(),
                since = %leash.since,
                own = if self.config.dry_run() { "leashed" } else { "unleashed" },
                "{}: the leash recorded in the store decides for every instance sharing it; \
                 `mandrill leash` and `mandrill unleash --reason …` turn it",
                if leash.leashed { "LEASHED (dry run)" } else { "UNLEASHED" }
            );
        } else if leash.leashed {
            warn!(
                "LEASHED (dry run): restarts are decided and recorded as dry-run, none is issued; \
                 `mandrill unleash --reason …` acts for every instance sharing the store"
            );
        } else if self.config.restarter.kind.is_real() {
            warn!(
                restarter = ?self.config.restarter.kind,
                allow = ?self.config.safety.allow,
                deny = ?self.config.safety.deny,
                "UNLEASHED: restarts of real hosts will be issued"
            );
        }
        if self.config.restarter.kind.is_real() && !self.config.require_signed() {
            warn!(
                restarter = ?self.config.restarter.kind,
                "UNSIGNED REQUESTS ACCEPTED: safety.require_signed = false with a real backend; \
                 anyone who can publish to the queue can ask for restarts (see docs/safety.md)"
            );
        }
        // A simulated backend has no host to probe: the warning would be
        // about settings the quick start never set.
        if self.config.restarter.kind.is_real()
            && self.config.safety.pause_on_unrecovered
            && !self.config.verified_by_probe()
        {
            warn!(
                "safety.pause_on_unrecovered needs a verification probe (verify.probe): without \
                 one no restart is ever found unrecovered, so it never pauses; the budget counts \
                 a restarted host as disrupted for safety.budget.settle instead"
            );
        }
        // Instance ids have no prefix to group by: `i-0abc…` is in `i`.
        if self.config.restarter.kind == crate::config::RestarterKind::Ec2
            && !self.config.inventory.is_configured()
            && self.config.safety.groups.is_empty()
        {
            warn!(
                "restarter.kind = \"ec2\" without an inventory: every instance id is in the \
                 group \"i\" (its name's default), so each group limit counts the whole fleet; \
                 [inventory.ec2] gives each instance its group and zone"
            );
        }
        if let Ok(Some(calendar)) = self.config.calendar() {
            log_calendar(
                &calendar,
                self.config.safety.max_defer,
                jiff::Timestamp::now(),
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

/// Says at start-up whether the calendar is open now and when that
/// changes, and how long a request may wait: closed time does not count
/// against `safety.max_defer`.
fn log_calendar(calendar: &crate::safety::Calendar, max_defer: Duration, now: jiff::Timestamp) {
    let (open, outlook) = calendar.outlook(now);
    let max_defer = humantime::format_duration(max_defer).to_string();
    if open {
        info!(%max_defer, "restarts only inside the calendar: {outlook}");
    } else {
        warn!(
            %max_defer,
            "restarts only inside the calendar: {outlook}; requests wait for it (closed time \
             does not count against safety.max_defer)"
        );
    }
}

#[cfg(test)]
mod tests;
