//! (b) twins through sqlx: the SQLite ceiling's tables, pragmas, batches and
//! work, written the way mandrill's writer writes them (one connection,
//! driven from async code, statements over many rows), and one row per
//! statement as (b) itself does: the writer's driver is chosen by
//! measurement, these against (b).

use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection as _, QueryBuilder, Sqlite};

use super::sqlite::{SQLITE_BATCH, SQLITE_SCHEMA, WAL_AUTOCHECKPOINT_PAGES};
use super::{now_millis, parse, parse_rules, payloads};

/// Rows per multi-row statement, as the store's writer's.
const ROWS_PER_STATEMENT: usize = 500;

/// A fresh file with (b)'s schema and pragmas (and the writer's
/// `temp_store`), its queue filled with `n` payloads, untimed.
async fn prepared(n: usize, path: &std::path::Path) -> SqliteConnection {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .pragma("temp_store", "memory")
        .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES.to_string());
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .expect("ceiling database opens");
    sqlx::raw_sql(SQLITE_SCHEMA)
        .execute(&mut conn)
        .await
        .expect("ceiling schema");
    let now = now_millis();
    let mut tx = conn.begin().await.expect("begin");
    for payload in payloads(n, false) {
        sqlx::query("INSERT INTO queue (payload, published_at, visible_at) VALUES (?1, ?2, ?2)")
            .bind(payload.as_ref())
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("publish");
    }
    tx.commit().await.expect("commit");
    conn
}

/// Takes up to a batch of visible messages, as (b) does.
async fn pull(tx: &mut SqliteConnection, now: i64) -> Vec<(i64, Vec<u8>)> {
    sqlx::query_as(
        "SELECT id, payload FROM queue WHERE visible_at <= ?1 ORDER BY visible_at LIMIT ?2",
    )
    .bind(now)
    .bind(SQLITE_BATCH as i64)
    .fetch_all(tx)
    .await
    .expect("pull")
}

/// (b) through sqlx as the writer does it: per transaction of up to 1024
/// messages, per chunk of 500, one statement each for the receipts, the
/// claims (`RETURNING` the attempt), the journal rows, the outcomes, the
/// settled journal rows and the acks; one commit per batch.
pub(crate) async fn sqlite_sqlx(n: usize, dir: &std::path::Path) -> f64 {
    let mut conn = prepared(n, &dir.join("ceiling-sqlx.db")).await;
    let rules = parse_rules();
    let started = Instant::now();
    let mut done = 0;
    loop {
        let now = now_millis();
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        let batch = pull(&mut tx, now).await;
        if batch.is_empty() {
            break;
        }
        for chunk in batch.chunks(ROWS_PER_STATEMENT) {
            let requests: Vec<_> = chunk.iter().map(|(_, p)| parse(p, &rules)).collect();
            let ids: Vec<String> = requests.iter().map(|r| r.message_id.to_string()).collect();
            let mut receipts: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO requests (message_id, instance_name, hostname, requested_by, reason,
                                       status, attempts, received_at, updated_at) ",
            );
            receipts.push_values(requests.iter().zip(&ids), |mut row, (request, id)| {
                row.push_bind(id.as_str())
                    .push_bind(request.instance_name.as_str())
                    .push_bind(request.hostname.as_str())
                    .push_bind(request.requested_by.as_deref())
                    .push_bind(request.reason.as_deref())
                    .push_bind("received")
                    .push_bind(0_i64)
                    .push_bind(now)
                    .push_bind(now);
            });
            receipts.push(" ON CONFLICT (message_id) DO NOTHING");
            receipts.build().execute(&mut *tx).await.expect("receipts");
            let mut claims: QueryBuilder<Sqlite> =
                QueryBuilder::new("UPDATE requests SET attempts = attempts + 1, claim_until = ");
            claims.push_bind(now + 60_000).push(", updated_at = ");
            claims.push_bind(now).push(" WHERE message_id IN (");
            let mut list = claims.separated(", ");
            for id in &ids {
                list.push_bind(id.as_str());
            }
            claims.push(") RETURNING message_id, attempts");
            let attempts: std::collections::HashMap<String, i64> = claims
                .build_query_as::<(String, i64)>()
                .fetch_all(&mut *tx)
                .await
                .expect("claims")
                .into_iter()
                .collect();
            let mut journal: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict) ",
            );
            journal.push_values(requests.iter().zip(&ids), |mut row, (request, id)| {
                row.push_bind(id.as_str())
                    .push_bind(attempts[id])
                    .push_bind(request.instance_name.as_str())
                    .push_bind(request.group())
                    .push_bind(now)
                    .push_bind("allowed");
            });
            journal.build().execute(&mut *tx).await.expect("journal");
            let mut outcomes: QueryBuilder<Sqlite> = QueryBuilder::new(
                "UPDATE requests SET status = 'restarted', claim_until = NULL, updated_at = ",
            );
            outcomes.push_bind(now).push(", completed_at = ");
            outcomes.push_bind(now).push(" WHERE message_id IN (");
            let mut list = outcomes.separated(", ");
            for id in &ids {
                list.push_bind(id.as_str());
            }
            outcomes.push(") AND status NOT IN ('restarted', 'failed', 'rejected')");
            outcomes.build().execute(&mut *tx).await.expect("outcomes");
            let mut settle: QueryBuilder<Sqlite> =
                QueryBuilder::new("UPDATE restarts SET outcome = 'restarted', settled_at = ");
            settle.push_bind(now).push(" FROM (");
            settle.push_values(&ids, |mut row, id| {
                row.push_bind(id.as_str()).push_bind(attempts[id]);
            });
            settle.push(
                ") AS j WHERE restarts.message_id = j.column1 AND restarts.attempt = j.column2
                   AND restarts.outcome IS NULL",
            );
            settle
                .build()
                .execute(&mut *tx)
                .await
                .expect("journal settled");
            let mut acks: QueryBuilder<Sqlite> =
                QueryBuilder::new("DELETE FROM queue WHERE id IN (");
            let mut list = acks.separated(", ");
            for (queue_id, _) in chunk {
                list.push_bind(*queue_id);
            }
            acks.push(")");
            acks.build().execute(&mut *tx).await.expect("acks");
        }
        tx.commit().await.expect("commit");
        done += batch.len();
    }
    assert_eq!(done, n);
    n as f64 / started.elapsed().as_secs_f64()
}

/// (b) through sqlx statement for statement: one row per statement, each
/// prepared once and cached by the connection, as rusqlite's
/// `prepare_cached` does; one commit per batch.
pub(crate) async fn sqlite_sqlx_one_row(n: usize, dir: &std::path::Path) -> f64 {
    let mut conn = prepared(n, &dir.join("ceiling-sqlx-one-row.db")).await;
    let rules = parse_rules();
    let started = Instant::now();
    let mut done = 0;
    loop {
        let now = now_millis();
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        let batch = pull(&mut tx, now).await;
        if batch.is_empty() {
            break;
        }
        for (queue_id, payload) in &batch {
            let request = parse(payload, &rules);
            let id = request.message_id.to_string();
            sqlx::query(
                "INSERT INTO requests (message_id, instance_name, hostname, requested_by, reason,
                                       status, attempts, received_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'received', 0, ?6, ?6)
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(&id)
            .bind(request.instance_name.as_str())
            .bind(request.hostname.as_str())
            .bind(request.requested_by.as_deref())
            .bind(request.reason.as_deref())
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("receipt");
            let attempt: i64 = sqlx::query_scalar(
                "UPDATE requests SET attempts = attempts + 1, claim_until = ?2, updated_at = ?3
                 WHERE message_id = ?1 RETURNING attempts",
            )
            .bind(&id)
            .bind(now + 60_000)
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .expect("claim");
            sqlx::query(
                "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'allowed')",
            )
            .bind(&id)
            .bind(attempt)
            .bind(request.instance_name.as_str())
            .bind(request.group())
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("journal");
            sqlx::query(
                "UPDATE requests SET status = 'restarted', claim_until = NULL, updated_at = ?2,
                                     completed_at = ?2
                 WHERE message_id = ?1 AND status NOT IN ('restarted', 'failed', 'rejected')",
            )
            .bind(&id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("outcome");
            sqlx::query(
                "UPDATE restarts SET outcome = 'restarted', settled_at = ?3
                 WHERE message_id = ?1 AND attempt = ?2 AND outcome IS NULL",
            )
            .bind(&id)
            .bind(attempt)
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("journal settled");
            sqlx::query("DELETE FROM queue WHERE id = ?1")
                .bind(queue_id)
                .execute(&mut *tx)
                .await
                .expect("ack");
        }
        tx.commit().await.expect("commit");
        done += batch.len();
    }
    assert_eq!(done, n);
    n as f64 / started.elapsed().as_secs_f64()
}
