//! The counting guards, decided inside the claim: journaled, counted
//! whatever the instances' clocks, and stamped when the claim holds their
//! locks. Which hosts count as disrupted is in `disruption.rs`.

use super::*;

pub(crate) async fn counting_guards_are_decided_in_the_claim_and_journaled(store: &dyn Store) {
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
            unknown: None,
            leashed: None,
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
    let token = ClaimToken::new();
    assert!(matches!(
        store.claim_restart(&other, limited, token).await.unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    // ...and a claim given back leaves nothing in the journal.
    store.release_claim(&other, 1, token).await.unwrap();
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
    let usage = store
        .group_usage(crate::store::UsageStarts::since(hour_ago))
        .await
        .unwrap();
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
    let usage = store
        .group_usage(crate::store::UsageStarts::since(hour_ago))
        .await
        .unwrap();
    assert_eq!(usage["herd"].disrupted, 1, "in flight: {usage:?}");
}

/// Instances' clocks differ, so another instance's claim of the same host
/// can be stamped later than this claim's `now`. `stamp_later` moves the store's
/// journal rows a minute ahead, as such a claim would have stamped them:
/// the host must still be cooling. (The guards' read once left out rows
/// stamped after `now`, and two instances could restart one host within
/// its cooldown.) Run on a store of its own: every journal row moves.
/// What the SQL stores' `stamp_later` runs for
/// [`a_claim_stamped_after_now_still_cools_its_host`].
pub(crate) const STAMP_LATER_SQL: &str = "UPDATE restarts SET claimed_at = claimed_at + 60000";

pub(crate) async fn a_claim_stamped_after_now_still_cools_its_host(
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
pub(crate) async fn a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them(
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
