//! The writer under a database that refuses: one refused write fails
//! alone, errors are classified, and a transaction SQLite ended by itself
//! (a full disk) does not leave the writer refusing every later one. And
//! what it writes no reader needs: no index entry for a request in
//! progress.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use super::*;

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
        store.claim_restart(&poison, terms, crate::store::ClaimToken::new()),
        futures::future::join_all(innocent.iter().map(|r| store.claim_restart(
            r,
            terms,
            crate::store::ClaimToken::new()
        )))
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

/// A trigger that, while `test_fault.broken` is set, ends the transaction of
/// any insert into `table` the way a full disk does: SQLite rolls it back by
/// itself, and the rollback the writer's connection sends then finds none.
async fn break_inserts(url: &str, table: &str, broken: bool) {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS test_fault (broken INTEGER NOT NULL);
         CREATE TRIGGER IF NOT EXISTS test_fault_{table} BEFORE INSERT ON {table}
         WHEN (SELECT broken FROM test_fault) BEGIN
             SELECT RAISE(ROLLBACK, 'database or disk is full');
         END;
         DELETE FROM test_fault;
         INSERT INTO test_fault (broken) VALUES ({});",
        i32::from(broken)
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
}

/// A write whose transaction SQLite ended by itself (as a full disk does)
/// fails naming the cause; the next write commits.
#[tokio::test]
async fn store_writer_recovers_after_a_transaction_sqlite_ended_itself() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("mandrill.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    break_inserts(&url, "requests", true).await;
    let refused = store
        .record_rejection(&crate::domain::Asked::default(), "first", b"x")
        .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.with_causes().to_string().contains("disk is full")),
        "{refused:?}"
    );
    break_inserts(&url, "requests", false).await;
    // The cause is gone: the next write commits.
    store
        .record_rejection(&crate::domain::Asked::default(), "second", b"y")
        .await
        .unwrap();
    let reasons: Vec<Option<String>> = store
        .history(10)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| entry.last_error)
        .collect();
    assert_eq!(reasons, [Some("second".to_owned())]);
    store.close().await;
}

/// Retention finds what it prunes by `requests_completed_at`, which holds
/// only completed requests (a request in progress writes no entry there).
#[tokio::test]
async fn retention_reads_an_index_of_completed_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let index: String =
        sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'requests_completed_at'")
            .fetch_one(&store.pool)
            .await
            .unwrap();
    assert!(index.ends_with("WHERE completed_at IS NOT NULL"), "{index}");
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!(
        "EXPLAIN QUERY PLAN {}",
        crate::sqlite::store::outcomes::PRUNE_REQUESTS_SQL
    ))
    .bind(100i64)
    .bind(10i64)
    .fetch_all(&store.pool)
    .await
    .unwrap();
    assert!(
        plan.iter()
            .any(|(.., detail)| detail.contains("INDEX requests_completed_at")),
        "{plan:?}"
    );
    store.close().await;
}

/// Pruning runs in the writer's transaction, which the queue shares: each
/// of its statements reads an index, never a whole table (a first prune
/// after retention was turned on over a large file held the queue).
#[tokio::test]
async fn every_pruning_statement_reads_an_index_not_a_table() {
    use crate::sqlite::store::outcomes::{PRUNE_JOURNAL_SQL, PRUNE_PRUNED_SQL};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    for statement in [PRUNE_JOURNAL_SQL, PRUNE_PRUNED_SQL[0], PRUNE_PRUNED_SQL[1]] {
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {statement}"))
                .bind(100i64)
                .bind(10i64)
                .fetch_all(&store.pool)
                .await
                .unwrap();
        for (.., detail) in &plan {
            let table_scan = detail.starts_with("SCAN ")
                && !detail.contains("INDEX")
                && !detail.contains("json_each");
            assert!(!table_scan, "{statement}: {plan:?}");
        }
    }
    store.close().await;
}
