//! A claim retried with its own token (its answer was lost, or the store
//! was out): the same attempt again, never one more.

use super::*;

/// A call whose claim was committed but whose answer was lost tries again
/// with the same token: it is answered with the attempt it claimed (and
/// what that claim counted as unknown), nothing is written, and the claim
/// still holds against any other call, even once the switch is paused.
pub(crate) async fn a_retried_claim_with_its_own_token_gets_the_same_attempt_and_writes_nothing(
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
        leashed: None,
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
        leashed: None,
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
            unknown: None,
            leashed: None,
        }
    );
}

/// The same call tried again for longer than its claim's hold (the store
/// was out that long): nothing was issued and nobody claimed since, so it
/// gets the same attempt, not one more with the first counted as unknown;
/// the hold is renewed, and the journal keeps the one row.
///
/// Both with and without counting guards (PostgreSQL decides a claim they
/// apply to in a transaction of its own).
pub(crate) async fn a_retried_claim_whose_hold_ran_out_gets_the_same_attempt_held_anew(
    store: &dyn Store,
) {
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
        leashed: None,
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
