//! Behaviour every `Store` must have; each implementation's tests call these.
//!
//! Test code only (the module is `cfg(test)`), and one file of over 400
//! lines on purpose: it is the one list of what a store promises, read in
//! order from [`all`].

use std::time::Duration;

use uuid::Uuid;

use super::*;
use crate::domain::{Domain, Outcome, ParseRules, RestartRequest, Status};
use crate::safety::limits::{self, Limits};

pub use crate::domain::testing::request;

const TERMS: ClaimTerms = ClaimTerms {
    max_attempts: 3,
    hold: Duration::from_secs(3600),
    limits: crate::safety::Limits::NONE,
};

/// Every contract behaviour, in order, on one store.
pub async fn all(store: &dyn Store) {
    final_outcome_is_never_overwritten(store).await;
    every_final_status_is_kept(store).await;
    outcome_without_claim_creates_row(store).await;
    claim_holds_and_unknown_outcomes_count(store).await;
    a_retried_claim_with_its_own_token_gets_the_same_attempt_and_writes_nothing(store).await;
    a_retried_claim_whose_hold_ran_out_gets_the_same_attempt_held_anew(store).await;
    a_released_claim_is_not_a_used_attempt(store).await;
    a_host_is_never_claimed_for_two_requests_at_once(store).await;
    rejections_are_listed_but_never_count_as_the_request(store).await;
    outcome_details_are_kept(store).await;
    the_kill_switch_stops_every_claim_until_resumed(store).await;
    a_conditional_turn_of_the_switch_happens_only_as_expected(store).await;
    a_paused_group_defers_its_claims_only_until_resumed(store).await;
    recent_recoveries_are_the_groups_latest_verified_restarts(store).await;
    counting_guards_are_decided_in_the_claim_and_journaled(store).await;
    the_requester_quota_and_the_zone_budget_count_across_groups_and_instances(store, store).await;
    a_request_without_zone_or_requester_is_never_counted_in_them(store).await;
    the_first_receipt_is_kept(store).await;
    the_report_reads_the_journal_and_the_verdicts_since_a_moment(store).await;
    prune_removes_old_final_entries_only_and_in_bounded_passes(store).await;
    a_campaign_is_read_back_as_recorded_and_only_once(store).await;
    decisions_are_read_before_a_request_has_a_record(store).await;
}

/// A request deferred before any claim has no record of its own, only its
/// decisions: they are read all the same, oldest first.
pub async fn decisions_are_read_before_a_request_has_a_record(store: &dyn Store) {
    let deferred = request("cattle-0d01");
    assert_eq!(store.decisions(deferred.message_id).await.unwrap(), vec![]);
    for reason in [
        "deferred by not_before: first",
        "deferred by calendar: second",
    ] {
        let decision = Decision {
            verdict: "deferred",
            guard: reason.split(' ').nth(2).unwrap().trim_end_matches(':'),
            reason,
        };
        store.record_decision(&deferred, 0, decision).await.unwrap();
    }
    assert_eq!(store.story(deferred.message_id).await.unwrap(), None);
    let decisions = store.decisions(deferred.message_id).await.unwrap();
    let read: Vec<(&str, &str)> = decisions
        .iter()
        .map(|d| (d.guard.as_str(), d.reason.as_str()))
        .collect();
    assert_eq!(
        read,
        [
            ("not_before", "deferred by not_before: first"),
            ("calendar", "deferred by calendar: second")
        ]
    );
    assert!(
        decisions
            .iter()
            .all(|d| d.verdict == "deferred" && d.attempt == 0)
    );
}

/// A campaign reads back whole (targets in order, times to the
/// millisecond); an unknown id is `None`; the same id twice is refused.
pub async fn a_campaign_is_read_back_as_recorded_and_only_once(store: &dyn Store) {
    let campaign = Campaign {
        id: Uuid::new_v4(),
        group: "cattle".into(),
        created_at: Timestamp::from_millis(1_795_000_000_123),
        requester: Some("chaos".into()),
        targets: ["cattle-07", "cattle-02"]
            .iter()
            .enumerate()
            .map(|(index, name)| CampaignTarget {
                instance_name: (*name).into(),
                message_id: Uuid::new_v4(),
                due_at: Timestamp::from_millis(1_795_000_000_123 + 60_000 * index as i64),
            })
            .collect(),
    };
    assert_eq!(store.campaign(campaign.id).await.unwrap(), None);
    store.record_campaign(&campaign).await.unwrap();
    assert_eq!(
        store.campaign(campaign.id).await.unwrap(),
        Some(campaign.clone())
    );
    let unsigned = Campaign {
        id: Uuid::new_v4(),
        requester: None,
        targets: Vec::new(),
        ..campaign.clone()
    };
    store.record_campaign(&unsigned).await.unwrap();
    assert_eq!(
        store.campaign(unsigned.id).await.unwrap(),
        Some(unsigned.clone())
    );
    assert!(
        store.record_campaign(&campaign).await.is_err(),
        "one id, once"
    );
    // The report reads the campaigns started since its moment, oldest first.
    let since = |millis| store.report(Timestamp::from_millis(millis));
    let ids = |data: ReportData| data.campaigns.iter().map(|c| c.id).collect::<Vec<_>>();
    let both = ids(since(1_795_000_000_123).await.unwrap());
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both.contains(&campaign.id) && both.contains(&unsigned.id));
    assert!(ids(since(1_795_000_000_124).await.unwrap()).is_empty());
}

pub async fn final_outcome_is_never_overwritten(store: &dyn Store) {
    let request = request("cattle-0001");
    assert_eq!(store.lookup(request.message_id).await.unwrap(), None);
    let claimed = store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert_eq!(
        claimed,
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
    assert_eq!(
        store.lookup(request.message_id).await.unwrap(),
        Some(Status::Received)
    );
    let failed = Outcome::Retrying {
        error: "boom".into(),
    };
    assert_eq!(
        store.record_outcome(&request, 1, &failed).await.unwrap(),
        Recorded::Recorded
    );
    assert_eq!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 2,
            unknown: None
        }
    );
    assert_eq!(
        store
            .record_outcome(&request, 2, &Outcome::restarted())
            .await
            .unwrap(),
        Recorded::Recorded
    );
    // A late duplicate neither claims nor overwrites the final outcome.
    assert_eq!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Final(Status::Restarted)
    );
    assert_eq!(
        store
            .record_outcome(&request, 3, &Outcome::Failed { error: "x".into() })
            .await
            .unwrap(),
        Recorded::AlreadyFinal(Status::Restarted)
    );
    assert_eq!(
        store.lookup(request.message_id).await.unwrap(),
        Some(Status::Restarted)
    );
    let entry = entry(store, request.message_id).await;
    assert_eq!(entry.status, Status::Restarted);
    assert_eq!(entry.attempts, 2);
    assert_eq!(entry.hostname.as_deref(), Some("cattle-0001.example.net"));
    assert!(entry.completed_at.is_some());
}

/// Every final status stays final, whichever outcome wrote it: a later
/// outcome (a redelivery that ran out of attempts, another instance) is
/// refused over `unrecovered`, `denied`, `dry-run` and `expired` as over
/// `restarted`.
pub async fn every_final_status_is_kept(store: &dyn Store) {
    let finals = [
        Outcome::Unrecovered {
            error: "not healthy after 60s".into(),
            output: None,
        },
        Outcome::Denied {
            reason: "denied by safety.deny".into(),
        },
        Outcome::DryRun {
            action: "run [\"true\"]".into(),
        },
        Outcome::Expired {
            reason: "deferred past safety.max_defer".into(),
        },
    ];
    for (n, outcome) in finals.iter().enumerate() {
        let request = request(&format!("steer-{n:04}"));
        assert_eq!(
            store
                .claim_restart(&request, TERMS, ClaimToken::new())
                .await
                .unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None
            }
        );
        assert_eq!(
            store.record_outcome(&request, 1, outcome).await.unwrap(),
            Recorded::Recorded
        );
        let late = Outcome::Failed {
            error: "out of attempts".into(),
        };
        assert_eq!(
            store.record_outcome(&request, 2, &late).await.unwrap(),
            Recorded::AlreadyFinal(outcome.status()),
            "{outcome:?}"
        );
        assert_eq!(
            store.lookup(request.message_id).await.unwrap(),
            Some(outcome.status())
        );
        assert_eq!(
            store
                .claim_restart(&request, TERMS, ClaimToken::new())
                .await
                .unwrap(),
            Claim::Final(outcome.status())
        );
    }
}

/// `first_received` creates the row of a request the store has not seen
/// (`received`, no attempt) and gives the same time ever after, claimed or
/// not: what `safety.max_defer` counts from when `published_at` cannot.
pub async fn the_first_receipt_is_kept(store: &dyn Store) {
    let undated = request("cattle-first");
    let first = store.first_received(&undated).await.unwrap();
    let row = entry(store, undated.message_id).await;
    assert_eq!((row.status, row.attempts), (Status::Received, 0));
    assert_eq!(row.received_at, first);
    // Later, and after a claim: still the first time.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(store.first_received(&undated).await.unwrap(), first);
    let claim = store
        .claim_restart(&undated, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    assert_eq!(store.first_received(&undated).await.unwrap(), first);
    // A request claimed first was received when it was claimed.
    let claimed = request("cattle-claimed-first");
    store
        .claim_restart(&claimed, TERMS, ClaimToken::new())
        .await
        .unwrap();
    let received = entry(store, claimed.message_id).await.received_at;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(store.first_received(&claimed).await.unwrap(), received);
    for request in [&undated, &claimed] {
        let outcome = Outcome::Restarted(crate::domain::Restarted::default());
        store.record_outcome(request, 1, &outcome).await.unwrap();
    }
}

pub async fn outcome_without_claim_creates_row(store: &dyn Store) {
    let request = request("cattle-0002");
    let outcome = Outcome::Failed {
        error: "gave up".into(),
    };
    assert_eq!(
        store.record_outcome(&request, 5, &outcome).await.unwrap(),
        Recorded::Recorded
    );
    let entry = entry(store, request.message_id).await;
    assert_eq!(entry.status, Status::Failed);
    assert_eq!(entry.last_error.as_deref(), Some("gave up"));
}

pub async fn claim_holds_and_unknown_outcomes_count(store: &dyn Store) {
    let request = request("cattle-0003");
    let first = store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert_eq!(
        first,
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
    // While the claim holds, no other delivery may restart.
    let Claim::InFlight { attempt: 1, wait } = store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("a held claim must block a second one");
    };
    assert!(wait > Duration::ZERO && wait <= TERMS.hold);
    // A claim that never got its outcome, once its hold is over, counts
    // as a used attempt: a crash never buys a request extra restarts.
    let expired = ClaimTerms {
        hold: Duration::ZERO,
        limits: crate::safety::Limits::NONE,
        ..TERMS
    };
    let other = self::request("cattle-0004");
    assert_eq!(
        store
            .claim_restart(&other, expired, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        store
            .claim_restart(&other, expired, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 2,
            unknown: Some(1)
        }
    );
    let entry = entry(store, other.message_id).await;
    assert!(
        entry
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("attempt 1"),
        "{entry:?}"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        store
            .claim_restart(&other, expired, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 3,
            unknown: Some(2)
        }
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        store
            .claim_restart(&other, expired, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Exhausted {
            attempts: 3,
            unknown: Some(3)
        }
    );
    // Recording the last attempt's outcome releases its claim.
    store
        .record_outcome(&request, 1, &Outcome::Retrying { error: "e".into() })
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 2,
            unknown: None
        }
    );
}

/// A call whose claim was committed but whose answer was lost tries again
/// with the same token: it is answered with the attempt it claimed (and
/// what that claim counted as unknown), nothing is written, and the claim
/// still holds against any other call, even once the switch is paused.
pub async fn a_retried_claim_with_its_own_token_gets_the_same_attempt_and_writes_nothing(
    store: &dyn Store,
) {
    let request = request("cattle-0008");
    let expired = ClaimTerms {
        hold: Duration::ZERO,
        ..TERMS
    };
    store
        .claim_restart(&request, expired, ClaimToken::new())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let token = ClaimToken::new();
    let claimed = Claim::Claimed {
        attempt: 2,
        unknown: Some(1),
    };
    assert_eq!(
        store.claim_restart(&request, TERMS, token).await.unwrap(),
        claimed
    );
    let before = store.story(request.message_id).await.unwrap().unwrap();
    // Later, so that a write would show in the times.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        store.claim_restart(&request, TERMS, token).await.unwrap(),
        claimed,
        "the same call, tried again, gets the same answer"
    );
    assert_eq!(
        store.story(request.message_id).await.unwrap().unwrap(),
        before,
        "answering it again writes nothing"
    );
    assert!(
        matches!(
            store
                .claim_restart(&request, TERMS, ClaimToken::new())
                .await
                .unwrap(),
            Claim::InFlight { attempt: 2, .. }
        ),
        "another call finds the claim in flight"
    );
    // A claim the counting guards decide keeps its token too.
    let guarded = ClaimTerms {
        limits: Limits {
            group_max: Some(100),
            window: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let counted = self::request("calf-0002");
    let other = ClaimToken::new();
    let first = Claim::Claimed {
        attempt: 1,
        unknown: None,
    };
    for _ in 0..2 {
        assert_eq!(
            store.claim_restart(&counted, guarded, other).await.unwrap(),
            first
        );
    }
    // Decided before the pause: the answer it would have had.
    store.set_switch(true, "contract", "retry").await.unwrap();
    let retried = store.claim_restart(&request, TERMS, token).await;
    store.set_switch(false, "contract", "done").await.unwrap();
    assert_eq!(retried.unwrap(), claimed);
    // Its outcome recorded, the claim no longer holds: the token answers
    // nothing any more.
    store
        .record_outcome(&request, 2, &Outcome::Retrying { error: "e".into() })
        .await
        .unwrap();
    assert_eq!(
        store.claim_restart(&request, TERMS, token).await.unwrap(),
        Claim::Claimed {
            attempt: 3,
            unknown: None
        }
    );
}

/// Two requests (two message ids) for one host: while the first's claim
/// is in flight, the second is deferred ("host busy"), counting guards or
/// none; it claims once the first's outcome is recorded, or once the
/// first's hold is over without one (its handler died). A call retried
/// with its own token past its hold does not take the host back from a
/// request that claimed it since.
///
/// Both with and without counting guards (PostgreSQL decides a claim they
/// apply to in a transaction of its own; SQLite reads the journal for it).
pub async fn a_host_is_never_claimed_for_two_requests_at_once(store: &dyn Store) {
    let guarded = Limits {
        group_max: Some(100),
        window: Duration::from_secs(3600),
        ..Limits::NONE
    };
    for (host, limits) in [("busy-0001", Limits::NONE), ("busy-0002", guarded)] {
        let terms = ClaimTerms { limits, ..TERMS };
        let expired = ClaimTerms {
            hold: Duration::ZERO,
            ..terms
        };
        let first = Claim::Claimed {
            attempt: 1,
            unknown: None,
        };
        let busy = |claim: Claim, holder: &RestartRequest| match claim {
            Claim::Deferred {
                guard: "host busy",
                reason,
                wait,
            } => {
                assert!(reason.contains(host), "{reason}");
                assert!(reason.contains(&holder.message_id.to_string()), "{reason}");
                assert!(wait > Duration::ZERO && wait <= TERMS.hold, "{wait:?}");
            }
            other => panic!("{host}: a second request for a host in flight: {other:?}"),
        };
        // In flight, then its outcome recorded.
        let a = request(host);
        let b = request(host);
        assert_eq!(
            store
                .claim_restart(&a, terms, ClaimToken::new())
                .await
                .unwrap(),
            first
        );
        busy(
            store
                .claim_restart(&b, terms, ClaimToken::new())
                .await
                .unwrap(),
            &a,
        );
        let story = store.story(b.message_id).await.unwrap().unwrap();
        assert!(
            story
                .decisions
                .iter()
                .any(|d| d.verdict == "deferred" && d.guard == "host busy"),
            "{story:?}"
        );
        // Another host is not held by it.
        let elsewhere = request(&format!("{host}-other"));
        assert_eq!(
            store
                .claim_restart(&elsewhere, terms, ClaimToken::new())
                .await
                .unwrap(),
            first
        );
        store
            .record_outcome(&a, 1, &Outcome::restarted())
            .await
            .unwrap();
        assert_eq!(
            store
                .claim_restart(&b, terms, ClaimToken::new())
                .await
                .unwrap(),
            first
        );
        store
            .record_outcome(&b, 1, &Outcome::restarted())
            .await
            .unwrap();
        // In flight, then its hold over without an outcome (a crash): the
        // host is free again, and the late call of the crashed claim, with
        // its own token, finds it held by the other request.
        let c = request(host);
        let d = request(host);
        let c_token = ClaimToken::new();
        assert_eq!(
            store.claim_restart(&c, expired, c_token).await.unwrap(),
            first
        );
        assert_eq!(
            store
                .claim_restart(&d, terms, ClaimToken::new())
                .await
                .unwrap(),
            first
        );
        busy(store.claim_restart(&c, terms, c_token).await.unwrap(), &d);
        busy(
            store
                .claim_restart(&c, terms, ClaimToken::new())
                .await
                .unwrap(),
            &d,
        );
        store
            .record_outcome(&d, 1, &Outcome::restarted())
            .await
            .unwrap();
        // A claim given back unused holds nothing either.
        let e = request(host);
        assert_eq!(
            store
                .claim_restart(&e, terms, ClaimToken::new())
                .await
                .unwrap(),
            first
        );
        store.release_claim(&e, 1).await.unwrap();
        assert!(
            matches!(
                store
                    .claim_restart(&c, terms, ClaimToken::new())
                    .await
                    .unwrap(),
                Claim::Claimed { .. }
            ),
            "{host}: nothing holds the host"
        );
    }
}

/// The same call tried again for longer than its claim's hold (the store
/// was out that long): nothing was issued and nobody claimed since, so it
/// gets the same attempt, not one more with the first counted as unknown;
/// the hold is renewed, and the journal keeps the one row.
///
/// Both with and without counting guards (PostgreSQL decides a claim they
/// apply to in a transaction of its own).
pub async fn a_retried_claim_whose_hold_ran_out_gets_the_same_attempt_held_anew(store: &dyn Store) {
    let guarded = Limits {
        group_max: Some(100),
        window: Duration::from_secs(3600),
        ..Limits::NONE
    };
    for (name, limits) in [("cattle-0009", Limits::NONE), ("calf-0001", guarded)] {
        let terms = ClaimTerms { limits, ..TERMS };
        a_claim_retried_past_its_hold(store, &request(name), terms).await;
    }
}

async fn a_claim_retried_past_its_hold(
    store: &dyn Store,
    request: &RestartRequest,
    terms: ClaimTerms,
) {
    let expired = ClaimTerms {
        hold: Duration::ZERO,
        ..terms
    };
    let token = ClaimToken::new();
    let claimed = Claim::Claimed {
        attempt: 1,
        unknown: None,
    };
    assert_eq!(
        store.claim_restart(request, expired, token).await.unwrap(),
        claimed
    );
    let journal = store
        .story(request.message_id)
        .await
        .unwrap()
        .unwrap()
        .attempts;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        store.claim_restart(request, terms, token).await.unwrap(),
        claimed
    );
    assert_eq!(
        store
            .story(request.message_id)
            .await
            .unwrap()
            .unwrap()
            .attempts,
        journal
    );
    assert!(
        matches!(
            store
                .claim_restart(request, terms, ClaimToken::new())
                .await
                .unwrap(),
            Claim::InFlight { attempt: 1, .. }
        ),
        "the hold was renewed"
    );
}

pub async fn a_released_claim_is_not_a_used_attempt(store: &dyn Store) {
    let request = request("cattle-0005");
    let claim = |expected: u32| {
        let request = request.clone();
        async move {
            assert_eq!(
                store
                    .claim_restart(&request, TERMS, ClaimToken::new())
                    .await
                    .unwrap(),
                Claim::Claimed {
                    attempt: expected,
                    unknown: None
                }
            );
        }
    };
    claim(1).await;
    // Given back (a guard closed before the restart): the hold is lifted
    // at once and the attempt is claimed again, with nothing unknown.
    store.release_claim(&request, 1).await.unwrap();
    claim(1).await;
    // Only the latest, still-held claim is given back.
    store.release_claim(&request, 2).await.unwrap();
    assert!(matches!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::InFlight { attempt: 1, .. }
    ));
    store
        .record_outcome(&request, 1, &Outcome::Retrying { error: "e".into() })
        .await
        .unwrap();
    store.release_claim(&request, 1).await.unwrap();
    claim(2).await;
    assert_eq!(entry(store, request.message_id).await.attempts, 2);
    // A final request stays final.
    store
        .record_outcome(&request, 2, &Outcome::restarted())
        .await
        .unwrap();
    store.release_claim(&request, 2).await.unwrap();
    assert_eq!(entry(store, request.message_id).await.attempts, 2);
    assert_eq!(
        store.lookup(request.message_id).await.unwrap(),
        Some(Status::Restarted)
    );
}

pub async fn rejections_are_listed_but_never_count_as_the_request(store: &dyn Store) {
    store
        .record_rejection(None, "payload is not a valid request", b"garbage")
        .await
        .unwrap();
    let valid = request("cattle-0005");
    let id = valid.message_id;
    store
        .record_rejection(Some(id), "instance_name \"X\" is bad", b"{}")
        .await
        .unwrap();
    let history = store.history(100).await.unwrap();
    let rejected: Vec<_> = history
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), 2);
    assert!(rejected.iter().any(|e| e.message_id == Some(id)));
    // A malformed payload that carried this id does not make a later
    // valid request with the same id count as done.
    assert_eq!(store.lookup(id).await.unwrap(), None);
    assert_eq!(
        store
            .claim_restart(&valid, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
}

pub async fn prune_removes_old_final_entries_only_and_in_bounded_passes(store: &dyn Store) {
    let before = store.history(1000).await.unwrap();
    let finals = before.iter().filter(|e| e.status.is_final()).count();
    let open = before.len() - finals;
    assert!(
        finals >= 3,
        "the earlier contract steps leave final entries"
    );
    // Nothing completed a day ago or earlier: nothing to prune.
    let yesterday = Timestamp::from_millis(Timestamp::now().as_millis() - 86_400_000);
    assert_eq!(store.prune(yesterday, 1000).await.unwrap(), 0);
    let tomorrow = Timestamp::from_millis(Timestamp::now().as_millis() + 86_400_000);
    assert_eq!(store.prune(tomorrow, 2).await.unwrap(), 2);
    let rest = u64::try_from(finals - 2).unwrap();
    assert_eq!(store.prune(tomorrow, 1000).await.unwrap(), rest);
    let after = store.history(1000).await.unwrap();
    assert_eq!(after.len(), open);
    assert!(after.iter().all(|e| !e.status.is_final()));
    // Nothing of the pruned requests is left behind: no journal rows (every
    // one was claimed before `tomorrow`), no deferral counts.
    let epoch = Timestamp::from_millis(0);
    assert_eq!(
        store.group_usage(epoch, epoch).await.unwrap(),
        std::collections::BTreeMap::new()
    );
    for pruned in before.iter().filter(|e| e.status.is_final()) {
        if let Some(id) = pruned.message_id {
            assert_eq!(store.deferrals(id).await.unwrap(), 0, "{pruned:?}");
        }
    }
}

pub async fn outcome_details_are_kept(store: &dyn Store) {
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"cattle-0006","requested_by":"sre","reason":"game day"}}"#,
        Uuid::new_v4()
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    let request = RestartRequest::parse(payload.as_bytes(), &rules).unwrap();
    store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap();
    let restarted = Outcome::Restarted(crate::domain::Restarted {
        recovered_after: Some(Duration::from_millis(12_345)),
        output: Some("app restarted".into()),
    });
    store.record_outcome(&request, 1, &restarted).await.unwrap();
    let entry = entry(store, request.message_id).await;
    assert_eq!(entry.recovered_after, Some(Duration::from_millis(12_345)));
    assert_eq!(entry.output.as_deref(), Some("app restarted"));
    assert_eq!(entry.requested_by.as_deref(), Some("sre"));
    assert_eq!(entry.reason.as_deref(), Some("game day"));
    let json = serde_json::to_value(&entry).unwrap();
    assert_eq!(json["recovered_after"], serde_json::json!(12.345));
}

pub async fn the_kill_switch_stops_every_claim_until_resumed(store: &dyn Store) {
    assert!(!store.switch().await.unwrap().paused);
    let request = request("cattle-0007");
    store
        .set_switch(true, "sre-on-call", "incident 42")
        .await
        .unwrap();
    let switch = store.switch().await.unwrap();
    assert!(switch.paused);
    assert_eq!(switch.by.as_deref(), Some("sre-on-call"));
    assert_eq!(switch.reason.as_deref(), Some("incident 42"));
    assert!(switch.since.is_some());
    let Claim::Paused { reason } = store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("a paused store must refuse the claim");
    };
    assert!(
        reason.contains("sre-on-call") && reason.contains("incident 42"),
        "{reason}"
    );
    // Nothing was claimed: no attempt used.
    assert_eq!(
        store
            .lookup(request.message_id)
            .await
            .unwrap()
            .unwrap_or(Status::Received),
        Status::Received
    );
    store
        .set_switch(false, "sre-on-call", "resolved")
        .await
        .unwrap();
    assert!(!store.switch().await.unwrap().paused);
    assert_eq!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
}

/// A group pause defers every claim of that group's hosts, naming the
/// pause and its cause, with or without counting guards (the SQL stores
/// read it on both their claim paths), and no other group's; it keeps its
/// first cause, and lifts only when resumed.
pub async fn a_paused_group_defers_its_claims_only_until_resumed(store: &dyn Store) {
    assert!(store.group_pauses().await.unwrap().is_empty());
    assert!(
        store
            .set_group_pause("slowpoke", Some(("recovery-objective", "p95 exceeds 2m")))
            .await
            .unwrap()
    );
    // Paused already: the first cause stays.
    assert!(
        !store
            .set_group_pause("slowpoke", Some(("ana", "again")))
            .await
            .unwrap()
    );
    let pauses = store.group_pauses().await.unwrap();
    assert_eq!(pauses.len(), 1, "{pauses:?}");
    assert_eq!(
        (
            pauses[0].group.as_str(),
            pauses[0].by.as_str(),
            pauses[0].reason.as_str()
        ),
        ("slowpoke", "recovery-objective", "p95 exceeds 2m")
    );
    let counted = ClaimTerms {
        limits: Limits {
            group_max: Some(100),
            window: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let paused = request("slowpoke-0001");
    for terms in [TERMS, counted] {
        let claim = store
            .claim_restart(&paused, terms, ClaimToken::new())
            .await
            .unwrap();
        let Claim::Deferred {
            guard,
            reason,
            wait,
        } = claim
        else {
            panic!("a paused group's claim must be deferred, not {claim:?}");
        };
        assert_eq!((guard, wait), ("group pause", GROUP_PAUSE_RECHECK));
        assert!(
            reason.contains("slowpoke") && reason.contains("p95 exceeds 2m"),
            "{reason}"
        );
    }
    // Recorded as a deferral, and nothing claimed.
    let story = store.story(paused.message_id).await.unwrap().unwrap();
    assert!(story.attempts.is_empty(), "{story:?}");
    assert!(
        story.decisions.iter().any(|d| d.guard == "group pause"),
        "{story:?}"
    );
    // Another group is not paused.
    let other = request("brisk-0001");
    assert_eq!(
        store
            .claim_restart(&other, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
    assert!(store.set_group_pause("slowpoke", None).await.unwrap());
    assert!(!store.set_group_pause("slowpoke", None).await.unwrap());
    assert!(store.group_pauses().await.unwrap().is_empty());
    assert_eq!(
        store
            .claim_restart(&paused, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
}

/// A group's verified restarts, newest first: each recovery time, or
/// `None` for a host that never came back; restarts nobody probed, failed
/// ones and other groups' are not among them.
pub async fn recent_recoveries_are_the_groups_latest_verified_restarts(store: &dyn Store) {
    let verified = |secs: u64| {
        Outcome::Restarted(crate::domain::Restarted {
            recovered_after: Some(Duration::from_secs(secs)),
            output: None,
        })
    };
    let outcomes = [
        ("recov-0001", verified(10)),
        ("recov-0002", Outcome::restarted()),
        (
            "recov-0003",
            Outcome::Unrecovered {
                error: "probe never passed".into(),
                output: None,
            },
        ),
        (
            "recov-0004",
            Outcome::Failed {
                error: "refused".into(),
            },
        ),
        ("elsewhere-0001", verified(1)),
        ("recov-0005", verified(30)),
    ];
    for (instance, outcome) in outcomes {
        let request = request(instance);
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap();
        store.record_outcome(&request, 1, &outcome).await.unwrap();
        // Claims a millisecond apart at least: newest first is then one order.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        store.recent_recoveries("recov", 10).await.unwrap(),
        [
            Some(Duration::from_secs(30)),
            None,
            Some(Duration::from_secs(10))
        ]
    );
    assert_eq!(
        store.recent_recoveries("recov", 2).await.unwrap(),
        [Some(Duration::from_secs(30)), None]
    );
    assert!(
        store
            .recent_recoveries("nobody", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// `set_switch_if` checks and writes in one step: a pause that is not the
/// expected one is never undone, and a pause never overwrites another.
pub async fn a_conditional_turn_of_the_switch_happens_only_as_expected(store: &dyn Store) {
    use crate::store::SwitchExpected::{PausedBy, Running};
    assert!(!store.switch().await.unwrap().paused);
    let by = |switch: Switch| (switch.paused, switch.by.unwrap_or_default());
    assert!(
        !store
            .set_switch_if(PausedBy("file"), false, "file", "x")
            .await
            .unwrap()
    );
    assert!(
        store
            .set_switch_if(Running, true, "file", "exists")
            .await
            .unwrap()
    );
    assert_eq!(by(store.switch().await.unwrap()), (true, "file".into()));
    // Already paused: a second pause does not take it over.
    assert!(
        !store
            .set_switch_if(Running, true, "other", "x")
            .await
            .unwrap()
    );
    // Someone else paused since: not resumed.
    store.set_switch(true, "sre", "game day").await.unwrap();
    assert!(
        !store
            .set_switch_if(PausedBy("file"), false, "file", "removed")
            .await
            .unwrap()
    );
    assert_eq!(by(store.switch().await.unwrap()), (true, "sre".into()));
    store.set_switch(true, "file", "exists").await.unwrap();
    assert!(
        store
            .set_switch_if(PausedBy("file"), false, "file", "removed")
            .await
            .unwrap()
    );
    let switch = store.switch().await.unwrap();
    assert_eq!(
        (switch.paused, switch.reason.as_deref()),
        (false, Some("removed"))
    );
}

pub async fn counting_guards_are_decided_in_the_claim_and_journaled(store: &dyn Store) {
    let limited = ClaimTerms {
        limits: Limits {
            group_max: Some(2),
            global_max: None,
            window: Duration::from_secs(3600),
            host_cooldown: None,
            budget: Some(1),
            forget_after: Duration::from_secs(3600),
            budget_retry: limits::BUDGET_RETRY,
            ..Limits::NONE
        },
        ..TERMS
    };
    let first = request("herd-0001");
    let second = request("herd-0002");
    let third = request("herd-0003");
    assert_eq!(
        store
            .claim_restart(&first, limited, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
    // herd-0001's restart is in flight: the group's one disruption.
    let Claim::Deferred { guard, wait, .. } = store
        .claim_restart(&second, limited, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("the budget must hold while another host of the group is disrupted");
    };
    assert_eq!((guard, wait), ("disruption budget", limits::BUDGET_RETRY));
    store
        .record_outcome(&first, 1, &Outcome::restarted())
        .await
        .unwrap();
    assert!(matches!(
        store
            .claim_restart(&second, limited, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    store
        .record_outcome(&second, 1, &Outcome::restarted())
        .await
        .unwrap();
    // Two restarts of group herd in the window: the third waits for a
    // slot, about an hour.
    let Claim::Deferred {
        guard,
        wait,
        reason,
    } = store
        .claim_restart(&third, limited, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("the rate limit must hold");
    };
    assert_eq!(guard, "rate limit");
    assert!(wait > Duration::from_secs(3000), "{wait:?}");
    assert!(reason.contains("group herd had 2 of its 2"), "{reason}");
    // Another group is not limited by herd's use...
    let mut other = request("herd-0004");
    other.group = Some("flock".into());
    assert!(matches!(
        store
            .claim_restart(&other, limited, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    // ...and a claim given back leaves nothing in the journal.
    store.release_claim(&other, 1).await.unwrap();
    // The host cooldown counts restarts of the host by any request.
    let cooling = ClaimTerms {
        limits: Limits {
            host_cooldown: Some(Duration::from_secs(600)),
            ..Limits::NONE
        },
        ..TERMS
    };
    let again = request("herd-0001");
    let Claim::Deferred { guard, .. } = store
        .claim_restart(&again, cooling, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("the host cooldown must hold");
    };
    assert_eq!(guard, "host cooldown");

    // A dry run (no restart issued) uses up nothing once settled.
    let mut leashed = request("lamb-0001");
    leashed.group = Some("lamb".into());
    let once = ClaimTerms {
        limits: Limits {
            group_max: Some(1),
            ..limited.limits
        },
        ..TERMS
    };
    store
        .claim_restart(&leashed, once, ClaimToken::new())
        .await
        .unwrap();
    let dry = Outcome::DryRun {
        action: "run [\"true\"]".into(),
    };
    store.record_outcome(&leashed, 1, &dry).await.unwrap();
    let mut next = request("lamb-0002");
    next.group = Some("lamb".into());
    assert!(
        matches!(
            store
                .claim_restart(&next, once, ClaimToken::new())
                .await
                .unwrap(),
            Claim::Claimed { attempt: 1, .. }
        ),
        "a dry run must not use up the group's one restart"
    );

    // The story: the journal and the decisions, oldest first.
    let story = store.story(second.message_id).await.unwrap().unwrap();
    assert_eq!(story.entry.status, Status::Restarted);
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(story.attempts[0].outcome, Some(Status::Restarted));
    assert_eq!(story.attempts[0].group, "herd");
    assert!(
        story.attempts[0].verdict.contains("restart 2 of 2"),
        "{:?}",
        story.attempts[0]
    );
    assert_eq!(story.decisions.len(), 1, "{:?}", story.decisions);
    assert_eq!(story.decisions[0].guard, "disruption budget");
    assert_eq!(story.decisions[0].verdict, "deferred");
    let story = store.story(third.message_id).await.unwrap().unwrap();
    assert!(story.attempts.is_empty());
    assert_eq!(story.decisions[0].guard, "rate limit");
    // A repeated verdict is told once.
    store
        .claim_restart(&third, limited, ClaimToken::new())
        .await
        .unwrap();
    assert_eq!(
        store
            .story(third.message_id)
            .await
            .unwrap()
            .unwrap()
            .decisions
            .len(),
        1
    );
    let story = store.story(other.message_id).await.unwrap().unwrap();
    assert!(story.attempts.is_empty(), "{:?}", story.attempts);
    // Decisions the worker records (eligibility, calendar, ...).
    let decision = Decision {
        verdict: "denied",
        guard: "eligibility",
        reason: "denied by safety.deny",
    };
    store.record_decision(&third, 0, decision).await.unwrap();
    let story = store.story(third.message_id).await.unwrap().unwrap();
    assert_eq!(story.decisions.len(), 2);
    assert_eq!(story.decisions[1].reason, "denied by safety.deny");
    assert_eq!(store.story(Uuid::new_v4()).await.unwrap(), None);
    // Every deferred delivery counts, told once or not; other verdicts
    // do not.
    assert_eq!(store.deferrals(third.message_id).await.unwrap(), 2);
    assert_eq!(store.deferrals(second.message_id).await.unwrap(), 1);
    assert_eq!(store.deferrals(first.message_id).await.unwrap(), 0);
    // Use per group: herd-0001 and -0002 restarted (recovered), nothing
    // of herd disrupted; herd-0004's claim was given back.
    let hour_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 3_600_000);
    let usage = store.group_usage(hour_ago, hour_ago).await.unwrap();
    assert_eq!(
        usage.get("herd"),
        Some(&GroupUsage {
            restarts: 2,
            disrupted: 0
        }),
        "{usage:?}"
    );
    assert!(!usage.contains_key("flock"), "{usage:?}");
    store
        .claim_restart(&third, TERMS, ClaimToken::new())
        .await
        .unwrap();
    let usage = store.group_usage(hour_ago, hour_ago).await.unwrap();
    assert_eq!(usage["herd"].disrupted, 1, "in flight: {usage:?}");
}

/// `report(since)` lists the attempts claimed since then with their
/// outcome, group and requester, the recovery time and last error on a
/// request's latest attempt only, and the verdicts recorded since then
/// with the request's host, requester and group where the store knows
/// them; nothing from before `since`.
pub async fn the_report_reads_the_journal_and_the_verdicts_since_a_moment(store: &dyn Store) {
    let before = request_of("tally-0001", "tally", None, Some("ci"));
    store
        .claim_restart(&before, TERMS, ClaimToken::new())
        .await
        .unwrap();
    store
        .record_outcome(&before, 1, &Outcome::restarted())
        .await
        .unwrap();
    // A moment after the first claim's stamp, and well before the next
    // claims' (a store's clock may read a millisecond or two behind the
    // wall clock).
    let claimed = store.story(before.message_id).await.unwrap().unwrap();
    let since = Timestamp::from_millis(claimed.attempts[0].claimed_at.as_millis() + 1);
    while Timestamp::now().as_millis() < since.as_millis() + 20 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let retried = request_of("tally-0002", "tally", None, Some("ci"));
    for attempt in 1..=2 {
        store
            .claim_restart(&retried, TERMS, ClaimToken::new())
            .await
            .unwrap();
        let outcome = if attempt == 1 {
            Outcome::Retrying {
                error: "ssh: timeout".into(),
            }
        } else {
            Outcome::Restarted(crate::domain::Restarted {
                recovered_after: Some(Duration::from_millis(4_500)),
                output: None,
            })
        };
        store
            .record_outcome(&retried, attempt, &outcome)
            .await
            .unwrap();
    }
    let lost = request_of("tally-0003", "tally", None, None);
    store
        .claim_restart(&lost, TERMS, ClaimToken::new())
        .await
        .unwrap();
    let unrecovered = Outcome::Unrecovered {
        error: "<b>not healthy</b> after 60s".into(),
        output: None,
    };
    store.record_outcome(&lost, 1, &unrecovered).await.unwrap();
    let deferred = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "closed until monday",
    };
    store.record_decision(&lost, 0, deferred).await.unwrap();
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"tally-0004","requested_by":"mallory"}}"#,
        Uuid::new_v4()
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    let denied = RestartRequest::parse(payload.as_bytes(), &rules).unwrap();
    let denial = Decision {
        verdict: "denied",
        guard: "eligibility",
        reason: "<script>deny-listed</script>",
    };
    store.record_decision(&denied, 0, denial).await.unwrap();
    let reason = "<script>deny-listed</script>".to_owned();
    store
        .record_outcome(&denied, 0, &Outcome::Denied { reason })
        .await
        .unwrap();

    let report = store.report(since).await.unwrap();
    let ours = [before.message_id, retried.message_id, lost.message_id];
    let mut attempts: Vec<_> = report
        .attempts
        .iter()
        .filter(|a| ours.contains(&a.message_id))
        .map(|a| {
            (
                a.instance_name.as_str(),
                a.attempt,
                a.group.as_str(),
                a.requester.as_deref(),
                a.outcome,
                a.settled_at.is_some(),
                a.recovered_after,
                a.last_error.as_deref(),
            )
        })
        .collect();
    // In claim order; claims within one millisecond in any order.
    attempts.sort_by_key(|a| (a.0, a.1));
    assert_eq!(
        attempts,
        [
            (
                "tally-0002",
                1,
                "tally",
                Some("ci"),
                Some(Status::Retrying),
                true,
                None,
                None
            ),
            (
                "tally-0002",
                2,
                "tally",
                Some("ci"),
                Some(Status::Restarted),
                true,
                Some(Duration::from_millis(4_500)),
                None
            ),
            (
                "tally-0003",
                1,
                "tally",
                None,
                Some(Status::Unrecovered),
                true,
                None,
                Some("<b>not healthy</b> after 60s")
            ),
        ]
    );
    let mut decisions: Vec<_> = report
        .decisions
        .iter()
        .filter(|d| [lost.message_id, denied.message_id].contains(&d.message_id))
        .map(|d| {
            (
                d.verdict.as_str(),
                d.guard.as_str(),
                d.reason.as_str(),
                d.instance_name.as_deref(),
                d.group.as_deref(),
                d.requested_by.as_deref(),
            )
        })
        .collect();
    // Both recorded within a millisecond or not: in time order, ties in
    // any order.
    decisions.sort();
    assert_eq!(
        decisions,
        [
            (
                "deferred",
                "calendar",
                "closed until monday",
                Some("tally-0003"),
                Some("tally"),
                None
            ),
            (
                "denied",
                "eligibility",
                "<script>deny-listed</script>",
                Some("tally-0004"),
                None,
                Some("mallory")
            ),
        ]
    );
    let later = Timestamp::from_millis(Timestamp::now().as_millis() + 3_600_000);
    assert_eq!(store.report(later).await.unwrap(), ReportData::default());
}

/// A request of `group`, placed in `zone` and signed by `requester`, as
/// the worker hands it to the store.
fn request_of(
    instance: &str,
    group: &str,
    zone: Option<&str>,
    requester: Option<&str>,
) -> RestartRequest {
    let mut request = request(instance);
    request.group = Some(group.into());
    request.zone = zone.map(Into::into);
    request.requester = requester.map(Into::into);
    request
}

/// The requester quota counts a requester's claims over every group, and
/// the zone budget a zone's disrupted hosts over every group, whichever
/// instance claimed them: `first` and `second` are two instances on one
/// database (or one store twice). A dry run and a given-back claim count
/// in neither.
pub async fn the_requester_quota_and_the_zone_budget_count_across_groups_and_instances(
    first: &dyn Store,
    second: &dyn Store,
) {
    let quota = ClaimTerms {
        limits: Limits {
            requester_max: Some(2),
            requester_window: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let by_ci = |instance: &str, group: &str| request_of(instance, group, None, Some("ci-quota"));
    let one = by_ci("quota-a-0001", "quota-a");
    assert!(matches!(
        first
            .claim_restart(&one, quota, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    // A dry run issued nothing, and a claim given back was never used.
    let leashed = by_ci("quota-b-0001", "quota-b");
    second
        .claim_restart(&leashed, quota, ClaimToken::new())
        .await
        .unwrap();
    let dry = Outcome::DryRun {
        action: "run [\"true\"]".into(),
    };
    second.record_outcome(&leashed, 1, &dry).await.unwrap();
    let released = by_ci("quota-c-0001", "quota-c");
    first
        .claim_restart(&released, quota, ClaimToken::new())
        .await
        .unwrap();
    first.release_claim(&released, 1).await.unwrap();
    let two = by_ci("quota-b-0002", "quota-b");
    let claim = second
        .claim_restart(&two, quota, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    first
        .record_outcome(&one, 1, &Outcome::restarted())
        .await
        .unwrap();
    // Two restarts by ci in the hour, in two groups, by two instances:
    // a third, in a third group, waits for a slot (about an hour), on
    // either instance.
    for store in [first, second] {
        let three = by_ci("quota-c-0002", "quota-c");
        let claim = store
            .claim_restart(&three, quota, ClaimToken::new())
            .await
            .unwrap();
        let Claim::Deferred {
            guard,
            wait,
            reason,
        } = claim
        else {
            panic!("the requester quota must hold across groups and instances: {claim:?}");
        };
        assert_eq!(guard, "requester quota");
        assert!(wait > Duration::from_secs(3000), "{wait:?}");
        assert!(
            reason.contains("requester ci-quota had 2 of its 2"),
            "{reason}"
        );
    }
    // Another requester has its own quota.
    let other = request_of("quota-c-0003", "quota-c", None, Some("ci-other"));
    assert!(matches!(
        second
            .claim_restart(&other, quota, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));

    let zoned = ClaimTerms {
        limits: Limits {
            zone_budget: Some(1),
            forget_after: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let in_zone =
        |instance: &str, group: &str, zone: &str| request_of(instance, group, Some(zone), None);
    let one = in_zone("zone-a-0001", "zone-a", "eu-quota-1a");
    assert!(matches!(
        first
            .claim_restart(&one, zoned, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    // zone-a-0001's restart is in flight: its zone's one disruption, which
    // holds a host of another group, on another instance...
    let neighbour = in_zone("zone-b-0001", "zone-b", "eu-quota-1a");
    let claim = second
        .claim_restart(&neighbour, zoned, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred {
        guard,
        wait,
        reason,
    } = claim
    else {
        panic!("the zone budget must hold across groups and instances: {claim:?}");
    };
    assert_eq!((guard, wait), ("zone budget", limits::BUDGET_RETRY));
    assert!(reason.contains("zone eu-quota-1a"), "{reason}");
    // ...but not a host of the same group in another zone.
    let elsewhere = in_zone("zone-b-0002", "zone-b", "eu-quota-1b");
    assert!(matches!(
        second
            .claim_restart(&elsewhere, zoned, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    // Recovered (verified: no settle here), the zone is free again.
    first
        .record_outcome(&one, 1, &Outcome::restarted())
        .await
        .unwrap();
    assert!(matches!(
        second
            .claim_restart(&neighbour, zoned, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    let story = first.story(neighbour.message_id).await.unwrap().unwrap();
    assert_eq!(story.decisions[0].guard, "zone budget");
    assert!(
        story.attempts[0]
            .verdict
            .contains("1 of 1 hosts of zone eu-quota-1a"),
        "{:?}",
        story.attempts[0]
    );
}

/// A request the inventory gives no zone, unsigned, is held by neither the
/// zone budget nor the requester quota, and its claims count in neither:
/// not a zone's disruption, not a requester's restart.
pub async fn a_request_without_zone_or_requester_is_never_counted_in_them(store: &dyn Store) {
    let strict = ClaimTerms {
        limits: Limits {
            zone_budget: Some(1),
            requester_max: Some(1),
            requester_window: Duration::from_secs(3600),
            forget_after: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    // Two plain requests in flight at once: neither limit holds them.
    for instance in ["plain-0001", "plain-0002"] {
        let plain = request_of(instance, "plain", None, None);
        let claim = store
            .claim_restart(&plain, strict, ClaimToken::new())
            .await
            .unwrap();
        assert!(
            matches!(claim, Claim::Claimed { attempt: 1, .. }),
            "{claim:?}"
        );
    }
    // Nor do they count: a zone's first disruption and a requester's first
    // restart are still free (in flight, the plain hosts would fill both).
    let zoned = request_of("plain-0003", "plain", Some("eu-plain-1a"), None);
    let claim = store
        .claim_restart(&zoned, strict, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    let signed = request_of("plain-0004", "plain", None, Some("ci-plain"));
    let claim = store
        .claim_restart(&signed, strict, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    // And the signed, zoned ones are counted: each limit is now spent.
    let next = request_of("plain-0005", "plain", Some("eu-plain-1a"), Some("ci-plain"));
    let Claim::Deferred { guard, .. } = store
        .claim_restart(&next, strict, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("the zone's and the requester's own claims must count");
    };
    assert_eq!(guard, "requester quota");
}

/// Without a verification probe, "restarted" means the reboot was issued,
/// not that the host is back: the host counts as disrupted, for its group's
/// budget and its zone's, until `settle` has passed since its restart
/// ended. `settle_passes` moves every journal row's end back 10 minutes,
/// past the 5-minute settle, as time passing would. Run on a store of its
/// own: every journal row moves.
pub const SETTLE_PASSES_SQL: &str = "UPDATE restarts SET settled_at = settled_at - 600000";

pub async fn a_restarted_host_counts_as_disrupted_until_settle_passes(
    store: &dyn Store,
    settle_passes: impl std::future::Future<Output = ()>,
) {
    let settling = ClaimTerms {
        limits: Limits {
            budget: Some(1),
            zone_budget: Some(1),
            forget_after: Duration::from_secs(3600),
            settle: Duration::from_secs(300),
            ..Limits::NONE
        },
        ..TERMS
    };
    let first = request_of("settle-a-0001", "settle-a", Some("eu-settle-1a"), None);
    assert!(matches!(
        store
            .claim_restart(&first, settling, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    store
        .record_outcome(&first, 1, &Outcome::restarted())
        .await
        .unwrap();
    // Restarted, not yet settled: its group's one disruption...
    let sibling = request_of("settle-a-0002", "settle-a", Some("eu-settle-1b"), None);
    let claim = store
        .claim_restart(&sibling, settling, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("a restarted host must count until settle passes: {claim:?}");
    };
    assert_eq!(guard, "disruption budget");
    // ...and its zone's.
    let neighbour = request_of("settle-b-0001", "settle-b", Some("eu-settle-1a"), None);
    let claim = store
        .claim_restart(&neighbour, settling, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("a restarted host must count in its zone until settle passes: {claim:?}");
    };
    assert_eq!(guard, "zone budget");
    // With a probe (no settle), its verified recovery ends the disruption
    // at once. (The claim is given back: nothing was issued.)
    let verified = ClaimTerms {
        limits: Limits {
            settle: Duration::ZERO,
            ..settling.limits
        },
        ..settling
    };
    let claim = store
        .claim_restart(&neighbour, verified, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    store.release_claim(&neighbour, 1).await.unwrap();
    settle_passes.await;
    // Settled: its zone and its group are free.
    let claim = store
        .claim_restart(&neighbour, settling, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    let claim = store
        .claim_restart(&sibling, settling, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
}

/// Instances' clocks differ, so another instance's claim of the same host
/// can be stamped later than this claim's `now`. `stamp_later` moves the store's
/// journal rows a minute ahead, as such a claim would have stamped them:
/// the host must still be cooling. (The guards' read once left out rows
/// stamped after `now`, and two instances could restart one host within
/// its cooldown.) Run on a store of its own: every journal row moves.
/// What the SQL stores' `stamp_later` runs for
/// [`a_claim_stamped_after_now_still_cools_its_host`].
pub const STAMP_LATER_SQL: &str = "UPDATE restarts SET claimed_at = claimed_at + 60000";

pub async fn a_claim_stamped_after_now_still_cools_its_host(
    store: &dyn Store,
    stamp_later: impl std::future::Future<Output = ()>,
) {
    let cooling = ClaimTerms {
        limits: Limits {
            host_cooldown: Some(Duration::from_secs(600)),
            ..Limits::NONE
        },
        ..TERMS
    };
    let first = request("stray-0001");
    assert!(matches!(
        store
            .claim_restart(&first, cooling, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    // Ended, so that only the cooldown holds the host.
    store
        .record_outcome(&first, 1, &Outcome::restarted())
        .await
        .unwrap();
    stamp_later.await;
    let second = request("stray-0001");
    let claim = store
        .claim_restart(&second, cooling, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("the host cooldown must hold against a claim stamped later: {claim:?}");
    };
    assert_eq!(guard, "host cooldown");
}

/// A claim that waits for the counting guards' locks is stamped once it
/// holds them, not when it asked: else a restart would leave the rate
/// window (and end its host's cooldown) early by the time it waited, and
/// two restarts could land closer than a limit allows. The caller holds
/// the locks this claim needs (group `cattle`) before calling; `release`
/// releases them, and is run 300 ms into the claim's wait.
pub async fn a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them(
    store: &dyn Store,
    release: impl std::future::Future<Output = ()>,
) {
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = crate::store::Timestamp::now().as_millis();
        release.await;
        released
    };
    let limited = ClaimTerms {
        limits: Limits {
            group_max: Some(10),
            window: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let waiting = request("cattle-wait");
    let (claim, released) = tokio::join!(
        store.claim_restart(&waiting, limited, ClaimToken::new()),
        release
    );
    let claim = claim.unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    let story = store.story(waiting.message_id).await.unwrap().unwrap();
    let stamped = story.attempts[0].claimed_at.as_millis();
    assert!(
        stamped >= released,
        "stamped at {stamped}, before the locks it waited for were released at {released}"
    );
}

async fn entry(store: &dyn Store, id: Uuid) -> HistoryEntry {
    let history = store.history(1000).await.unwrap();
    history
        .into_iter()
        .find(|e| e.message_id == Some(id))
        .unwrap()
}
