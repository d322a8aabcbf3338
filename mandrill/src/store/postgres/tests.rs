//! The PostgreSQL store against a throwaway database of its own per test.

use std::time::Duration;

use uuid::Uuid;

use super::PostgresStore;
use super::testing::TestDatabase;
use crate::domain::{Outcome, RestartRequest, Status};
use crate::store::{Claim, ClaimTerms, Recorded, Store, StoreError, contract};

#[tokio::test]
async fn postgres_store_keeps_the_store_contract() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    contract::all(&store).await;
    let kept = store.history(100).await.unwrap().len();
    store.close().await;
    // Reconnecting runs migrations again without harm and keeps the data.
    let store = PostgresStore::connect(&database.url, 1).await.unwrap();
    assert_eq!(store.history(100).await.unwrap().len(), kept);
    store.close().await;
}

#[tokio::test]
async fn concurrent_instances_record_only_one_first_outcome() {
    let database = TestDatabase::create().await;
    let first = PostgresStore::connect(&database.url, 4).await.unwrap();
    let second = PostgresStore::connect(&database.url, 4).await.unwrap();
    let request = contract::request("cattle-race");
    let outcomes: Vec<Recorded> = futures::future::join_all((0..20).map(|n| {
        let store = if n % 2 == 0 { &first } else { &second };
        let request = &request;
        async move {
            store
                .record_outcome(request, 1, &Outcome::restarted())
                .await
                .unwrap()
        }
    }))
    .await;
    let recorded = outcomes
        .iter()
        .filter(|o| **o == Recorded::Recorded)
        .count();
    assert_eq!(recorded, 1, "{outcomes:?}");
    first.close().await;
    second.close().await;
}

#[tokio::test]
async fn a_claim_stamped_after_now_still_cools_its_host() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    let later = async {
        sqlx::query(contract::STAMP_LATER_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::a_claim_stamped_after_now_still_cools_its_host(&store, later).await;
    store.close().await;
}

#[tokio::test]
async fn a_restarted_host_counts_as_disrupted_until_settle_passes() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    let settle_passes = async {
        sqlx::query(contract::SETTLE_PASSES_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::a_restarted_host_counts_as_disrupted_until_settle_passes(&store, settle_passes).await;
    store.close().await;
}

#[tokio::test]
async fn a_claim_that_issued_nothing_never_hides_a_disrupted_host() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    let earlier = async {
        sqlx::query(contract::CLAIMS_EARLIER_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::a_claim_that_issued_nothing_never_hides_a_disrupted_host(&store, earlier).await;
    store.close().await;
}

#[tokio::test]
async fn every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    let tie = async {
        sqlx::query(contract::TIE_CLAIMS_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption(&store, tie).await;
    store.close().await;
}

/// Two instances on one database: the requester quota and the zone budget
/// count what either claimed.
#[tokio::test]
async fn the_requester_quota_and_the_zone_budget_count_across_instances() {
    let database = TestDatabase::create().await;
    let first = PostgresStore::connect(&database.url, 4).await.unwrap();
    let second = PostgresStore::connect(&database.url, 4).await.unwrap();
    contract::the_requester_quota_and_the_zone_budget_count_across_groups_and_instances(
        &first, &second,
    )
    .await;
    first.close().await;
    second.close().await;
}

const TERMS: ClaimTerms = ClaimTerms {
    max_attempts: 3,
    hold: Duration::from_secs(3600),
    limits: crate::safety::Limits::NONE,
};

#[tokio::test]
async fn concurrent_deliveries_through_the_batches_claim_and_record_once() {
    let database = TestDatabase::create().await;
    let first = PostgresStore::connect_with(&database.url, 4, 3, crate::store::DEFAULT_TIMEOUT)
        .await
        .unwrap();
    let second = PostgresStore::connect_with(&database.url, 4, 2, crate::store::DEFAULT_TIMEOUT)
        .await
        .unwrap();
    let requests: Vec<RestartRequest> = (0..40)
        .map(|n| contract::request(&format!("herd-{n:03}")))
        .collect();
    // Four deliveries of every request, on two instances at once: each
    // claims, and records an outcome for the attempt it claimed.
    let deliveries = futures::future::join_all((0..4 * requests.len()).map(|n| {
        let store = if n % 2 == 0 { &first } else { &second };
        let request = &requests[n % requests.len()];
        async move {
            let claim = store
                .claim_restart(request, TERMS, crate::store::ClaimToken::new())
                .await
                .unwrap();
            let recorded = match claim {
                Claim::Claimed { attempt, .. } => Some(
                    store
                        .record_outcome(request, attempt, &Outcome::restarted())
                        .await
                        .unwrap(),
                ),
                _ => None,
            };
            (request.message_id, claim, recorded)
        }
    }))
    .await;
    for request in &requests {
        let mine: Vec<_> = deliveries
            .iter()
            .filter(|(id, _, _)| *id == request.message_id)
            .collect();
        let claimed = mine
            .iter()
            .filter(|(_, claim, _)| matches!(claim, Claim::Claimed { attempt: 1, .. }))
            .count();
        assert_eq!(claimed, 1, "{mine:?}");
        let recorded = mine
            .iter()
            .filter(|(_, _, recorded)| *recorded == Some(Recorded::Recorded))
            .count();
        assert_eq!(recorded, 1, "{mine:?}");
        let story = first.story(request.message_id).await.unwrap().unwrap();
        assert_eq!(story.entry.status, Status::Restarted);
        assert_eq!(story.attempts.len(), 1, "{story:?}");
        assert_eq!(story.attempts[0].outcome, Some(Status::Restarted));
    }
    // And outcomes alone, twenty per request at once: one is first.
    let outcomes = futures::future::join_all((0..20 * requests.len()).map(|n| {
        let store = if n % 2 == 0 { &first } else { &second };
        let request = &requests[n % requests.len()];
        let fresh = RestartRequest {
            message_id: Uuid::from_u128(request.message_id.as_u128() ^ 1),
            ..request.clone()
        };
        async move {
            let recorded = store
                .record_outcome(&fresh, 1, &Outcome::restarted())
                .await
                .unwrap();
            (fresh.message_id, recorded)
        }
    }))
    .await;
    let mut firsts = std::collections::HashMap::<Uuid, usize>::new();
    for (id, recorded) in &outcomes {
        *firsts.entry(*id).or_default() += usize::from(*recorded == Recorded::Recorded);
    }
    assert_eq!(firsts.len(), requests.len());
    assert!(firsts.values().all(|n| *n == 1), "{firsts:?}");
    first.close().await;
    second.close().await;
}

/// Makes every journal insert fail with `sqlstate`, or only that of
/// `culprit`'s.
async fn sabotage_the_journal(store: &PostgresStore, sqlstate: &str, culprit: Option<Uuid>) {
    let condition = culprit.map_or_else(
        || "true".to_owned(),
        |id| format!("NEW.message_id = '{id}'"),
    );
    sqlx::query(&format!(
        "CREATE OR REPLACE FUNCTION sabotage() RETURNS trigger AS $$
         BEGIN
             IF {condition} THEN
                 RAISE EXCEPTION 'sabotaged' USING ERRCODE = '{sqlstate}';
             END IF;
             RETURN NEW;
         END $$ LANGUAGE plpgsql"
    ))
    .execute(&store.pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE OR REPLACE TRIGGER sabotage BEFORE INSERT ON restarts
         FOR EACH ROW EXECUTE FUNCTION sabotage()",
    )
    .execute(&store.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failed_batch_answers_every_caller_and_commits_nothing() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect_with(&database.url, 4, 1, crate::store::DEFAULT_TIMEOUT)
        .await
        .unwrap();
    // A serialization failure: transient, and it fails the whole batch.
    sabotage_the_journal(&store, "40001", None).await;
    let requests: Vec<RestartRequest> = (0..30)
        .map(|n| contract::request(&format!("stall-{n:03}")))
        .collect();
    let claims = futures::future::join_all(
        requests
            .iter()
            .map(|r| store.claim_restart(r, TERMS, crate::store::ClaimToken::new())),
    )
    .await;
    for claim in &claims {
        let error = claim.as_ref().unwrap_err();
        assert!(matches!(error, StoreError::Batch(_)), "{error}");
        assert!(error.is_transient(), "{error}");
    }
    sqlx::query("DROP TRIGGER sabotage ON restarts")
        .execute(&store.pool)
        .await
        .unwrap();
    // Nothing of the failed batches was committed: the first attempt is
    // still there to claim.
    for request in &requests {
        assert_eq!(
            store
                .claim_restart(request, TERMS, crate::store::ClaimToken::new())
                .await
                .unwrap(),
            Claim::Claimed {
                attempt: 1,
                unknown: None,
                leashed: None,
            }
        );
    }
    store.close().await;
}

#[tokio::test]
async fn a_write_refused_for_good_fails_only_its_own_caller() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect_with(&database.url, 4, 1, crate::store::DEFAULT_TIMEOUT)
        .await
        .unwrap();
    let requests: Vec<RestartRequest> = (0..30)
        .map(|n| contract::request(&format!("flock-{n:03}")))
        .collect();
    let culprit = requests[7].message_id;
    // A check violation: permanent.
    sabotage_the_journal(&store, "23514", Some(culprit)).await;
    let claims = futures::future::join_all(
        requests
            .iter()
            .map(|r| store.claim_restart(r, TERMS, crate::store::ClaimToken::new())),
    )
    .await;
    for (request, claim) in requests.iter().zip(&claims) {
        if request.message_id == culprit {
            let error = claim.as_ref().unwrap_err();
            assert!(!error.is_transient(), "{error}");
        } else {
            assert!(
                matches!(claim, Ok(Claim::Claimed { attempt: 1, .. })),
                "{claim:?}"
            );
        }
    }
    store.close().await;
}

#[tokio::test]
async fn many_handlers_in_flight_never_queue_on_the_pool() {
    // A pooled connection per handler for its lookup, its claim and its
    // outcome would, with thousands in flight and a few connections, wait
    // past the pool's acquire timeout: the hot path holds one connection
    // per writer and one for lookups.
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect_with(&database.url, 32, 2, crate::store::DEFAULT_TIMEOUT)
        .await
        .unwrap();
    let requests: Vec<RestartRequest> = (0..600)
        .map(|n| contract::request(&format!("crowd-{n:04}")))
        .collect();
    let handled = futures::future::join_all(requests.iter().map(|request| {
        let store = &store;
        async move {
            assert_eq!(store.lookup(request.message_id).await.unwrap(), None);
            let Claim::Claimed { attempt, .. } = store
                .claim_restart(request, TERMS, crate::store::ClaimToken::new())
                .await
                .unwrap()
            else {
                panic!("a fresh request is claimed");
            };
            store
                .record_outcome(request, attempt, &Outcome::restarted())
                .await
                .unwrap()
        }
    }))
    .await;
    assert!(handled.iter().all(|r| *r == Recorded::Recorded));
    // Three tasks use the pool; sqlx gives a connection back in a task
    // of its own, so a few more may have been opened meanwhile, but
    // nowhere near one per handler (the whole pool, before).
    let opened = store.pool.size();
    assert!(opened <= 10, "{opened} connections opened");
    store.close().await;
}

#[tokio::test]
async fn real_errors_are_classified_transient_or_permanent() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 1).await.unwrap();
    // The value that once restarted a host ten times: PostgreSQL cannot
    // store NUL in text, and retrying never helps.
    let nul = sqlx::query("SELECT $1::text")
        .bind("game\0day")
        .execute(&store.pool)
        .await
        .unwrap_err();
    assert!(!StoreError::from(nul).is_transient());
    let too_long = sqlx::query("SELECT $1::varchar(3)::text")
        .bind("abcdef")
        .execute(&store.pool)
        .await;
    // Casting truncates silently; an explicit column would refuse.
    assert!(too_long.is_ok());
    sqlx::query("CREATE TEMP TABLE short (v varchar(3))")
        .execute(&store.pool)
        .await
        .unwrap();
    let refused = sqlx::query("INSERT INTO short VALUES ($1)")
        .bind("abcdef")
        .execute(&store.pool)
        .await
        .unwrap_err();
    assert!(!StoreError::from(refused).is_transient());
    store.close().await;
    // Nothing listening: a connection error, worth retrying.
    let unreachable = PostgresStore::connect("postgres://root@127.0.0.1:1/postgres", 1)
        .await
        .unwrap_err();
    assert!(unreachable.is_transient(), "{unreachable}");
}

#[tokio::test]
async fn nul_bytes_in_a_rejected_payload_are_kept_readable() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 1).await.unwrap();
    store
        .record_rejection(
            &crate::domain::Asked::default(),
            "payload is not valid utf-8",
            b"\0\xff",
        )
        .await
        .unwrap();
    assert_eq!(store.history(1).await.unwrap()[0].status, Status::Rejected);
    store.close().await;
}

#[tokio::test]
async fn a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them() {
    use sqlx::Connection as _;
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    // Another instance's claim of the group, holding its advisory lock.
    let mut other = sqlx::PgConnection::connect(&database.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('mandrill:group:cattle', 0))")
        .execute(&mut other)
        .await
        .unwrap();
    let release = async {
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    };
    contract::a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them(&store, release)
        .await;
    store.close().await;
}

/// With a pool of one, the writer kept the only connection after its first
/// batch, and every read (the pull loop's store probe among them) waited
/// for it until the pool's timeout, again and again.
#[tokio::test]
async fn a_pool_of_one_still_reads_after_a_batch_commits() {
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 1).await.unwrap();
    let request = contract::request("cattle-pool");
    store
        .record_outcome(&request, 1, &Outcome::restarted())
        .await
        .unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), store.history(10)).await;
    let history = read
        .expect("a read waited for the writer's connection")
        .unwrap();
    assert_eq!(history.len(), 1);
    store.close().await;
}

/// Every connection carries the server's own bounds, from the store's
/// timeout; a statement that runs too long is cancelled by the server at
/// half of it: a definite failure (rolled back, transient), before the
/// client's deadline would leave the outcome unknown.
#[tokio::test]
async fn the_server_cancels_a_statement_at_half_the_store_timeout() {
    let database = TestDatabase::create().await;
    let timeout = Duration::from_secs(4);
    let store = PostgresStore::connect_with(&database.url, 4, 1, timeout)
        .await
        .unwrap();
    for (setting, expected) in [
        ("statement_timeout", "2s"),
        ("lock_timeout", "2s"),
        ("idle_in_transaction_session_timeout", "4s"),
    ] {
        let shown: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(shown, expected, "{setting}");
    }
    sqlx::query(
        "CREATE OR REPLACE FUNCTION sabotage() RETURNS trigger AS $$
         BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$ LANGUAGE plpgsql",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE OR REPLACE TRIGGER sabotage BEFORE INSERT ON restarts
         FOR EACH ROW EXECUTE FUNCTION sabotage()",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    let request = contract::request("cattle-slow");
    let error = store
        .claim_restart(&request, TERMS, crate::store::ClaimToken::new())
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(!error.outcome_unknown(), "{}", error.with_causes());
    assert!(
        error
            .with_causes()
            .to_string()
            .contains("statement timeout"),
        "{}",
        error.with_causes()
    );
    store.close().await;
}

/// Closing the store ends every session it opened before it returns, the
/// writers' kept connections among them: each was dropped, and went back
/// to the pool from a task of its own, which ended its session a moment
/// after `close` had returned (or never, if the process exited first).
#[tokio::test]
async fn closing_the_store_ends_every_session_it_opened() {
    use sqlx::Connection as _;
    let database = TestDatabase::create().await;
    let store = PostgresStore::connect(&database.url, 4).await.unwrap();
    let requests: Vec<RestartRequest> = (0..20)
        .map(|n| contract::request(&format!("cattle-close-{n}")))
        .collect();
    futures::future::join_all(requests.iter().map(|request| {
        let store = &store;
        async move {
            store
                .claim_restart(request, TERMS, crate::store::ClaimToken::new())
                .await
                .unwrap();
            store
                .record_outcome(request, 1, &Outcome::restarted())
                .await
                .unwrap();
        }
    }))
    .await;
    store.close().await;
    let mut conn = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let open: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT pid, state, query FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    assert!(open.is_empty(), "sessions left open: {open:?}");
}

/// The statements' query plans.
mod plan;
/// What the writes cost PostgreSQL.
mod writes;
