use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use super::*;
use crate::store::contract;

/// One write the database refuses for good fails alone, not the writes
/// that shared its transaction.
#[tokio::test]
async fn a_refused_write_does_not_fail_the_rest_of_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    // A constraint only this request breaks.
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON requests
         WHEN NEW.instance_name = 'cattle-poison'
         BEGIN SELECT RAISE(ABORT, 'poisoned row'); END",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(60),
        limits: crate::safety::Limits::NONE,
    };
    let poison = contract::request("cattle-poison");
    let innocent: Vec<_> = (0..20)
        .map(|n| contract::request(&format!("cattle-{n:04}")))
        .collect();
    let (poisoned, claims) = tokio::join!(
        store.claim_restart(&poison, terms),
        futures::future::join_all(innocent.iter().map(|r| store.claim_restart(r, terms)))
    );
    let error = poisoned.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    for claim in claims {
        assert!(
            matches!(claim, Ok(Claim::Claimed { attempt: 1, .. })),
            "{claim:?}"
        );
    }
    store.close().await;
}

#[tokio::test]
async fn real_errors_are_classified_transient_or_permanent() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    sqlx::query("CREATE TABLE one (v TEXT UNIQUE)")
        .execute(&store.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO one VALUES ('x')")
        .execute(&store.pool)
        .await
        .unwrap();
    let duplicate = sqlx::query("INSERT INTO one VALUES ('x')")
        .execute(&store.pool)
        .await
        .unwrap_err();
    assert!(!StoreError::from(duplicate).is_transient());
    // Another connection holds the write lock: busy, worth retrying.
    let options = SqliteConnectOptions::from_str(&url)
        .unwrap()
        .busy_timeout(Duration::ZERO);
    let mut holder = SqliteConnection::connect_with(&options).await.unwrap();
    let mut other = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let busy = sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap_err();
    assert!(StoreError::from(busy).is_transient());
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    store.close().await;
}

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

#[tokio::test]
async fn sqlite_store_keeps_the_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    contract::all(&store).await;
    let kept = store.history(100).await.unwrap().len();
    store.close().await;
    // Reopening runs migrations again without harm and keeps the data.
    let store = SqliteStore::connect(&url, 1).await.unwrap();
    assert_eq!(store.history(100).await.unwrap().len(), kept);
    store.close().await;
}
