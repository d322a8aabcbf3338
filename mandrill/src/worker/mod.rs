//! The worker: pull, handle, keep leases, settle.
//!
//! One pull loop takes deliveries as fast as flow control allows and spawns a
//! handler task per delivery into a [`TaskTracker`]; it never waits for a
//! handler. A supervisor restarts the pull loop when it fails. On shutdown the
//! pull loop stops, handlers get `shutdown_grace` to finish, then handlers
//! that have not issued their restart yet nack and return, while handlers
//! whose restart is issued finish recording it (the shielded section).
//!
//! The worker reads no files and no signals: it is handed a [`WorkerConfig`],
//! its adapters and a [`Shutdown`].

mod flow;
mod handler;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::broker::{BrokerError, Consumer};
use crate::domain::{ParseRules, RestartRequest};
use crate::notify::{Event, EventKind, Notifier};
use crate::restarter::Restarter;
use crate::safety::PolicyHandle;
use crate::stats::Stats;
use crate::store::{ClaimTerms, Store};

pub use flow::FlowControl;

/// How the worker behaves. Every field has a default in `config`.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Deliveries handled at once; the pull loop waits for capacity beyond it.
    pub max_in_flight: usize,
    /// Most deliveries asked for in one pull.
    pub pull_batch: usize,
    /// Restart attempts at one request before a failing restart is dead-lettered.
    pub max_attempts: u32,
    /// Deliveries of one message, for whatever reason, after which the worker
    /// gives up on it: records why and dead-letters it. The worker keeps this
    /// limit itself so that every broker's give-up is recorded in the store.
    pub max_deliveries: u32,
    /// Redelivery delay after a failed restart, by attempt.
    pub retry_backoff: Backoff,
    /// Tries at recording an outcome before giving up and nacking.
    pub record_attempts: u32,
    /// Delay between those tries.
    pub record_backoff: Backoff,
    /// A restart that takes longer counts as failed.
    pub restart_timeout: Duration,
    /// How long in-flight work may finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// How often leases are extended; `None` derives it from the broker's
    /// ack deadline (a third of it, so one lost extension is survivable).
    pub lease_extension_interval: Option<Duration>,
    /// Consecutive pull-loop failures after which the worker gives up.
    pub max_pull_failures: u32,
    /// Delay before restarting a failed pull loop, by consecutive failure.
    pub pull_backoff: Backoff,
    /// How payloads are validated.
    pub parse: ParseRules,
    /// How often the kill switch is read from the store while running. (A
    /// claim also reads it, atomically, so this only bounds how soon pulling
    /// pauses and resumes.)
    pub switch_poll_interval: Duration,
    /// The safety policy (leash, eligibility, guards, stop conditions),
    /// shared with whoever reloads it: a handler reads it when it decides,
    /// so a reload applies to every decision made after it.
    pub policy: PolicyHandle,
}

/// Tells the worker to stop: first gracefully, then, if asked again, at once.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    requested: CancellationToken,
    hurried: CancellationToken,
}

impl Shutdown {
    /// A shutdown not yet requested.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stop pulling and let in-flight work finish within the grace period.
    pub fn request(&self) {
        self.requested.cancel();
    }

    /// Skip (the rest of) the grace period.
    pub fn hurry(&self) {
        self.requested.cancel();
        self.hurried.cancel();
    }

    /// Whether shutdown was requested.
    pub fn is_requested(&self) -> bool {
        self.requested.is_cancelled()
    }

    /// Completes once shutdown is requested.
    pub async fn requested(&self) {
        self.requested.cancelled().await;
    }

    /// Completes once the grace period is to be skipped.
    pub async fn hurried(&self) {
        self.hurried.cancelled().await;
    }
}

/// Why the worker stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The pull loop kept failing.
    #[error("pulling failed {failures} times in a row, last with: {last_error}")]
    PullGaveUp {
        /// Consecutive failures.
        failures: u32,
        /// The last one.
        last_error: String,
    },
}

/// Whether the store answers, as the handlers find out: while it does not,
/// the pull loop takes no new work (each nack would cost a delivery) and
/// probes it until it answers.
#[derive(Debug, Default)]
pub(crate) struct StoreHealth {
    down: std::sync::atomic::AtomicBool,
}

impl StoreHealth {
    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A store operation failed transiently.
    pub(crate) fn failed(&self, stats: &Stats) {
        if !self.down.swap(true, std::sync::atomic::Ordering::AcqRel) {
            stats.store_outages.inc();
            stats.store_down.inc();
            error!("store unreachable: pausing pulls until it answers");
        }
    }

    /// A store operation succeeded.
    pub(crate) fn succeeded(&self, stats: &Stats) {
        // A load first: the common case (up) costs no write to shared memory.
        if self.is_down() && self.down.swap(false, std::sync::atomic::Ordering::AcqRel) {
            stats.store_down.dec();
            info!("store reachable again: resuming pulls");
        }
    }
}

/// What stands for the lease of a broker without leases (see [`Worker::new`]).
const UNLEASED: Duration = Duration::from_secs(24 * 60 * 60);

/// Everything a handler needs, shared by all of them.
pub(crate) struct Context {
    pub broker: Arc<dyn Consumer>,
    pub store: Arc<dyn Store>,
    pub restarter: Arc<dyn Restarter>,
    pub config: WorkerConfig,
    pub stats: Arc<Stats>,
    pub flow: Arc<FlowControl>,
    pub lease_extension_interval: Duration,
    /// The broker's lease.
    pub ack_deadline: Duration,
    /// How much of a lease must be left to take a step that needs it.
    pub lease_margin: Duration,
    /// The terms of every restart claim.
    pub claim_terms: ClaimTerms,
    /// Whether the store answers.
    pub store_health: StoreHealth,
    /// The kill switch as last read: while on, nothing is pulled.
    pub paused: std::sync::atomic::AtomicBool,
    /// Instants are kept as milliseconds since this one.
    pub epoch: Instant,
    /// Cancelled when the grace period is over: handlers that have not issued
    /// their restart nack and return.
    pub abort: CancellationToken,
    /// The `[[notify]]` endpoints, if any; never waited for.
    pub notifier: Option<Arc<Notifier>>,
}

impl Context {
    /// `at` as milliseconds since the epoch (0 if before it).
    pub(crate) fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }
}

/// See the module docs.
pub struct Worker {
    context: Arc<Context>,
}

impl Worker {
    /// A worker over these adapters.
    pub fn new(
        config: WorkerConfig,
        broker: Arc<dyn Consumer>,
        store: Arc<dyn Store>,
        restarter: Arc<dyn Restarter>,
        stats: Arc<Stats>,
    ) -> Self {
        let lease = broker.lease();
        // Without a lease a delivery is ours until settled: it never runs
        // short, which a day stands for (bounded, so that instants computed
        // from it cannot overflow), and extensions, if any, are harmless.
        let ack_deadline = lease.unwrap_or(UNLEASED);
        // Always well inside the lease, whatever was configured: an
        // extension that comes after the deadline is a duplicate restart.
        let lease_extension_interval = config
            .lease_extension_interval
            .unwrap_or(ack_deadline / 3)
            .min(ack_deadline / 2)
            .max(Duration::from_millis(10));
        let claim_terms = ClaimTerms {
            max_attempts: config.max_attempts,
            // Long enough for the restart to time out and its outcome to be
            // recorded: until then no other delivery restarts the host.
            // Without a lease nothing is redelivered while this process
            // lives: the restart's own time is enough.
            hold: config
                .restart_timeout
                .saturating_add(lease.unwrap_or_default().saturating_mul(2)),
            // Resolved per request from the policy's counting guards.
            limits: crate::safety::Limits::NONE,
        };
        Self {
            context: Arc::new(Context {
                flow: Arc::new(FlowControl::new(config.max_in_flight)),
                broker,
                store,
                restarter,
                stats,
                lease_extension_interval,
                ack_deadline,
                lease_margin: ack_deadline / 4,
                claim_terms,
                store_health: StoreHealth::default(),
                paused: std::sync::atomic::AtomicBool::new(false),
                epoch: Instant::now(),
                abort: CancellationToken::new(),
                notifier: None,
                config,
            }),
        }
    }

    /// Tells `notifier` what happens. Before [`Worker::run`] only.
    pub fn with_notifier(mut self, notifier: Option<Arc<Notifier>>) -> Self {
        match Arc::get_mut(&mut self.context) {
            Some(context) => context.notifier = notifier,
            // Only `flow_control` hands out a part of the context, never
            // the context itself, so it is not shared before `run`.
            None => warn!("the worker's context is shared already; notifications are off"),
        }
        self
    }

    /// The flow control, so that a configuration reload can change the limit.
    pub fn flow_control(&self) -> Arc<FlowControl> {
        self.context.flow.clone()
    }

    /// The safety policy's handle, so that a reload can replace it.
    pub fn policy(&self) -> PolicyHandle {
        self.context.config.policy.clone()
    }

    /// Runs until `shutdown` is requested (or pulling gives up), then drains.
    /// Every delivery pulled is settled or left to lease expiry before this
    /// returns.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), WorkerError> {
        let context = self.context;
        let tracker = TaskTracker::new();
        // Read once before the first pull, then watched for as long as the
        // pull loop runs.
        if let Ok(switch) = context.store.switch().await {
            context.set_paused(switch.paused, &switch.paused_reason());
        }
        let stopped = tokio::select! {
            stopped = supervise(&context, &tracker, &shutdown) => stopped,
            never = watch_switch(&context) => match never {},
        };

        tracker.close();
        let grace = context.config.shutdown_grace;
        info!(
            in_flight = tracker.len(),
            ?grace,
            "stopped pulling; waiting for in-flight messages"
        );
        let drained = tokio::select! {
            () = tracker.wait() => true,
            () = tokio::time::sleep(grace) => false,
            () = shutdown.hurried() => false,
        };
        if !drained {
            warn!(
                in_flight = tracker.len(),
                "grace period over: nacking messages whose restart has not begun, \
                 waiting for restarts already issued to be recorded"
            );
            context.abort.cancel();
            tracker.wait().await;
        }
        info!("all in-flight messages settled");
        stopped
    }
}

/// Runs the pull loop, restarting it with backoff when it fails.
async fn supervise(
    context: &Arc<Context>,
    tracker: &TaskTracker,
    shutdown: &Shutdown,
) -> Result<(), WorkerError> {
    let mut failures = 0u32;
    loop {
        let run = AssertUnwindSafe(pull_loop(context, tracker, shutdown, &mut failures))
            .catch_unwind()
            .await;
        let (last_error, fatal) = match run {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => {
                let fatal = matches!(error, BrokerError::Fatal(_));
                (error.with_causes().to_string(), fatal)
            }
            Err(panic) => {
                context.stats.panics.inc();
                (format!("panicked: {}", panic_message(&*panic)), false)
            }
        };
        failures += 1;
        context.stats.pull_failures.inc();
        if fatal || failures >= context.config.max_pull_failures {
            error!(failures, error = %last_error, "pull loop failed; giving up");
            return Err(WorkerError::PullGaveUp {
                failures,
                last_error,
            });
        }
        let delay = context.config.pull_backoff.delay(failures);
        error!(failures, error = %last_error, ?delay, "pull loop failed; restarting it");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(()),
        }
    }
}

/// Pulls as capacity allows and spawns a handler per delivery. Returns Ok on
/// shutdown, Err when the broker fails.
async fn pull_loop(
    context: &Arc<Context>,
    tracker: &TaskTracker,
    shutdown: &Shutdown,
    failures: &mut u32,
) -> Result<(), BrokerError> {
    loop {
        if context.store_health.is_down() && !wait_for_store(context, shutdown).await {
            return Ok(());
        }
        if context.is_paused() && !wait_for_resume(context, shutdown).await {
            return Ok(());
        }
        let mut permits = tokio::select! {
            biased;
            () = shutdown.requested() => return Ok(()),
            permit = context.flow.acquire() => permit,
        };
        context
            .flow
            .top_up(&mut permits, context.config.pull_batch.saturating_sub(1));
        let deliveries = tokio::select! {
            biased;
            () = shutdown.requested() => return Ok(()),
            pulled = context.broker.pull(permits.num_permits()) => pulled?,
        };
        *failures = 0;
        let pulled_any = !deliveries.is_empty();
        for delivery in deliveries {
            context.stats.pulled.inc();
            match permits.split(1) {
                Some(permit) => {
                    handler::spawn(tracker, context.clone(), delivery, permit);
                }
                None => {
                    // The broker returned more than asked: give the extra back.
                    warn!(tag = %delivery.tag, "broker over-delivered; nacking the extra");
                    let _ = context.broker.nack(&delivery.tag, Duration::ZERO).await;
                }
            }
        }
        if pulled_any {
            // Let the handlers just spawned run before pulling more: a broker
            // that always has a batch ready would otherwise keep this thread,
            // and every message would sit spawned but unstarted in memory.
            tokio::task::yield_now().await;
        }
    }
}

impl Context {
    /// Queues a notification about `request` if an endpoint wants `kind`;
    /// builds nothing otherwise, and never waits.
    pub(crate) fn notify(
        &self,
        kind: EventKind,
        request: &RestartRequest,
        attempt: u32,
        detail: Option<&dyn std::fmt::Display>,
    ) {
        if let Some(notifier) = &self.notifier
            && notifier.wants(kind)
        {
            let detail = detail.map(ToString::to_string);
            notifier.send(Event::about(kind, request, attempt, detail));
        }
    }

    /// Queues a dead-letter notification, with the message id if the
    /// payload has a readable one.
    pub(crate) fn notify_dead_letter(&self, payload: &[u8], reason: &str) {
        if let Some(notifier) = &self.notifier
            && notifier.wants(EventKind::DeadLettered)
        {
            notifier.send(Event {
                message_id: crate::domain::salvage_message_id(payload),
                detail: Some(reason.to_owned()),
                ..Event::bare(EventKind::DeadLettered)
            });
        }
    }

    /// Queues a notification that the kill switch turned.
    pub(crate) fn notify_switch(&self, paused: bool, by: &str, reason: &str) {
        if let Some(notifier) = &self.notifier {
            notifier.send(Event::switch(paused, by, reason));
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records the switch as read; says so when it turns.
    pub(crate) fn set_paused(&self, paused: bool, why: &str) {
        if self
            .paused
            .swap(paused, std::sync::atomic::Ordering::AcqRel)
            != paused
        {
            if paused {
                warn!(
                    why,
                    "restarts paused (kill switch): pulling stops until resumed"
                );
            } else {
                info!("restarts resumed (kill switch): pulling again");
            }
        }
    }
}

/// Reads the kill switch every `switch_poll_interval` until shutdown, so
/// that pulling stops while it is on: a paused message stays in the broker,
/// costing no delivery.
async fn watch_switch(context: &Context) -> std::convert::Infallible {
    let every = context.config.switch_poll_interval;
    if every.is_zero() {
        return std::future::pending().await;
    }
    loop {
        match context.store.switch().await {
            Ok(switch) => context.set_paused(switch.paused, &switch.paused_reason()),
            Err(error) => debug!(%error, "could not read the kill switch"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits while the kill switch is on; false if shutdown came first.
async fn wait_for_resume(context: &Context, shutdown: &Shutdown) -> bool {
    let every = context
        .config
        .switch_poll_interval
        .max(Duration::from_millis(100));
    while context.is_paused() {
        tokio::select! {
            biased;
            () = shutdown.requested() => return false,
            () = tokio::time::sleep(every) => {}
        }
    }
    true
}

/// Probes the store until it answers; false if shutdown came first.
async fn wait_for_store(context: &Context, shutdown: &Shutdown) -> bool {
    let mut probes = 0u32;
    while context.store_health.is_down() {
        probes = probes.saturating_add(1);
        let delay = context.config.record_backoff.delay(probes);
        tokio::select! {
            biased;
            () = shutdown.requested() => return false,
            () = tokio::time::sleep(delay) => {}
        }
        // Handlers retrying in place may have found it back already.
        if !context.store_health.is_down() {
            break;
        }
        match context.store.lookup(uuid::Uuid::nil()).await {
            Ok(_) => context.store_health.succeeded(&context.stats),
            Err(error) if probes == 1 || probes.is_multiple_of(10) => {
                warn!(%error, probes, "store still unreachable; pulls stay paused");
            }
            Err(_) => {}
        }
    }
    true
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

#[cfg(test)]
mod tests;
