//! What an outcome writes: a final status is never overwritten, the first
//! receipt is kept, and an outcome keeps its details, claimed or not.

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
            unknown: None,
            leashed: None,
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
            unknown: None,
            leashed: None,
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
                unknown: None,
                leashed: None,
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
