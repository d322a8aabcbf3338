//! Everything after the restart: the outcome, recorded (shielded: retried
//! until the store answers), and how to settle.

use std::future::Future;

use futures::future::Either;

use tracing::{debug, error, info, warn};

use super::lease::Progress;
use super::reply::reply;
use super::retry::{Stopped, Until, store_op};
use super::settle::{Settlement, settle_recorded};
use super::shared::Shared;
use crate::broker::DeliveryTag;
use crate::domain::Timestamp;
// A host's output is in a restart's error: the text log, which writes a
// field as it is, gets it escaped, one event a line and no terminal control.
use crate::domain::printable;
use crate::domain::{Outcome, RestartRequest};
use crate::notify::EventKind;
use crate::restarter::RestartError;
use crate::stats::DeadLetterReason;
use crate::store::Recorded;

/// Everything after the restart: the outcome, recorded, and how to settle.
///
/// A plain function: the outcome is judged here, synchronously, so that the
/// restart's result (and the error taken apart from it) is not kept in the
/// future that waits on the store.
pub(super) fn conclude<'a>(
    shared: &'a Shared,
    progress: &'a Progress,
    tag: &'a DeliveryTag,
    request: &'a RestartRequest,
    attempt: u32,
    restarted: Result<crate::domain::Restarted, RestartError>,
) -> impl Future<Output = Settlement> + Send + 'a {
    if let Err(error @ RestartError::OutcomeUnknown { .. }) = restarted {
        return Either::Left(std::future::ready(leave_claimed(shared, attempt, &error)));
    }
    let judged = judge(shared, request, attempt, restarted);
    Either::Right(record(shared, progress, tag, request, attempt, judged))
}

/// A restart that may still be running on the host: nothing is recorded,
/// so that its claim stays open. No delivery restarts the host before the
/// claim's hold expires, and then the attempt counts as used ("issued,
/// outcome unknown"). The delivery comes back once the hold has expired,
/// so that the redelivery is not spent on a deferral.
fn leave_claimed(shared: &Shared, attempt: u32, error: &RestartError) -> Settlement {
    shared.stats.restart_failures.inc();
    let error = error.with_causes().to_string();
    error!(error = %printable(&error), attempt, "the restart's outcome is unknown (it may still be running on the host): no outcome recorded, so its claim holds the host until it expires and then counts as a used attempt");
    Settlement::Nack {
        delay: shared
            .claim_terms
            .hold
            .max(shared.config.retry_backoff.delay(attempt)),
        why: "the restart's outcome is unknown: it may still be running on the host".into(),
    }
}

/// What [`judge`] made of a restart's result.
struct Judged {
    outcome: Outcome,
    /// How long the backend asked to wait before a retry.
    retry_after: Option<std::time::Duration>,
    /// Why to pause all restarts first (a host that did not come back).
    pause: Option<String>,
}

/// The outcome of a restart, counted, logged and notified.
fn judge(
    shared: &Shared,
    request: &RestartRequest,
    attempt: u32,
    restarted: Result<crate::domain::Restarted, RestartError>,
) -> Judged {
    let config = &shared.config;
    let mut retry_after = None;
    let mut pause = None;
    let outcome = match restarted {
        Ok(restarted) => {
            shared.stats.restarted.inc();
            if let Some(after) = restarted.recovered_after {
                shared.stats.timings.recovery.observe(after);
            }
            match restarted.recovered_after {
                // As people read durations (`2s 3ms`), to the millisecond;
                // without a probe there is nothing to say.
                Some(after) => info!(
                    recovered_after = %humantime::format_duration(std::time::Duration::from_millis(
                        u64::try_from(after.as_millis()).unwrap_or(u64::MAX)
                    )),
                    "restarted"
                ),
                None => info!("restarted"),
            }
            shared.notify(EventKind::Restarted, request, attempt, None);
            Outcome::Restarted(restarted)
        }
        Err(RestartError::Unrecovered {
            host,
            after,
            cause,
            output,
        }) => {
            shared.stats.unrecovered.inc();
            let error = RestartError::Unrecovered {
                host,
                after,
                cause,
                output: None,
            };
            let error = error.with_causes().to_string();
            error!(error = %printable(&error), "restarted, but the host did not come back");
            shared.notify(EventKind::Unrecovered, request, attempt, Some(&error));
            if config.policy.current().pause_on_unrecovered {
                // Fail closed: a host that does not come back stops every
                // instance until someone looks (`mandrill resume`).
                pause = Some(format!(
                    "{} did not recover after its restart",
                    request.hostname
                ));
            }
            Outcome::Unrecovered { error, output }
        }
        Err(error) if !error.is_retryable() || attempt >= config.max_attempts => {
            shared.stats.restart_failures.inc();
            let retryable = error.is_retryable();
            let error = error.with_causes().to_string();
            if retryable {
                warn!(error = %printable(&error), attempt, "restart failed on the last attempt");
            } else {
                warn!(error = %printable(&error), attempt, "restart refused for good; not retrying");
            }
            shared.notify(EventKind::Failed, request, attempt, Some(&error));
            Outcome::Failed { error }
        }
        Err(error) => {
            shared.stats.restart_failures.inc();
            retry_after = error.retry_after();
            let error = error.with_causes().to_string();
            warn!(error = %printable(&error), attempt, "restart failed; will retry");
            Outcome::Retrying { error }
        }
    };
    Judged {
        outcome,
        retry_after,
        pause,
    }
}

/// Pauses all restarts (the kill switch), saying why. Retried as the
/// outcome is (shielded: until the store answers, bounded once shutdown is
/// under way), before the outcome is recorded: the pause fails closed only
/// if a store blip cannot skip it.
async fn pause_restarts(shared: &Shared, progress: &Progress, why: String) {
    let asked = Timestamp::now();
    let paused = store_op(shared, progress, Until::Shielded, || {
        shared.store.set_switch(true, "mandrill", &why)
    })
    .await;
    match paused {
        Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
        Ok(()) => {
            error!(reason = why, "paused all restarts");
            shared.notify_switch(true, "mandrill", &why, asked);
        }
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(error = %error.with_causes(), reason = why, "could not pause restarts")
        }
        Err(Stopped::Shutdown | Stopped::LeaseLost) => {
            error!(reason = why, "could not pause restarts: shutting down");
        }
    }
}

/// The outcome recorded (after pausing restarts, if it says to), and how to
/// settle.
async fn record(
    shared: &Shared,
    progress: &Progress,
    tag: &DeliveryTag,
    request: &RestartRequest,
    attempt: u32,
    judged: Judged,
) -> Settlement {
    let config = &shared.config;
    let Judged {
        outcome,
        retry_after,
        pause,
    } = judged;
    if let Some(why) = pause {
        // Boxed: rare, and it would otherwise keep a slot in this future.
        Box::pin(pause_restarts(shared, progress, why)).await;
    }

    // An outcome settled by an ack takes the ack into its own transaction
    // when the broker and the store share a database (SQLite, one file):
    // both commit or neither.
    let ack = match outcome {
        Outcome::Retrying { .. } | Outcome::Failed { .. } => None,
        _ => shared.broker.joint_ack(tag),
    };
    let recorded = store_op(shared, progress, Until::Shielded, || {
        shared
            .store
            .record_outcome_acking(request, attempt, &outcome, ack.clone())
    })
    .await;
    if let Ok((Recorded::Recorded, _)) = recorded {
        reply(shared, request, &outcome);
    }
    match recorded {
        Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
        Ok((Recorded::Recorded, true)) => {
            debug!(status = %outcome.status(), "outcome recorded and acked");
            return Settlement::Acked;
        }
        Ok((Recorded::Recorded, false)) => debug!(status = %outcome.status(), "outcome recorded"),
        // The claim judged who asked: this delivery's own row, so never
        // another's. Told as a refusal all the same, writing nothing.
        Ok((Recorded::Conflict(conflict), _)) => {
            error!(
                conflict,
                "the store found the restarted request's row another's"
            );
            progress.dead_letter_because(DeadLetterReason::Refused);
            return Settlement::DeadLetter { reason: conflict };
        }
        Ok((Recorded::AlreadyFinal(status), _)) => {
            shared.stats.duplicates.inc();
            warn!(%status, "another delivery recorded a final outcome first; keeping it");
            progress.dead_letter_because(DeadLetterReason::RestartFailed);
            return settle_recorded(status);
        }
        Err(Stopped::Permanent(error)) => {
            // Never restart again because bookkeeping failed: give it up.
            error!(error = %error.with_causes(), "the store refused the outcome; dead-lettering without another restart");
            shared.stats.given_up.inc();
            progress.dead_letter_because(DeadLetterReason::StoreRefused);
            return Settlement::DeadLetter {
                reason: format!(
                    "restart attempt {attempt} ended ({}), but its outcome could not be recorded: {}",
                    outcome.status(),
                    error.with_causes()
                ),
            };
        }
        Err(Stopped::OutOfTime(error)) => {
            error!(error = %error.with_causes(), "shutting down without the outcome recorded; nacking so it is not lost");
            return Settlement::Nack {
                delay: config.retry_backoff.delay(attempt),
                why: "outcome not recorded".into(),
            };
        }
        // Not reachable after the restart (no lease or abort check there);
        // a nack is the safe answer all the same.
        Err(Stopped::Shutdown | Stopped::LeaseLost) => {
            return Settlement::Nack {
                delay: config.retry_backoff.delay(attempt),
                why: "outcome not recorded".into(),
            };
        }
    }
    match outcome {
        // Unrecovered is final and recorded: the request was carried out.
        // (Denied and dry-run outcomes are settled where they are decided.)
        Outcome::Restarted(_)
        | Outcome::Unrecovered { .. }
        | Outcome::Denied { .. }
        | Outcome::DryRun { .. }
        | Outcome::Expired { .. }
        | Outcome::Cancelled { .. } => Settlement::Ack,
        Outcome::Retrying { .. } => Settlement::Nack {
            delay: retry_after.unwrap_or_else(|| config.retry_backoff.delay(attempt)),
            why: "restart failed".into(),
        },
        Outcome::Failed { error } => {
            progress.dead_letter_because(DeadLetterReason::RestartFailed);
            Settlement::DeadLetter {
                reason: format!(
                    "restart failed after {}: {error}",
                    crate::settings::duration::count(attempt, "attempt")
                ),
            }
        }
    }
}
