//! How a delivery ends: `Settlement`, settling it with the broker (retried
//! on transient errors), and the rejection of a malformed payload.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tracing::{error, info, warn};

use super::lease::Progress;
use super::retry::{Stopped, Until, store_op};
use super::shared::Shared;
use crate::broker::{BrokerError, Delivery};
use crate::domain::{Asked, RestartRequest, Status};
use crate::stats::DeadLetterReason;

/// How a delivery is to be settled.
#[derive(Debug)]
pub(super) enum Settlement {
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

pub(super) fn shutting_down() -> Settlement {
    Settlement::Nack {
        delay: Duration::ZERO,
        why: "shutting down before the restart began".into(),
    }
}

/// How to settle a delivery whose request already has a final outcome. A
/// request recorded as failed is dead-lettered again rather than acked: the
/// delivery that recorded it may have failed to dead-letter it (a broker
/// hiccup), and acking now would lose the dead letter.
pub(super) fn settle_recorded(status: Status) -> Settlement {
    match status {
        Status::Failed => Settlement::DeadLetter {
            reason: "restart failed on every attempt (recorded by an earlier delivery)".into(),
        },
        _ => Settlement::Ack,
    }
}

/// A rare path's future, boxed and built outside the caller's state: the
/// values it is made from (a rejection, a reason) would otherwise keep slots
/// in every handler task for its whole life.
pub(super) fn rare<'a>(future: impl Future<Output = Settlement> + Send + 'a) -> RareSettlement<'a> {
    Box::pin(future)
}

/// See [`rare`].
pub(super) type RareSettlement<'a> = Pin<Box<dyn Future<Output = Settlement> + Send + 'a>>;

/// Records a malformed payload and dead-letters it ([`record_apart`]).
pub(super) async fn reject(
    shared: &Shared,
    delivery: &Delivery,
    progress: &Progress,
    reason: String,
) -> Settlement {
    shared.stats.rejected.inc();
    progress.dead_letter_because(DeadLetterReason::Malformed);
    warn!(reason, "rejected malformed message");
    // What it asked, read unverified: the history shows who tried to
    // restart what, marked unverified.
    let asked = Asked::salvage(&delivery.payload);
    record_apart(shared, progress, &asked, reason, &delivery.payload).await
}

/// Refuses a valid payload that asked something else under a `message_id`
/// recorded for another request (`reason`, from the store's
/// [`identity_conflict`](crate::store::identity_conflict)): recorded apart
/// with what it asked and who signed it (never onto the other request's
/// record), and dead-lettered. The other request is left as it was.
pub(super) async fn refuse(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    reason: String,
) -> Settlement {
    progress.dead_letter_because(DeadLetterReason::Refused);
    warn!(reason, "refused: the message id is another request's");
    let asked = Asked::of(request);
    // The request as parsed stands for its payload: what it asked, legible
    // even when the payload was a signed token.
    let payload = request.to_wire();
    record_apart(shared, progress, &asked, reason, &payload).await
}

/// Records a payload apart from every request's record (what it `asked`,
/// why not, the payload), then dead-letters it. Recording is retried in
/// place like every store write, but a store that refuses for good does
/// not keep the dead letter from the broker.
async fn record_apart(
    shared: &Shared,
    progress: &Progress,
    asked: &Asked,
    reason: String,
    payload: &[u8],
) -> Settlement {
    let recorded = store_op(shared, progress, Until::LeaseHeld, || {
        shared.store.record_rejection(asked, &reason, payload)
    })
    .await;
    match recorded {
        Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
        Ok(()) => {}
        Err(Stopped::Shutdown) => return shutting_down(),
        Err(Stopped::LeaseLost) => return Settlement::Abandon,
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(error = %error.with_causes(), "could not record the payload apart; dead-lettering anyway");
        }
    }
    Settlement::DeadLetter { reason }
}

/// Settles a delivery, retrying a few times when the broker is briefly
/// unavailable. A lost lease is not retried: the broker redelivers.
pub(super) async fn settle(
    shared: &Shared,
    delivery: &Delivery,
    settlement: Settlement,
    why: DeadLetterReason,
) {
    const TRIES: u32 = 3;
    let tag = &delivery.tag;
    let stats = &shared.stats;
    for tried in 1..=TRIES {
        let result = match &settlement {
            Settlement::Ack => shared.broker.ack(tag).await.map(|()| {
                stats.acked.inc();
                info!("acked");
            }),
            Settlement::Acked => {
                stats.acked.inc();
                info!("acked");
                Ok(())
            }
            Settlement::Nack { delay, why } => shared.broker.nack(tag, *delay).await.map(|()| {
                stats.nacked.inc();
                info!(?delay, why, "nacked");
            }),
            Settlement::DeadLetter { reason } => {
                shared.broker.dead_letter(tag, reason).await.map(|()| {
                    stats.dead_lettered.inc();
                    stats.dead_letter_reasons[why as usize].inc();
                    warn!(reason, "dead-lettered");
                    shared.notify_dead_letter(&delivery.payload, reason);
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
