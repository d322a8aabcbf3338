//! Store operations retried in place: transient failures are retried while
//! the lease is kept (and the pull loop pauses), until the grace period ends
//! before the restart, or a bounded number of tries after it.

use std::future::Future;

use tracing::warn;

use super::lease::Progress;
use super::shared::Shared;
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
}

/// When a store operation may stop retrying.
#[derive(Clone, Copy)]
pub(super) enum Until {
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
pub(super) async fn store_op<T, F, Fut>(
    shared: &Shared,
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
        if matches!(until, Until::LeaseHeld) && !progress.lease_held(shared) {
            return Err(Stopped::LeaseLost);
        }
        let result = match until {
            Until::LeaseHeld => match shared.abort.or_abort(operation()).await {
                Some(result) => result,
                None => return Err(Stopped::Shutdown),
            },
            Until::Shielded => operation().await,
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
        tried = tried.saturating_add(1);
        let delay = shared.config.record_backoff.delay(tried);
        if matches!(until, Until::Shielded) && shared.abort.is_aborted() {
            tried_after_abort += 1;
            if tried_after_abort >= shared.config.record_attempts {
                return Err(Stopped::OutOfTime(error));
            }
        }
        if tried == 1 || tried.is_multiple_of(10) {
            warn!(%error, tried, ?delay, "store unavailable; retrying in place");
        }
        match until {
            Until::LeaseHeld => {
                if shared
                    .abort
                    .or_abort(tokio::time::sleep(delay))
                    .await
                    .is_none()
                {
                    return Err(Stopped::Shutdown);
                }
            }
            Until::Shielded => tokio::time::sleep(delay).await,
        }
    }
}
