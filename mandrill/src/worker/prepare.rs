//! Everything before the restart: the delivery limit, eligibility, the
//! guards, the reservation and the claim; then, after the claim, the guards
//! again and the stop conditions.
//!
//! One phase of a delivery, in the order it runs, so one file past 400
//! lines.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tracing::{error, info, warn};

use super::decisions::{
    deny, give_up, held, held_by_the_claim, note_decision, record_decision, unclaim,
    unclaim_at_shutdown,
};
use super::lease::Progress;
use super::retry::{Stopped, Until, store_op};
use super::settle::{RareSettlement, Settlement, rare, refuse, settle_recorded, shutting_down};
use super::shared::Shared;
use crate::broker::Delivery;
use crate::domain::{Outcome, RestartRequest};
use crate::restarter::{Refusal, Reservation};
use crate::safety::{Hold, LeashRecord, Placement, Policy, leash};
use crate::store::{Claim, ClaimTerms, ClaimToken, Decision, unknown_outcome};

/// How soon a delivery deferred by the kill switch is looked at again.
pub(super) const PAUSED_RECHECK: Duration = Duration::from_secs(5);

/// How soon a delivery whose claim is to be decided afresh is redelivered:
/// one that met a reload during a store outage, or whose claim, answered
/// after a try that timed out, is not used.
pub(super) const DECIDE_AFRESH: Duration = Duration::from_secs(1);

/// How long the read of the kill switch right before a restart may take:
/// as long as the operator's pages wait for the store (`admin::STORE_TIMEOUT`).
/// A switch that cannot be read in that time is taken as on (fail closed).
pub(super) const SWITCH_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How soon a request whose group's budget cannot be known (a percentage
/// of an unknown size) is tried again: a reload may have fixed it.
pub(super) const UNKNOWN_BUDGET_RETRY: Duration = Duration::from_secs(60);

/// Everything before the restart: the delivery limit, eligibility,
/// capacity, and the claim that decides whether to restart at all. `Ok`
/// with the claimed attempt, the leash as the store's record said in the
/// claim's transaction (`None`: no operator turned it), and the
/// reservation; or how to settle.
///
/// `policy` is the one in force when the batch was pulled: read once per
/// batch for the decisions before the claim (each read is a shared lock),
/// and again only after a wait on the store.
pub(super) async fn prepare(
    shared: &Shared,
    delivery: &Delivery,
    progress: &Progress,
    request: &RestartRequest,
    policy: &Policy,
) -> Result<(u32, Option<bool>, Reservation), Settlement> {
    let config = &shared.config;
    let mut policy = policy;
    let reread: Arc<Policy>;
    if delivery.attempt > config.max_deliveries {
        // Deliveries a guard deferred (a closed calendar, a full rate
        // window, the kill switch) were settled on purpose: they do not
        // count, or a request waiting overnight would be given up.
        let deferred = match Box::pin(store_op(shared, progress, Until::LeaseHeld, || {
            shared.store.deferrals(request.message_id)
        }))
        .await
        {
            Ok(deferred) => deferred,
            Err(Stopped::Shutdown) => return Err(shutting_down()),
            Err(Stopped::LeaseLost) => return Err(Settlement::Abandon),
            Err(Stopped::Reloaded) => unreachable!("only a claim stops for a reload"),
            Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
                warn!(error = %error.with_causes(), "cannot read how often the request was deferred; counting none");
                0
            }
        };
        let unsettled = delivery.attempt.saturating_sub(deferred);
        if unsettled > config.max_deliveries {
            let reason = format!(
                "delivered {unsettled} times without being settled (broker.max_deliveries is {}{})",
                config.max_deliveries,
                if deferred > 0 {
                    format!("; {deferred} more deliveries were deferred by a guard")
                } else {
                    String::new()
                }
            );
            return Err(rare(give_up(shared, progress, request, 0, reason)).await);
        }
        // The store may have kept us waiting: decide under the policy now.
        reread = config.policy.current();
        policy = &reread;
    }
    let mut terms = match decide(shared, progress, request, policy) {
        Ok(terms) => terms,
        Err(settle) => return Err(settle.await),
    };
    let reserving = async {
        let reserving = shared.restarter.reserve(request);
        (reserving.may_wait(), reserving.await)
    };
    let (may_wait, reservation) = match shared.abort.or_abort(reserving).await {
        Some((may_wait, Ok(reservation))) => (may_wait, reservation),
        Some((_, Err(refusal))) => {
            // Before the claim: nothing claimed, nothing issued, so no
            // attempt is used. Deferred like a guard's hold, and recorded
            // as its decision (which also keeps the delivery out of
            // `max_deliveries`).
            info!(%refusal, "the backend refused the reservation");
            let Refusal {
                guard,
                reason,
                retry_after,
                ..
            } = refusal;
            // "Try again at once" would redeliver in a loop, writing a
            // deferral each time: wait at least a second, as an in-flight
            // hold does.
            let retry_after = retry_after.max(Duration::from_secs(1));
            let hold = policy.guards.defer(request, guard, retry_after, reason);
            return Err(rare(held(shared, progress, request, hold)).await);
        }
        None => return Err(shutting_down()),
    };
    // Reserving may have waited (a full pool of blocking threads): a policy
    // reloaded meanwhile decides the claim, its limits included. (Read only
    // then: each read takes a shared lock, and most reservations are
    // answered at once.)
    if may_wait {
        let current = shared.config.policy.current();
        if !std::ptr::eq(&*current, policy) {
            terms = match decide(shared, progress, request, &current) {
                Ok(terms) => terms,
                Err(settle) => {
                    drop(reservation);
                    return Err(settle.await);
                }
            };
        }
    }
    // The claim: recorded before the restart is issued. One token for
    // every try of it: a try whose claim was committed but whose answer was
    // lost is answered again by the next, not taken for another's claim.
    // (Moved into the closure: the handler keeps one copy of it.)
    let token = ClaimToken::new();
    progress
        .claim_token
        .store(token.to_stored(), std::sync::atomic::Ordering::Release);
    let terms = &terms;
    let until = Until::LeaseHeldOnceSent {
        decided_under: policy,
    };
    let claimed = store_op(shared, progress, until, move || {
        shared.store.claim_restart(request, *terms, token)
    })
    .await;
    match claimed {
        Ok(Claim::Claimed {
            attempt,
            unknown,
            leashed,
        }) => {
            if shared.abort.is_aborted() {
                // Answered after the grace period ended: nothing is issued
                // now, so the attempt is given back.
                return Err(rare(unclaim_at_shutdown(shared, progress, request, attempt)).await);
            }
            if progress
                .claim_retried
                .load(std::sync::atomic::Ordering::Acquire)
                && let Some(why) = claimed_too_long_ago(shared, progress, policy)
            {
                // Nothing is issued: given back, and the redelivery claims
                // afresh. A deferral, so it does not use up
                // `broker.max_deliveries`.
                let reason = format!("its claim was answered after a try that timed out, {why}");
                let hold = policy.guards.defer(request, "store", DECIDE_AFRESH, reason);
                return Err(rare(unclaim(shared, progress, request, attempt, hold)).await);
            }
            if let Some(unknown) = unknown {
                warn!(
                    unknown,
                    "an earlier restart attempt was issued but its outcome never recorded; \
                     counted as failed"
                );
            }
            Ok((attempt, leashed, reservation))
        }
        Ok(Claim::Final(status)) => {
            shared.stats.duplicates.inc();
            info!(%status, "already recorded as final; not restarting again");
            Err(settle_recorded(status))
        }
        Ok(Claim::Paused { reason }) => {
            // The kill switch: nothing claimed, nothing issued. Pulling
            // pauses too, so the message waits in the broker meanwhile.
            shared.stats.deferred.inc();
            info!(reason, "deferred: restarts are paused");
            shared.set_paused(true, &reason);
            Err(Settlement::Nack {
                delay: PAUSED_RECHECK,
                why: "restarts are paused".into(),
            })
        }
        Ok(Claim::Deferred {
            guard,
            reason,
            wait,
        }) => {
            // Recorded (and counted as a deferral) by the claim; nothing
            // claimed, nothing issued.
            let hold = policy.guards.defer(request, guard, wait, reason);
            Err(rare(held_by_the_claim(shared, progress, request, hold)).await)
        }
        Ok(Claim::InFlight { attempt, wait }) => {
            shared.stats.deferred.inc();
            let delay = wait.max(Duration::from_secs(1));
            info!(
                attempt,
                ?delay,
                "a restart of this request may still be in flight elsewhere"
            );
            Err(Settlement::Nack {
                delay,
                why: format!("restart attempt {attempt} may still be in flight"),
            })
        }
        Ok(Claim::Exhausted { attempts, unknown }) => {
            let reason = match unknown {
                Some(attempt) => format!(
                    "restart failed after {}: {}",
                    crate::settings::duration::count(attempts, "attempt"),
                    unknown_outcome(attempt)
                ),
                None => format!("all {attempts} restart attempts are used"),
            };
            Err(rare(give_up(shared, progress, request, attempts, reason)).await)
        }
        Ok(Claim::Conflict { reason }) => {
            Err(rare(refuse(shared, progress, request, reason)).await)
        }
        Ok(Claim::Cancelled { reason }) => {
            // Its campaign was stopped while an earlier attempt ran: no
            // attempt is claimed again.
            info!(reason, "cancelled: its campaign was stopped");
            let outcome = Outcome::Cancelled { reason };
            Err(rare(record_decision(shared, progress, request, 0, outcome)).await)
        }
        Err(Stopped::Shutdown) => Err(shutting_down()),
        Err(Stopped::LeaseLost) => Err(Settlement::Abandon),
        Err(Stopped::Reloaded) => {
            // Nothing claimed (or a claim whose answer was lost, which holds
            // the request until its hold ends): the redelivery is decided
            // under the policy in force then, its limits included.
            shared.stats.deferred.inc();
            info!("the policy was reloaded while the store was down: deciding again");
            Err(Settlement::Nack {
                delay: DECIDE_AFRESH,
                why: "the policy was reloaded while the claim waited for the store".into(),
            })
        }
        Err(Stopped::Permanent(error) | Stopped::OutOfTime(error)) => {
            error!(error = %error.with_causes(), "the store refused the claim; giving up without restarting");
            shared.stats.given_up.inc();
            Err(Settlement::DeadLetter {
                reason: format!(
                    "could not record the claim to restart: {}",
                    error.with_causes()
                ),
            })
        }
    }
}

/// Why a claim answered after a try that timed out must not be used, if
/// it must not: that try may have claimed, and its answer be that claim,
/// with the time (hold, the journal's `claimed_at`) and the guards of then.
/// Used while half of the hold's margin past the restart is left (so the
/// restart ends inside the hold; the time since the pull bounds the claim's
/// age) and the policy that decided it is still in force.
fn claimed_too_long_ago(
    shared: &Shared,
    progress: &Progress,
    policy: &Policy,
) -> Option<&'static str> {
    let pulled = (shared.millis(tokio::time::Instant::now()) as u32).wrapping_sub(progress.pulled);
    let margin = shared
        .claim_terms
        .hold
        .saturating_sub(shared.config.restart_timeout)
        / 2;
    if Duration::from_millis(u64::from(pulled)) >= margin {
        return Some("so long ago that its hold may end before the restart does");
    }
    if !std::ptr::eq(&*shared.config.policy.current(), policy) {
        return Some("and the policy was reloaded since it was decided");
    }
    None
}

/// What `policy` decides before the claim: eligibility, the deferring
/// guards, and the counting guards' limits for the request's group. `Ok`
/// with the claim's terms, or how to settle instead (boxed: rare).
fn decide<'a>(
    shared: &'a Shared,
    progress: &'a Progress,
    request: &'a RestartRequest,
    policy: &Policy,
) -> Result<ClaimTerms, RareSettlement<'a>> {
    if let Err(reason) = eligible(policy, request) {
        return Err(rare(deny(shared, progress, request, 0, reason)));
    }
    if let Some(hold) = policy.guards.hold(request) {
        return Err(rare(held(shared, progress, request, hold)));
    }
    let limits = match policy.limits(request.group()) {
        Ok(mut limits) => {
            // A signed request's quota, counted in the claim.
            policy.requesters.limit(request, &mut limits);
            limits
        }
        Err(reason) => {
            let hold =
                policy
                    .guards
                    .defer(request, "disruption budget", UNKNOWN_BUDGET_RETRY, reason);
            return Err(rare(held(shared, progress, request, hold)));
        }
    };
    Ok(ClaimTerms {
        limits,
        // The stop conditions run between the claim and the restart: the
        // hold lasts through them too, or another delivery of the request
        // could find it expired while this one's restart is still to come.
        hold: shared
            .claim_terms
            .hold
            .saturating_add(policy.stop_conditions.longest_run()),
        ..shared.claim_terms
    })
}

/// Eligibility and the guards again after the claim, under the policy in
/// force now, then the stop conditions (also before a dry run's action: the
/// dry run shows every guard's decision). `Ok` with whether the policy is
/// leashed, or why not to restart (see [`Halt`]).
///
/// Decided at once unless stop conditions are configured: only then is
/// there anything to wait for, and a future (boxed: it is rare, and the
/// handler's state would otherwise keep room for it) to wait on. Their
/// results are recorded against `attempt` for the request's story (a
/// failing one's with the deferral): one store write more per restart,
/// only where checks that take a probe's round trip run anyway.
pub(super) fn recheck<'a>(
    shared: &'a Shared,
    request: &'a RestartRequest,
    attempt: u32,
) -> Result<Rechecked, BoxFuture<'a, Rechecked>> {
    let policy = shared.config.policy.current();
    // A reload may have denied the instance while the claim waited, or the
    // inventory dropped it, moved it, or grown too old.
    if let Err(halt) = still_allowed(&policy, request) {
        return Ok(Err(halt));
    }
    if let Some(hold) = policy.guards.hold(request) {
        return Ok(Err(Halt::Hold(hold)));
    }
    if policy.stop_conditions.is_empty() {
        return Ok(Ok(policy.dry_run));
    }
    Err(Box::pin(async move {
        let Some(checked) = shared.abort.or_abort(policy.stop_conditions.check()).await else {
            return Err(Halt::GraceOver);
        };
        let results = match checked {
            Ok(results) => results,
            Err(reason) => {
                return Err(Halt::Hold(policy.defer(request, policy.stop_retry, reason)));
            }
        };
        // Naming the attempt: a retry's checks are recorded too, not taken
        // for a repeat of the last verdict.
        let reason = format!(
            "checked stop conditions before attempt {attempt}: {}",
            results.join(", ")
        );
        let decision = Decision {
            verdict: "checked",
            guard: "stop conditions",
            reason: &reason,
        };
        // After this delivery's own claim, which judged who asked: a
        // conflict cannot be answered here.
        note_decision(shared, request, attempt, decision).await;
        Ok(policy.dry_run)
    }))
}

/// Eligibility (a signature required now included) and the inventory's
/// placement under `policy`: what a reload or an inventory refresh may
/// have changed since the request was decided. Synchronous and cheap, so
/// that it can run right before the restart.
fn still_allowed(policy: &Policy, request: &RestartRequest) -> Result<(), Halt> {
    eligible(policy, request).map_err(Halt::Denied)?;
    match policy.still_placed(request) {
        Ok(()) => Ok(()),
        Err(Placement::Denied { reason, .. }) => Err(Halt::Denied(reason)),
        Err(Placement::Deferred { reason, retry }) => Err(Halt::Hold(policy.guards.defer(
            request,
            "inventory",
            retry,
            reason,
        ))),
    }
}

/// What else may have changed while the stop conditions ran: the leash
/// (the store's record as just read, `record`, else the instance's own,
/// which a reload may have turned: the claim is given back, and the next
/// delivery records the dry run) and the calendar.
fn unleashed_and_open(
    policy: &Policy,
    request: &RestartRequest,
    record: Option<&LeashRecord>,
) -> Result<(), Halt> {
    if leash::leashed(record.map(|r| r.leashed), policy.dry_run) {
        let by = record.map_or_else(
            || "a reload".to_owned(),
            |record| format!("{} ({})", record.by, record.reason),
        );
        let reason = format!(
            "deferred: leashed by {by} while the stop conditions ran; the next delivery \
             records the dry run"
        );
        return Err(Halt::Hold(policy.guards.defer(
            request,
            "leash",
            RELEASHED_RETRY,
            reason,
        )));
    }
    policy
        .guards
        .hold(request)
        .map_or(Ok(()), |hold| Err(Halt::Hold(hold)))
}

/// How soon a request leashed by a reload right before its restart comes
/// back, to be recorded as a dry run.
const RELEASHED_RETRY: Duration = Duration::from_secs(1);

/// How a claimed restart that is not issued after all is settled (see
/// [`Halt`]).
pub(super) async fn halt(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    halt: Halt,
) -> Settlement {
    match halt {
        Halt::Denied(reason) => deny(shared, progress, request, attempt, reason).await,
        Halt::Hold(hold) => unclaim(shared, progress, request, attempt, hold).await,
        Halt::GraceOver => unclaim_at_shutdown(shared, progress, request, attempt).await,
    }
}

/// `None` when the restart may be issued now; else how it was settled
/// instead. The kill switch must be off (see [`switch_is_off`]), else the
/// claim is given back and the delivery deferred. And when stop conditions
/// ran (`stop_conditions_ran`: they take seconds, during which a SIGHUP or
/// an inventory refresh may land), eligibility and the placement are
/// decided once more under the policy in force now (see
/// [`still_allowed`]): a denial is recorded against the claimed attempt, a
/// deferral gives the claim back. Without stop conditions nothing could
/// have changed since [`recheck`], so nothing is read again. One future for
/// all, so that the handler keeps room for one pointer.
pub(super) async fn unless_paused(
    shared: &Shared,
    progress: &Progress,
    request: &RestartRequest,
    attempt: u32,
    stop_conditions_ran: bool,
) -> Option<Settlement> {
    // Without stop conditions nothing awaits between the claim's
    // transaction, which read the switch, and the restart: a read here
    // would narrow no window, and cost the SQLite pipeline a quarter of
    // its rate (one pooled read per restart; docs/benchmarks.md).
    if !stop_conditions_ran {
        return None;
    }
    let record = match switch_is_off(shared, request).await {
        Ok(record) => record,
        Err(hold) => return Some(unclaim(shared, progress, request, attempt, hold).await),
    };
    if let Err(hold) = group_not_paused(shared, request).await {
        return Some(unclaim(shared, progress, request, attempt, hold).await);
    }
    // After the switch's read, which may wait: as close to the restart as
    // the lease check allows.
    let policy = shared.config.policy.current();
    let late = still_allowed(&policy, request)
        .and_then(|()| unleashed_and_open(&policy, request, record.as_ref()));
    match late {
        Ok(()) => None,
        Err(halted) => Some(rare(halt(shared, progress, request, attempt, halted)).await),
    }
}

/// The kill switch, read once more right before the restart is issued:
/// the claim read it in its own transaction, but a `pause` that lands
/// after the claim (while the stop conditions run, say) must still stop
/// the restart. `Ok` when it is off, with the leash's record read in the
/// same row (so an operator's `leash` then stops the restart too); else
/// the hold that defers the request
/// naming who paused (or expires it past `safety.max_defer`, as any
/// guard's hold). A switch that cannot be read within
/// [`SWITCH_READ_TIMEOUT`] holds too: fail closed.
async fn switch_is_off(
    shared: &Shared,
    request: &RestartRequest,
) -> Result<Option<LeashRecord>, Hold> {
    let reason = match tokio::time::timeout(SWITCH_READ_TIMEOUT, shared.store.switch()).await {
        Ok(Ok(switch)) if !switch.paused => return Ok(switch.leash),
        Ok(Ok(switch)) => {
            let reason = switch.paused_reason();
            shared.set_paused(true, &reason);
            format!("deferred by kill switch: restarts {reason}")
        }
        Ok(Err(error)) => format!(
            "deferred by kill switch: it could not be read, so it counts as on: {}",
            error.with_causes()
        ),
        Err(_elapsed) => format!(
            "deferred by kill switch: it could not be read within {}, so it counts as on",
            humantime::format_duration(SWITCH_READ_TIMEOUT)
        ),
    };
    let policy = shared.config.policy.current();
    Err(policy
        .guards
        .defer(request, "kill switch", PAUSED_RECHECK, reason))
}

/// The request's group pause, read once more right before the restart,
/// for the same reason as the kill switch: a recovery objective breached
/// while the stop conditions ran pauses the group after the claim read it.
/// Pauses that cannot be read within [`SWITCH_READ_TIMEOUT`] count as
/// pausing the group: fail closed.
async fn group_not_paused(shared: &Shared, request: &RestartRequest) -> Result<(), Hold> {
    let group = request.group();
    let reason = match tokio::time::timeout(SWITCH_READ_TIMEOUT, shared.store.group_pauses()).await
    {
        Ok(Ok(pauses)) => match pauses.iter().find(|pause| pause.group == group) {
            None => return Ok(()),
            Some(pause) => format!("deferred by group pause: {}", pause.deferred_reason()),
        },
        Ok(Err(error)) => format!(
            "deferred by group pause: the pauses could not be read, so group {group} counts as \
             paused: {}",
            error.with_causes()
        ),
        Err(_elapsed) => format!(
            "deferred by group pause: the pauses could not be read within {}, so group {group} \
             counts as paused",
            humantime::format_duration(SWITCH_READ_TIMEOUT)
        ),
    };
    let policy = shared.config.policy.current();
    Err(policy
        .guards
        .defer(request, "group pause", PAUSED_RECHECK, reason))
}

/// Eligibility: `safety.allow`/`safety.deny` (the deny also by the
/// machine's other names: its address, its aliases), a signature if the policy
/// in force requires one (a reload may have turned it on since the parse),
/// then what the request's verified requester may restart (its `allow`,
/// and its `groups` with the operator's group, which [`Policy::place`]
/// assigned before anything) and whether its signature still holds (the
/// key in force, `exp`): after the claim this is the check right before
/// the restart.
fn eligible(policy: &Policy, request: &RestartRequest) -> Result<(), String> {
    policy.eligibility.check(request.instance_name.as_str())?;
    policy.check_other_names(request)?;
    if request.requester.is_none() && policy.requesters.signatures().required() {
        return Err(
            "denied: unsigned, and a signature is required now (safety.require_signed); \
             sign it as a requester"
                .into(),
        );
    }
    if request.requester.is_some() {
        let now = std::time::SystemTime::from(policy.guards.clock.now());
        policy.requesters.check(request, request.group(), now)?;
    }
    Ok(())
}

/// What [`recheck`] decides: `Ok` with whether the policy is leashed, or
/// why not to restart.
pub(super) type Rechecked = Result<bool, Halt>;

/// Why a claimed restart is not issued after all.
pub(super) enum Halt {
    /// The instance is no longer eligible (a reload denied it): recorded
    /// `denied` against the claimed attempt.
    Denied(String),
    /// A guard holds it: the claim is given back and the delivery deferred,
    /// or, past `safety.max_defer`, recorded `expired`.
    Hold(Hold),
    /// The grace period ended while the stop conditions ran (the restart
    /// was not issued, so it must not be).
    GraceOver,
}
