//! Decisions that issue nothing: denied, deferred, expired, dry run, given
//! up, a claim given back. Each is recorded (for the history, and
//! `mandrill explain`), then settled.
//!
//! Every way a delivery ends without a restart, so one file past 400 lines.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{error, info, warn};

use super::lease::Progress;
use super::reply::reply;
use super::retry::{Stopped, Until, store_op};
use super::settle::{Settlement, refuse, settle_recorded, shutting_down};
use super::shared::Shared;
use crate::domain::{Outcome, RestartRequest};
use crate::notify::EventKind;
use crate::safety::{Hold, Since};
use crate::stats::DeadLetterReason;
use crate::store::{Decision, Recorded};

/// Records a request a safety guard refused for good, and acks it: the
/// request was handled, by a decision not to act. `attempt` is 0 when it
/// was refused before any claim, or the claimed attempt when a reload
/// denied it after (nothing was issued; the denial settles the claim).
pub(super) async fn deny(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    reason: String,
) -> Settlement {
    deny_by(shared, progress, request, attempt, "eligibility", reason).await
}

/// As [`deny`], for the guard named: `group` when the message's group
/// disagrees with the operator's.
pub(super) async fn deny_by(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    guard: &'static str,
    reason: String,
) -> Settlement {
    shared.stats.denied.inc();
    info!(reason, attempt, guard, "denied");
    let decision = Decision {
        verdict: "denied",
        guard,
        reason: &reason,
    };
    if let Some(conflict) = note_decision(shared, request, attempt, decision).await {
        return refuse(shared, progress, request, conflict).await;
    }
    let outcome = Outcome::Denied { reason };
    record_decision(shared, progress, request, attempt, outcome).await
}

/// As [`held`], for a hold the store's claim decided and already recorded
/// (with its deferral counted): a deferral is not noted a second time, or
/// it would count twice against `broker.max_deliveries`' allowance. Past
/// `safety.max_defer` it is an expiry, which the claim did not record.
pub(super) async fn held_by_the_claim(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    hold: Hold,
) -> Settlement {
    settle_hold(shared, progress, request, hold, false).await
}

/// A guard said not now. Deferred: nacked to come back when the guard could
/// pass, with nothing claimed or issued (the nack frees the flow-control
/// slot). Deferred past `safety.max_defer`: recorded `expired` and acked.
pub(super) async fn held(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    hold: Hold,
) -> Settlement {
    settle_hold(shared, progress, request, hold, true).await
}

/// [`held`] and [`held_by_the_claim`]: `note_deferral` says whether a
/// deferral's decision is still to be recorded.
async fn settle_hold(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    hold: Hold,
    note_deferral: bool,
) -> Settlement {
    let policy = shared.config.policy.current();
    let hold = match hold {
        Hold::Defer {
            guard,
            delay,
            reason,
            // Undated (no `published_at`, or one too far ahead): its expiry is
            // judged from its first receipt, which only the store knows.
        } if policy.guards.published(request).is_none() => {
            Box::pin(date_by_first_receipt(shared, request, guard, delay, reason)).await
        }
        hold => hold,
    };
    match hold {
        Hold::Defer {
            guard,
            delay,
            reason,
        } => {
            shared.stats.deferred.inc();
            info!(?delay, guard, reason, "deferred");
            if note_deferral {
                let decision = Decision {
                    verdict: "deferred",
                    guard,
                    reason: &reason,
                };
                // Not deferred on another request's behalf: its record
                // is left alone, this payload refused.
                if let Some(conflict) = note_decision(shared, request, 0, decision).await {
                    return refuse(shared, progress, request, conflict).await;
                }
            }
            // Back within `safety.recheck` whatever the guard waits for:
            // a reload or a `resume` meanwhile decides it then.
            let delay = policy.guards.nack_delay(delay);
            Settlement::Nack { delay, why: reason }
        }
        Hold::Expired { guard, reason } => {
            shared.stats.expired.inc();
            info!(guard, reason, "expired");
            let decision = Decision {
                verdict: "expired",
                guard,
                reason: &reason,
            };
            if let Some(conflict) = note_decision(shared, request, 0, decision).await {
                return refuse(shared, progress, request, conflict).await;
            }
            let outcome = Outcome::Expired { reason };
            record_decision(shared, progress, request, 0, outcome).await
        }
    }
}

/// How long asking the store when it first received a request may take
/// before the deferral goes ahead without the answer (asked again at the
/// next one): as long as the kill switch's read before a restart.
const FIRST_RECEIPT_TIMEOUT: Duration = Duration::from_secs(2);

/// A deferral of a request its own `published_at` cannot date: expired if
/// it would still wait past `safety.max_defer` after the store first
/// received it, else deferred. Asked only here, on the way to a nack: the
/// store's read (and, the first time, its write) is kept off the path of
/// requests that are not deferred.
async fn date_by_first_receipt(
    shared: &Shared,
    request: &RestartRequest,
    guard: &'static str,
    delay: Duration,
    reason: String,
) -> Hold {
    let asked =
        tokio::time::timeout(FIRST_RECEIPT_TIMEOUT, shared.store.first_received(request)).await;
    match asked {
        Ok(Ok(received)) => {
            // Out of range only from a corrupt row: taken as long ago, so
            // the request expires (does less) rather than waits for ever.
            let received = jiff::Timestamp::from_millisecond(received.as_millis())
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
            let policy = shared.config.policy.current();
            policy
                .guards
                .defer_since(Since::FirstReceived(received), guard, delay, reason)
        }
        Ok(Err(error)) => {
            warn!(error = %error.with_causes(), "cannot read when the request was first received; deferring without expiry this time");
            Hold::Defer {
                guard,
                delay,
                reason,
            }
        }
        Err(_elapsed) => {
            warn!(
                "reading when the request was first received timed out; deferring without expiry this time"
            );
            Hold::Defer {
                guard,
                delay,
                reason,
            }
        }
    }
}

/// A guard closed between the claim and the restart. Deferred: the claim
/// is given back, so that it does not count as a used attempt, and the
/// delivery deferred. Expired: recorded against the claimed attempt (final,
/// so the count no longer matters).
pub(super) async fn unclaim(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    hold: Hold,
) -> Settlement {
    if let Hold::Expired { reason, .. } = hold {
        shared.stats.expired.inc();
        info!(reason, "expired after the claim");
        let outcome = Outcome::Expired { reason };
        return record_decision(shared, progress, request, attempt, outcome).await;
    }
    let token = progress.claim_token();
    let released = store_op(shared, progress, Until::LeaseHeld, || {
        shared.store.release_claim(request, attempt, token)
    })
    .await;
    match released {
        Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
        Ok(()) => progress.claimed.store(0, Ordering::Release),
        // The claim holds until it expires and then counts as used: an
        // attempt lost, never a restart outside the guard.
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            warn!(error = %error.with_causes(), attempt, "could not give back the claim; it counts as used");
        }
        // Shutdown's abort stops a store call before it is sent, or cuts
        // it off: given back with one bounded try, as every shutdown path
        // gives back a claim never issued (it frees only this delivery's
        // own claim, named by its token, so a second release is harmless).
        Err(Stopped::Shutdown) => {
            return unclaim_at_shutdown(shared, progress, request, attempt).await;
        }
        // Nothing issued: given back, though another consumer may hold the
        // message now (else the claim would count as an attempt issued with
        // its outcome unknown).
        Err(Stopped::LeaseLost) => {
            return unclaim_lease_lost(shared, progress, request, attempt).await;
        }
    }
    held(shared, progress, request, hold).await
}

/// Leashed: records the exact action the restart would have taken, as the
/// outcome of the attempt just claimed, and acks. Nothing touches the host.
pub(super) async fn dry_run_action(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
) -> Settlement {
    let action = shared.restarter.describe(request);
    shared.stats.dry_runs.inc();
    info!(
        action,
        "dry run: not restarting (leashed: `mandrill status` says by whom; `mandrill unleash \
         --reason …` acts)"
    );
    let decision = Decision {
        verdict: "dry-run",
        guard: "leash",
        reason: "leashed (the leash recorded in the store, else safety.dry_run): every guard \
                 allowed it; the action was recorded, not taken",
    };
    // After this delivery's own claim, which judged who asked: a
    // conflict cannot be answered here.
    note_decision(shared, request, attempt, decision).await;
    let outcome = Outcome::DryRun { action };
    record_decision(shared, progress, request, attempt, outcome).await
}

/// Records a guard's verdict for `mandrill explain`. Best effort: the
/// verdict is acted on whether or not its note is kept, and what it decides
/// is recorded with the outcome anyway. `Some` with the conflict when the
/// `message_id` is recorded for another request (nothing was written): the
/// payload is to be refused.
pub(super) async fn note_decision(
    shared: &Shared,
    request: &RestartRequest,
    attempt: u32,
    decision: Decision<'_>,
) -> Option<String> {
    match shared
        .store
        .record_decision(request, attempt, decision)
        .await
    {
        Ok(Recorded::Conflict(conflict)) => Some(conflict),
        Ok(_) => None,
        Err(error) => {
            warn!(error = %error.with_causes(), "could not record the decision for explain");
            None
        }
    }
}

/// Records a final decision that issued nothing, then acks.
pub(super) async fn record_decision(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    outcome: Outcome,
) -> Settlement {
    let recorded = store_op(shared, progress, Until::LeaseHeld, || {
        shared.store.record_outcome(request, attempt, &outcome)
    })
    .await;
    match recorded {
        Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
        Ok(Recorded::Recorded) => {
            reply(shared, request, &outcome);
            Settlement::Ack
        }
        Ok(Recorded::AlreadyFinal(status)) => settle_recorded(status),
        Ok(Recorded::Conflict(conflict)) => refuse(shared, progress, request, conflict).await,
        // After a claim (a dry run, a denial or an expiry decided after
        // it), nothing was issued: the claim is given back, or it would
        // count as an attempt issued with its outcome unknown.
        Err(Stopped::Shutdown) if attempt > 0 => {
            unclaim_at_shutdown(shared, progress, request, attempt).await
        }
        Err(Stopped::Shutdown) => shutting_down(),
        Err(Stopped::LeaseLost) if attempt > 0 => {
            unclaim_lease_lost(shared, progress, request, attempt).await
        }
        Err(Stopped::LeaseLost) => Settlement::Abandon,
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(error = %error.with_causes(), "the store refused the decision; dead-lettering");
            progress.dead_letter_because(DeadLetterReason::StoreRefused);
            Settlement::DeadLetter {
                reason: format!(
                    "{} decided, but it could not be recorded: {}",
                    outcome.status(),
                    error.with_causes()
                ),
            }
        }
    }
}

/// Records a request as failed for `reason` and dead-letters it: the one
/// way the worker gives up on a valid request, on every broker.
pub(super) async fn give_up(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    reason: String,
) -> Settlement {
    warn!(reason, "giving up on the request");
    let outcome = Outcome::Failed {
        error: reason.clone(),
    };
    let recorded = store_op(shared, progress, Until::LeaseHeld, || {
        shared.store.record_outcome(request, attempt, &outcome)
    })
    .await;
    match recorded {
        Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
        Ok(Recorded::AlreadyFinal(status)) => return settle_recorded(status),
        Ok(Recorded::Conflict(conflict)) => {
            return refuse(shared, progress, request, conflict).await;
        }
        Ok(Recorded::Recorded) => {
            reply(shared, request, &outcome);
        }
        Err(Stopped::Shutdown) => return shutting_down(),
        Err(Stopped::LeaseLost) => return Settlement::Abandon,
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(error = %error.with_causes(), "could not record giving up; dead-lettering anyway");
        }
    }
    shared.stats.given_up.inc();
    shared.notify(EventKind::Failed, request, attempt, Some(&reason));
    progress.dead_letter_because(DeadLetterReason::GivenUp);
    Settlement::DeadLetter { reason }
}

/// The grace period ended between the claim and the restart: nothing was
/// issued, so the claim is given back (one try, bounded, as shutdown is
/// under way; else it counts as used) and the delivery nacked.
pub(super) async fn unclaim_at_shutdown(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
) -> Settlement {
    give_back_once(shared, progress, request, attempt).await;
    shutting_down()
}

/// The lease lapsed between the claim and the restart (the checks took
/// longer than the extensions could cover, or the broker said it is gone):
/// another consumer may hold the message now, so nothing is issued here;
/// the claim is given back (one bounded try) and the delivery abandoned.
pub(super) async fn unclaim_lease_lost(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
) -> Settlement {
    warn!(
        attempt,
        "the lease was lost before the restart; not restarting"
    );
    give_back_once(shared, progress, request, attempt).await;
    Settlement::Abandon
}

/// Gives the claim back with one try, bounded: an attempt never issued is
/// not a used one (else it counts as used).
async fn give_back_once(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
) {
    let released = tokio::time::timeout(
        Duration::from_secs(1),
        shared
            .store
            .release_claim(request, attempt, progress.claim_token()),
    )
    .await;
    match released {
        Ok(Ok(())) => progress.claimed.store(0, Ordering::Release),
        Ok(Err(error)) => {
            warn!(error = %error.with_causes(), attempt, "could not give back the claim; it counts as used")
        }
        Err(_elapsed) => warn!(
            attempt,
            "giving back the claim timed out; it counts as used"
        ),
    }
}
