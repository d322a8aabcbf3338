//! Handling one delivery, from payload to settlement.
//!
//! 1. Parse at the edge; a malformed payload is recorded and dead-lettered.
//!    A message delivered more than `max_deliveries` times is given up on:
//!    recorded as failed and dead-lettered, whatever the broker.
//! 2. Reserve capacity for the restart (a free thread, a rate limit), then
//!    **claim** the restart attempt in the store: the audit record that a
//!    restart is about to be issued, written before anything touches the
//!    host. The claim says whether to restart at all: the request may be
//!    final already, another delivery's restart may still be in flight, or
//!    every attempt may be used (a claimed attempt whose outcome was never
//!    recorded counts as used). Until the restart is issued, the end of the
//!    grace period aborts the handler (nack), and a lost lease abandons the
//!    delivery to the broker. Store errors are retried in place: transient
//!    ones while the lease is kept (and the pull loop pauses until the store
//!    answers), permanent ones give the message up with the reason.
//! 3. Check again: the guards under the policy in force now, the stop
//!    conditions, the leash, then the kill switch read once more (a
//!    `pause` since the claim gives the claim back) and, if stop
//!    conditions ran, eligibility and the inventory's placement once more
//!    under the policy in force then; last, the lease and the grace
//!    period (either over gives the claim back). Restart. From here
//!    the restart is issued, so the handler no longer listens for the
//!    abort: it is shielded until the outcome is recorded and settled.
//! 4. Record the outcome (retried in place until the store answers; bounded
//!    only once shutdown's grace period is over), then ack, nack with
//!    backoff, or dead-letter. Never ack an outcome that
//!    is not recorded; never restart again because recording failed. A
//!    restart that may still be running on the host records nothing: its
//!    claim holds the host until it expires, then counts as a used attempt.
//!
//! The lease is extended throughout. A panic anywhere becomes a failed
//! attempt if one was claimed, and a nack (or a dead letter, on the last
//! delivery). Settling is retried on transient broker errors.
//!
//! One delivery's life, from receipt to settlement, read top to bottom:
//! one piece past 400 lines.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, error, info, info_span, warn};

use super::conclude::conclude;
use super::decisions::{deny_by, dry_run_action, held, unclaim_at_shutdown, unclaim_lease_lost};
use super::lease::{Leased, Progress, with_lease};
use super::prepare::{halt, prepare, recheck, unless_paused};
use super::settle::{RareSettlement, Settlement, rare, reject, settle};
use super::shared::{Shared, panic_message};
use crate::broker::Delivery;
use crate::domain::{Outcome, RestartRequest};
use crate::restarter::RestartError;
use crate::safety::{Placement, Policy};
use crate::stats::DeadLetterReason;

/// Spawns one task for a pulled batch: it drives each delivery's handler
/// concurrently and ends when the last is settled. `permits` holds one
/// flow-control permit per delivery; each handler releases its own.
///
/// One task per batch rather than per delivery: a task is an allocation, a
/// schedule and several copies of the handler's state on the way into it;
/// a `FuturesUnordered` node is one allocation, written once. Each handler
/// is still isolated: its panics are caught on their own (see [`message`]).
pub(super) fn spawn_batch(
    tracker: &TaskTracker,
    shared: Arc<Shared>,
    deliveries: Vec<Delivery>,
    permits: OwnedSemaphorePermit,
) {
    tracker.spawn(drive_batch(shared, deliveries, permits));
}

async fn drive_batch(
    shared: Arc<Shared>,
    deliveries: Vec<Delivery>,
    mut permits: OwnedSemaphorePermit,
) {
    // The batch owns its deliveries and their lease state; each handler
    // borrows its own, and one extender keeps all their leases. One clock
    // read for the batch: its deliveries were pulled together.
    let pulled = Instant::now();
    let batch: Box<[Leased]> = deliveries
        .into_iter()
        .map(|delivery| Leased::new(&shared, delivery, pulled))
        .collect();
    // The policy for the decisions before the claim, read once for the
    // batch (each read takes a shared lock); the check after the claim
    // reads the one in force then.
    let policy = shared.config.policy.current();
    let mut handlers = FuturesUnordered::new();
    for leased in &batch {
        // The pull loop took one permit per delivery.
        let Some(permit) = permits.split(1) else {
            unreachable!("the pull loop takes one flow-control permit per delivery");
        };
        handlers.push(message(&shared, &policy, leased, permit));
    }
    let drained = async {
        while let Some(handled) = handlers.next().await {
            if let Err(panic) = handled {
                // Outside the handler's own guards (which turn a panic into a
                // nack): this delivery is left to lease expiry, and the batch
                // goes on. Its in-flight count and its permit were given back
                // by the handler's `InFlight` as the panic unwound.
                shared.stats.panics.inc();
                error!(panic = %panic_message(&*panic), "handler panicked; the broker will redeliver");
            }
        }
    };
    with_lease(&shared, &batch, drained).await;
}

/// One delivery counted in flight, holding its flow-control permit: both
/// given back exactly once when it is dropped, however the handler ends
/// (returning, or a panic unwinding through it, before or after settling).
struct InFlight<'a> {
    shared: &'a Shared,
    permit: Option<OwnedSemaphorePermit>,
}

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared, permit: OwnedSemaphorePermit) -> Self {
        shared.stats.in_flight.inc();
        Self {
            shared,
            permit: Some(permit),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.stats.in_flight.dec();
        if let Some(permit) = self.permit.take() {
            self.shared.flow.release(permit);
        }
    }
}

/// One delivery's handler as its batch drives it: in its own span, with
/// its panics caught, so that one panic fails one message, not its batch.
pub(super) fn message<'a>(
    shared: &'a Shared,
    policy: &'a Policy,
    leased: &'a Leased,
    permit: OwnedSemaphorePermit,
) -> impl Future<Output = std::thread::Result<()>> + 'a {
    let delivery = &leased.delivery;
    let span = info_span!(
        "message",
        tag = %delivery.tag,
        delivery = delivery.attempt,
        message_id = tracing::field::Empty,
        host = tracing::field::Empty,
    );
    AssertUnwindSafe(handle(shared, policy, delivery, &leased.progress, permit).instrument(span))
        .catch_unwind()
}

/// Handles one delivery and settles it.
///
/// A plain function returning an `async move` block: an `async fn` would copy
/// its arguments into its state a second time.
#[allow(clippy::manual_async_fn)] // deliberate, see above
fn handle<'a>(
    shared: &'a Shared,
    policy: &'a Policy,
    delivery: &'a Delivery,
    progress: &'a Progress,
    permit: OwnedSemaphorePermit,
) -> impl Future<Output = ()> + 'a {
    async move {
        let _in_flight = InFlight::enter(shared, permit);
        info!("pulled");
        let guarded = guarded(shared, policy, delivery, progress).await;
        // The work is over, one way or the other: its lease is no longer
        // extended (settling is quick, or retried on the broker's terms).
        progress.work_done();
        let settlement = match guarded {
            Ok(settlement) => settlement,
            Err(panic) => {
                shared.stats.panics.inc();
                let message = panic_message(&*panic);
                error!(panic = %message, "handler panicked");
                Box::pin(after_panic(shared, delivery, progress, message)).await
            }
        };
        // A panic while settling is caught here like any other.
        let settled = settle(
            shared,
            delivery,
            settlement,
            DeadLetterReason::from_u8(progress.dead_letter.load(Ordering::Relaxed)),
        );
        if let Err(panic) = AssertUnwindSafe(Box::pin(settled)).catch_unwind().await {
            shared.stats.panics.inc();
            error!(panic = %panic_message(&*panic), "settling panicked; the broker will redeliver");
        }
        let handled = (shared.millis(Instant::now()) as u32).wrapping_sub(progress.pulled);
        let handled = Duration::from_millis(handled.into());
        shared.stats.timings.handling.observe(handled);
        // `_in_flight` is dropped here: counted out, its permit returned.
    }
}

/// How to settle a delivery whose handler panicked.
///
/// Before its claimed restart was issued, the attempt is recorded as failed
/// (best effort), so that the redelivery need not wait out the claim's
/// hold. Once issued, the restart may have run, may still be running, or
/// may have succeeded: its outcome is unknown, exactly as after a crash.
/// The claim is left as it is: its hold keeps every other delivery from
/// restarting the host until the restart would have timed out, and then it
/// counts as a used attempt, so `max_attempts` holds. The delivery is
/// nacked until the hold is over. The last delivery is given up on either
/// way.
pub(super) async fn after_panic(
    shared: &Shared,
    delivery: &Delivery,
    progress: &Progress,
    message: String,
) -> Settlement {
    let config = &shared.config;
    let attempt = progress.claimed.load(Ordering::Acquire);
    let issued = attempt > 0 && progress.issued.load(Ordering::Acquire);
    let parsed = RestartRequest::parse_verified(
        &delivery.payload,
        delivery.full_size,
        &config.parse,
        config.policy.current().requesters.signatures(),
    )
    .ok();
    let out_of_deliveries = delivery.attempt >= config.max_deliveries
        && unsettled(shared, parsed.as_ref(), delivery.attempt).await >= config.max_deliveries;
    if issued && !out_of_deliveries {
        let policy = config.policy.current();
        let hold = shared
            .claim_terms
            .hold
            .saturating_add(policy.stop_conditions.longest_run());
        warn!(
            attempt,
            ?hold,
            "the handler panicked after issuing its restart: its outcome is unknown, \
             so the attempt counts as used and no other delivery restarts the host \
             before its claim's hold ends"
        );
        return Settlement::Nack {
            delay: hold.max(config.retry_backoff.delay(attempt)),
            why: format!("handler panicked after issuing restart attempt {attempt}"),
        };
    }
    let last = attempt >= config.max_attempts || out_of_deliveries;
    let error = if issued {
        format!(
            "restart attempt {attempt} was issued but its outcome is unknown (the handler \
             panicked: {message}); counted as failed"
        )
    } else {
        format!("handler panicked: {message}")
    };
    if let Some(request) = &parsed
        && (attempt > 0 || last)
    {
        let outcome = if last {
            Outcome::Failed {
                error: error.clone(),
            }
        } else {
            Outcome::Retrying {
                error: error.clone(),
            }
        };
        match shared
            .store
            .record_outcome(request, attempt, &outcome)
            .await
        {
            Err(error) => {
                warn!(error = %error.with_causes(), "could not record the panic as a failed attempt");
            }
            Ok(crate::store::Recorded::Recorded) => {
                super::reply::reply(shared, request, &outcome);
            }
            Ok(crate::store::Recorded::AlreadyFinal(_) | crate::store::Recorded::Conflict(_)) => {}
        }
    }
    if last {
        shared.stats.given_up.inc();
        progress.dead_letter_because(DeadLetterReason::Panicked);
        Settlement::DeadLetter {
            reason: format!("handler panicked on its last attempt: {message}"),
        }
    } else {
        Settlement::Nack {
            delay: config.retry_backoff.delay(attempt.max(1)),
            why: "handler panicked".into(),
        }
    }
}

/// How many of `delivered` deliveries count against `broker.max_deliveries`:
/// those a guard deferred were settled on purpose and do not, as the
/// claim's check counts them. One bounded read; all count if it fails.
async fn unsettled(shared: &Shared, request: Option<&RestartRequest>, delivered: u32) -> u32 {
    let Some(request) = request else {
        return delivered;
    };
    let deferrals = shared.store.deferrals(request.message_id);
    match tokio::time::timeout(Duration::from_secs(1), deferrals).await {
        Ok(Ok(deferred)) => delivered.saturating_sub(deferred),
        _ => delivered,
    }
}

/// The work of one delivery, with its panics caught (its lease is kept by
/// its batch: see [`with_lease`]).
///
/// A plain function on purpose: the combinators' intermediate values live on
/// this stack frame, not in the task. Built inline in an `async fn`, a value
/// moved into a combinator stays reserved until the `.await` ends, and the
/// task would carry each layer twice.
pub(super) fn guarded<'a>(
    shared: &'a Shared,
    policy: &'a Policy,
    delivery: &'a Delivery,
    progress: &'a Progress,
) -> impl Future<Output = std::thread::Result<Settlement>> + 'a {
    AssertUnwindSafe(process(shared, policy, delivery, progress)).catch_unwind()
}

/// The payload parsed (boxed: the request lives for the whole task, and
/// inline it would take ~150 bytes of every handler's state), or the rare
/// path that rejects it. A plain function, so that the parse's `Result`
/// (the request or its rejection, 152 bytes) is never part of the handler's
/// state: awaited inside `process`, the rejection would keep that slot in
/// every handler for its whole life.
///
/// A signed payload is verified here, with the batch's policy's keys.
fn parse_or_reject<'a>(
    shared: &'a Shared,
    policy: &Policy,
    delivery: &'a Delivery,
    progress: &'a Progress,
) -> Result<Box<RestartRequest>, RareSettlement<'a>> {
    match RestartRequest::parse_verified(
        &delivery.payload,
        delivery.full_size,
        &shared.config.parse,
        policy.requesters.signatures(),
    ) {
        Ok(request) => Ok(Box::new(request)),
        Err(rejection) => {
            shared.stats.rejection_reasons[rejection.kind_index()].inc();
            Err(rare(reject(
                shared,
                delivery,
                progress,
                rejection.to_string(),
            )))
        }
    }
}

/// [`Policy::place`], or the settlement of a request that is not counted
/// at all (denied, or deferred by the inventory). A plain function, as
/// [`parse_or_reject`], so that the placement's reasons are never part of
/// the handler's state.
fn place_or_settle<'a>(
    shared: &'a Shared,
    policy: &Policy,
    progress: &'a Progress,
    request: &'a mut RestartRequest,
) -> Result<(), RareSettlement<'a>> {
    match policy.place(request) {
        Ok(()) => Ok(()),
        Err(Placement::Denied { guard, reason }) => {
            Err(rare(deny_by(shared, progress, request, 0, guard, reason)))
        }
        Err(Placement::Deferred { reason, retry }) => {
            let hold = policy.guards.defer(request, "inventory", retry, reason);
            Err(rare(held(shared, progress, request, hold)))
        }
    }
}

/// The work of one delivery: parse, prepare and claim, recheck, restart,
/// conclude. `policy` is the batch's, for the decisions before the claim.
pub(super) async fn process(
    shared: &Shared,
    policy: &Policy,
    delivery: &Delivery,
    progress: &Progress,
) -> Settlement {
    let config = &shared.config;
    let mut request = match parse_or_reject(shared, policy, delivery, progress) {
        Ok(request) => request,
        Err(rejected) => return rejected.await,
    };
    {
        let span = tracing::Span::current();
        span.record("message_id", tracing::field::display(request.message_id));
        span.record("host", tracing::field::display(&request.hostname));
    }
    // The operator's group (and, with an inventory, zone and address),
    // before anything counts: the stores count `request.group()`. Not in
    // the inventory, or a message naming another group: denied.
    if let Err(unplaced) = place_or_settle(shared, policy, progress, &mut request) {
        return unplaced.await;
    }
    // Each phase is boxed: only one phase's state is alive at a time, and
    // boxing keeps the others out of the task's size for its whole life.
    let (attempt, store_leash, reservation) =
        match Box::pin(prepare(shared, delivery, progress, &request, policy)).await {
            Ok(ready) => ready,
            Err(settlement) => return settlement,
        };
    progress.claimed.store(attempt, Ordering::Release);
    // The tutorial's "saved": now the claim, recorded before the restart.
    info!(attempt, "saved");

    // Checked again after the claim, which may have waited out a store
    // outage: a decision made before waiting is never trusted after it.
    // Under the policy in force now (a reload since is honoured), and with
    // the stop conditions, which run here, right before the restart.
    // In a block: what it decided is not kept in the handler's state for the
    // restart.
    let (dry_run, stop_conditions_ran) = {
        let (rechecked, stop_conditions_ran) = match recheck(shared, &request, attempt) {
            Ok(decided) => (decided, false),
            Err(stop_conditions) => (stop_conditions.await, true),
        };
        match rechecked {
            // The store's record as the claim read it, else the
            // instance's own under the policy in force now.
            Ok(own) => (
                crate::safety::leash::leashed(store_leash, own),
                stop_conditions_ran,
            ),
            Err(halted) => {
                drop(reservation);
                return rare(halt(shared, progress, &request, attempt, halted)).await;
            }
        }
    };
    if dry_run {
        drop(reservation);
        return rare(dry_run_action(shared, progress, &request, attempt)).await;
    }
    // A `pause` since the claim's transaction (while the stop conditions
    // ran, say) stops the restart too; the claim is given back. So does a
    // reload or an inventory refresh that landed while the stop conditions
    // ran and no longer allows the restart.
    if let Some(stopped) = Box::pin(unless_paused(
        shared,
        progress,
        &request,
        attempt,
        stop_conditions_ran,
    ))
    .await
    {
        drop(reservation);
        return stopped;
    }
    // The last moment to not restart: the lease must still be ours (checked
    // after the switch, whose read may wait).
    if !progress.lease_held(shared) {
        drop(reservation);
        return rare(unclaim_lease_lost(shared, progress, &request, attempt)).await;
    }
    // Nor may the grace period have ended meanwhile (the switch's read, the
    // stop conditions' record): a restart issued now would outlive it, and
    // its outcome be recorded past the deadline, if at all.
    if shared.abort.is_aborted() {
        drop(reservation);
        return rare(unclaim_at_shutdown(shared, progress, &request, attempt)).await;
    }

    // Shielded from here: the restart is issued, so its outcome must be
    // recorded whatever shutdown does. A panic from here on leaves the
    // attempt issued with its outcome unknown (see `after_panic`).
    progress.issued.store(true, Ordering::Release);
    // Timed inside the box, for the same reason.
    let timings = &shared.stats.timings;
    let restarted = Box::pin(async {
        // One clock read for the timer and the timing both.
        let started = Instant::now();
        let restarted = tokio::time::timeout_at(
            started + config.restart_timeout,
            shared.restarter.restart(&request, reservation),
        )
        .await;
        timings.restart.observe(started.elapsed());
        restarted
    })
    .await
    .unwrap_or_else(|_elapsed| {
        Err(RestartError::TimedOut {
            host: request.hostname.clone(),
            after: config.restart_timeout,
        })
    });
    Box::pin(conclude(
        shared,
        progress,
        &delivery.tag,
        &request,
        attempt,
        restarted,
    ))
    .await
}
