//! Handling one delivery, from payload to settlement.
//!
//! 1. Parse at the edge; a malformed payload is recorded and dead-lettered.
//! 2. Look up the message id (serial, because it decides whether to restart
//!    at all); a request already final is acked without restarting again.
//!    Until this point, the end of the grace period aborts the handler and
//!    the delivery is nacked.
//!    Then reserve capacity for the restart (a free thread, a rate limit):
//!    still abortable, nothing has touched the host yet.
//! 3. Save and restart, concurrently; wait for both, whatever either does.
//!    From here the restart is issued, so the handler no longer listens for
//!    the abort: it is shielded until the outcome is recorded and settled.
//! 4. Record the outcome (with retries), then ack, nack with backoff, or
//!    dead-letter. Never ack an outcome that is not recorded.
//!
//! The lease is extended throughout steps 2 to 4. A panic anywhere becomes a
//! nack (or a dead letter, on the last attempt).

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::{Context as Shared, panic_message};
use crate::broker::{BrokerError, Delivery, DeliveryTag};
use crate::domain::{Outcome, RestartRequest, Status, salvage_message_id};
use crate::restarter::RestartError;
use crate::store::{Recorded, StoreError};

/// How a delivery is to be settled.
#[derive(Debug)]
enum Settlement {
    Ack,
    Nack { delay: Duration, why: String },
    DeadLetter { reason: String },
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
        attempt = delivery.attempt,
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
        info!("pulled");
        let settlement = match guarded(&context, &delivery).await {
            Ok(settlement) => settlement,
            Err(panic) => {
                context.stats.panics.inc();
                let message = panic_message(&*panic);
                error!(panic = %message, "handler panicked");
                if delivery.attempt >= context.config.max_attempts {
                    Settlement::DeadLetter {
                        reason: format!("handler panicked on every attempt: {message}"),
                    }
                } else {
                    Settlement::Nack {
                        delay: context.config.retry_backoff.delay(delivery.attempt),
                        why: "handler panicked".into(),
                    }
                }
            }
        };
        settle(&context, &delivery.tag, settlement).await;
        context.stats.in_flight.dec();
        context.flow.release(permit);
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
) -> impl Future<Output = std::thread::Result<Settlement>> + 'a {
    AssertUnwindSafe(with_lease(
        context,
        &delivery.tag,
        process(context, delivery),
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
    work: W,
) -> WithLease<W, impl Future<Output = Infallible> + 'a> {
    WithLease {
        work,
        extender: extend_forever(context, tag),
    }
}

async fn extend_forever(context: &Shared, tag: &DeliveryTag) -> Infallible {
    loop {
        tokio::time::sleep(context.lease_extension_interval).await;
        match context.broker.extend(tag).await {
            Ok(()) => {
                context.stats.lease_extensions.inc();
                info!("extended lease");
            }
            Err(error @ BrokerError::LeaseLost(_)) => {
                context.stats.leases_lost.inc();
                warn!(%error, "lease lost; the message may be redelivered");
                return std::future::pending().await;
            }
            Err(error) => warn!(%error, "could not extend lease; will try again"),
        }
    }
}

async fn process(context: &Shared, delivery: &Delivery) -> Settlement {
    let config = &context.config;
    let attempt = delivery.attempt;
    let request = match RestartRequest::parse(&delivery.payload, &config.parse) {
        Ok(request) => request,
        // Boxed: a rare path whose state would otherwise enlarge every task.
        Err(rejection) => return Box::pin(reject(context, delivery, rejection.to_string())).await,
    };
    {
        let span = tracing::Span::current();
        span.record("message_id", tracing::field::display(request.message_id));
        span.record("host", tracing::field::display(&request.hostname));
    }

    // Serial on purpose: whether to restart depends on what is recorded.
    // In a block, so that the lookup's result is not kept across later awaits.
    {
        let prior = tokio::select! {
            biased;
            () = context.abort.cancelled() => {
                return Settlement::Nack {
                    delay: Duration::ZERO,
                    why: "shutting down before the restart began".into(),
                };
            }
            prior = context.store.lookup(request.message_id) => prior,
        };
        match prior {
            Ok(Some(status)) if status.is_final() => {
                context.stats.duplicates.inc();
                info!(%status, "already recorded as final; not restarting again");
                return settle_recorded(status);
            }
            Ok(_) => {}
            Err(error) => {
                context.stats.store_failures.inc();
                warn!(%error, "could not look up the request");
                return Settlement::Nack {
                    delay: config.retry_backoff.delay(attempt),
                    why: "store unavailable".into(),
                };
            }
        }
    }

    let reservation = tokio::select! {
        biased;
        () = context.abort.cancelled() => {
            return Settlement::Nack {
                delay: Duration::ZERO,
                why: "shutting down before the restart began".into(),
            };
        }
        reservation = context.restarter.reserve() => reservation,
    };

    // Shielded from here: the restart is issued, so its outcome must be
    // recorded whatever shutdown does. Both futures are written inside
    // join! so that they are stored once, in place.
    let (saved, restarted) =
        tokio::join!(context.store.record_received(&request, attempt), async {
            tokio::time::timeout(
                config.restart_timeout,
                context.restarter.restart(&request.hostname, reservation),
            )
            .await
            .unwrap_or_else(|_elapsed| {
                Err(RestartError::TimedOut {
                    host: request.hostname.clone(),
                    after: config.restart_timeout,
                })
            })
        });
    match saved {
        Ok(()) => info!("saved"),
        Err(error) => {
            // Not fatal: recording the outcome creates the row if need be.
            context.stats.store_failures.inc();
            warn!(%error, "could not save receipt; the outcome will be recorded in full");
        }
    }
    let outcome = match restarted {
        Ok(()) => {
            context.stats.restarted.inc();
            info!("restarted");
            Outcome::Restarted
        }
        Err(error) if attempt >= config.max_attempts => {
            context.stats.restart_failures.inc();
            warn!(%error, "restart failed on the last attempt");
            Outcome::Failed {
                error: error.to_string(),
            }
        }
        Err(error) => {
            context.stats.restart_failures.inc();
            warn!(%error, "restart failed; will retry");
            Outcome::Retrying {
                error: error.to_string(),
            }
        }
    };

    // Boxed: only one phase at a time needs this state, and boxing keeps it
    // out of the task's size for the whole of its life.
    let recorded = Box::pin(record_with_retries(context, || {
        context.store.record_outcome(&request, attempt, &outcome)
    }))
    .await;
    match recorded {
        Ok(Recorded::Recorded) => debug!(status = %outcome.status(), "outcome recorded"),
        Ok(Recorded::AlreadyFinal(status)) => {
            context.stats.duplicates.inc();
            warn!(%status, "another delivery recorded a final outcome first; keeping it");
            return settle_recorded(status);
        }
        Err(error) => {
            error!(%error, "could not record the outcome; nacking so it is not lost");
            return Settlement::Nack {
                delay: config.retry_backoff.delay(attempt),
                why: "outcome not recorded".into(),
            };
        }
    }
    match outcome {
        Outcome::Restarted => Settlement::Ack,
        Outcome::Retrying { .. } => Settlement::Nack {
            delay: config.retry_backoff.delay(attempt),
            why: "restart failed".into(),
        },
        Outcome::Failed { error } => Settlement::DeadLetter {
            reason: format!("restart failed after {attempt} attempts: {error}"),
        },
    }
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

/// Records a malformed payload and dead-letters it. Recording is best effort:
/// the broker keeps the dead letter either way.
async fn reject(context: &Shared, delivery: &Delivery, reason: String) -> Settlement {
    context.stats.rejected.inc();
    warn!(reason, "rejected malformed message");
    let message_id = salvage_message_id(&delivery.payload);
    let recorded = record_with_retries(context, || {
        context
            .store
            .record_rejection(message_id, &reason, &delivery.payload)
    })
    .await;
    if let Err(error) = recorded {
        error!(%error, "could not record the rejection; dead-lettering anyway");
    }
    Settlement::DeadLetter { reason }
}

async fn record_with_retries<T, F, Fut>(context: &Shared, mut operation: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let attempts = context.config.record_attempts.max(1);
    let mut tried = 0;
    loop {
        tried += 1;
        match operation().await {
            Ok(value) => return Ok(value),
            Err(error) if tried >= attempts => return Err(error),
            Err(error) => {
                context.stats.store_failures.inc();
                let delay = context.config.record_backoff.delay(tried);
                warn!(%error, tried, ?delay, "store write failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

async fn settle(context: &Shared, tag: &DeliveryTag, settlement: Settlement) {
    let stats = &context.stats;
    let result = match settlement {
        Settlement::Ack => context.broker.ack(tag).await.map(|()| {
            stats.acked.inc();
            info!("acked");
        }),
        Settlement::Nack { delay, why } => context.broker.nack(tag, delay).await.map(|()| {
            stats.nacked.inc();
            info!(?delay, why, "nacked");
        }),
        Settlement::DeadLetter { reason } => {
            context.broker.dead_letter(tag, &reason).await.map(|()| {
                stats.dead_lettered.inc();
                warn!(reason, "dead-lettered");
            })
        }
    };
    if let Err(error) = result {
        stats.settle_failures.inc();
        warn!(%error, "could not settle; the broker will redeliver after the lease expires");
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
