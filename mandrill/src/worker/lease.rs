//! The leases of one pulled batch, kept while its handlers work: `Leased`
//! (a delivery and its `Progress`, the lease and claim state shared by the
//! work and the extender), `extend_batch` (one timer for the whole batch)
//! and `WithLease` (the batch's work, with the extender polled beside it).

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::FutureExt as _;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::shared::Shared;
use crate::broker::{BrokerError, Delivery};
use crate::stats::DeadLetterReason;
use crate::store::ClaimToken;

/// One delivery of a pulled batch and what its handler knows of it. The
/// batch's task owns these; each handler borrows its own, and the batch's
/// one extender reads them all.
#[derive(Debug)]
pub(super) struct Leased {
    pub(super) delivery: Delivery,
    pub(super) progress: Progress,
}

impl Leased {
    /// A delivery pulled at `pulled`: its lease counts from then.
    pub(super) fn new(shared: &Shared, delivery: Delivery, pulled: Instant) -> Self {
        Self {
            delivery,
            progress: Progress::new(shared, pulled),
        }
    }
}

/// What one handler knows of its delivery while it works: shared between the
/// work and the batch's lease extender (both polled by the batch's task).
#[derive(Debug)]
pub(super) struct Progress {
    /// When the lease runs out unless extended, in milliseconds since the
    /// worker's epoch.
    lease_expires: AtomicU64,
    /// When the delivery was pulled, in milliseconds since the worker's epoch
    /// (wrapping: only the handling time is taken from it).
    pub(super) pulled: u32,
    /// The restart attempt this delivery claimed; 0 before a claim.
    pub(super) claimed: AtomicU32,
    /// The token of this delivery's claiming call
    /// ([`ClaimToken::to_stored`]), set before it is sent: a release
    /// gives back only the claim made with it.
    pub(super) claim_token: AtomicI64,
    /// A try of the claim timed out and it was tried again: its answer may
    /// be the timed-out try's claim, committed with the time (hold,
    /// `claimed_at`) and guards of then (set by `store_op`).
    pub(super) claim_retried: AtomicBool,
    /// The claimed restart was handed to the restarter: from here its
    /// outcome is unknown until the restarter answers.
    pub(super) issued: AtomicBool,
    /// Why a dead letter was chosen, a [`DeadLetterReason`].
    pub(super) dead_letter: AtomicU8,
    /// The broker said the lease is gone.
    lease_lost: AtomicBool,
    /// The handler's work is still running, so its lease is still extended.
    /// Cleared once the work ends (settling needs no more lease than the
    /// work left it), as dropping a handler's own extender did.
    working: AtomicBool,
}

impl Progress {
    pub(super) fn new(shared: &Shared, pulled: Instant) -> Self {
        Self {
            lease_expires: AtomicU64::new(shared.millis(pulled + shared.ack_deadline)),
            pulled: shared.millis(pulled) as u32,
            claimed: AtomicU32::new(0),
            claim_token: AtomicI64::new(0),
            claim_retried: AtomicBool::new(false),
            issued: AtomicBool::new(false),
            dead_letter: AtomicU8::new(DeadLetterReason::Other as u8),
            lease_lost: AtomicBool::new(false),
            working: AtomicBool::new(true),
        }
    }

    /// The token of this delivery's claim (see `claim_token`).
    pub(super) fn claim_token(&self) -> ClaimToken {
        ClaimToken::from_stored(self.claim_token.load(Ordering::Acquire))
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

    /// The work is over: stop extending this delivery's lease.
    pub(super) fn work_done(&self) {
        self.working.store(false, Ordering::Release);
    }

    /// Whether the extender should extend this lease now.
    fn wants_extension(&self) -> bool {
        self.working.load(Ordering::Acquire) && !self.lease_lost.load(Ordering::Acquire)
    }
}

pin_project_lite::pin_project! {
    /// `work`, with the leases kept while it runs: polls the extender only
    /// while the work is pending, and drops it (stopping extension) as soon
    /// as the work completes.
    ///
    /// A struct rather than an `async fn` with `select!`: an `async fn` keeps
    /// its argument and the pinned copy of it both in its state.
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

/// Runs `work` (the batch's handlers) while extending the lease of each of
/// `batch`'s deliveries whose work is still running, every interval.
pub(super) fn with_lease<'a, W: Future + 'a>(
    shared: &'a Shared,
    batch: &'a [Leased],
    work: W,
) -> WithLease<W, impl Future<Output = Infallible> + 'a> {
    WithLease {
        work,
        extender: extend_batch(shared, batch),
    }
}

/// One timer for a whole batch, rather than one per handler: a waiting
/// handler holds no timer of its own (its memory, and the timer wheel's
/// work, count once per batch). The deliveries of a batch were pulled
/// together, so their leases run on one schedule; each is extended while
/// its own work runs, and the extensions of one round go out together.
///
/// A round never outlasts the interval: each extension is given that long,
/// and the next round starts on schedule, so one extension the broker never
/// answers cannot keep the batch's other leases from being extended (with a
/// timer per handler it held up only its own).
pub(super) async fn extend_batch(shared: &Shared, batch: &[Leased]) -> Infallible {
    let interval = shared.lease_extension_interval;
    let mut next = Instant::now() + interval;
    loop {
        tokio::time::sleep_until(next).await;
        let started = Instant::now();
        next = started + interval;
        // The new deadline counts from the request, not the answer.
        let expires = shared.millis(started + shared.ack_deadline);
        let mut extensions: FuturesUnordered<_> = batch
            .iter()
            .filter(|leased| leased.progress.wants_extension())
            .map(|leased| async move {
                let tag = &leased.delivery.tag;
                // A panicking adapter fails this extension, not the batch's
                // task (which would drop every handler of the batch, their
                // restarts under way among them).
                let extending = AssertUnwindSafe(shared.broker.extend(tag)).catch_unwind();
                (leased, tokio::time::timeout(interval, extending).await)
            })
            .collect();
        while let Some((leased, extended)) = extensions.next().await {
            let progress = &leased.progress;
            if !progress.working.load(Ordering::Acquire) {
                // Finished while its extension was on its way (and perhaps
                // settled already): the answer no longer matters.
                continue;
            }
            let tag = &leased.delivery.tag;
            match extended {
                Ok(Ok(Ok(()))) => {
                    progress.lease_expires.store(expires, Ordering::Release);
                    shared.stats.lease_extensions.inc();
                    info!(%tag, "extended lease");
                }
                Ok(Ok(Err(error @ BrokerError::LeaseLost(_)))) => {
                    progress.lease_lost.store(true, Ordering::Release);
                    shared.stats.leases_lost.inc();
                    warn!(%tag, error = %error.with_causes(), "lease lost; the message may be redelivered");
                }
                Ok(Ok(Err(error))) => {
                    warn!(%tag, error = %error.with_causes(), "could not extend lease; will try again")
                }
                Ok(Err(_panic)) => {
                    error!(%tag, "extending the lease panicked; will try again");
                }
                // The broker may have extended it: the deadline known here
                // stays the earlier one, which only errs on the safe side.
                Err(_elapsed) => {
                    warn!(%tag, ?interval, "extending the lease got no answer; will try again")
                }
            }
        }
    }
}
