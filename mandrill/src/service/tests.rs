use super::*;
use crate::domain::{Domain, Outcome, ParseRules, RestartRequest};
use crate::sqlite::SqliteStore;
use crate::store::Store;

fn request() -> RestartRequest {
    request_for("cattle-old")
}

fn request_for(instance: &str) -> RestartRequest {
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"{instance}"}}"#,
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
            crate::store::ClaimToken::new(),
        )
        .await
        .unwrap();
    // Older than anything pruning keeps (a signed token's validity is
    // the floor), as a row finished two days ago.
    let two_days_ago = crate::domain::Timestamp::now().as_millis() - 2 * 24 * 3_600_000;
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE requests SET completed_at = $1, updated_at = $1 WHERE message_id = $2")
        .bind(two_days_ago)
        .bind(old.message_id.to_string())
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let stop = CancellationToken::new();
    let pruning = tokio::spawn(prune_history(
        store.clone(),
        Duration::from_millis(10),
        PolicyHandle::default(),
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

/// A retention shorter than the rate window must not prune a restart the
/// window still counts, or the group's next restart would be allowed inside
/// the window.
#[tokio::test]
async fn pruning_keeps_the_journal_the_guards_still_count() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("g.db").display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::connect(&url, 2).await.unwrap());
    let hour = Duration::from_secs(3600);
    let terms = crate::store::ClaimTerms {
        max_attempts: 1,
        hold: Duration::from_secs(60),
        limits: crate::safety::Limits {
            group_max: Some(1),
            window: hour,
            ..crate::safety::Limits::NONE
        },
    };
    let first = request_for("cattle-first");
    let claimed = store
        .claim_restart(&first, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    assert!(
        matches!(claimed, crate::store::Claim::Claimed { attempt: 1, .. }),
        "{claimed:?}"
    );
    store
        .record_outcome(&first, 1, &Outcome::restarted())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let counting = crate::safety::Counting::new(
        &std::collections::BTreeMap::new(),
        &crate::safety::RateSettings {
            group_max: Some(1),
            window: hour,
            ..crate::safety::RateSettings::default()
        },
        &crate::safety::BudgetSettings::default(),
        false,
    )
    .unwrap();
    let policy = PolicyHandle::new(crate::safety::Policy {
        guards: crate::safety::Guards {
            counting,
            ..crate::safety::Guards::default()
        },
        ..crate::safety::Policy::default()
    });
    let stop = CancellationToken::new();
    let pruning = tokio::spawn(prune_history(
        store.clone(),
        Duration::from_millis(10),
        policy,
        Duration::ZERO,
        stop.clone(),
    ));
    // The first prune runs at once; give it ample time to finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    pruning.await.unwrap();

    assert_eq!(
        store.history(10).await.unwrap().len(),
        1,
        "the restart was pruned"
    );
    let second = store
        .claim_restart(
            &request_for("cattle-second"),
            terms,
            crate::store::ClaimToken::new(),
        )
        .await
        .unwrap();
    assert!(
        !matches!(second, crate::store::Claim::Claimed { .. }),
        "a second restart of the group inside the window: {second:?}"
    );
    store.close().await;
}
