use super::*;
use crate::domain::{Domain, Outcome, ParseRules, RestartRequest};
use crate::store::{SqliteStore, Store};

fn request() -> RestartRequest {
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"cattle-old"}}"#,
        uuid::Uuid::new_v4()
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
}

#[tokio::test]
async fn history_past_its_retention_is_pruned_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("h.db").display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::connect(&url, 2).await.unwrap());
    // More than one batch's worth would take long; two rows prove the rule.
    let (old, open) = (request(), request());
    store
        .record_outcome(&old, 1, &Outcome::restarted())
        .await
        .unwrap();
    store
        .claim_restart(
            &open,
            crate::store::ClaimTerms {
                max_attempts: 1,
                hold: Duration::from_secs(60),
                limits: crate::safety::Limits::NONE,
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stop = CancellationToken::new();
    let pruning = tokio::spawn(prune_history(
        store.clone(),
        Duration::from_millis(10),
        Duration::ZERO,
        stop.clone(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.history(10).await.unwrap().len() != 1 {
        assert!(tokio::time::Instant::now() < deadline, "never pruned");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The request still in progress is kept, whatever its age.
    let kept = store.history(10).await.unwrap();
    assert_eq!(kept[0].message_id, Some(open.message_id));
    stop.cancel();
    pruning.await.unwrap();
    store.close().await;
}
