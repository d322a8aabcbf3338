//! Which hosts count as disrupted, for the group's budget and the zone's:
//! a restarted host until its restart settles, and a host whose latest
//! claims tie if any of them disrupts.

use super::*;

/// Without a verification probe, "restarted" means the reboot was issued,
/// not that the host is back: the host counts as disrupted, for its group's
/// budget and its zone's, until `settle` has passed since its restart
/// ended. `settle_passes` moves every journal row's end back 10 minutes,
/// past the 5-minute settle, as time passing would. Run on a store of its
/// own: every journal row moves.
pub(crate) const SETTLE_PASSES_SQL: &str = "UPDATE restarts SET settled_at = settled_at - 600000";

pub(crate) async fn a_restarted_host_counts_as_disrupted_until_settle_passes(
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
    let token = ClaimToken::new();
    let claim = store
        .claim_restart(&neighbour, verified, token)
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
    store.release_claim(&neighbour, 1, token).await.unwrap();
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

/// Two claims of one host can be stamped in the same millisecond (two
/// requests' claims in one batch, or by two instances). `USAGE_SQL` takes
/// every row at the host's latest time, so the host counts as disrupted
/// if any of them does, whichever was written last. `tie` stamps every
/// journal row at the latest claim's time, as such claims would have been.
/// Run on a store of its own: every journal row moves.
pub(crate) const TIE_CLAIMS_SQL: &str =
    "UPDATE restarts SET claimed_at = (SELECT MAX(claimed_at) FROM restarts)";

pub(crate) async fn every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption(
    store: &dyn Store,
    tie: impl std::future::Future<Output = ()>,
) {
    // A verified restart (no settle) ends its host's disruption; a failed
    // one does not.
    let budgets = |budget, zone_budget| ClaimTerms {
        limits: Limits {
            budget: Some(budget),
            zone_budget: Some(zone_budget),
            forget_after: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let failed = Outcome::Failed {
        error: "no answer".into(),
    };
    let restarted = Outcome::restarted();
    // Each host restarted by two requests, one after the other: the
    // failed restart first on one host, last on the other, so that a
    // store that took one row of a tie, first or last, misses a host.
    for (instance, outcomes) in [
        ("tie-0001", [&failed, &restarted]),
        ("tie-0002", [&restarted, &failed]),
    ] {
        for outcome in outcomes {
            let request = request_of(instance, "tie", Some("eu-tie-1a"), None);
            let claim = store
                .claim_restart(&request, TERMS, ClaimToken::new())
                .await
                .unwrap();
            assert!(
                matches!(claim, Claim::Claimed { attempt: 1, .. }),
                "{claim:?}"
            );
            store.record_outcome(&request, 1, outcome).await.unwrap();
        }
    }
    tie.await;
    let hour_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 3_600_000);
    let usage = store
        .group_usage(crate::store::UsageStarts::since(hour_ago))
        .await
        .unwrap();
    assert_eq!(usage["tie"].disrupted, 2, "{usage:?}");
    // Both hosts fill the group's budget of two...
    let third = request_of("tie-0003", "tie", Some("eu-tie-1b"), None);
    let claim = store
        .claim_restart(&third, budgets(2, 10), ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("a host with a disrupting claim among its tied ones must count: {claim:?}");
    };
    assert_eq!(guard, "disruption budget");
    // ...and their zone's, for a host of any group.
    let neighbour = request_of("knot-0001", "knot", Some("eu-tie-1a"), None);
    let claim = store
        .claim_restart(&neighbour, budgets(10, 2), ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!(
            "a host with a disrupting claim among its tied ones must count in its zone: {claim:?}"
        );
    };
    assert_eq!(guard, "zone budget");
    // A host counts once, however many of its claims tie.
    for (request, terms) in [(&third, budgets(3, 10)), (&neighbour, budgets(10, 3))] {
        let claim = store
            .claim_restart(request, terms, ClaimToken::new())
            .await
            .unwrap();
        assert!(
            matches!(claim, Claim::Claimed { attempt: 1, .. }),
            "{claim:?}"
        );
    }
}

/// A dry run, a denial or an expiry issued no restart: claimed after a
/// host's restart, it must not hide the host's disruption (the budget
/// reads each host's latest *issued* claim). `earlier` moves every journal
/// row (its claim and its end) back a minute, so that the claims that
/// issue nothing are stamped strictly later than the restarts they follow
/// (a tie would count the host anyway). Run on a store of its own: every
/// journal row moves.
pub(crate) const CLAIMS_EARLIER_SQL: &str =
    "UPDATE restarts SET claimed_at = claimed_at - 60000, settled_at = settled_at - 60000";

pub(crate) async fn a_claim_that_issued_nothing_never_hides_a_disrupted_host(
    store: &dyn Store,
    earlier: impl std::future::Future<Output = ()>,
) {
    let budgets = |budget, zone_budget| ClaimTerms {
        limits: Limits {
            budget: Some(budget),
            zone_budget: Some(zone_budget),
            forget_after: Duration::from_secs(3600),
            settle: Duration::from_secs(300),
            ..Limits::NONE
        },
        ..TERMS
    };
    let claim_and_record = |instance: &'static str, outcome: Outcome| async move {
        let request = request_of(instance, "mask", Some("eu-mask-1a"), None);
        let claim = store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap();
        assert!(
            matches!(claim, Claim::Claimed { attempt: 1, .. }),
            "{instance}: {claim:?}"
        );
        store.record_outcome(&request, 1, &outcome).await.unwrap();
    };
    // Three hosts disrupted: one restarted and still settling, one whose
    // restart failed, one that never came back.
    claim_and_record("mask-0001", Outcome::restarted()).await;
    claim_and_record(
        "mask-0002",
        Outcome::Failed {
            error: "no answer".into(),
        },
    )
    .await;
    claim_and_record(
        "mask-0003",
        Outcome::Unrecovered {
            error: "no ping".into(),
            output: None,
        },
    )
    .await;
    earlier.await;
    // Each is then claimed by a request that issues nothing.
    claim_and_record(
        "mask-0001",
        Outcome::DryRun {
            action: "restart mask-0001".into(),
        },
    )
    .await;
    claim_and_record(
        "mask-0002",
        Outcome::Denied {
            reason: "denied by safety.deny".into(),
        },
    )
    .await;
    claim_and_record(
        "mask-0003",
        Outcome::Expired {
            reason: "deferred past safety.max_defer".into(),
        },
    )
    .await;
    // The status's count sees the three, as the guard below does (it
    // left the restarted host out, still settling, and said "0 of 1"
    // where the claims were deferred for "1 of 1")...
    let now = Timestamp::now().as_millis();
    let hour_ago = Timestamp::from_millis(now - 3_600_000);
    let starts = crate::store::UsageStarts {
        settled_after: Timestamp::from_millis(now - 300_000),
        ..crate::store::UsageStarts::since(hour_ago)
    };
    let usage = store.group_usage(starts).await.unwrap();
    assert_eq!(usage["mask"].disrupted, 3, "{usage:?}");
    // ...without a settle, the failed and the unrecovered host...
    let usage = store
        .group_usage(crate::store::UsageStarts::since(hour_ago))
        .await
        .unwrap();
    assert_eq!(usage["mask"].disrupted, 2, "{usage:?}");
    // ...and the three hosts fill their group's budget of three...
    let fourth = request_of("mask-0004", "mask", Some("eu-mask-1b"), None);
    let claim = store
        .claim_restart(&fourth, budgets(3, 10), ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("a claim that issued nothing must not hide a disrupted host: {claim:?}");
    };
    assert_eq!(guard, "disruption budget");
    // ...and their zone's, for a host of any group.
    let neighbour = request_of("veil-0001", "veil", Some("eu-mask-1a"), None);
    let claim = store
        .claim_restart(&neighbour, budgets(10, 3), ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("a claim that issued nothing must not hide a disrupted host's zone: {claim:?}");
    };
    assert_eq!(guard, "zone budget");
    // The restarted host's cooldown runs from its restart, not its dry run.
    let again = request_of("mask-0001", "mask", Some("eu-mask-1a"), None);
    let cooling = ClaimTerms {
        limits: Limits {
            host_cooldown: Some(Duration::from_secs(3600)),
            ..Limits::NONE
        },
        ..TERMS
    };
    let claim = store
        .claim_restart(&again, cooling, ClaimToken::new())
        .await
        .unwrap();
    let Claim::Deferred { guard, .. } = claim else {
        panic!("a dry run must not hide a host's last restart from its cooldown: {claim:?}");
    };
    assert_eq!(guard, "host cooldown");
    // Each host counts once: a budget of four lets the fourth through.
    let claim = store
        .claim_restart(&fourth, budgets(4, 10), ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed { attempt: 1, .. }),
        "{claim:?}"
    );
}
