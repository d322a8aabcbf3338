//! Companions of the worker that the service runs beside it: history
//! pruning, and `--until-idle`'s watch.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::domain::Timestamp;
use crate::domain::signed::{LEEWAY, MAX_LIFETIME};
use crate::safety::{Policy, PolicyHandle};
use crate::stats::Stats;
use crate::store::Store;
use crate::worker::Shutdown;

/// Rows deleted per pruning statement: small enough that the store's writer
/// (and so the pipeline) is never held for long.
const PRUNE_BATCH: u32 = 5_000;

/// How long a signed request can be accepted, from its first receipt to its
/// last: verification takes it from `iat - LEEWAY` (an `iat` up to a leeway
/// ahead) until `exp + LEEWAY`, and `exp - iat` is at most `MAX_LIFETIME`.
const SIGNED_VALIDITY: Duration = MAX_LIFETIME.saturating_add(LEEWAY.saturating_mul(2));

/// How long finished requests are kept under `policy`: `retention`, but
/// never less than what a guard still reads (the counting guards' and the
/// requesters' quota windows), nor than [`SIGNED_VALIDITY`]: a finished
/// row is what makes a republished signed request a duplicate, so pruning
/// it while its token is still valid would let the same token restart the
/// host again. The floor holds with no requester configured too: it costs
/// at most a day of rows, and a reload can configure requesters at any
/// time, so it must not depend on the policy of the moment.
fn keep(retention: Duration, policy: &Policy) -> Duration {
    retention
        .max(policy.guards.counting.lookback())
        .max(policy.requesters.lookback())
        .max(SIGNED_VALIDITY)
}

/// Deletes finished requests older than `retention`, `first_after` start and
/// then every hour, in bounded batches with a pause between them.
///
/// Never a journal row the counting guards still read, nor one whose signed
/// request could still be replayed: see [`keep`] (the policy in force at
/// each prune), so that a retention shorter than the rate window cannot let
/// a group's restart drop out of its count.
pub(super) async fn prune_history(
    store: Arc<dyn Store>,
    retention: Duration,
    policy: PolicyHandle,
    first_after: Duration,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + first_after,
        Duration::from_secs(3600),
    );
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let keep = keep(retention, &policy.current());
        let cutoff = Timestamp::from_millis(
            Timestamp::now()
                .as_millis()
                .saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX)),
        );
        let mut pruned = 0u64;
        loop {
            match store.prune(cutoff, PRUNE_BATCH).await {
                Ok(rows) => {
                    pruned += rows;
                    if rows < u64::from(PRUNE_BATCH) {
                        break;
                    }
                }
                Err(error) => {
                    warn!(error = %error.with_causes(), "could not prune the history; will try again");
                    break;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = stop.cancelled() => return,
            }
        }
        if pruned > 0 {
            info!(
                pruned,
                ?keep,
                "pruned finished requests past their retention (and the guards' lookback)"
            );
        }
    }
}

/// Requests shutdown once the broker reports an empty backlog and no
/// delivery is being handled. Checks every `every`.
pub(super) async fn request_shutdown_when_idle(
    broker: Arc<dyn Broker>,
    stats: Arc<Stats>,
    shutdown: Shutdown,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        // Raced against the stop, so that a broker that stopped answering
        // cannot hold the shutdown.
        let backlog = tokio::select! {
            backlog = broker.backlog() => backlog,
            () = stop.cancelled() => return,
        };
        match backlog {
            Ok(Some(0)) if stats.in_flight.get() == 0 => {
                info!("queue is idle: nothing visible, delayed or in flight; shutting down");
                shutdown.request();
                return;
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                warn!("this broker cannot report its backlog; --until-idle has no effect");
                return;
            }
            Err(error) => {
                warn!(error = %error.with_causes(), "could not read the broker's backlog")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_finished_requests_while_a_signed_token_could_be_replayed() {
        let policy = Policy::default();
        // A retention under a day keeps a day and two leeways: a token
        // issued a minute ahead, valid 24 h and a minute past its exp.
        let hour = Duration::from_secs(3600);
        assert_eq!(keep(hour, &policy), Duration::from_secs(24 * 3600 + 2 * 60));
        // A longer retention is kept as configured.
        let ninety_days = Duration::from_secs(90 * 24 * 3600);
        assert_eq!(keep(ninety_days, &policy), ninety_days);
    }
}
