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
//! 3. Restart. From here the restart is issued, so the handler no longer
//!    listens for the abort: it is shielded until the outcome is recorded
//!    and settled.
//! 4. Record the outcome (retried in place until the store answers; bounded
//!    only once shutdown's grace period is over), then ack, nack with
//!    backoff, or dead-letter. Never ack an outcome that
//!    is not recorded; never restart again because recording failed.
//!
//! The lease is extended throughout. A panic anywhere becomes a failed
//! attempt if one was claimed, and a nack (or a dead letter, on the last
//! delivery). Settling is retried on transient broker errors.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::{Context as Shared, panic_message};
use crate::broker::{BrokerError, Delivery, DeliveryTag};
use crate::domain::{Outcome, RestartRequest, Status, salvage_message_id};
use crate::notify::EventKind;
use crate::restarter::{Reservation, RestartError};
use crate::safety::Hold;
use crate::stats::DeadLetterReason;
use crate::store::{Claim, ClaimTerms, Decision, Recorded, StoreError, unknown_outcome};

/// How soon a delivery deferred by the kill switch is looked at again.
const PAUSED_RECHECK: Duration = Duration::from_secs(5);

/// How a delivery is to be settled.
#[derive(Debug)]
enum Settlement {
    Ack,
    /// Acked already, in the transaction that recorded the outcome.
    Acked,
    Nack {
        delay: Duration,
        why: String,
    },
    DeadLetter {
        reason: String,
    },
    /// The lease was lost before a restart was issued: another consumer may
    /// own the message now. Leave it to the broker; settle nothing.
    Abandon,
}

/// What one handler knows of its delivery while it works: shared between the
/// work and the lease extender (both polled by the handler's task).
#[derive(Debug)]
pub(super) struct Progress {
    /// The broker said the lease is gone.
    lease_lost: AtomicBool,
    /// When the lease runs out unless extended, in milliseconds since the
    /// worker's epoch.
    lease_expires: AtomicU64,
    /// The restart attempt this delivery claimed; 0 before a claim.
    claimed: AtomicU32,
    /// Why a dead letter was chosen, a [`DeadLetterReason`] (in the padding
    /// after `claimed`: no bigger a task).
    dead_letter: AtomicU8,
}

impl Progress {
    fn new(context: &Shared) -> Self {
        Self {
            lease_lost: AtomicBool::new(false),
            lease_expires: AtomicU64::new(context.millis(Instant::now() + context.ack_deadline)),
            claimed: AtomicU32::new(0),
            dead_letter: AtomicU8::new(DeadLetterReason::Other as u8),
        }
    }

    /// Notes why the settlement about to be returned is a dead letter.
    fn dead_letter_because(&self, reason: DeadLetterReason) {
        self.dead_letter.store(reason as u8, Ordering::Relaxed);
    }

    /// Whether the lease is still ours, with a margin for the step about to
    /// be taken.
    fn lease_held(&self, context: &Shared) -> bool {
        !self.lease_lost.load(Ordering::Acquire)
            && context.millis(Instant::now() + context.lease_margin)
                < self.lease_expires.load(Ordering::Acquire)
    }
}

/// Spawns the handling of one delivery, which holds one flow-control permit.
pub(crate) fn spawn(
    tracker: &TaskTracker,
    context: Arc<Shared>,
    delivery: Delivery,
    permit: OwnedSemaphorePermit,
) {
    let span = info_span!(
        "message",
        tag = %delivery.tag,
        delivery = delivery.attempt,
        message_id = tracing::field::Empty,
        host = tracing::field::Empty,
    );
    tracker.spawn(handle(context, delivery, permit).instrument(span));
}

/// Handles one delivery and settles it.
///
/// A plain function returning an `async move` block: an `async fn` would copy
/// its arguments into its state a second time.
#[allow(clippy::manual_async_fn)] // deliberate, see above
fn handle(
    context: Arc<Shared>,
    delivery: Delivery,
    permit: OwnedSemaphorePermit,
) -> impl Future<Output = ()> {
    async move {
        context.stats.in_flight.inc();
        // Milliseconds in a u32 (wrapping): a full `Instant` held across the
        // awaits would grow every in-flight task by 16 bytes.
        let started = context.millis(Instant::now()) as u32;
        info!("pulled");
        let progress = Progress::new(&context);
        let settlement = match guarded(&context, &delivery, &progress).await {
            Ok(settlement) => settlement,
            Err(panic) => {
                context.stats.panics.inc();
                let message = panic_message(&*panic);
                error!(panic = %message, "handler panicked");
                Box::pin(after_panic(&context, &delivery, &progress, message)).await
            }
        };
        // A panic while settling must not leak the in-flight count or the
        // flow-control permit: caught here like any other.
        let settled = settle(
            &context,
            &delivery,
            settlement,
            DeadLetterReason::from_u8(progress.dead_letter.load(Ordering::Relaxed)),
        );
        if let Err(panic) = AssertUnwindSafe(Box::pin(settled)).catch_unwind().await {
            context.stats.panics.inc();
            error!(panic = %panic_message(&*panic), "settling panicked; the broker will redeliver");
        }
        let handled = (context.millis(Instant::now()) as u32).wrapping_sub(started);
        let handled = Duration::from_millis(handled.into());
        context.stats.timings.handling.observe(handled);
        context.stats.in_flight.dec();
        context.flow.release(permit);
    }
}

/// How to settle a delivery whose handler panicked. An attempt it had
/// claimed is recorded as failed (best effort), so that the redelivery need
/// not wait out the claim's hold; the last delivery is given up on.
async fn after_panic(
    context: &Shared,
    delivery: &Delivery,
    progress: &Progress,
    message: String,
) -> Settlement {
    let config = &context.config;
    let attempt = progress.claimed.load(Ordering::Acquire);
    let last = attempt >= config.max_attempts || delivery.attempt >= config.max_deliveries;
    let error = format!("handler panicked: {message}");
    if let Ok(request) =
        RestartRequest::parse_sized(&delivery.payload, delivery.full_size, &config.parse)
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
        if let Err(error) = context
            .store
            .record_outcome(&request, attempt, &outcome)
            .await
        {
            warn!(%error, "could not record the panic as a failed attempt");
        }
    }
    if last {
        context.stats.given_up.inc();
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

/// The work of one delivery, with its lease kept and its panics caught.
///
/// A plain function on purpose: the combinators' intermediate values live on
/// this stack frame, not in the task. Built inline in an `async fn`, a value
/// moved into a combinator stays reserved until the `.await` ends, and the
/// task would carry each layer twice.
fn guarded<'a>(
    context: &'a Shared,
    delivery: &'a Delivery,
    progress: &'a Progress,
) -> impl Future<Output = std::thread::Result<Settlement>> + 'a {
    AssertUnwindSafe(with_lease(
        context,
        &delivery.tag,
        progress,
        process(context, delivery, progress),
    ))
    .catch_unwind()
}

pin_project_lite::pin_project! {
    /// `work`, with the lease kept while it runs: polls the extender only
    /// while the work is pending, and drops it (stopping extension) as soon
    /// as the work completes.
    ///
    /// A struct rather than an `async fn` with `select!`: an `async fn` keeps
    /// its argument and the pinned copy of it both in its state, which
    /// doubled every task's memory.
    struct WithLease<W, E> {
        #[pin]
        work: W,
        #[pin]
        extender: E,
    }
}

impl<W: Future, E: Future<Output = Infallible>> Future for WithLease<W, E> {
    type Output = W::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<W::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(output);
        }
        match this.extender.poll(cx) {
            Poll::Ready(never) => match never {},
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Runs `work` while extending the delivery's lease every interval.
fn with_lease<'a, W: Future + 'a>(
    context: &'a Shared,
    tag: &'a DeliveryTag,
    progress: &'a Progress,
    work: W,
) -> WithLease<W, impl Future<Output = Infallible> + 'a> {
    WithLease {
        work,
        extender: extend_forever(context, tag, progress),
    }
}

async fn extend_forever(context: &Shared, tag: &DeliveryTag, progress: &Progress) -> Infallible {
    loop {
        tokio::time::sleep(context.lease_extension_interval).await;
        // The new deadline counts from the request, not the answer.
        let expires = context.millis(Instant::now() + context.ack_deadline);
        match context.broker.extend(tag).await {
            Ok(()) => {
                progress.lease_expires.store(expires, Ordering::Release);
                context.stats.lease_extensions.inc();
                info!("extended lease");
            }
            Err(error @ BrokerError::LeaseLost(_)) => {
                progress.lease_lost.store(true, Ordering::Release);
                context.stats.leases_lost.inc();
                warn!(error = %error.with_causes(), "lease lost; the message may be redelivered");
                return std::future::pending().await;
            }
            Err(error) => {
                warn!(error = %error.with_causes(), "could not extend lease; will try again")
            }
        }
    }
}

/// Why a store operation retried in place stopped without an answer.
enum Stopped {
    /// The grace period is over (before the restart was issued).
    Shutdown,
    /// The lease was lost (before the restart was issued).
    LeaseLost,
    /// The store refused in a way retrying cannot fix.
    Permanent(StoreError),
    /// Shutdown's grace period ended while retrying (after the restart was
    /// issued), and `record_attempts` more tries failed too.
    OutOfTime(StoreError),
}

/// When a store operation may stop retrying.
#[derive(Clone, Copy)]
enum Until {
    /// Before the restart: while the lease is held and the grace period lasts.
    LeaseHeld,
    /// After the restart: until the store answers (the pull loop is paused
    /// meanwhile, and the lease kept), or for at most `record_attempts`
    /// tries once the grace period is over, so that shutdown is bounded.
    Shielded,
}

/// Runs a store operation, retrying transient failures in place. While the
/// store fails, it is marked down, so that the pull loop stops taking new
/// work instead of churning deliveries; any success marks it up again.
async fn store_op<T, F, Fut>(
    context: &Shared,
    progress: &Progress,
    until: Until,
    mut operation: F,
) -> Result<T, Stopped>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tried = 0u32;
    let mut tried_after_abort = 0u32;
    loop {
        if matches!(until, Until::LeaseHeld) && !progress.lease_held(context) {
            return Err(Stopped::LeaseLost);
        }
        let result = match until {
            Until::LeaseHeld => tokio::select! {
                biased;
                () = context.abort.cancelled() => return Err(Stopped::Shutdown),
                result = operation() => result,
            },
            Until::Shielded => operation().await,
        };
        let error = match result {
            Ok(value) => {
                context.store_health.succeeded(&context.stats);
                return Ok(value);
            }
            Err(error) => error,
        };
        context.stats.store_failures.inc();
        if !error.is_transient() {
            return Err(Stopped::Permanent(error));
        }
        context.store_health.failed(&context.stats);
        tried = tried.saturating_add(1);
        let delay = context.config.record_backoff.delay(tried);
        if matches!(until, Until::Shielded) && context.abort.is_cancelled() {
            tried_after_abort += 1;
            if tried_after_abort >= context.config.record_attempts {
                return Err(Stopped::OutOfTime(error));
            }
        }
        if tried == 1 || tried.is_multiple_of(10) {
            warn!(%error, tried, ?delay, "store unavailable; retrying in place");
        }
        match until {
            Until::LeaseHeld => tokio::select! {
                biased;
                () = context.abort.cancelled() => return Err(Stopped::Shutdown),
                () = tokio::time::sleep(delay) => {}
            },
            Until::Shielded => tokio::time::sleep(delay).await,
        }
    }
}

fn shutting_down() -> Settlement {
    Settlement::Nack {
        delay: Duration::ZERO,
        why: "shutting down before the restart began".into(),
    }
}

async fn process(context: &Shared, delivery: &Delivery, progress: &Progress) -> Settlement {
    let config = &context.config;
    // Boxed: the request lives for the whole task, and inline it would take
    // ~150 bytes of every handler's state.
    let mut request =
        match RestartRequest::parse_sized(&delivery.payload, delivery.full_size, &config.parse) {
            Ok(request) => Box::new(request),
            Err(rejection) => {
                context.stats.rejection_reasons[rejection.kind_index()].inc();
                return rare(reject(context, delivery, progress, rejection.to_string())).await;
            }
        };
    config.policy.current().guards.counting.assign(&mut request);
    {
        let span = tracing::Span::current();
        span.record("message_id", tracing::field::display(request.message_id));
        span.record("host", tracing::field::display(&request.hostname));
    }
    // Each phase is boxed: only one phase's state is alive at a time, and
    // boxing keeps the others out of the task's size for its whole life.
    let (attempt, reservation) =
        match Box::pin(prepare(context, delivery, progress, &request)).await {
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
    let dry_run = match Box::pin(recheck(context, &request)).await {
        Ok(dry_run) => dry_run,
        Err(Some(hold)) => {
            drop(reservation);
            return rare(unclaim(context, progress, &request, attempt, hold)).await;
        }
        Err(None) => {
            drop(reservation);
            return rare(unclaim_at_shutdown(context, progress, &request, attempt)).await;
        }
    };
    if dry_run {
        drop(reservation);
        return rare(dry_run_action(context, progress, &request, attempt)).await;
    }

    // Shielded from here: the restart is issued, so its outcome must be
    // recorded whatever shutdown does.
    // Timed inside the box, for the same reason.
    let timings = &context.stats.timings;
    let restarted = Box::pin(async {
        let started = Instant::now();
        let restarted = tokio::time::timeout(
            config.restart_timeout,
            context.restarter.restart(&request, reservation),
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
        context,
        progress,
        &delivery.tag,
        &request,
        attempt,
        restarted,
    ))
    .await
}

/// The guards again after the claim, under the policy in force now, then
/// the stop conditions (also before a dry run's action: the dry run shows
/// every guard's decision). `Ok` with whether the policy is leashed, or why
/// to hold the request; `Err(None)` when the grace period ended while the
/// stop conditions ran (the restart was not issued, so it must not be).
async fn recheck(context: &Shared, request: &RestartRequest) -> Result<bool, Option<Hold>> {
    let policy = context.config.policy.current();
    if let Some(hold) = policy.guards.hold(request) {
        return Err(Some(hold));
    }
    if !policy.stop_conditions.is_empty() {
        let checked = tokio::select! {
            biased;
            () = context.abort.cancelled() => return Err(None),
            checked = policy.stop_conditions.check() => checked,
        };
        if let Err(reason) = checked {
            return Err(Some(policy.defer(request, policy.stop_retry, reason)));
        }
    }
    Ok(policy.dry_run)
}

/// The grace period ended between the claim and the restart: nothing was
/// issued, so the claim is given back (one try, bounded, as shutdown is
/// under way; else it counts as used) and the delivery nacked.
async fn unclaim_at_shutdown(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
) -> Settlement {
    let released = tokio::time::timeout(
        Duration::from_secs(1),
        context.store.release_claim(request, attempt),
    )
    .await;
    match released {
        Ok(Ok(())) => progress.claimed.store(0, Ordering::Release),
        Ok(Err(error)) => {
            warn!(%error, attempt, "could not give back the claim; it counts as used")
        }
        Err(_elapsed) => warn!(
            attempt,
            "giving back the claim timed out; it counts as used"
        ),
    }
    shutting_down()
}

/// Everything before the restart: the delivery limit, eligibility,
/// capacity, and the claim that decides whether to restart at all. `Ok`
/// with the claimed attempt and its reservation, or how to settle.
async fn prepare(
    context: &Shared,
    delivery: &Delivery,
    progress: &Progress,
    request: &RestartRequest,
) -> Result<(u32, Reservation), Settlement> {
    let config = &context.config;
    if delivery.attempt > config.max_deliveries {
        // Deliveries a guard deferred (a closed calendar, a full rate
        // window, the kill switch) were settled on purpose: they do not
        // count, or a request waiting overnight would be given up.
        let deferred = match store_op(context, progress, Until::LeaseHeld, || {
            context.store.deferrals(request.message_id)
        })
        .await
        {
            Ok(deferred) => deferred,
            Err(Stopped::Shutdown) => return Err(shutting_down()),
            Err(Stopped::LeaseLost) => return Err(Settlement::Abandon),
            Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
                warn!(%error, "cannot read how often the request was deferred; counting none");
                0
            }
        };
        let unsettled = delivery.attempt.saturating_sub(deferred);
        if unsettled > config.max_deliveries {
            let reason = format!(
                "delivered {unsettled} times without being settled (broker.max_deliveries is {}{})",
                config.max_deliveries,
                if deferred > 0 {
                    format!("; {deferred} more deliveries were deferred by a guard")
                } else {
                    String::new()
                }
            );
            return Err(give_up(context, progress, request, 0, reason).await);
        }
    }
    // Read once for the decisions before the claim.
    let policy = config.policy.current();
    if let Err(reason) = policy.eligibility.check(request.instance_name.as_str()) {
        return Err(deny(context, progress, request, reason).await);
    }
    if let Some(hold) = policy.guards.hold(request) {
        return Err(held(context, progress, request, hold).await);
    }
    let limits = match policy.guards.counting.limits(request.group()) {
        Ok(limits) => limits,
        Err(reason) => {
            let hold =
                policy
                    .guards
                    .defer(request, "disruption budget", UNKNOWN_BUDGET_RETRY, reason);
            return Err(held(context, progress, request, hold).await);
        }
    };
    let terms = ClaimTerms {
        limits,
        ..context.claim_terms
    };
    let reservation = tokio::select! {
        biased;
        () = context.abort.cancelled() => return Err(shutting_down()),
        reservation = context.restarter.reserve(request) => reservation,
    };
    // The claim: recorded before the restart is issued.
    let claimed = store_op(context, progress, Until::LeaseHeld, || {
        context.store.claim_restart(request, terms)
    })
    .await;
    match claimed {
        Ok(Claim::Claimed { attempt, unknown }) => {
            if let Some(unknown) = unknown {
                warn!(
                    unknown,
                    "an earlier restart attempt was issued but its outcome never recorded; \
                     counted as failed"
                );
            }
            Ok((attempt, reservation))
        }
        Ok(Claim::Final(status)) => {
            context.stats.duplicates.inc();
            info!(%status, "already recorded as final; not restarting again");
            Err(settle_recorded(status))
        }
        Ok(Claim::Paused { reason }) => {
            // The kill switch: nothing claimed, nothing issued. Pulling
            // pauses too, so the message waits in the broker meanwhile.
            context.stats.deferred.inc();
            info!(reason, "deferred: restarts are paused");
            context.set_paused(true, &reason);
            Err(Settlement::Nack {
                delay: PAUSED_RECHECK,
                why: "restarts are paused".into(),
            })
        }
        Ok(Claim::Deferred {
            guard,
            reason,
            wait,
        }) => {
            // Recorded by the claim; nothing claimed, nothing issued.
            let hold = policy.guards.defer(request, guard, wait, reason);
            Err(held(context, progress, request, hold).await)
        }
        Ok(Claim::InFlight { attempt, wait }) => {
            context.stats.deferred.inc();
            let delay = wait.max(Duration::from_secs(1));
            info!(
                attempt,
                ?delay,
                "a restart of this request may still be in flight elsewhere"
            );
            Err(Settlement::Nack {
                delay,
                why: format!("restart attempt {attempt} may still be in flight"),
            })
        }
        Ok(Claim::Exhausted { attempts, unknown }) => {
            let reason = match unknown {
                Some(attempt) => format!(
                    "restart failed after {attempts} attempts: {}",
                    unknown_outcome(attempt)
                ),
                None => format!("all {attempts} restart attempts are used"),
            };
            Err(give_up(context, progress, request, attempts, reason).await)
        }
        Err(Stopped::Shutdown) => Err(shutting_down()),
        Err(Stopped::LeaseLost) => Err(Settlement::Abandon),
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(%error, "the store refused the claim; giving up without restarting");
            context.stats.given_up.inc();
            Err(Settlement::DeadLetter {
                reason: format!("could not record the claim to restart: {error}"),
            })
        }
    }
}

/// Everything after the restart: the outcome, recorded, and how to settle.
async fn conclude(
    context: &Shared,
    progress: &Progress,
    tag: &DeliveryTag,
    request: &RestartRequest,
    attempt: u32,
    restarted: Result<crate::domain::Restarted, RestartError>,
) -> Settlement {
    let config = &context.config;
    let mut retry_after = None;
    let outcome = match restarted {
        Ok(restarted) => {
            context.stats.restarted.inc();
            if let Some(after) = restarted.recovered_after {
                context.stats.timings.recovery.observe(after);
            }
            info!(recovered_after = ?restarted.recovered_after, "restarted");
            context.notify(EventKind::Restarted, request, attempt, None);
            Outcome::Restarted(restarted)
        }
        Err(RestartError::Unrecovered {
            host,
            after,
            reason,
            output,
        }) => {
            context.stats.unrecovered.inc();
            let error = RestartError::Unrecovered {
                host,
                after,
                reason,
                output: None,
            };
            error!(%error, "restarted, but the host did not come back");
            context.notify(EventKind::Unrecovered, request, attempt, Some(&error));
            if config.policy.current().pause_on_unrecovered {
                // Fail closed: a host that does not come back stops every
                // instance until someone looks (`mandrill resume`).
                let why = format!("{} did not recover after its restart", request.hostname);
                match context.store.set_switch(true, "mandrill", &why).await {
                    Ok(()) => {
                        error!(reason = why, "paused all restarts");
                        context.notify_switch(true, "mandrill", &why);
                    }
                    Err(error) => error!(%error, "could not pause restarts"),
                }
            }
            Outcome::Unrecovered {
                error: error.to_string(),
                output,
            }
        }
        Err(error) if !error.is_retryable() || attempt >= config.max_attempts => {
            context.stats.restart_failures.inc();
            if error.is_retryable() {
                warn!(%error, attempt, "restart failed on the last attempt");
            } else {
                warn!(%error, attempt, "restart refused for good; not retrying");
            }
            context.notify(EventKind::Failed, request, attempt, Some(&error));
            Outcome::Failed {
                error: error.to_string(),
            }
        }
        Err(error) => {
            context.stats.restart_failures.inc();
            warn!(%error, attempt, "restart failed; will retry");
            retry_after = error.retry_after();
            Outcome::Retrying {
                error: error.to_string(),
            }
        }
    };

    // An outcome settled by an ack takes the ack into its own transaction
    // when the broker and the store share a database.
    let ack = match outcome {
        Outcome::Retrying { .. } | Outcome::Failed { .. } => None,
        _ => context.broker.joint_ack(tag),
    };
    let recorded = store_op(context, progress, Until::Shielded, || {
        context
            .store
            .record_outcome_acking(request, attempt, &outcome, ack.clone())
    })
    .await;
    match recorded {
        Ok((Recorded::Recorded, true)) => {
            debug!(status = %outcome.status(), "outcome recorded and acked");
            return Settlement::Acked;
        }
        Ok((Recorded::Recorded, false)) => {
            debug!(status = %outcome.status(), "outcome recorded");
        }
        Ok((Recorded::AlreadyFinal(status), _)) => {
            context.stats.duplicates.inc();
            warn!(%status, "another delivery recorded a final outcome first; keeping it");
            progress.dead_letter_because(DeadLetterReason::RestartFailed);
            return settle_recorded(status);
        }
        Err(Stopped::Permanent(error)) => {
            // Never restart again because bookkeeping failed: give it up.
            error!(%error, "the store refused the outcome; dead-lettering without another restart");
            context.stats.given_up.inc();
            progress.dead_letter_because(DeadLetterReason::StoreRefused);
            return Settlement::DeadLetter {
                reason: format!(
                    "restart attempt {attempt} ended ({}), but its outcome could not be recorded: {error}",
                    outcome.status()
                ),
            };
        }
        Err(Stopped::OutOfTime(error)) => {
            error!(%error, "shutting down without the outcome recorded; nacking so it is not lost");
            return Settlement::Nack {
                delay: config.retry_backoff.delay(attempt),
                why: "outcome not recorded".into(),
            };
        }
        // Not reachable after the restart (no lease or abort check there);
        // a nack is the safe answer all the same.
        Err(Stopped::Shutdown | Stopped::LeaseLost) => {
            return Settlement::Nack {
                delay: config.retry_backoff.delay(attempt),
                why: "outcome not recorded".into(),
            };
        }
    }
    match outcome {
        // Unrecovered is final and recorded: the request was carried out.
        // (Denied and dry-run outcomes are settled where they are decided.)
        Outcome::Restarted(_)
        | Outcome::Unrecovered { .. }
        | Outcome::Denied { .. }
        | Outcome::DryRun { .. }
        | Outcome::Expired { .. } => Settlement::Ack,
        Outcome::Retrying { .. } => Settlement::Nack {
            delay: retry_after.unwrap_or_else(|| config.retry_backoff.delay(attempt)),
            why: "restart failed".into(),
        },
        Outcome::Failed { error } => {
            progress.dead_letter_because(DeadLetterReason::RestartFailed);
            Settlement::DeadLetter {
                reason: format!("restart failed after {attempt} attempts: {error}"),
            }
        }
    }
}

/// Records a request a safety guard refused for good, and acks it: the
/// request was handled, by a decision not to act.
async fn deny(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    reason: String,
) -> Settlement {
    context.stats.denied.inc();
    info!(reason, "denied");
    let decision = Decision {
        verdict: "denied",
        guard: "eligibility",
        reason: &reason,
    };
    note_decision(context, request, 0, decision).await;
    let outcome = Outcome::Denied { reason };
    record_decision(context, progress, request, 0, outcome).await
}

/// A guard said not now. Deferred: nacked to come back when the guard could
/// pass, with nothing claimed or issued (the nack frees the flow-control
/// slot). Deferred past `safety.max_defer`: recorded `expired` and acked.
async fn held(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    hold: Hold,
) -> Settlement {
    match hold {
        Hold::Defer {
            guard,
            delay,
            reason,
        } => {
            context.stats.deferred.inc();
            info!(?delay, guard, reason, "deferred");
            let decision = Decision {
                verdict: "deferred",
                guard,
                reason: &reason,
            };
            note_decision(context, request, 0, decision).await;
            Settlement::Nack { delay, why: reason }
        }
        Hold::Expired { guard, reason } => {
            context.stats.expired.inc();
            info!(guard, reason, "expired");
            let decision = Decision {
                verdict: "expired",
                guard,
                reason: &reason,
            };
            note_decision(context, request, 0, decision).await;
            let outcome = Outcome::Expired { reason };
            record_decision(context, progress, request, 0, outcome).await
        }
    }
}

/// A guard closed between the claim and the restart. Deferred: the claim
/// is given back, so that it does not count as a used attempt, and the
/// delivery deferred. Expired: recorded against the claimed attempt (final,
/// so the count no longer matters).
async fn unclaim(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    hold: Hold,
) -> Settlement {
    if let Hold::Expired { reason, .. } = hold {
        context.stats.expired.inc();
        info!(reason, "expired after the claim");
        let outcome = Outcome::Expired { reason };
        return record_decision(context, progress, request, attempt, outcome).await;
    }
    let released = store_op(context, progress, Until::LeaseHeld, || {
        context.store.release_claim(request, attempt)
    })
    .await;
    match released {
        Ok(()) => progress.claimed.store(0, Ordering::Release),
        // The claim holds until it expires and then counts as used: an
        // attempt lost, never a restart outside the guard.
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            warn!(%error, attempt, "could not give back the claim; it counts as used");
        }
        Err(Stopped::Shutdown) => return shutting_down(),
        Err(Stopped::LeaseLost) => return Settlement::Abandon,
    }
    held(context, progress, request, hold).await
}

/// Leashed: records the exact action the restart would have taken, as the
/// outcome of the attempt just claimed, and acks. Nothing touches the host.
async fn dry_run_action(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
) -> Settlement {
    let action = context.restarter.describe(request);
    context.stats.dry_runs.inc();
    info!(
        action,
        "dry run: not restarting (leashed; mandrill run --unleash acts)"
    );
    let decision = Decision {
        verdict: "dry-run",
        guard: "leash",
        reason: "leashed (safety.dry_run): every guard allowed it; the action was recorded,                  not taken",
    };
    note_decision(context, request, attempt, decision).await;
    let outcome = Outcome::DryRun { action };
    record_decision(context, progress, request, attempt, outcome).await
}

/// How soon a request whose group's budget cannot be known (a percentage
/// of an unknown size) is tried again: a reload may have fixed it.
const UNKNOWN_BUDGET_RETRY: Duration = Duration::from_secs(60);

/// Records a guard's verdict for `mandrill explain`. Best effort: the
/// verdict is acted on whether or not its note is kept, and what it decides
/// is recorded with the outcome anyway.
async fn note_decision(
    context: &Shared,
    request: &RestartRequest,
    attempt: u32,
    decision: Decision<'_>,
) {
    if let Err(error) = context
        .store
        .record_decision(request, attempt, decision)
        .await
    {
        warn!(%error, "could not record the decision for explain");
    }
}

/// Records a final decision that issued nothing, then acks.
async fn record_decision(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    outcome: Outcome,
) -> Settlement {
    let recorded = store_op(context, progress, Until::LeaseHeld, || {
        context.store.record_outcome(request, attempt, &outcome)
    })
    .await;
    match recorded {
        Ok(Recorded::Recorded) => Settlement::Ack,
        Ok(Recorded::AlreadyFinal(status)) => settle_recorded(status),
        Err(Stopped::Shutdown) => shutting_down(),
        Err(Stopped::LeaseLost) => Settlement::Abandon,
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(%error, "the store refused the decision; dead-lettering");
            progress.dead_letter_because(DeadLetterReason::StoreRefused);
            Settlement::DeadLetter {
                reason: format!(
                    "{} decided, but it could not be recorded: {error}",
                    outcome.status()
                ),
            }
        }
    }
}

/// A rare path's future, boxed and built outside the caller's state: the
/// values it is made from (a rejection, a reason) would otherwise keep slots
/// in every handler task for its whole life.
fn rare<'a>(
    future: impl Future<Output = Settlement> + Send + 'a,
) -> Pin<Box<dyn Future<Output = Settlement> + Send + 'a>> {
    Box::pin(future)
}

/// Records a request as failed for `reason` and dead-letters it: the one
/// way the worker gives up on a valid request, on every broker.
async fn give_up(
    context: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    reason: String,
) -> Settlement {
    warn!(reason, "giving up on the request");
    let outcome = Outcome::Failed {
        error: reason.clone(),
    };
    let recorded = store_op(context, progress, Until::LeaseHeld, || {
        context.store.record_outcome(request, attempt, &outcome)
    })
    .await;
    match recorded {
        Ok(Recorded::AlreadyFinal(status)) => return settle_recorded(status),
        Ok(Recorded::Recorded) => {}
        Err(Stopped::Shutdown) => return shutting_down(),
        Err(Stopped::LeaseLost) => return Settlement::Abandon,
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(%error, "could not record giving up; dead-lettering anyway");
        }
    }
    context.stats.given_up.inc();
    context.notify(EventKind::Failed, request, attempt, Some(&reason));
    progress.dead_letter_because(DeadLetterReason::GivenUp);
    Settlement::DeadLetter { reason }
}

/// How to settle a delivery whose request already has a final outcome. A
/// request recorded as failed is dead-lettered again rather than acked: the
/// delivery that recorded it may have failed to dead-letter it (a broker
/// hiccup), and acking now would lose the dead letter.
fn settle_recorded(status: Status) -> Settlement {
    match status {
        Status::Failed => Settlement::DeadLetter {
            reason: "restart failed on every attempt (recorded by an earlier delivery)".into(),
        },
        _ => Settlement::Ack,
    }
}

/// Records a malformed payload and dead-letters it. Recording is retried
/// in place like every store write, but a store that refuses for good does
/// not keep the dead letter from the broker.
async fn reject(
    context: &Shared,
    delivery: &Delivery,
    progress: &Progress,
    reason: String,
) -> Settlement {
    context.stats.rejected.inc();
    progress.dead_letter_because(DeadLetterReason::Malformed);
    warn!(reason, "rejected malformed message");
    let message_id = salvage_message_id(&delivery.payload);
    let recorded = store_op(context, progress, Until::LeaseHeld, || {
        context
            .store
            .record_rejection(message_id, &reason, &delivery.payload)
    })
    .await;
    match recorded {
        Ok(()) => {}
        Err(Stopped::Shutdown) => return shutting_down(),
        Err(Stopped::LeaseLost) => return Settlement::Abandon,
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(%error, "could not record the rejection; dead-lettering anyway");
        }
    }
    Settlement::DeadLetter { reason }
}

/// Settles a delivery, retrying a few times when the broker is briefly
/// unavailable. A lost lease is not retried: the broker redelivers.
async fn settle(
    context: &Shared,
    delivery: &Delivery,
    settlement: Settlement,
    why: DeadLetterReason,
) {
    const TRIES: u32 = 3;
    let tag = &delivery.tag;
    let stats = &context.stats;
    for tried in 1..=TRIES {
        let result = match &settlement {
            Settlement::Ack => context.broker.ack(tag).await.map(|()| {
                stats.acked.inc();
                info!("acked");
            }),
            Settlement::Acked => {
                stats.acked.inc();
                info!("acked");
                Ok(())
            }
            Settlement::Nack { delay, why } => context.broker.nack(tag, *delay).await.map(|()| {
                stats.nacked.inc();
                info!(?delay, why, "nacked");
            }),
            Settlement::DeadLetter { reason } => {
                context.broker.dead_letter(tag, reason).await.map(|()| {
                    stats.dead_lettered.inc();
                    stats.dead_letter_reasons[why as usize].inc();
                    warn!(reason, "dead-lettered");
                    context.notify_dead_letter(&delivery.payload, reason);
                })
            }
            Settlement::Abandon => {
                stats.abandoned.inc();
                warn!(
                    "lease lost before the restart was issued; leaving the message to the broker"
                );
                Ok(())
            }
        };
        match result {
            Ok(()) => return,
            Err(error @ BrokerError::Unavailable(_)) if tried < TRIES => {
                let delay = Duration::from_millis(100 << tried);
                warn!(error = %error.with_causes(), tried, ?delay, "could not settle; retrying");
                tokio::time::sleep(delay).await;
            }
            Err(error) => {
                stats.settle_failures.inc();
                warn!(error = %error.with_causes(), "could not settle; the broker will redeliver after the lease expires");
                return;
            }
        }
    }
}

#[cfg(test)]
pub(super) fn handle_for_size(
    context: Arc<Shared>,
    delivery: Delivery,
    permit: OwnedSemaphorePermit,
) -> impl Future<Output = ()> {
    handle(context, delivery, permit)
}
