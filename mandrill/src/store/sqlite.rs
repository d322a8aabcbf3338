//! The embedded default store: SQLite through sqlx, in WAL mode with
//! `synchronous = FULL`, so that a recorded outcome survives power loss.
//!
//! Writes are committed in groups: one writer task owns one connection,
//! takes every write queued (receipts, outcomes, rejections), runs them in
//! one `BEGIN IMMEDIATE` transaction and answers each caller only after the
//! commit. Many handlers' writes share one fsync, and no caller hears
//! "recorded" before it is durable. Reads use a separate pool, so that they
//! never wait behind a batch.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, Row, Sqlite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};
use uuid::Uuid;

use super::{HistoryEntry, Recorded, Store, StoreError, Timestamp, payload_excerpt};
use crate::domain::{Outcome, RestartRequest, Status};

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 1024;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// For reads.
    pool: SqlitePool,
    /// To the writer task.
    writes: mpsc::Sender<Write>,
    /// To the lookup task, which answers many lookups with one query.
    lookups: mpsc::Sender<Lookup>,
    /// Stops the lookup task.
    closing: CancellationToken,
    /// The writer and lookup tasks.
    tasks: TaskTracker,
}

/// A lookup waiting for its answer.
type Lookup = (Uuid, oneshot::Sender<Result<Option<Status>, StoreError>>);

/// One write, with whom to tell once it is committed.
#[derive(Debug)]
enum Write {
    Received {
        request: RestartRequest,
        attempt: u32,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Outcome {
        request: RestartRequest,
        attempt: u32,
        outcome: Outcome,
        reply: oneshot::Sender<Result<Recorded, StoreError>>,
    },
    Rejection {
        message_id: Option<Uuid>,
        reason: String,
        excerpt: String,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Stop after this batch; later writes are refused.
    Close,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite:PATH`, or
    /// `sqlite::memory:`) and brings its schema up to date.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        // An in-memory database exists once per connection: the writer must
        // share the pool's only connection there.
        let in_memory = url.contains(":memory:");
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { max_connections.max(1) })
            .connect_with(options.clone())
            .await?;
        let migrator = sqlx::migrate!("./migrations/sqlite");
        if let Err(first) = migrator.run(&pool).await {
            // Another process (or the broker of another process) may have
            // been migrating the same file at the same moment; a second run
            // sees its work. A real problem fails again.
            debug!(error = %first, "migration failed; trying once more");
            migrator.run(&pool).await?;
        }
        let writer = if in_memory {
            Writer::Pool(pool.clone())
        } else {
            Writer::Connection(Box::new(WriterConnection::open(options).await?))
        };
        let (writes, receiver) = mpsc::channel(MAX_BATCH * 4);
        let (lookups, lookup_receiver) = mpsc::channel(MAX_BATCH * 4);
        let closing = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(write_loop(writer, receiver));
        tasks.spawn(lookup_loop(pool.clone(), lookup_receiver, closing.clone()));
        tasks.close();
        Ok(Self {
            pool,
            writes,
            lookups,
            closing,
            tasks,
        })
    }

    async fn call<T>(
        &self,
        write: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Write,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(write(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// Answers every queued lookup with one query, until `closing`.
async fn lookup_loop(
    pool: SqlitePool,
    mut receiver: mpsc::Receiver<Lookup>,
    closing: CancellationToken,
) {
    let mut batch: Vec<Lookup> = Vec::with_capacity(MAX_BATCH);
    loop {
        tokio::select! {
            received = receiver.recv_many(&mut batch, MAX_BATCH) => if received == 0 { break },
            () = closing.cancelled() => break,
        }
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.to_string()).collect();
        // A vector of strings always serialises.
        let ids = serde_json::to_string(&ids).expect("ids serialise");
        let found: Result<Vec<(String, String)>, sqlx::Error> = sqlx::query_as(
            "SELECT message_id, status FROM requests
             WHERE message_id IN (SELECT value FROM json_each(?1))",
        )
        .bind(ids)
        .fetch_all(&pool)
        .await;
        match found {
            Ok(rows) => {
                let statuses: std::collections::HashMap<String, String> =
                    rows.into_iter().collect();
                for (id, reply) in batch.drain(..) {
                    let status = statuses.get(&id.to_string()).map(|s| {
                        Status::from_name(s)
                            .ok_or_else(|| StoreError::Corrupt(format!("status {s:?}")))
                    });
                    let _ = reply.send(status.transpose());
                }
            }
            Err(error) => {
                let message = error.to_string();
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Read(message.clone())));
                }
            }
        }
    }
    receiver.close();
    while let Ok((_, reply)) = receiver.try_recv() {
        let _ = reply.send(Err(StoreError::Closed));
    }
}

/// Where the writer writes: its own connection, or (in-memory databases)
/// the pool's one connection.
enum Writer {
    /// Boxed: the connect options are large, and the enum is made once.
    Connection(Box<WriterConnection>),
    Pool(SqlitePool),
}

/// The writer's own connection, replaced after a failed transaction.
///
/// Some errors (a full disk, for one) make SQLite end the transaction by
/// itself; sqlx's `ROLLBACK` then fails, sqlx keeps counting the transaction
/// as open, and the connection refuses every later `BEGIN IMMEDIATE` ("at
/// non-zero transaction depth"). A fresh connection carries no such state.
struct WriterConnection {
    options: SqliteConnectOptions,
    /// `None` after a failure, until the next batch connects again.
    conn: Option<SqliteConnection>,
}

impl WriterConnection {
    async fn open(options: SqliteConnectOptions) -> Result<Self, sqlx::Error> {
        let conn = SqliteConnection::connect_with(&options).await?;
        Ok(Self {
            options,
            conn: Some(conn),
        })
    }

    /// The connection, opened again if the last one was discarded.
    async fn get(&mut self) -> Result<&mut SqliteConnection, sqlx::Error> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => SqliteConnection::connect_with(&self.options).await?,
        };
        Ok(self.conn.insert(conn))
    }

    /// Drops the connection after a failed transaction.
    async fn discard(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(error) = conn.close().await
        {
            debug!(%error, "closing a failed writer connection failed");
        }
    }
}

/// Takes every queued write, commits them in one transaction, answers.
async fn write_loop(mut writer: Writer, mut receiver: mpsc::Receiver<Write>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closing = false;
    while !closing && receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let before = batch.len();
        batch.retain(|write| !matches!(write, Write::Close));
        closing = batch.len() < before;
        let committed = match &mut writer {
            Writer::Connection(own) => match own.get().await {
                Ok(conn) => commit_batch(conn, &batch).await,
                Err(error) => Err(error),
            },
            Writer::Pool(pool) => match pool.acquire().await {
                Ok(mut conn) => commit_batch(&mut conn, &batch).await,
                Err(error) => Err(error),
            },
        };
        match committed {
            Ok(results) => {
                for (write, result) in batch.drain(..).zip(results) {
                    answer(write, result);
                }
            }
            Err(error) => {
                warn!(%error, writes = batch.len(), "store transaction failed");
                // Nothing of the batch was committed. (An in-memory database
                // lives in its one connection, which must not be replaced.)
                if let Writer::Connection(own) = &mut writer {
                    own.discard().await;
                }
                let message = error.to_string();
                for write in batch.drain(..) {
                    fail(write, StoreError::Write(message.clone()));
                }
            }
        }
    }
    // Whoever is still waiting gets an answer, not a hang.
    receiver.close();
    while let Ok(write) = receiver.try_recv() {
        fail(write, StoreError::Closed);
    }
    if let Writer::Connection(own) = writer
        && let Some(conn) = own.conn
        && let Err(error) = conn.close().await
    {
        warn!(%error, "closing the store's writer connection failed");
    }
}

fn answer(write: Write, result: Option<Status>) {
    match write {
        Write::Received { reply, .. } | Write::Rejection { reply, .. } => {
            let _ = reply.send(Ok(()));
        }
        Write::Outcome { reply, .. } => {
            let _ = reply.send(Ok(match result {
                None => Recorded::Recorded,
                Some(status) => Recorded::AlreadyFinal(status),
            }));
        }
        Write::Close => {}
    }
}

fn fail(write: Write, error: StoreError) {
    match write {
        Write::Received { reply, .. } | Write::Rejection { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Outcome { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Close => {}
    }
}

/// Runs every write of `batch` in one write transaction. For each write,
/// `Some(status)` when an outcome was not recorded because `status` was
/// already final. Any error fails the whole batch: nothing is committed.
///
/// Receipts go in one statement, then outcomes in one, then rejections one
/// by one. That order is one valid order among concurrent callers as long as
/// no request appears twice in the batch (a handler's own receipt is
/// committed before it records its outcome); when one does (two deliveries of
/// a request racing), the batch runs write by write, in arrival order.
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &[Write],
) -> Result<Vec<Option<Status>>, sqlx::Error> {
    let now = Timestamp::now().as_millis();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let mut results = vec![None; batch.len()];
    let mut seen = std::collections::HashSet::with_capacity(batch.len());
    let repeats = batch.iter().any(|write| match write {
        Write::Received { request, .. } | Write::Outcome { request, .. } => {
            !seen.insert(request.message_id)
        }
        _ => false,
    });
    if repeats {
        for (write, result) in batch.iter().zip(&mut results) {
            match write {
                Write::Received {
                    request, attempt, ..
                } => insert_received(&mut tx, &[(request, *attempt)], now).await?,
                Write::Outcome {
                    request,
                    attempt,
                    outcome,
                    ..
                } => {
                    *result = insert_outcomes(&mut tx, &[(request, *attempt, outcome)], now)
                        .await?
                        .remove(0)
                }
                _ => {}
            }
        }
    } else {
        let receipts: Vec<_> = batch
            .iter()
            .filter_map(|write| match write {
                Write::Received {
                    request, attempt, ..
                } => Some((request, *attempt)),
                _ => None,
            })
            .collect();
        insert_received(&mut tx, &receipts, now).await?;
        let (indexes, outcomes): (Vec<usize>, Vec<_>) = batch
            .iter()
            .enumerate()
            .filter_map(|(index, write)| match write {
                Write::Outcome {
                    request,
                    attempt,
                    outcome,
                    ..
                } => Some((index, (request, *attempt, outcome))),
                _ => None,
            })
            .unzip();
        let recorded = insert_outcomes(&mut tx, &outcomes, now).await?;
        for (index, result) in indexes.into_iter().zip(recorded) {
            results[index] = result;
        }
    }
    for write in batch {
        if let Write::Rejection {
            message_id,
            reason,
            excerpt,
            ..
        } = write
        {
            insert_rejection(&mut tx, *message_id, reason, excerpt, now).await?;
        }
    }
    tx.commit().await?;
    Ok(results)
}

type Tx<'c> = sqlx::Transaction<'c, Sqlite>;

const FINAL_STATUSES: &str = "('restarted', 'failed', 'rejected')";

fn entry_from_row(row: &SqliteRow) -> Result<HistoryEntry, StoreError> {
    let status: String = row.try_get("status")?;
    let message_id: Option<String> = row.try_get("message_id")?;
    Ok(HistoryEntry {
        message_id: message_id
            .map(|id| {
                Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("message_id {id:?}")))
            })
            .transpose()?,
        instance_name: row.try_get("instance_name")?,
        hostname: row.try_get("hostname")?,
        status: Status::from_name(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("status {status:?}")))?,
        attempts: row
            .try_get::<i64, _>("attempts")?
            .try_into()
            .unwrap_or(u32::MAX),
        last_error: row.try_get("last_error")?,
        received_at: Timestamp::from_millis(row.try_get("received_at")?),
        updated_at: Timestamp::from_millis(row.try_get("updated_at")?),
        completed_at: row
            .try_get::<Option<i64>, _>("completed_at")?
            .map(Timestamp::from_millis),
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.lookups
            .send((message_id, reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn record_received(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let request = request.clone();
        self.call(|reply| Write::Received {
            request,
            attempt,
            reply,
        })
        .await
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let (request, outcome) = (request.clone(), outcome.clone());
        self.call(|reply| Write::Outcome {
            request,
            attempt,
            outcome,
            reply,
        })
        .await
    }

    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let (reason, excerpt) = (reason.to_owned(), payload_excerpt(payload));
        self.call(|reply| Write::Rejection {
            message_id,
            reason,
            excerpt,
            reply,
        })
        .await
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT message_id, instance_name, hostname, status, attempts, last_error,
                    received_at, updated_at, completed_at
             FROM requests ORDER BY updated_at DESC, id DESC LIMIT ?1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn close(&self) {
        // Fails only if the writer already stopped, which is what we want.
        let _ = self.writes.send(Write::Close).await;
        self.closing.cancel();
        self.tasks.wait().await;
        self.pool.close().await;
    }
}

/// Records receipts, in one statement.
async fn insert_received(
    tx: &mut Tx<'_>,
    receipts: &[(&RestartRequest, u32)],
    now: i64,
) -> Result<(), sqlx::Error> {
    if receipts.is_empty() {
        return Ok(());
    }
    let rows: Vec<_> = receipts
        .iter()
        .map(|(request, attempt)| {
            serde_json::json!([
                request.message_id.to_string(),
                request.instance_name.as_str(),
                request.hostname.as_str(),
                request.requested_by,
                request.reason,
                attempt,
            ])
        })
        .collect();
    // `WHERE true` tells SQLite's parser the ON CONFLICT is an upsert clause.
    sqlx::query(&format!(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, reason, status,
              attempts, received_at, updated_at)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4,
                'received', j.value ->> 5, ?2, ?2
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id) DO UPDATE SET
             attempts = max(requests.attempts, excluded.attempts),
             updated_at = excluded.updated_at,
             status = CASE WHEN requests.status IN {FINAL_STATUSES}
                           THEN requests.status ELSE 'received' END"
    ))
    .bind(serde_json::Value::Array(rows).to_string())
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records outcomes, in one statement; for each, `None` if recorded, or the
/// final status that was already there. The request ids must be distinct.
async fn insert_outcomes(
    tx: &mut Tx<'_>,
    outcomes: &[(&RestartRequest, u32, &Outcome)],
    now: i64,
) -> Result<Vec<Option<Status>>, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<_> = outcomes
        .iter()
        .map(|(request, attempt, outcome)| {
            let status = outcome.status();
            serde_json::json!([
                request.message_id.to_string(),
                request.instance_name.as_str(),
                request.hostname.as_str(),
                request.requested_by,
                request.reason,
                status.as_str(),
                attempt,
                outcome.error(),
                status.is_final().then_some(now),
            ])
        })
        .collect();
    // One statement, so that two deliveries of the same message (or two
    // instances) cannot both record a first final outcome.
    let recorded: Vec<String> = sqlx::query_scalar(&format!(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, reason, status,
              attempts, last_error, received_at, updated_at, completed_at)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4,
                j.value ->> 5, j.value ->> 6, j.value ->> 7, ?2, ?2, j.value ->> 8
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id) DO UPDATE SET
             status = excluded.status,
             attempts = max(requests.attempts, excluded.attempts),
             last_error = excluded.last_error,
             updated_at = excluded.updated_at,
             completed_at = excluded.completed_at
         WHERE requests.status NOT IN {FINAL_STATUSES}
         RETURNING message_id"
    ))
    .bind(serde_json::Value::Array(rows).to_string())
    .bind(now)
    .fetch_all(&mut **tx)
    .await?;
    let recorded: std::collections::HashSet<String> = recorded.into_iter().collect();
    let mut results = Vec::with_capacity(outcomes.len());
    for (request, _, _) in outcomes {
        let id = request.message_id.to_string();
        if recorded.contains(&id) {
            results.push(None);
            continue;
        }
        let existing: String =
            sqlx::query_scalar("SELECT status FROM requests WHERE message_id = ?1")
                .bind(&id)
                .fetch_one(&mut **tx)
                .await?;
        // The row was written by this program with a status from the CHECK list.
        results.push(Some(Status::from_name(&existing).unwrap_or(Status::Failed)));
    }
    Ok(results)
}

async fn insert_rejection(
    tx: &mut Tx<'_>,
    message_id: Option<Uuid>,
    reason: &str,
    excerpt: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO requests
             (message_id, status, attempts, last_error, payload, received_at, updated_at, completed_at)
         VALUES (?1, 'rejected', 1, ?2, ?3, ?4, ?4, ?4)
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(message_id.map(|id| id.to_string()))
    .bind(reason)
    .bind(excerpt)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::*;

    #[tokio::test]
    async fn sqlite_store_keeps_the_store_contract() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = SqliteStore::connect(&url, 2).await.unwrap();
        contract::final_outcome_is_never_overwritten(&store).await;
        contract::outcome_without_received_creates_row(&store).await;
        contract::rejections_are_listed(&store).await;
        store.close().await;
        // Reopening runs migrations again without harm and keeps the data.
        let store = SqliteStore::connect(&url, 1).await.unwrap();
        assert_eq!(store.history(100).await.unwrap().len(), 4);
        store.close().await;
    }
}
