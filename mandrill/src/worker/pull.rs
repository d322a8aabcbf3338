//! The pull loop and its supervisor: take deliveries as flow control
//! allows, hand each pulled batch to one task that drives its handlers, pause while the store is down or the kill
//! switch is on, and restart the loop with backoff when it fails.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, warn};

use super::shared::{Shared, panic_message};
use super::{Shutdown, WorkerError, handler};
use crate::broker::{BrokerError, Delivery};

/// Pulls outstanding at once (see [`pull_loop`]).
const PULLS_IN_FLIGHT: usize = 2;

/// Runs the pull loop, restarting it with backoff when it fails.
pub(super) async fn supervise(
    shared: &Arc<Shared>,
    tracker: &TaskTracker,
    shutdown: &Shutdown,
) -> Result<(), WorkerError> {
    let mut failures = 0u32;
    loop {
        let run = AssertUnwindSafe(pull_loop(shared, tracker, shutdown, &mut failures))
            .catch_unwind()
            .await;
        let (last_error, fatal) = match run {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => {
                let fatal = matches!(error, BrokerError::Fatal(_));
                (error.with_causes().to_string(), fatal)
            }
            Err(panic) => {
                shared.stats.panics.inc();
                (format!("panicked: {}", panic_message(&*panic)), false)
            }
        };
        failures += 1;
        shared.stats.pull_failures.inc();
        if fatal || failures >= shared.config.max_pull_failures {
            error!(failures, error = %last_error, "pull loop failed; giving up");
            return Err(WorkerError::PullGaveUp {
                failures,
                last_error,
            });
        }
        let delay = shared.config.pull_backoff.delay(failures);
        error!(failures, error = %last_error, ?delay, "pull loop failed; restarting it");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.requested() => return Ok(()),
        }
    }
}

/// Pulls as capacity allows and hands each delivery to a handler. Returns
/// Ok on shutdown, Err when the broker fails.
///
/// Up to [`PULLS_IN_FLIGHT`] pulls are outstanding at once, each holding
/// its own permits: a broker whose pull waits for a commit (the SQLite
/// queue's lease is written before the pull returns) would otherwise leave
/// its writer idle for a round trip per batch.
async fn pull_loop(
    shared: &Arc<Shared>,
    tracker: &TaskTracker,
    shutdown: &Shutdown,
    failures: &mut u32,
) -> Result<(), BrokerError> {
    let mut pulls = FuturesUnordered::new();
    loop {
        if pulls.is_empty() {
            if shared.store_health.is_down() && !wait_for_store(shared, shutdown).await {
                return Ok(());
            }
            if shared.is_paused() && !wait_for_resume(shared, shutdown).await {
                return Ok(());
            }
        }
        let may_start =
            pulls.len() < PULLS_IN_FLIGHT && !shared.store_health.is_down() && !shared.is_paused();
        // Nothing to wait for but shutdown: the store went down while the
        // switch was waited for (a failed read of it marks the store down),
        // or the switch turned on since the checks above. Back to them.
        if pulls.is_empty() && !may_start {
            continue;
        }
        tokio::select! {
            biased;
            () = shutdown.requested() => return Ok(()),
            Some((permits, pulled)) = pulls.next(), if !pulls.is_empty() => {
                let deliveries: Vec<_> = pulled?;
                *failures = 0;
                hand_over(shared, tracker, permits, deliveries).await;
                // Let the handlers just spawned run before pulling more: a
                // broker that always has a batch ready would otherwise keep
                // this thread, and every message would sit spawned but
                // unstarted in memory.
                tokio::task::yield_now().await;
            }
            mut permits = shared.flow.acquire(), if may_start => {
                shared
                    .flow
                    .top_up(&mut permits, shared.config.pull_batch.saturating_sub(1));
                let broker = &shared.broker;
                pulls.push(async move {
                    let pulled = broker.pull(permits.num_permits()).await;
                    (permits, pulled)
                });
            }
            else => {}
        }
    }
}

/// Gives each pulled delivery a permit and the batch to its task; permits
/// not used go back, and deliveries beyond what was asked are nacked.
async fn hand_over(
    shared: &Arc<Shared>,
    tracker: &TaskTracker,
    mut permits: OwnedSemaphorePermit,
    mut deliveries: Vec<Delivery>,
) {
    let asked = permits.num_permits();
    if deliveries.len() > asked {
        // The broker returned more than asked: give the extra back.
        for extra in deliveries.split_off(asked) {
            shared.stats.pulled.inc();
            warn!(tag = %extra.tag, "broker over-delivered; nacking the extra");
            let _ = shared.broker.nack(&extra.tag, Duration::ZERO).await;
        }
    }
    if deliveries.is_empty() {
        shared.flow.release(permits);
        return;
    }
    shared.stats.pulled.add(deliveries.len() as u64);
    // Exactly one permit per delivery goes with the batch; the rest are
    // returned here.
    let Some(batch) = permits.split(deliveries.len()) else {
        unreachable!("no more deliveries than permits are kept");
    };
    shared.flow.release(permits);
    handler::spawn_batch(tracker, shared.clone(), deliveries, batch);
}

/// Reads the kill switch every `switch_poll_interval` until shutdown, so
/// that pulling stops while it is on: a paused message stays in the broker,
/// costing no delivery.
pub(super) async fn watch_switch(shared: &Shared) -> std::convert::Infallible {
    let every = shared.config.switch_poll_interval;
    if every.is_zero() {
        return std::future::pending().await;
    }
    loop {
        // A read that fails marks the store down, as the handlers' do, so
        // that an outage while no message flows still pauses pulling and
        // turns /readyz (it said "ready" with the store down). A read that
        // succeeds does not mark it up: reads may work while writes fail,
        // and the pull loop's own probe decides when pulling resumes.
        match shared.store.switch().await {
            Ok(switch) => {
                shared.set_paused(switch.paused, &switch.paused_reason());
                observe_leash(shared, switch.leash.as_ref());
            }
            Err(error) => {
                if error.is_transient() {
                    shared.store_health.failed(&shared.stats);
                }
                debug!(error = %error.with_causes(), "could not read the kill switch");
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Tells the policy handle the leash's record as just read from the store
/// (beside the switch, at no extra cost), and says loudly when it changed
/// the mode this instance tells. The claims read the record themselves.
pub(super) fn observe_leash(shared: &Shared, record: Option<&crate::safety::LeashRecord>) {
    let Some(leash) = shared.config.policy.observe(record) else {
        return;
    };
    let reason = leash.reason.as_deref().unwrap_or_default();
    let since = leash.since.to_string();
    match (record.is_some(), leash.leashed) {
        (true, true) => warn!(
            by = %leash.by,
            reason,
            since,
            "LEASHED (dry run) by the leash recorded in the store: every instance sharing it \
             records restarts as dry runs, none is issued"
        ),
        (true, false) => warn!(
            by = %leash.by,
            reason,
            since,
            "UNLEASHED by the leash recorded in the store: every instance sharing it issues \
             restarts"
        ),
        (false, leashed) => warn!(
            leashed,
            by = %leash.by,
            "the leash's record is gone from the store: this instance's own mode decides"
        ),
    }
}

/// Waits while the kill switch is on; false if shutdown came first.
async fn wait_for_resume(shared: &Shared, shutdown: &Shutdown) -> bool {
    let every = shared
        .config
        .switch_poll_interval
        .max(Duration::from_millis(100));
    while shared.is_paused() {
        tokio::select! {
            biased;
            () = shutdown.requested() => return false,
            () = tokio::time::sleep(every) => {}
        }
    }
    true
}

/// Probes the store until it answers; false if shutdown came first.
async fn wait_for_store(shared: &Shared, shutdown: &Shutdown) -> bool {
    let mut probes = 0u32;
    while shared.store_health.is_down() {
        probes = probes.saturating_add(1);
        let delay = shared.config.record_backoff.delay(probes);
        tokio::select! {
            biased;
            () = shutdown.requested() => return false,
            () = tokio::time::sleep(delay) => {}
        }
        // Handlers retrying in place may have found it back already.
        if !shared.store_health.is_down() {
            break;
        }
        // Raced against shutdown: a store that hangs must not keep the
        // pull loop, and so the drain, from seeing it.
        let probe = tokio::select! {
            biased;
            () = shutdown.requested() => return false,
            probe = shared.store.lookup(uuid::Uuid::nil()) => probe,
        };
        match probe {
            Ok(_) => shared.store_health.succeeded(&shared.stats),
            Err(error) if probes == 1 || probes.is_multiple_of(10) => {
                warn!(error = %error.with_causes(), probes, "store still unreachable; pulls stay paused");
            }
            Err(_) => {}
        }
    }
    true
}
