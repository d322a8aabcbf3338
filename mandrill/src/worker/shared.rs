//! What every handler shares: the adapters, the configuration, the store's
//! health, the kill switch as last read, and the abort at the end of the
//! grace period.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{error, info, warn};

use super::{FlowControl, WorkerConfig};
use crate::broker::Consumer;
use crate::domain::RestartRequest;
use crate::domain::Timestamp;
use crate::notify::{Event, EventKind, Notifier};
use crate::restarter::Restarter;
use crate::stats::Stats;
use crate::store::{ClaimTerms, Store};

/// Everything a handler needs, shared by all of them.
pub(crate) struct Shared {
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
    pub paused: AtomicBool,
    /// Instants are kept as milliseconds since this one.
    pub epoch: Instant,
    /// The grace period is over: handlers that have not issued their
    /// restart nack and return. See [`Abort`].
    pub abort: Abort,
    /// The `[[notify]]` endpoints, if any; never waited for.
    pub notifier: Option<Arc<Notifier>>,
    /// Verdicts being published to `reply_to` destinations (`reply.rs`),
    /// each bounded; the drain waits for them.
    pub replies: tokio_util::task::TaskTracker,
}

impl Shared {
    /// `at` as milliseconds since the epoch (0 if before it).
    pub(crate) fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

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

    /// Queues a notification that this instance turned the kill switch,
    /// asked of the store at `asked` and written by now.
    pub(crate) fn notify_switch(&self, paused: bool, by: &str, reason: &str, asked: Timestamp) {
        if let Some(notifier) = &self.notifier {
            notifier.switch_turned_here(paused, by, reason, asked, Timestamp::now());
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Records the switch as read; says so when it turns.
    pub(crate) fn set_paused(&self, paused: bool, why: &str) {
        if self.paused.swap(paused, Ordering::AcqRel) != paused {
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

/// The end of the grace period, as handlers see it.
///
/// A flag read per step, and a token waited on only by a handler that is
/// actually waiting: every `CancellationToken::cancelled()` polled while
/// pending registers a waiter on the token's one shared list (a lock), and
/// `is_cancelled` takes that lock too. With the flag, a store call or a
/// reservation that completes at once touches nothing shared.
#[derive(Debug, Default)]
pub(crate) struct Abort {
    aborted: AtomicBool,
    token: CancellationToken,
    /// Until when restarts already issued may still try to record their
    /// outcome; set when the grace period ends.
    record_deadline: std::sync::OnceLock<Instant>,
}

impl Abort {
    /// Ends the grace period: every abortable wait returns.
    #[cfg(test)]
    pub(crate) fn abort(&self) {
        // The flag first: a waiter woken by the token finds it set.
        self.aborted.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Ends the grace period, as [`Abort::abort`]; restarts already issued
    /// may try to record their outcome until `record_deadline`.
    pub(crate) fn abort_with_deadline(&self, record_deadline: Instant) {
        let _ = self.record_deadline.set(record_deadline);
        self.aborted.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Until when an outcome may still be recorded, once the grace period
    /// is over.
    pub(crate) fn record_deadline(&self) -> Option<Instant> {
        self.record_deadline.get().copied()
    }

    /// Whether the grace period is over. One atomic load.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// `work`, unless the grace period ends first: `None` then. The one
    /// abort-or-nack choice of the handlers. Biased towards the abort as
    /// before: work is not started once the grace period is over.
    pub(crate) fn or_abort<F: Future>(&self, work: F) -> OrAbort<'_, F> {
        OrAbort {
            work,
            abort: self,
            cancelled: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// See [`Abort::or_abort`]. Polls `work` first and registers on the
    /// abort token only while `work` is pending.
    pub(crate) struct OrAbort<'a, F> {
        #[pin]
        work: F,
        abort: &'a Abort,
        #[pin]
        cancelled: Option<WaitForCancellationFuture<'a>>,
    }
}

impl<F: Future> Future for OrAbort<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.abort.is_aborted() {
            return Poll::Ready(None);
        }
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(Some(output));
        }
        // Pending: only now wait on the token. A cancel between the flag's
        // load and this registration is seen by the token's own check.
        if this.cancelled.is_none() {
            this.cancelled.set(Some(this.abort.token.cancelled()));
        }
        match this.cancelled.as_pin_mut().map(|c| c.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

/// Whether the store answers, as the handlers find out: while it does not,
/// the pull loop takes no new work (each nack would cost a delivery) and
/// probes it until it answers.
#[derive(Debug, Default)]
pub(crate) struct StoreHealth {
    down: AtomicBool,
}

impl StoreHealth {
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// A store operation failed transiently.
    pub(crate) fn failed(&self, stats: &Stats) {
        if !self.down.swap(true, Ordering::AcqRel) {
            stats.store_outages.inc();
            stats.store_down.inc();
            error!("store unreachable: pausing pulls until it answers");
        }
    }

    /// A store operation succeeded.
    pub(crate) fn succeeded(&self, stats: &Stats) {
        // A load first: the common case (up) costs no write to shared memory.
        if self.is_down() && self.down.swap(false, Ordering::AcqRel) {
            stats.store_down.dec();
            info!("store reachable again: resuming pulls");
        }
    }
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
mod tests {
    use std::task::Waker;

    use super::*;

    #[tokio::test]
    async fn or_abort_returns_the_work_or_none_once_aborted() {
        let abort = Abort::default();
        assert_eq!(abort.or_abort(async { 7 }).await, Some(7));
        // Pending work is interrupted by the abort.
        let waiting = abort.or_abort(std::future::pending::<()>());
        let mut waiting = std::pin::pin!(waiting);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        abort.abort();
        assert_eq!(waiting.poll(&mut cx), Poll::Ready(None));
        // Work is not started once aborted.
        let started = AtomicBool::new(false);
        let work = async { started.store(true, Ordering::Relaxed) };
        assert_eq!(abort.or_abort(work).await, None);
        assert!(!started.load(Ordering::Relaxed));
    }
}
