//! A request is who asked and what for: a payload under another request's
//! `message_id` never joins it, whichever write it reaches.

use super::*;

pub(crate) async fn a_payload_under_another_requests_id_never_joins_it(store: &dyn Store) {
    // Who asked and for what: `signer` verified (and so `requested_by`,
    // as the parse sets it), or unsigned free text `by`.
    let asked =
        |request: &RestartRequest, instance: &str, signer: Option<&str>, by: &str, reason: &str| {
            let mut asked = crate::domain::testing::request(instance);
            asked.message_id = request.message_id;
            asked.requester = signer.map(Into::into);
            asked.requested_by = Some(by.into());
            asked.reason = Some(reason.into());
            asked
        };
    let refused = |claim: Claim| {
        let Claim::Conflict { reason } = claim else {
            panic!("another request's id must be refused, got {claim:?}");
        };
        reason
    };
    let denied = Outcome::Denied {
        reason: "not allowed".into(),
    };
    let deferral = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "closed",
    };
    // V's signed request for cattle-a1, claimed (so held).
    let original = asked(
        &request("cattle-a1"),
        "cattle-a1",
        Some("v"),
        "v",
        "kernel update",
    );
    let token = ClaimToken::new();
    let claimed = store.claim_restart(&original, TERMS, token).await.unwrap();
    assert_eq!(
        claimed,
        Claim::Claimed {
            attempt: 1,
            unknown: None,
            leashed: None,
        }
    );
    let impostors = [
        // Another signer, another host.
        asked(&original, "web-7", Some("m"), "m", "kernel update"),
        // Another signer, the same host and reason.
        asked(&original, "cattle-a1", Some("m"), "m", "kernel update"),
        // Unsigned, naming V: a signed request never matches an unsigned one.
        asked(&original, "cattle-a1", None, "v", "kernel update"),
        // V's own signature, another reason or another host.
        asked(&original, "cattle-a1", Some("v"), "v", "just because"),
        asked(&original, "cattle-a2", Some("v"), "v", "kernel update"),
    ];
    for impostor in &impostors {
        let reason = refused(
            store
                .claim_restart(impostor, TERMS, ClaimToken::new())
                .await
                .unwrap(),
        );
        assert!(
            reason.contains(&original.message_id.to_string()),
            "the refusal names the id: {reason}"
        );
        // No other write a payload reaches before its claim lands either.
        let recorded = store.record_outcome(impostor, 0, &denied).await.unwrap();
        assert!(matches!(recorded, Recorded::Conflict(_)), "{recorded:?}");
        let recorded = store
            .record_outcome(impostor, 1, &Outcome::restarted())
            .await
            .unwrap();
        assert!(matches!(recorded, Recorded::Conflict(_)), "{recorded:?}");
        let recorded = store.record_decision(impostor, 0, deferral).await.unwrap();
        assert!(matches!(recorded, Recorded::Conflict(_)), "{recorded:?}");
        store.first_received(impostor).await.unwrap();
    }
    // Nor the journal: the original's attempt is still in flight (an
    // impostor's outcome ended it there: the host no longer held, and a
    // `dry-run` would have taken it out of every count).
    let story = store.story(original.message_id).await.unwrap().unwrap();
    let ends: Vec<Option<Status>> = story.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(ends, vec![None], "settled by another request's outcome");
    let reason = refused(
        store
            .claim_restart(&impostors[0], TERMS, ClaimToken::new())
            .await
            .unwrap(),
    );
    assert!(
        reason.contains("instance cattle-a1 (this payload: web-7)")
            && reason.contains("requested by v (verified) (this payload: m (verified))"),
        "the refusal names the conflict: {reason}"
    );
    // The same request (a redelivery) still joins its record.
    let again = asked(&original, "cattle-a1", Some("v"), "v", "kernel update");
    assert!(matches!(
        store
            .claim_restart(&again, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::InFlight { attempt: 1, .. }
    ));
    assert_eq!(store.decisions(original.message_id).await.unwrap(), vec![]);
    assert_eq!(store.deferrals(original.message_id).await.unwrap(), 0);
    // The original runs untouched.
    assert_eq!(
        store
            .record_outcome(&original, 1, &Outcome::restarted())
            .await
            .unwrap(),
        Recorded::Recorded
    );
    let kept = entry(store, original.message_id).await;
    assert_eq!(
        (
            kept.instance_name.as_deref(),
            kept.requested_by.as_deref(),
            kept.verified,
            kept.reason.as_deref(),
            kept.status,
            kept.attempts
        ),
        (
            Some("cattle-a1"),
            Some("v"),
            true,
            Some("kernel update"),
            Status::Restarted,
            1
        )
    );
    let story = store.story(original.message_id).await.unwrap().unwrap();
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(story.attempts[0].group, "cattle");
    // A final record is not answered for another request either.
    refused(
        store
            .claim_restart(&impostors[0], TERMS, ClaimToken::new())
            .await
            .unwrap(),
    );
    // Bound from whichever write records the request first: a receipt,
    // an outcome with no claim before it, a deferral before any claim.
    // Unsigned, the same `requested_by` is the same request.
    let first = asked(&request("cattle-b1"), "cattle-b1", None, "carol", "drill");
    store.first_received(&first).await.unwrap();
    refused(
        store
            .claim_restart(
                &asked(&first, "cattle-b1", None, "dave", "drill"),
                TERMS,
                ClaimToken::new(),
            )
            .await
            .unwrap(),
    );
    claim_and_restart(
        store,
        &asked(&first, "cattle-b1", None, "carol", "drill"),
        1,
    )
    .await;
    let first = asked(&request("cattle-b2"), "cattle-b2", None, "erin", "game day");
    let retrying = Outcome::Retrying {
        error: "no answer".into(),
    };
    store.record_outcome(&first, 1, &retrying).await.unwrap();
    refused(
        store
            .claim_restart(
                &asked(&first, "cattle-b2", None, "erin", "again"),
                TERMS,
                ClaimToken::new(),
            )
            .await
            .unwrap(),
    );
    claim_and_restart(store, &first, 2).await;
    let first = asked(&request("cattle-b3"), "cattle-b3", Some("v"), "v", "drill");
    assert_eq!(
        store.record_decision(&first, 0, deferral).await.unwrap(),
        Recorded::Recorded
    );
    refused(
        store
            .claim_restart(
                &asked(&first, "web-7", Some("m"), "m", "drill"),
                TERMS,
                ClaimToken::new(),
            )
            .await
            .unwrap(),
    );
    claim_and_restart(store, &first, 1).await;
    let kept = entry(store, first.message_id).await;
    assert_eq!(
        (
            kept.instance_name.as_deref(),
            kept.requested_by.as_deref(),
            kept.verified
        ),
        (Some("cattle-b3"), Some("v"), true)
    );
}

/// Claims `request`, expecting `attempt` with no unknown outcome before
/// it, and records it restarted.
async fn claim_and_restart(store: &dyn Store, request: &RestartRequest, attempt: u32) {
    let claim = store
        .claim_restart(request, TERMS, ClaimToken::new())
        .await
        .unwrap();
    assert_eq!(
        claim,
        Claim::Claimed {
            attempt,
            unknown: None,
            leashed: None,
        }
    );
    store
        .record_outcome(request, attempt, &Outcome::restarted())
        .await
        .unwrap();
}
