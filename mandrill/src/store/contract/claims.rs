//! What a claim holds: its attempts and the unknown outcomes they count,
//! one request per host at a time, and a released claim used up nothing.
//!
//! One promise a function, each read alone; one file past 400 lines.

use super::*;

pub(crate) async fn claim_holds_and_unknown_outcomes_count(store: &dyn Store) {
    let request = request("cattle-0003");
    let first = store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert_eq!(
        first,
        Claim::Claimed {
            attempt: 1,
            unknown: None,
            leashed: None,
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
            unknown: None,
            leashed: None,
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
            unknown: Some(1),
            leashed: None,
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
            unknown: Some(2),
            leashed: None,
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
            unknown: None,
            leashed: None,
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
pub(crate) async fn a_host_is_never_claimed_for_two_requests_at_once(store: &dyn Store) {
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
            leashed: None,
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
        let e_token = ClaimToken::new();
        assert_eq!(
            store.claim_restart(&e, terms, e_token).await.unwrap(),
            first
        );
        store.release_claim(&e, 1, e_token).await.unwrap();
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

pub(crate) async fn a_released_claim_is_not_a_used_attempt(store: &dyn Store) {
    let request = request("cattle-0005");
    let claim = |expected: u32, token: ClaimToken| {
        let request = request.clone();
        async move {
            assert_eq!(
                store.claim_restart(&request, TERMS, token).await.unwrap(),
                Claim::Claimed {
                    attempt: expected,
                    unknown: None,
                    leashed: None,
                }
            );
        }
    };
    let (first, second, third) = (ClaimToken::new(), ClaimToken::new(), ClaimToken::new());
    claim(1, first).await;
    // Given back (a guard closed before the restart): the hold is lifted
    // at once and the attempt is claimed again, with nothing unknown.
    store.release_claim(&request, 1, first).await.unwrap();
    claim(1, second).await;
    // Only the latest, still-held claim is given back, and only with the
    // token it was made with: a late release of the first claim frees
    // nothing of the second's.
    store.release_claim(&request, 2, second).await.unwrap();
    store.release_claim(&request, 1, first).await.unwrap();
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
    store.release_claim(&request, 1, second).await.unwrap();
    claim(2, third).await;
    assert_eq!(entry(store, request.message_id).await.attempts, 2);
    // A final request stays final.
    store
        .record_outcome(&request, 2, &Outcome::restarted())
        .await
        .unwrap();
    store.release_claim(&request, 2, third).await.unwrap();
    assert_eq!(entry(store, request.message_id).await.attempts, 2);
    assert_eq!(
        store.lookup(request.message_id).await.unwrap(),
        Some(Status::Restarted)
    );
}

/// Two names of one machine (inventory entries sharing an address, which
/// the worker gives one `machine`) are one host to every counting guard:
/// host busy while either is in flight, the cooldown from either's
/// restart, and the budget's count, which counts the machine once.
/// Both with and without counting guards.
pub(crate) async fn two_names_of_one_machine_are_one_host_to_every_counting_guard(
    store: &dyn Store,
) {
    let alias = |instance: &str| {
        let mut request = request_of(instance, "alias", None, None);
        request.machine = Some("alias-0001".into());
        request
    };
    let guarded = ClaimTerms {
        limits: Limits {
            host_cooldown: Some(Duration::from_secs(3600)),
            budget: Some(5),
            forget_after: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let first = alias("alias-0001");
    let second = alias("alias-0001b");
    let claim = store
        .claim_restart(&first, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    // In flight under one name: busy under the other, guards or none.
    for terms in [TERMS, guarded] {
        let claim = store
            .claim_restart(&second, terms, ClaimToken::new())
            .await
            .unwrap();
        let Claim::Deferred { guard, .. } = claim else {
            panic!("one machine restarted twice at once under two names: {claim:?}");
        };
        assert_eq!(guard, "host busy");
    }
    store
        .record_outcome(
            &first,
            1,
            &Outcome::Failed {
                error: "no answer".into(),
            },
        )
        .await
        .unwrap();
    // Its restart cools the machine under every name.
    let claim = store
        .claim_restart(&second, guarded, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("an alias must be cooled by its machine's restart: {claim:?}");
    };
    assert_eq!(guard, "host cooldown");
    // Restarted under its other name too, the machine counts once.
    let claim = store
        .claim_restart(&second, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    store
        .record_outcome(
            &second,
            1,
            &Outcome::Failed {
                error: "no answer".into(),
            },
        )
        .await
        .unwrap();
    let hour_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 3_600_000);
    let usage = store
        .group_usage(crate::store::UsageStarts::since(hour_ago))
        .await
        .unwrap();
    assert_eq!(usage["alias"].disrupted, 1, "{usage:?}");
    // The report names the instance each request asked for.
    let report = store.report(hour_ago).await.unwrap();
    let mut names: Vec<&str> = report
        .attempts
        .iter()
        .filter(|a| a.group == "alias")
        .map(|a| a.instance_name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["alias-0001", "alias-0001b"]);
}

/// A release whose caller gave up (it timed out) may still commit, and the
/// caller tries it again; between the two, another delivery claims the
/// same attempt. The late release names the claim it gives back by its
/// token: it never frees the other delivery's claim.
pub(crate) async fn a_late_release_never_frees_another_deliverys_claim(store: &dyn Store) {
    let request = request("cattle-0019");
    let (first, second) = (ClaimToken::new(), ClaimToken::new());
    let claimed = Claim::Claimed {
        attempt: 1,
        unknown: None,
        leashed: None,
    };
    assert_eq!(
        store.claim_restart(&request, TERMS, first).await.unwrap(),
        claimed
    );
    // The first try commits after its caller stopped waiting for it...
    store.release_claim(&request, 1, first).await.unwrap();
    // ...so another delivery claims attempt 1 again...
    assert_eq!(
        store.claim_restart(&request, TERMS, second).await.unwrap(),
        claimed
    );
    // ...before the first delivery's second try lands.
    store.release_claim(&request, 1, first).await.unwrap();
    assert!(
        matches!(
            store
                .claim_restart(&request, TERMS, ClaimToken::new())
                .await
                .unwrap(),
            Claim::InFlight { attempt: 1, .. }
        ),
        "the second delivery's claim still holds"
    );
    let story = store.story(request.message_id).await.unwrap().unwrap();
    assert_eq!(story.attempts.len(), 1, "its journal row is kept");
    assert_eq!(story.entry.attempts, 1);
    // Its own release still gives it back.
    store.release_claim(&request, 1, second).await.unwrap();
    assert_eq!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        claimed
    );
}

/// A claim or an outcome waiting for its batch to commit holds the request
/// once: every message in flight waits so, and what each waiting call
/// holds is memory per message. The request once, its terms, the timer
/// and the queue's waiting state fit in four requests' room; a copy of
/// the request at every level of nested `async fn`s does not (a claim's
/// future was 5.3 KB on SQLite and 7.8 KB on PostgreSQL in the test
/// profile; 3.8 KB on PostgreSQL in release, where the benchmark's 10,000
/// messages in flight held 38 MB in them).
pub(crate) async fn a_waiting_write_holds_its_request_once(store: &dyn Store) {
    let room = 4 * std::mem::size_of::<RestartRequest>();
    let fits = |what: &str, held: usize| {
        assert!(
            held <= room,
            "a waiting {what} holds {held} bytes, over {room}"
        );
    };
    let request = request("cattle-0090");
    let claim = store.claim_restart(&request, TERMS, ClaimToken::new());
    fits("claim", std::mem::size_of_val(&*claim));
    let Claim::Claimed { attempt, .. } = claim.await.unwrap() else {
        panic!("a new request is claimed");
    };
    let outcome = Outcome::Restarted(crate::domain::Restarted::default());
    // Built but never polled: nothing is queued, nothing recorded.
    let unpolled = store.record_outcome(&request, attempt, &outcome);
    fits("outcome", std::mem::size_of_val(&*unpolled));
    drop(unpolled);
    let recorded = store.record_outcome_acking(&request, attempt, &outcome, None);
    fits("outcome", std::mem::size_of_val(&*recorded));
    assert_eq!(recorded.await.unwrap(), (Recorded::Recorded, false));
}
