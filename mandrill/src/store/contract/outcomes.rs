//! What an outcome writes: a final status is never overwritten, the first
//! receipt is kept, who asked and why are the first request's, and an
//! outcome keeps its details, claimed or not.

use super::*;

pub(crate) async fn final_outcome_is_never_overwritten(store: &dyn Store) {
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
pub(crate) async fn every_final_status_is_kept(store: &dyn Store) {
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
pub(crate) async fn the_first_receipt_is_kept(store: &dyn Store) {
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

/// Who asked for a restart and why are the request's that created its
/// record (the SQL stores insert them once, `ON CONFLICT DO NOTHING`): a
/// redelivery, or another request with the same id, that names someone
/// else changes neither, whether a claim, a first receipt or an outcome
/// created the record.
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
            unknown: None
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
            unknown: None
        }
    );
    store
        .record_outcome(request, attempt, &Outcome::restarted())
        .await
        .unwrap();
}

pub(crate) async fn outcome_without_claim_creates_row(store: &dyn Store) {
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

pub(crate) async fn outcome_details_are_kept(store: &dyn Store) {
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
