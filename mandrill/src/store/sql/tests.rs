use super::*;

#[test]
fn status_all_lists_every_status_once() {
    // A new variant breaks this match; then it belongs in `Status::ALL`.
    let position = |status: Status| match status {
        Status::Received => 0,
        Status::Retrying => 1,
        Status::Restarted => 2,
        Status::Failed => 3,
        Status::Rejected => 4,
        Status::Unrecovered => 5,
        Status::Denied => 6,
        Status::DryRun => 7,
        Status::Expired => 8,
        Status::Cancelled => 9,
    };
    let positions: Vec<usize> = Status::ALL.into_iter().map(position).collect();
    assert_eq!(positions, (0..10).collect::<Vec<_>>());
}

#[test]
fn the_statements_list_exactly_the_statuses_that_issued_no_restart() {
    let not_issued = sql_list(NOT_ISSUED.into_iter());
    assert_eq!(not_issued, "('dry-run', 'expired', 'denied')");
    let disrupting_ended = sql_list(std::iter::once(Status::Restarted).chain(NOT_ISSUED));
    for sql in [
        USAGE_SQL,
        USAGE_SUBJECT_SQL,
        GROUP_RESTARTS_SQL,
        GROUP_DISRUPTED_SQL,
    ] {
        let lists: Vec<&str> = sql
            .match_indices("NOT IN (")
            .map(|(at, _)| &sql[at + "NOT IN ".len()..=at + sql[at..].find(')').unwrap()])
            .collect();
        assert!(!lists.is_empty(), "{sql}");
        for list in lists {
            assert!(
                list == not_issued || list == disrupting_ended,
                "{list} in {sql}"
            );
        }
    }
}

#[test]
fn the_sql_lists_of_statuses_agree_with_is_final() {
    for status in Status::ALL {
        let quoted = format!("'{}'", status.as_str());
        assert_eq!(
            FINAL_STATUSES.contains(&quoted),
            status.is_final(),
            "{status} in {}",
            *FINAL_STATUSES
        );
        assert_eq!(
            OPEN_STATUSES.contains(&quoted),
            !status.is_final(),
            "{status} in {}",
            *OPEN_STATUSES
        );
    }
    assert!(RELEASE_SQL.contains(OPEN_STATUSES.as_str()));
    assert!(not_final("r").ends_with(FINAL_STATUSES.as_str()));
}

/// The shared upserts run on SQLite too, with rows from `json_each`
/// (the form the SQLite store batches in), and keep every final status.
#[tokio::test]
async fn the_shared_upserts_run_on_sqlite() {
    use std::str::FromStr;

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

    use crate::sqlite::SqliteStore;
    use crate::store::Store;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 1).await.unwrap();
    let pool = SqlitePool::connect_with(SqliteConnectOptions::from_str(&url).unwrap())
        .await
        .unwrap();
    let ids = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    let requests = serde_json::json!([
        [
            ids[0].to_string(),
            "cattle-0001",
            "cattle-0001.example.net",
            "sre",
            null
        ],
        [
            ids[1].to_string(),
            "cattle-0002",
            "cattle-0002.example.net",
            null,
            null
        ],
    ])
    .to_string();
    let insert = insert_requests(
        "SELECT j.value ->> 0 AS id, j.value ->> 1 AS instance_name,
                j.value ->> 2 AS hostname, j.value ->> 3 AS requested_by,
                NULL AS requester, j.value ->> 4 AS reason, $2 AS at
         FROM json_each($1) AS j",
    );
    // Each statement twice: the second run meets every conflict.
    let twice = async |sql: &str, rows: &str, at: i64| {
        for _ in 0..2 {
            let query = sqlx::query(sql).bind(rows).bind(at);
            query.execute(&pool).await.unwrap();
        }
    };
    twice(&insert, &requests, 1_000).await;
    let claims = serde_json::json!([
        [
            ids[0].to_string(),
            1,
            "cattle-0001",
            "cattle",
            "",
            "eu-1a",
            "ci"
        ],
        [
            ids[1].to_string(),
            1,
            "cattle-0002",
            "cattle",
            "",
            null,
            null
        ],
    ])
    .to_string();
    let journal = upsert_journal(
        "SELECT j.value ->> 0 AS id, j.value ->> 1 AS attempt,
                j.value ->> 2 AS instance_name, j.value ->> 3 AS grp,
                j.value ->> 4 AS verdict, j.value ->> 5 AS zone,
                j.value ->> 6 AS requester, $2 AS at
         FROM json_each($1) AS j",
    );
    twice(&journal, &claims, 2_000).await;
    let record = format!(
        "INSERT INTO requests
             (message_id, instance_name, hostname, status, attempts, last_error,
              received_at, updated_at, completed_at, output, recovered_after_ms)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3,
                j.value ->> 4, j.value ->> 5, $2, $2, j.value ->> 6, NULL, NULL
         FROM json_each($1) AS j WHERE true
         ON CONFLICT (message_id) DO UPDATE SET {}
         WHERE {}
         RETURNING message_id",
        outcome_set("excluded", "requests", "excluded.updated_at"),
        not_final("requests")
    );
    let outcomes = |status: &str, attempt: u32| {
        serde_json::json!([[
            ids[0].to_string(),
            "cattle-0001",
            "cattle-0001.example.net",
            status,
            attempt,
            null,
            3_000,
        ]])
        .to_string()
    };
    let recorded: Vec<String> = sqlx::query_scalar(&record)
        .bind(outcomes("unrecovered", 1))
        .bind(3_000_i64)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, [ids[0].to_string()]);
    // Final now: a later outcome is not recorded over it.
    let recorded: Vec<String> = sqlx::query_scalar(&record)
        .bind(outcomes("failed", 2))
        .bind(4_000_i64)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(recorded.is_empty());
    assert_eq!(
        store.lookup(ids[0]).await.unwrap(),
        Some(Status::Unrecovered)
    );
    let story = store.story(ids[1]).await.unwrap().unwrap();
    assert_eq!(story.entry.requested_by, None);
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(story.attempts[0].group, "cattle");
    let entry = store.story(ids[0]).await.unwrap().unwrap().entry;
    assert_eq!(
        (entry.attempts, entry.requested_by.as_deref()),
        (1, Some("sre"))
    );
    pool.close().await;
    store.close().await;
}
