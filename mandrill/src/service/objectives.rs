//! The recovery objectives' companion: judges each `[[recovery_objective]]`
//! every `safety.poll_interval` from the store's journal, logs each
//! change of verdict, and pauses a breached group whose objective says
//! `pause_on_breach`. The pause is recorded in the store with its cause,
//! so the claim defers that group's requests on every instance; it never
//! lifts by itself (a group that breached stays paused until an operator
//! has looked: `mandrill resume --group`).
//!
//! A breach pauses its group once: when the verdict turns breached (or is
//! breached when the instance starts). The same breach does not pause the
//! group again after an operator lifted the pause; the objective met
//! again, then breached anew, does.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::notify::{Event, Notifier};
use crate::safety::PolicyHandle;
use crate::safety::objectives::{Judged, RecoveryObjective, judge};
use crate::store::{Store, StoreError};

/// Who a pause for a breach is recorded as made by.
pub(crate) const BREACH_PAUSER: &str = "recovery-objective";

/// Every objective judged over its group's latest verified restarts, in
/// the configured order; what `status`, `/api/status`, `/metrics` and
/// the dashboard show.
pub(crate) async fn judge_all(
    store: &dyn Store,
    objectives: &[RecoveryObjective],
) -> Result<Vec<Judged>, StoreError> {
    let mut judged = Vec::with_capacity(objectives.len());
    for objective in objectives {
        let samples = store
            .recent_recoveries(&objective.group, objective.over_last)
            .await?;
        judged.push(judge(objective, &samples));
    }
    Ok(judged)
}

/// Judges the policy's objectives every `every` until `stop`.
pub(super) async fn watch(
    store: Arc<dyn Store>,
    policy: PolicyHandle,
    notifier: Option<Arc<Notifier>>,
    every: Duration,
    stop: CancellationToken,
) {
    let every = every.max(Duration::from_millis(100));
    // The groups whose current breach was acted on (logged, and paused
    // when told to): each breach once.
    let mut acted: HashSet<String> = HashSet::new();
    loop {
        let objectives = policy.current().recovery_objectives.clone();
        if !objectives.is_empty() {
            let judged = tokio::select! {
                judged = tokio::time::timeout(every.max(Duration::from_secs(2)), judge_all(&*store, &objectives)) => judged,
                () = stop.cancelled() => return,
            };
            match judged {
                Ok(Ok(judged)) => {
                    for (objective, judged) in objectives.iter().zip(judged) {
                        if !judged.breached() {
                            if acted.remove(&judged.group) && judged.met == Some(true) {
                                info!(group = %judged.group, verdict = %judged.describe(), "recovery objective met again");
                            }
                            continue;
                        }
                        if acted.contains(&judged.group) {
                            continue;
                        }
                        warn!(group = %judged.group, verdict = %judged.describe(), "recovery objective breached");
                        // A pause that failed is tried again next round.
                        if !objective.pause_on_breach
                            || pause(&*store, notifier.as_deref(), &judged).await
                        {
                            acted.insert(judged.group.clone());
                        }
                    }
                }
                // Every poll interval while the store is down: the outage
                // itself is told elsewhere (`mandrill_store_down`, /readyz).
                Ok(Err(error)) => {
                    debug!(error = %error.with_causes(), "could not judge the recovery objectives; will try again")
                }
                Err(_) => debug!("the store did not answer for the recovery objectives"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Pauses `judged`'s group for its breach, unless it is paused already
/// (the first cause stays); says so once, on the instance that paused it.
/// Whether the group is paused now.
async fn pause(store: &dyn Store, notifier: Option<&Notifier>, judged: &Judged) -> bool {
    let cause = format!("recovery objective breached: {}", judged.describe());
    match store
        .set_group_pause(&judged.group, Some((BREACH_PAUSER, &cause)))
        .await
    {
        Ok(true) => {
            warn!(group = %judged.group, %cause, "group paused until `mandrill resume --group`");
            if let Some(notifier) = notifier {
                notifier.send(Event::group_paused(&judged.group, BREACH_PAUSER, &cause));
            }
            true
        }
        Ok(false) => true,
        Err(error) => {
            warn!(group = %judged.group, error = %error.with_causes(), "could not pause the group; will try again");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Outcome;
    use crate::safety::Policy;
    use crate::store::{ClaimTerms, ClaimToken, MemoryStore};

    fn objective(group: &str, pause_on_breach: bool) -> RecoveryObjective {
        RecoveryObjective {
            group: group.into(),
            max: Duration::from_secs(60),
            pause_on_breach,
            ..RecoveryObjective::default()
        }
    }

    /// Records an unrecovered restart of `instance`.
    async fn never_back(store: &MemoryStore, instance: &str) {
        let request = crate::domain::testing::request(instance);
        let terms = ClaimTerms {
            max_attempts: 1,
            hold: Duration::from_secs(60),
            limits: crate::safety::Limits::NONE,
        };
        store
            .claim_restart(&request, terms, ClaimToken::new())
            .await
            .unwrap();
        let unrecovered = Outcome::Unrecovered {
            error: "probe never passed".into(),
            output: None,
        };
        store
            .record_outcome(&request, 1, &unrecovered)
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_breach_pauses_its_group_once_and_not_again_once_resumed() {
        let store = Arc::new(MemoryStore::new());
        never_back(&store, "web-0001").await;
        never_back(&store, "db-0001").await;
        let policy = PolicyHandle::new(Policy {
            recovery_objectives: vec![objective("web", true), objective("db", false)],
            ..Policy::default()
        });
        let stop = CancellationToken::new();
        let every = Duration::from_secs(1);
        let task = tokio::spawn(watch(store.clone(), policy, None, every, stop.clone()));
        // A few rounds, in paused time.
        tokio::time::sleep(every * 3).await;
        let pauses = store.group_pauses().await.unwrap();
        assert_eq!(pauses.len(), 1, "only web pauses on a breach: {pauses:?}");
        assert_eq!(pauses[0].by, BREACH_PAUSER);
        assert!(
            pauses[0].reason.contains("recovery objective breached")
                && pauses[0].reason.contains("unrecovered"),
            "{pauses:?}"
        );
        // An operator lifts it: the same breach does not pause it again.
        assert!(store.set_group_pause("web", None).await.unwrap());
        tokio::time::sleep(every * 5).await;
        assert!(store.group_pauses().await.unwrap().is_empty());
        stop.cancel();
        task.await.unwrap();
    }
}
