//! The worker: pull, handle, keep leases, settle.
//!
//! One pull loop takes deliveries as fast as flow control allows and spawns a
//! handler task per delivery into a [`TaskTracker`]; it never waits for a
//! handler. A supervisor restarts the pull loop when it fails. On shutdown the
//! pull loop stops, handlers get `shutdown_grace` to finish, then handlers
//! that have not issued their restart yet nack and return, while handlers
//! whose restart is issued finish recording it (the shielded section),
//! for at most `store_timeout` more.
//!
//! The worker reads no files and no signals: it is handed a [`WorkerConfig`],
//! its adapters and a [`Shutdown`].

mod conclude;
mod decisions;
mod flow;
mod handler;
mod lease;
mod prepare;
mod pull;
mod reply;
mod retry;
mod settle;
mod shared;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::broker::Consumer;
use crate::domain::ParseRules;
use crate::notify::Notifier;
use crate::restarter::Restarter;
use crate::safety::PolicyHandle;
use crate::stats::Stats;
use crate::store::{ClaimTerms, Store};
use shared::{Abort, Shared, StoreHealth};

pub(crate) use flow::FlowControl;

/// How the worker behaves. Every field has a default in `config`.
#[derive(Debug, Clone)]
pub(crate) struct WorkerConfig {
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
    /// The most one store call takes (`store.timeout`; the SQL stores
    /// bound each call by it). Once the grace period is over, restarts
    /// already issued get this long to record their outcome, then nack:
    /// so a store that hangs delays shutdown by at most this.
    pub store_timeout: Duration,
    /// The safety policy (leash, eligibility, guards, stop conditions),
    /// shared with whoever reloads it: a handler reads it when it decides,
    /// so a reload applies to every decision made after it.
    pub policy: PolicyHandle,
}

/// Tells the worker to stop: first gracefully, then, if asked again, at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shutdown {
    requested: CancellationToken,
    hurried: CancellationToken,
}

impl Shutdown {
    /// A shutdown not yet requested.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Stop pulling and let in-flight work finish within the grace period.
    pub(crate) fn request(&self) {
        self.requested.cancel();
    }

    /// Skip (the rest of) the grace period.
    pub(crate) fn hurry(&self) {
        self.requested.cancel();
        self.hurried.cancel();
    }

    /// Whether shutdown was requested.
    pub(crate) fn is_requested(&self) -> bool {
        self.requested.is_cancelled()
    }

    /// Completes once shutdown is requested.
    pub(crate) async fn requested(&self) {
        self.requested.cancelled().await;
    }

    /// Completes once the grace period is to be skipped.
    pub(crate) async fn hurried(&self) {
        self.hurried.cancelled().await;
    }
}

/// Why the worker stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkerError {
    /// The pull loop kept failing.
    #[error("pulling failed {failures} times in a row, last with: {last_error}")]
    PullGaveUp {
        /// Consecutive failures.
        failures: u32,
        /// The last one.
        last_error: String,
    },
}

/// What stands for the lease of a broker without leases (see [`Worker::new`]).
const UNLEASED: Duration = Duration::from_secs(24 * 60 * 60);

/// See the module docs.
pub(crate) struct Worker {
    shared: Arc<Shared>,
}

impl Worker {
    /// A worker over these adapters.
    pub(crate) fn new(
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
            shared: Arc::new(Shared {
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
                abort: Abort::default(),
                notifier: None,
                replies: TaskTracker::new(),
                config,
            }),
        }
    }

    /// Tells `notifier` what happens. Before [`Worker::run`] only.
    pub(crate) fn with_notifier(mut self, notifier: Option<Arc<Notifier>>) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.notifier = notifier,
            // Only `flow_control` hands out a part of `Shared`, never
            // `Shared` itself, so it is not shared before `run`.
            None => warn!("the worker's state is shared already; notifications are off"),
        }
        self
    }

    /// The flow control, so that a configuration reload can change the limit.
    pub(crate) fn flow_control(&self) -> Arc<FlowControl> {
        self.shared.flow.clone()
    }

    /// The safety policy's handle, so that a reload can replace it.
    pub(crate) fn policy(&self) -> PolicyHandle {
        self.shared.config.policy.clone()
    }

    /// Runs until `shutdown` is requested (or pulling gives up), then drains.
    /// Every delivery pulled is settled or left to lease expiry before this
    /// returns.
    pub(crate) async fn run(self, shutdown: Shutdown) -> Result<(), WorkerError> {
        let shared = self.shared;
        let tracker = TaskTracker::new();
        // Read once before the first pull, then watched for as long as the
        // pull loop runs.
        tokio::select! {
            biased;
            () = shutdown.requested() => {}
            read = shared.store.switch() => {
                if let Ok(switch) = read {
                    shared.set_paused(switch.paused, &switch.paused_reason());
                    pull::observe_leash(&shared, switch.leash.as_ref());
                }
            }
        }
        let stopped = tokio::select! {
            stopped = pull::supervise(&shared, &tracker, &shutdown) => stopped,
            never = pull::watch_switch(&shared) => match never {},
        };

        tracker.close();
        let grace = shared.config.shutdown_grace;
        info!(
            in_flight = shared.stats.in_flight.get(),
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
                in_flight = shared.stats.in_flight.get(),
                "grace period over: nacking messages whose restart has not begun, \
                 waiting for restarts already issued to be recorded"
            );
            shared
                .abort
                .abort_with_deadline(Instant::now() + shared.config.store_timeout);
            tracker.wait().await;
        }
        info!("all in-flight messages settled");
        // Each is bounded by its timeout.
        shared.replies.close();
        shared.replies.wait().await;
        stopped
    }
}

#[cfg(test)]
mod tests;
