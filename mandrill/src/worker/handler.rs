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

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::{Context, panic_message};
use crate::broker::{BrokerError, Delivery, DeliveryTag};
use crate::domain::{Outcome, RestartRequest, salvage_message_id};
use crate::restarter::RestartError;
use crate::store::{Recorded, StoreError};

/// How a delivery is to be settled.
#[derive(Debug)]
enum Settlement {
    Ack,
    Nack { delay: Duration, why: String },
    DeadLetter { reason: String },
}

/// Handles one delivery and settles it; holds one flow-control permit.
pub(crate) async fn handle(
    context: Arc<Context>,
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
    async {
        context.stats.in_flight.inc();
        debug!("pulled");
        let work = with_lease(&context, &delivery.tag, process(&context, &delivery));
        let settlement = match AssertUnwindSafe(work).catch_unwind().await {
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
    }
    .instrument(span)
    .await;
    context.flow.release(permit);
}

/// Runs `work` while extending the delivery's lease every interval.
async fn with_lease<F: Future>(context: &Context, tag: &DeliveryTag, work: F) -> F::Output {
    let extend_forever = async {
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
    };
    tokio::select! {
        biased;
        output = work => output,
        never = extend_forever => never,
    }
}

async fn process(context: &Context, delivery: &Delivery) -> Settlement {
    let config = &context.config;
    let attempt = delivery.attempt;
    let request = match RestartRequest::parse(&delivery.payload, &config.parse) {
        Ok(request) => request,
        Err(rejection) => return reject(context, delivery, &rejection.to_string()).await,
    };
    let span = tracing::Span::current();
    span.record("message_id", tracing::field::display(request.message_id));
    span.record("host", tracing::field::display(&request.hostname));

    // Serial on purpose: whether to restart depends on what is recorded.
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
            info!(%status, "already recorded as final; acking without restarting again");
            return Settlement::Ack;
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
    // recorded whatever shutdown does.
    let save = context.store.record_received(&request, attempt);
    let restart = async {
        match tokio::time::timeout(
            config.restart_timeout,
            context.restarter.restart(&request.hostname, reservation),
        )
        .await
        {
            Ok(result) => result,
            Err(_elapsed) => Err(RestartError::TimedOut {
                host: request.hostname.clone(),
                after: config.restart_timeout,
            }),
        }
    };
    let (saved, restarted) = tokio::join!(save, restart);
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

    match record_with_retries(context, || {
        context.store.record_outcome(&request, attempt, &outcome)
    })
    .await
    {
        Ok(Recorded::Recorded) => debug!(status = %outcome.status(), "outcome recorded"),
        Ok(Recorded::AlreadyFinal(status)) => {
            context.stats.duplicates.inc();
            warn!(%status, "another delivery recorded a final outcome first; keeping it");
            return Settlement::Ack;
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

/// Records a malformed payload and dead-letters it. Recording is best effort:
/// the broker keeps the dead letter either way.
async fn reject(context: &Context, delivery: &Delivery, reason: &str) -> Settlement {
    context.stats.rejected.inc();
    warn!(reason, "rejected malformed message");
    let message_id = salvage_message_id(&delivery.payload);
    let recorded = record_with_retries(context, || {
        context
            .store
            .record_rejection(message_id, reason, &delivery.payload)
    })
    .await;
    if let Err(error) = recorded {
        error!(%error, "could not record the rejection; dead-lettering anyway");
    }
    Settlement::DeadLetter {
        reason: reason.to_owned(),
    }
}

async fn record_with_retries<T, F, Fut>(context: &Context, mut operation: F) -> Result<T, StoreError>
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

async fn settle(context: &Context, tag: &DeliveryTag, settlement: Settlement) {
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
