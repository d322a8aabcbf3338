//! Store operations retried in place: transient failures are retried while
//! the lease is kept (and the pull loop pauses), until the grace period ends
//! before the restart, or a bounded number of tries after it.

use std::future::Future;
use std::time::Duration;

use tracing::warn;

use super::lease::Progress;
use super::shared::Shared;
use crate::safety::Policy;
use crate::store::StoreError;

/// Why a store operation retried in place stopped without an answer.
pub(super) enum Stopped {
    /// The grace period is over (before the restart was issued).
    Shutdown,
    /// The lease was lost (before the restart was issued).
    LeaseLost,
    /// The store refused in a way retrying cannot fix.
    Permanent(StoreError),
    /// Shutdown's grace period ended while retrying (after the restart was
    /// issued), and `record_attempts` more tries failed too.
    OutOfTime(StoreError),
    /// The claim only: the policy was reloaded while the store failed; its
    /// terms are to be decided again before another try.
    Reloaded,
}

/// When a store operation may stop retrying.
#[derive(Clone, Copy)]
pub(super) enum Until<'a> {
    /// Before the restart: while the lease is held and the grace period lasts.
    LeaseHeld,
    /// As `LeaseHeld`, except that a call under way when the grace period
    /// ends is awaited a little longer ([`SENT_CALL_WAIT`]) rather than
    /// dropped: for the claim, which a store that queues writes (the SQLite
    /// and PostgreSQL writers) commits whether or not its caller still
    /// waits. Answered, a claim can be given back; dropped, it would count
    /// as a used attempt. A try after a failure is a new decision: under a
    /// policy other than `decided_under` (a reload), it stops with
    /// [`Stopped::Reloaded`] instead, so that limits lowered meanwhile hold.
    LeaseHeldOnceSent { decided_under: &'a Policy },
    /// After the restart: until the store answers (the pull loop is paused
    /// meanwhile, and the lease kept), or, once the grace period is over,
    /// for at most `record_attempts` tries and until the abort's record
    /// deadline (`store_timeout` after it), so that shutdown is bounded
    /// even by a store that hangs.
    Shielded,
}

/// How much longer a call sent before the end of the grace period is
/// awaited under [`Until::LeaseHeldOnceSent`]: a writer's batch commits in
/// milliseconds, so this bounds shutdown only when the store hangs.
pub(super) const SENT_CALL_WAIT: Duration = Duration::from_secs(1);

/// Runs a store operation, retrying transient failures in place. While the
/// store fails, it is marked down, so that the pull loop stops taking new
/// work instead of churning deliveries; any success marks it up again.
pub(super) async fn store_op<T, F, Fut>(
    shared: &Shared,
    progress: &Progress,
    until: Until<'_>,
    mut operation: F,
) -> Result<T, Stopped>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tried = 0u32;
    let mut tried_after_abort = 0u32;
    loop {
        if matches!(until, Until::LeaseHeld | Until::LeaseHeldOnceSent { .. })
            && !progress.lease_held(shared)
        {
            return Err(Stopped::LeaseLost);
        }
        if let Until::LeaseHeldOnceSent { decided_under } = until {
            if shared.abort.is_aborted() {
                return Err(Stopped::Shutdown);
            }
            // Read only on a retry: each read is a shared lock. Not once a
            // try timed out: that try may have claimed, and only the
            // same-token answer names the attempt to give back (the caller
            // gives it back and decides afresh, `Progress::claim_retried`).
            if tried > 0
                && !progress
                    .claim_retried
                    .load(std::sync::atomic::Ordering::Acquire)
                && !std::ptr::eq(&*shared.config.policy.current(), decided_under)
            {
                return Err(Stopped::Reloaded);
            }
        }
        // One slot for the call, whichever way it is awaited: every handler
        // waiting on the store holds this future, so each path's wrapper
        // borrows the call rather than keeping a copy of its own, and the
        // rare waits (a timeout at shutdown, the backoff) are boxed.
        let mut call = std::pin::pin!(operation());
        let result = match until {
            Until::LeaseHeld => match shared.abort.or_abort(call.as_mut()).await {
                Some(result) => result,
                None => return Err(Stopped::Shutdown),
            },
            Until::LeaseHeldOnceSent { .. } => match shared.abort.or_abort(call.as_mut()).await {
                Some(result) => result,
                // Sent, and perhaps being committed: its answer says what
                // to give back.
                None => match Box::pin(tokio::time::timeout(SENT_CALL_WAIT, call)).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(_)) => return Err(Stopped::Shutdown),
                    Err(_elapsed) => {
                        warn!(
                            waited = ?SENT_CALL_WAIT,
                            "the grace period ended with a claim unanswered; \
                             if the store records it, it counts as a used attempt"
                        );
                        return Err(Stopped::Shutdown);
                    }
                },
            },
            Until::Shielded => match shared.abort.record_deadline() {
                None => call.await,
                // Boxed: only at shutdown.
                Some(deadline) => match Box::pin(tokio::time::timeout_at(deadline, call)).await {
                    Ok(result) => result,
                    Err(_elapsed) => {
                        let after = shared.config.store_timeout;
                        return Err(Stopped::OutOfTime(StoreError::TimedOut { after }));
                    }
                },
            },
        };
        let error = match result {
            Ok(value) => {
                shared.store_health.succeeded(&shared.stats);
                return Ok(value);
            }
            Err(error) => error,
        };
        shared.stats.store_failures.inc();
        if !error.is_transient() {
            return Err(Stopped::Permanent(error));
        }
        shared.store_health.failed(&shared.stats);
        // A claim that may have been committed all the same (its call
        // timed out; any other error rolled it back).
        if matches!(until, Until::LeaseHeldOnceSent { .. }) && error.outcome_unknown() {
            progress
                .claim_retried
                .store(true, std::sync::atomic::Ordering::Release);
        }
        tried = tried.saturating_add(1);
        let delay = shared.config.record_backoff.delay(tried);
        if matches!(until, Until::Shielded) && shared.abort.is_aborted() {
            tried_after_abort += 1;
            let past_deadline = shared
                .abort
                .record_deadline()
                .is_some_and(|deadline| tokio::time::Instant::now() + delay >= deadline);
            if tried_after_abort >= shared.config.record_attempts || past_deadline {
                return Err(Stopped::OutOfTime(error));
            }
        }
        if tried == 1 || tried.is_multiple_of(10) {
            warn!(error = %error.with_causes(), tried, ?delay, "store unavailable; retrying in place");
        }
        // Boxed: only a failing store gets here.
        let backoff = Box::pin(tokio::time::sleep(delay));
        match until {
            Until::LeaseHeld | Until::LeaseHeldOnceSent { .. } => {
                if shared.abort.or_abort(backoff).await.is_none() {
                    return Err(Stopped::Shutdown);
                }
            }
            Until::Shielded => backoff.await,
        }
    }
}
