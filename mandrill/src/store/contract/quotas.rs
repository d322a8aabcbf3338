//! The requester quota and the zone budget: counted across groups and
//! instances, and only for requests that have a requester or a zone.

use super::*;

/// The requester quota counts a requester's claims over every group, and
/// the zone budget a zone's disrupted hosts over every group, whichever
/// instance claimed them: `first` and `second` are two instances on one
/// database (or one store twice). A dry run and a given-back claim count
/// in neither.
pub(crate) async fn the_requester_quota_and_the_zone_budget_count_across_groups_and_instances(
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
    let token = ClaimToken::new();
    first.claim_restart(&released, quota, token).await.unwrap();
    first.release_claim(&released, 1, token).await.unwrap();
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
            .contains("1 of 1 host of zone eu-quota-1a"),
        "{:?}",
        story.attempts[0]
    );
}

/// A request the inventory gives no zone, unsigned, is held by neither the
/// zone budget nor the requester quota, and its claims count in neither:
/// not a zone's disruption, not a requester's restart.
pub(crate) async fn a_request_without_zone_or_requester_is_never_counted_in_them(
    store: &dyn Store,
) {
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
