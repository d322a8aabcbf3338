//! Databases written by earlier schemas, upgraded in place.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;

use super::*;

/// A database written by the previous schema is upgraded in place, and
/// a rejection recorded under a salvaged id stops counting as done.
#[tokio::test]
async fn upgrade_keeps_history_and_frees_ids_salvaged_from_rejections() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("old.db").display());
    let pool = SqlitePool::connect_with(
        SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true),
    )
    .await
    .unwrap();
    // The schema as the first two migrations of the days when the queue's
    // and the store's shared one list left it.
    let mut first_two = crate::sqlite::store_migrations().migrations[..1].to_vec();
    first_two.extend(crate::sqlite::queue_migrations().migrations.iter().cloned());
    let old = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(first_two),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    old.run(&pool).await.unwrap();
    let salvaged = Uuid::new_v4();
    let done = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO requests (message_id, status, attempts, last_error, received_at, updated_at, completed_at)
         VALUES (?1, 'rejected', 1, 'bad name', 1, 1, 1),
                (?2, 'restarted', 2, NULL, 1, 1, 1)",
    )
    .bind(salvaged.to_string())
    .bind(done.to_string())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    assert_eq!(store.lookup(salvaged).await.unwrap(), None);
    assert_eq!(store.lookup(done).await.unwrap(), Some(Status::Restarted));
    let history = store.history(10).await.unwrap();
    assert_eq!(history.len(), 2);
    assert!(
        history
            .iter()
            .any(|e| e.message_id == Some(salvaged) && e.status == Status::Rejected)
    );
    store.close().await;
}

/// A database whose claims were written before claims kept their token is
/// upgraded in place: a claim it holds still holds against every caller
/// (no token is its caller's), and new claims keep theirs.
#[tokio::test]
async fn upgrade_keeps_a_claim_held_without_a_token_held_against_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("old.db").display());
    let pool = SqlitePool::connect_with(
        SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true),
    )
    .await
    .unwrap();
    let store_migrations = crate::sqlite::store_migrations().migrations.to_vec();
    let before_tokens = store_migrations
        .iter()
        .position(|migration| migration.description.contains("claim token"))
        .expect("the migration that adds the token");
    let mut old: Vec<_> = store_migrations[..before_tokens].to_vec();
    old.extend(crate::sqlite::queue_migrations().migrations.iter().cloned());
    old.sort_by_key(|migration| migration.version);
    let old = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(old),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    old.run(&pool).await.unwrap();
    let request = contract::request("cattle-old");
    let in_an_hour = Timestamp::now().as_millis() + 3_600_000;
    sqlx::query(
        "INSERT INTO requests (message_id, instance_name, hostname, status, attempts,
                               claim_until, received_at, updated_at)
         VALUES (?1, ?2, ?3, 'received', 1, ?4, 1, 1)",
    )
    .bind(request.message_id.to_string())
    .bind(request.instance_name.as_str())
    .bind(request.hostname.as_str())
    .bind(in_an_hour)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(60),
        limits: crate::safety::Limits::NONE,
    };
    assert!(matches!(
        store
            .claim_restart(&request, terms, ClaimToken::new())
            .await
            .unwrap(),
        Claim::InFlight { attempt: 1, .. }
    ));
    let fresh = contract::request("cattle-new");
    let token = ClaimToken::new();
    for _ in 0..2 {
        assert_eq!(
            store.claim_restart(&fresh, terms, token).await.unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None,
                leashed: None,
            }
        );
    }
    store.close().await;
}
