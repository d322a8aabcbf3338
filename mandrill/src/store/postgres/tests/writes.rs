//! What the store's writes cost PostgreSQL: a claim and an outcome update
//! their rows without a new entry in every index where they can
//! (heap-only tuples; migration `0013_write_less.sql`).

use sqlx::Connection as _;

use super::TERMS;
use crate::domain::Outcome;
use crate::store::postgres::PostgresStore;
use crate::store::postgres::testing::TestDatabase;
use crate::store::{Claim, ClaimToken, Store as _, contract};

/// Requests claimed and settled, each through the store's writers as the
/// worker calls them, concurrently so that they share batches.
const REQUESTS: usize = 300;

/// Updates and heap-only updates of `table`, as PostgreSQL's statistics
/// count them once the writers' sessions have ended.
async fn updates(url: &str, table: &str, at_least: i64) -> (i64, i64) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    // A session reports its counts when it ends (or after ten idle
    // seconds): end any the store left behind.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    for _ in 0..100 {
        let counts: (i64, i64) = sqlx::query_as(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1",
        )
        .bind(table)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if counts.0 >= at_least {
            conn.close().await.unwrap();
            return counts;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("PostgreSQL never counted {at_least} updates of {table}");
}

/// The claim of a request its batch has just created rewrites that row
/// with the same `updated_at`, and an outcome settles its journal row
/// without changing an indexed column: with room left on each page, both
/// are heap-only. At the default fill factor neither was (pages are full
/// when written), so each added an entry to every index of its table.
#[tokio::test]
async fn claims_and_settled_journal_rows_are_heap_only_updates() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    let requests: Vec<_> = (0..REQUESTS)
        .map(|n| contract::request(&format!("cattle-{n:04}")))
        .collect();
    futures::future::join_all(requests.iter().map(|request| {
        let store = &store;
        async move {
            let claim = store
                .claim_restart(request, TERMS, ClaimToken::new())
                .await
                .unwrap();
            let Claim::Claimed { attempt, .. } = claim else {
                panic!("{claim:?}");
            };
            store
                .record_outcome(request, attempt, &Outcome::restarted())
                .await
                .unwrap();
        }
    }))
    .await;
    store.close().await;

    let n = i64::try_from(REQUESTS).unwrap();
    // Each request's row: its claim, then its outcome (which changes the
    // indexed `updated_at` and `completed_at`, so never heap-only). Not
    // every claim finds room (its page may have filled since): most do,
    // where at the default fill factor a few on the last page did.
    let (updated, heap_only) = updates(&database.url, "requests", 2 * n).await;
    assert!(
        heap_only >= n * 2 / 3,
        "{heap_only} of {updated} updates of requests heap-only"
    );
    // Each journal row: its outcome.
    let (updated, heap_only) = updates(&database.url, "restarts", n).await;
    assert!(
        heap_only >= n * 2 / 3,
        "{heap_only} of {updated} updates of restarts heap-only"
    );
}
