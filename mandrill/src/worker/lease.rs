//! The lease of one delivery, kept while its handler works: `Progress`
//! (the lease and claim state shared by the work and the extender) and
//! `WithLease` (the work, with the extender polled beside it).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::time::Instant;
use tracing::{info, warn};

use super::shared::Shared;
use crate::broker::{BrokerError, DeliveryTag};
use crate::stats::DeadLetterReason;

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
    pub(super) claimed: AtomicU32,
    /// Why a dead letter was chosen, a [`DeadLetterReason`] (in the padding
    /// after `claimed`: no bigger a task).
    pub(super) dead_letter: AtomicU8,
}

impl Progress {
    pub(super) fn new(shared: &Shared) -> Self {
        Self {
            lease_lost: AtomicBool::new(false),
            lease_expires: AtomicU64::new(shared.millis(Instant::now() + shared.ack_deadline)),
            claimed: AtomicU32::new(0),
            dead_letter: AtomicU8::new(DeadLetterReason::Other as u8),
        }
    }

    /// Notes why the settlement about to be returned is a dead letter.
    pub(super) fn dead_letter_because(&self, reason: DeadLetterReason) {
        self.dead_letter.store(reason as u8, Ordering::Relaxed);
    }

    /// Whether the lease is still ours, with a margin for the step about to
    /// be taken.
    pub(super) fn lease_held(&self, shared: &Shared) -> bool {
        !self.lease_lost.load(Ordering::Acquire)
            && shared.millis(Instant::now() + shared.lease_margin)
                < self.lease_expires.load(Ordering::Acquire)
    }
}

pin_project_lite::pin_project! {
    /// `work`, with the lease kept while it runs: polls the extender only
    /// while the work is pending, and drops it (stopping extension) as soon
    /// as the work completes.
    ///
    /// A struct rather than an `async fn` with `select!`: an `async fn` keeps
    /// its argument and the pinned copy of it both in its state, which
    /// doubled every task's memory.
    pub(super) struct WithLease<W, E> {
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
pub(super) fn with_lease<'a, W: Future + 'a>(
    shared: &'a Shared,
    tag: &'a DeliveryTag,
    progress: &'a Progress,
    work: W,
) -> WithLease<W, impl Future<Output = Infallible> + 'a> {
    WithLease {
        work,
        extender: extend_forever(shared, tag, progress),
    }
}

pub(super) async fn extend_forever(
    shared: &Shared,
    tag: &DeliveryTag,
    progress: &Progress,
) -> Infallible {
    loop {
        tokio::time::sleep(shared.lease_extension_interval).await;
        // The new deadline counts from the request, not the answer.
        let expires = shared.millis(Instant::now() + shared.ack_deadline);
        match shared.broker.extend(tag).await {
            Ok(()) => {
                progress.lease_expires.store(expires, Ordering::Release);
                shared.stats.lease_extensions.inc();
                info!("extended lease");
            }
            Err(error @ BrokerError::LeaseLost(_)) => {
                progress.lease_lost.store(true, Ordering::Release);
                shared.stats.leases_lost.inc();
                warn!(error = %error.with_causes(), "lease lost; the message may be redelivered");
                return std::future::pending().await;
            }
            Err(error) => {
                warn!(error = %error.with_causes(), "could not extend lease; will try again")
            }
        }
    }
}
