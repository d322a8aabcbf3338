//! The store's statements keep using their indexes: with a generic plan
//! (what a prepared statement falls back to), and with the store's own
//! settings on a table too small for PostgreSQL's default costs to prefer
//! them.

use crate::store::Store as _;
use crate::store::postgres::testing::TestDatabase;
use crate::store::postgres::{PRUNE_REQUESTS_SQL, PostgresStore, batch, outcomes};

#[tokio::test]
async fn the_batch_lock_uses_the_message_id_index_even_with_a_generic_plan() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 2).await.unwrap();
    sqlx::query(
        "INSERT INTO requests (message_id, status, received_at, updated_at)
         SELECT md5(n::text), 'restarted', 0, 0 FROM generate_series(1, 20000) AS n",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE requests")
        .execute(&store.pool)
        .await
        .unwrap();
    let mut conn = store.pool.acquire().await.unwrap();
    // What a prepared statement falls back to after a few executions.
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    for sql in [batch::LOCK_SQL, outcomes::OUTCOME_SQL.as_str()] {
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
            .bind(vec!["a".to_owned(), "b".to_owned()])
            .bind(vec!["restarted".to_owned(); 2])
            .bind(vec![1i32; 2])
            .bind(vec![None::<String>; 2])
            .bind(vec![None::<i64>; 2])
            .bind(vec![None::<String>; 2])
            .bind(vec![None::<i64>; 2])
            .bind(0i64)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("requests_message_id_key"), "{plan}");
        assert!(!plan.contains("Seq Scan on requests"), "{plan}");
    }
    drop(conn);
    store.close().await;
}

/// A batch of 300 against tables of 20,000 rows, analysed, planned as the
/// store plans (custom plans, its `random_page_cost`): the lock and the
/// outcomes' statement (which also settles the journal) look their rows up
/// by index. With PostgreSQL's default `random_page_cost` of 4, each was a
/// hash join over a scan of the whole table, at every batch.
#[tokio::test]
async fn a_batch_uses_the_indexes_on_a_table_of_twenty_thousand_rows() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 2).await.unwrap();
    for sql in [
        "INSERT INTO requests (message_id, status, received_at, updated_at)
         SELECT md5(n::text), 'received', 0, 0 FROM generate_series(1, 20000) AS n",
        "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
         SELECT md5(n::text), 1, 'cattle-0001', 'cattle', 0, ''
         FROM generate_series(1, 20000) AS n",
        "ANALYZE requests",
        "ANALYZE restarts",
    ] {
        sqlx::query(sql).execute(&store.pool).await.unwrap();
    }
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT md5(n::text) FROM generate_series(1, 300) AS n")
            .fetch_all(&store.pool)
            .await
            .unwrap();
    let mut conn = store.pool.acquire().await.unwrap();
    for sql in [batch::LOCK_SQL, outcomes::OUTCOME_SQL.as_str()] {
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
            .bind(&ids)
            .bind(vec!["restarted".to_owned(); ids.len()])
            .bind(vec![1i32; ids.len()])
            .bind(vec![None::<String>; ids.len()])
            .bind(vec![None::<i64>; ids.len()])
            .bind(vec![None::<String>; ids.len()])
            .bind(vec![None::<i64>; ids.len()])
            .bind(0i64)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan on requests"), "{plan}");
        assert!(!plan.contains("Seq Scan on restarts"), "{plan}");
    }
    drop(conn);
    store.close().await;
}

/// Retention finds what it prunes by `requests_completed_at`, which holds
/// only completed requests (a request in progress writes no entry there).
#[tokio::test]
async fn retention_reads_an_index_of_completed_requests_only() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 2).await.unwrap();
    let index: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'requests_completed_at'",
    )
    .fetch_one(&store.pool)
    .await
    .unwrap();
    assert!(
        index.contains("WHERE (completed_at IS NOT NULL)"),
        "{index}"
    );
    for sql in [
        "INSERT INTO requests (message_id, status, received_at, updated_at, completed_at)
         SELECT md5(n::text), 'restarted', 0, 0, CASE WHEN n % 2 = 0 THEN n END
         FROM generate_series(1, 20000) AS n",
        "ANALYZE requests",
    ] {
        sqlx::query(sql).execute(&store.pool).await.unwrap();
    }
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {PRUNE_REQUESTS_SQL}"))
        .bind(100i64)
        .bind(10i64)
        .fetch_all(&store.pool)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("requests_completed_at"), "{plan}");
    store.close().await;
}
