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
use std::sync::Arc;
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

use super::{
    Claim, ClaimState, ClaimTerms, DECISION_SQL, Decision, HistoryEntry, Recorded, Store,
    StoreError, Story, Switch, Timestamp, USAGE_SQL, claim_decision, decide_claim, duration_of,
    millis_of, payload_excerpt, sqlx_error_is_transient, switch_from, usage_binds, usage_from,
};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::safety::limits::Usage;

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
    Claim {
        request: RestartRequest,
        terms: ClaimTerms,
        reply: oneshot::Sender<Result<Claim, StoreError>>,
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
    Release {
        message_id: Uuid,
        attempt: u32,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Decision {
        message_id: Uuid,
        attempt: u32,
        verdict: String,
        guard: String,
        reason: String,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Prune {
        before: Timestamp,
        max_rows: u32,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Stop after this batch; later writes are refused.
    Close,
}

/// What one write of a committed batch answers.
#[derive(Debug, Clone)]
enum Answer {
    Done,
    Claim(Claim),
    /// `Some(status)` when an outcome was not recorded because `status` was
    /// already final.
    Outcome(Option<Status>),
    Pruned(u64),
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
                let error = Arc::new(error);
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Batch(error.clone())));
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

impl Writer {
    /// Commits `batch` in one transaction. After a failure nothing of it was
    /// committed, and the own connection is replaced (an in-memory database
    /// lives in its one connection, which must not be).
    async fn commit(&mut self, batch: &[Write]) -> Result<Vec<Answer>, sqlx::Error> {
        match self {
            Self::Connection(own) => {
                let committed = match own.get().await {
                    Ok(conn) => commit_batch(conn, batch).await,
                    Err(error) => Err(error),
                };
                if committed.is_err() {
                    own.discard().await;
                }
                committed
            }
            Self::Pool(pool) => match pool.acquire().await {
                Ok(mut conn) => commit_batch(&mut conn, batch).await,
                Err(error) => Err(error),
            },
        }
    }
}

/// A writer task's own connection, replaced after a failed transaction; the
/// SQLite queue's writer uses it too.
///
/// Some errors (a full disk, for one) make SQLite end the transaction by
/// itself; sqlx's `ROLLBACK` then fails, sqlx keeps counting the transaction
/// as open, and the connection refuses every later `BEGIN IMMEDIATE` ("at
/// non-zero transaction depth"). A fresh connection carries no such state.
pub(crate) struct WriterConnection {
    options: SqliteConnectOptions,
    /// `None` after a failure, until the next batch connects again.
    conn: Option<SqliteConnection>,
}

impl WriterConnection {
    pub(crate) async fn open(options: SqliteConnectOptions) -> Result<Self, sqlx::Error> {
        let conn = SqliteConnection::connect_with(&options).await?;
        Ok(Self {
            options,
            conn: Some(conn),
        })
    }

    /// The connection, opened again if the last one was discarded.
    pub(crate) async fn get(&mut self) -> Result<&mut SqliteConnection, sqlx::Error> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => SqliteConnection::connect_with(&self.options).await?,
        };
        Ok(self.conn.insert(conn))
    }

    /// Drops the connection after a failed transaction.
    pub(crate) async fn discard(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(error) = conn.close().await
        {
            debug!(%error, "closing a failed writer connection failed");
        }
    }

    /// Closes the connection, if one is open.
    pub(crate) async fn close(mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(error) = conn.close().await
        {
            warn!(%error, "closing a writer connection failed");
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
        match writer.commit(&batch).await {
            Ok(results) => {
                for (write, result) in batch.drain(..).zip(results) {
                    answer(write, result);
                }
            }
            Err(error) if batch.len() > 1 && !sqlx_error_is_transient(&error) => {
                // One write the database refuses for good must not fail the
                // others that shared its transaction (each caller would give
                // its request up): write them one by one, so that only the
                // culprit hears the error.
                warn!(%error, writes = batch.len(), "store batch refused; writing it one by one");
                for write in batch.drain(..) {
                    let single = [write];
                    let result = writer.commit(&single).await;
                    let [write] = single;
                    match result {
                        Ok(mut results) => answer(write, results.remove(0)),
                        Err(error) => fail(write, StoreError::Batch(Arc::new(error))),
                    }
                }
            }
            Err(error) => {
                warn!(%error, writes = batch.len(), "store transaction failed");
                let error = Arc::new(error);
                for write in batch.drain(..) {
                    fail(write, StoreError::Batch(error.clone()));
                }
            }
        }
    }
    // Whoever is still waiting gets an answer, not a hang.
    receiver.close();
    while let Ok(write) = receiver.try_recv() {
        fail(write, StoreError::Closed);
    }
    if let Writer::Connection(own) = writer {
        own.close().await;
    }
}

fn answer(write: Write, answer: Answer) {
    match (write, answer) {
        (Write::Claim { reply, .. }, Answer::Claim(claim)) => {
            let _ = reply.send(Ok(claim));
        }
        (Write::Outcome { reply, .. }, Answer::Outcome(existing)) => {
            let _ = reply.send(Ok(match existing {
                None => Recorded::Recorded,
                Some(status) => Recorded::AlreadyFinal(status),
            }));
        }
        (
            Write::Rejection { reply, .. }
            | Write::Release { reply, .. }
            | Write::Decision { reply, .. },
            Answer::Done,
        ) => {
            let _ = reply.send(Ok(()));
        }
        (Write::Prune { reply, .. }, Answer::Pruned(rows)) => {
            let _ = reply.send(Ok(rows));
        }
        (write, answer) => {
            // commit_batch answers each write with its own kind.
            fail(
                write,
                StoreError::Corrupt(format!("store writer mismatched answer {answer:?}")),
            );
        }
    }
}

fn fail(write: Write, error: StoreError) {
    match write {
        Write::Claim { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Rejection { reply, .. }
        | Write::Release { reply, .. }
        | Write::Decision { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Outcome { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Prune { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Write::Close => {}
    }
}

/// Runs every write of `batch` in one write transaction and answers each.
/// Any error fails the whole batch: nothing is committed.
///
/// Claims go in one pass, then outcomes in one statement, then rejections
/// and prunes one by one. That order is one valid order among concurrent
/// callers as long as no request appears twice in the batch (a handler's own
/// claim is committed before it records its outcome); when one does (two
/// deliveries of a request racing), the batch runs write by write, in
/// arrival order.
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &[Write],
) -> Result<Vec<Answer>, sqlx::Error> {
    let now = Timestamp::now().as_millis();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let mut answers = vec![Answer::Done; batch.len()];
    let mut seen = std::collections::HashSet::with_capacity(batch.len());
    let repeats = batch.iter().any(|write| match write {
        Write::Claim { request, .. } | Write::Outcome { request, .. } => {
            !seen.insert(request.message_id)
        }
        _ => false,
    });
    if repeats {
        for (write, answer) in batch.iter().zip(&mut answers) {
            match write {
                Write::Claim { request, terms, .. } => {
                    *answer =
                        Answer::Claim(claim(&mut tx, &[(request, *terms)], now).await?.remove(0));
                }
                Write::Outcome {
                    request,
                    attempt,
                    outcome,
                    ..
                } => {
                    *answer = Answer::Outcome(
                        insert_outcomes(&mut tx, &[(request, *attempt, outcome)], now).await?[0],
                    );
                }
                _ => {}
            }
        }
    } else {
        let (indexes, claims): (Vec<usize>, Vec<_>) = batch
            .iter()
            .enumerate()
            .filter_map(|(index, write)| match write {
                Write::Claim { request, terms, .. } => Some((index, (request, *terms))),
                _ => None,
            })
            .unzip();
        for (index, decided) in indexes.into_iter().zip(claim(&mut tx, &claims, now).await?) {
            answers[index] = Answer::Claim(decided);
        }
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
            answers[index] = Answer::Outcome(result);
        }
    }
    for (write, answer) in batch.iter().zip(&mut answers) {
        match write {
            Write::Rejection {
                message_id,
                reason,
                excerpt,
                ..
            } => insert_rejection(&mut tx, *message_id, reason, excerpt, now).await?,
            // After the claims: a handler releases only a claim it already
            // holds, committed in an earlier batch.
            Write::Release {
                message_id,
                attempt,
                ..
            } => release(&mut tx, *message_id, *attempt, now).await?,
            Write::Decision {
                message_id,
                attempt,
                verdict,
                guard,
                reason,
                ..
            } => {
                let decision = Decision {
                    verdict,
                    guard,
                    reason,
                };
                insert_decision(&mut tx, *message_id, *attempt, decision, now).await?;
            }
            Write::Prune {
                before, max_rows, ..
            } => *answer = Answer::Pruned(prune(&mut tx, *before, *max_rows).await?),
            _ => {}
        }
    }
    tx.commit().await?;
    Ok(answers)
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
        requested_by: row.try_get("requested_by")?,
        reason: row.try_get("reason")?,
        last_error: row.try_get("last_error")?,
        output: row.try_get("output")?,
        recovered_after: duration_of(row.try_get("recovered_after_ms")?),
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

    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        let request = request.clone();
        self.call(|reply| Write::Claim {
            request,
            terms,
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

    async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let message_id = request.message_id;
        self.call(|reply| Write::Release {
            message_id,
            attempt,
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
            "SELECT COALESCE(message_id, rejected_id) AS message_id, instance_name, hostname,
                    requested_by, reason, status, attempts, last_error, output,
                    recovered_after_ms, received_at, updated_at, completed_at
             FROM requests ORDER BY updated_at DESC, id DESC LIMIT ?1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<(), StoreError> {
        let message_id = request.message_id;
        let (verdict, guard, reason) = (
            decision.verdict.to_owned(),
            decision.guard.to_owned(),
            decision.reason.to_owned(),
        );
        self.call(|reply| Write::Decision {
            message_id,
            attempt,
            verdict,
            guard,
            reason,
            reply,
        })
        .await
    }

    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, super::GroupUsage>, StoreError> {
        let restarts = sqlx::query_as(super::GROUP_RESTARTS_SQL)
            .bind(window_start.as_millis())
            .fetch_all(&self.pool)
            .await?;
        let disrupted = sqlx::query_as(super::GROUP_DISRUPTED_SQL)
            .bind(memory_start.as_millis())
            .fetch_all(&self.pool)
            .await?;
        Ok(super::group_usage_from(restarts, disrupted))
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        let count: Option<i64> =
            sqlx::query_scalar("SELECT count FROM deferrals WHERE message_id = ?1")
                .bind(message_id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        Ok(count.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)))
    }

    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        let id = message_id.to_string();
        let Some(row) = sqlx::query(
            "SELECT message_id, instance_name, hostname, requested_by, reason, status, attempts,
                    last_error, output, recovered_after_ms, received_at, updated_at, completed_at
             FROM requests WHERE message_id = ?1",
        )
        .bind(&id)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let attempts = sqlx::query_as(super::STORY_ATTEMPTS_SQL)
            .bind(&id)
            .fetch_all(&self.pool)
            .await?;
        let decisions = sqlx::query_as(super::STORY_DECISIONS_SQL)
            .bind(&id)
            .fetch_all(&self.pool)
            .await?;
        Ok(Some(super::story_from(
            entry_from_row(&row)?,
            attempts,
            decisions,
        )))
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        let (paused, by, reason, since): (bool, Option<String>, Option<String>, i64) =
            sqlx::query_as("SELECT paused, by_whom, reason, updated_at FROM control WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
        Ok(switch_from(paused, by, reason, since))
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        // Rare: through the pool, waiting its turn for the write lock like
        // any other writer; committed (and so seen by every claim after it)
        // when this returns.
        sqlx::query(
            "UPDATE control SET paused = ?1, by_whom = ?2, reason = ?3, updated_at = ?4 WHERE id = 1",
        )
        .bind(paused)
        .bind(by)
        .bind(reason)
        .bind(Timestamp::now().as_millis())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.call(|reply| Write::Prune {
            before,
            max_rows,
            reply,
        })
        .await
    }

    async fn close(&self) {
        // Fails only if the writer already stopped, which is what we want.
        let _ = self.writes.send(Write::Close).await;
        self.closing.cancel();
        self.tasks.wait().await;
        self.pool.close().await;
    }
}

/// Claims restart attempts, in three statements whatever their number:
/// create missing rows, read the claim state of every row, write the claims
/// that succeed. The request ids must be distinct.
async fn claim(
    tx: &mut Tx<'_>,
    claims: &[(&RestartRequest, ClaimTerms)],
    now: i64,
) -> Result<Vec<Claim>, sqlx::Error> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<_> = claims
        .iter()
        .map(|(request, _)| {
            serde_json::json!([
                request.message_id.to_string(),
                request.instance_name.as_str(),
                request.hostname.as_str(),
                request.requested_by,
                request.reason,
            ])
        })
        .collect();
    let rows = serde_json::Value::Array(rows).to_string();
    sqlx::query(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, reason, status,
              attempts, received_at, updated_at)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4,
                'received', 0, ?2, ?2
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(&rows)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    let found: Vec<(String, String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT message_id, status, attempts, claim_until FROM requests
         WHERE message_id IN (SELECT j.value ->> 0 FROM json_each(?1) AS j)",
    )
    .bind(&rows)
    .fetch_all(&mut **tx)
    .await?;
    let states: std::collections::HashMap<String, ClaimState> = found
        .into_iter()
        .map(|(id, status, attempts, claim_until)| {
            let state = ClaimState {
                // The CHECK constraint admits only known statuses.
                status: Status::from_name(&status).unwrap_or(Status::Failed),
                attempts: u32::try_from(attempts).unwrap_or(0),
                claim_until,
            };
            (id, state)
        })
        .collect();
    // Read in the claims' own write transaction: a pause committed before
    // it stops every claim of the batch.
    let (paused, by, why, since): (bool, Option<String>, Option<String>, i64) =
        sqlx::query_as("SELECT paused, by_whom, reason, updated_at FROM control WHERE id = 1")
            .fetch_one(&mut **tx)
            .await?;
    let switch = switch_from(paused, by, why, since);
    let mut decided = Vec::with_capacity(claims.len());
    let mut writes = Vec::new();
    for (request, terms) in claims {
        let id = request.message_id.to_string();
        // The counting guards read the journal as this transaction left it,
        // so the claims written so far go in first.
        let usage = if terms.limits.is_active() {
            write_claims(tx, &mut writes, now).await?;
            let (window_start, memory_start) = usage_binds(&terms.limits, now);
            let row = sqlx::query_as(USAGE_SQL)
                .bind(request.group())
                .bind(request.instance_name.as_str())
                .bind(window_start)
                .bind(memory_start)
                .bind(now)
                .fetch_one(&mut **tx)
                .await?;
            usage_from(row)
        } else {
            Usage::default()
        };
        let (claim, write) = decide_claim(
            request,
            states.get(&id).copied(),
            &switch,
            now,
            *terms,
            &usage,
        );
        if let Some(write) = write {
            writes.push(serde_json::json!([
                id,
                write.attempts,
                write.claim_until,
                write.last_error,
                request.instance_name.as_str(),
                request.group(),
                write.verdict,
            ]));
        } else if let Some(decision) = claim_decision(&claim) {
            insert_decision(tx, request.message_id, 0, decision, now).await?;
        }
        decided.push(claim);
    }
    write_claims(tx, &mut writes, now).await?;
    Ok(decided)
}

/// Writes the claims decided so far, and their journal rows; empties `writes`.
async fn write_claims(
    tx: &mut Tx<'_>,
    writes: &mut Vec<serde_json::Value>,
    now: i64,
) -> Result<(), sqlx::Error> {
    if writes.is_empty() {
        return Ok(());
    }
    let json = serde_json::Value::Array(std::mem::take(writes)).to_string();
    sqlx::query(
        "UPDATE requests SET status = 'received', attempts = j.value ->> 1,
             claim_until = j.value ->> 2,
             last_error = coalesce(j.value ->> 3, requests.last_error), updated_at = ?2
         FROM json_each(?1) AS j WHERE requests.message_id = j.value ->> 0",
    )
    .bind(&json)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 4, j.value ->> 5, ?2, j.value ->> 6
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id, attempt) DO UPDATE SET
             claimed_at = excluded.claimed_at, verdict = excluded.verdict,
             outcome = NULL, settled_at = NULL",
    )
    .bind(&json)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn insert_decision(
    tx: &mut Tx<'_>,
    message_id: Uuid,
    attempt: u32,
    decision: Decision<'_>,
    now: i64,
) -> Result<(), sqlx::Error> {
    if decision.verdict == "deferred" {
        sqlx::query(super::DEFERRAL_SQL)
            .bind(message_id.to_string())
            .execute(&mut **tx)
            .await?;
    }
    sqlx::query(DECISION_SQL)
        .bind(message_id.to_string())
        .bind(now)
        .bind(i64::from(attempt))
        .bind(decision.verdict)
        .bind(decision.guard)
        .bind(decision.reason)
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
                outcome.output(),
                millis_of(outcome.recovered_after()),
            ])
        })
        .collect();
    // One statement, so that two deliveries of the same message (or two
    // instances) cannot both record a first final outcome.
    let recorded: Vec<String> = sqlx::query_scalar(&format!(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, reason, status,
              attempts, last_error, received_at, updated_at, completed_at, output,
              recovered_after_ms)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4,
                j.value ->> 5, j.value ->> 6, j.value ->> 7, ?2, ?2, j.value ->> 8,
                j.value ->> 9, j.value ->> 10
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id) DO UPDATE SET
             status = excluded.status,
             output = excluded.output,
             recovered_after_ms = excluded.recovered_after_ms,
             claim_until = CASE WHEN excluded.attempts >= requests.attempts
                                THEN NULL ELSE requests.claim_until END,
             attempts = max(requests.attempts, excluded.attempts),
             last_error = excluded.last_error,
             updated_at = excluded.updated_at,
             completed_at = excluded.completed_at
         WHERE requests.status NOT IN {FINAL_STATUSES}
         RETURNING message_id"
    ))
    .bind(serde_json::Value::Array(rows.clone()).to_string())
    .bind(now)
    .fetch_all(&mut **tx)
    .await?;
    // The attempt's own end, whatever another delivery recorded first.
    sqlx::query(
        "UPDATE restarts SET outcome = j.value ->> 5, settled_at = ?2
         FROM json_each(?1) AS j
         WHERE restarts.message_id = j.value ->> 0 AND restarts.attempt = j.value ->> 6
           AND restarts.outcome IS NULL",
    )
    .bind(serde_json::Value::Array(rows).to_string())
    .bind(now)
    .execute(&mut **tx)
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
             (rejected_id, status, attempts, last_error, payload, received_at, updated_at, completed_at)
         VALUES (?1, 'rejected', 1, ?2, ?3, ?4, ?4, ?4)",
    )
    .bind(message_id.map(|id| id.to_string()))
    .bind(reason)
    .bind(excerpt)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn release(
    tx: &mut Tx<'_>,
    message_id: Uuid,
    attempt: u32,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE requests SET attempts = attempts - 1, claim_until = NULL, updated_at = ?3
         WHERE message_id = ?1 AND attempts = ?2 AND ?2 > 0 AND claim_until IS NOT NULL
           AND status IN ('received', 'retrying')",
    )
    .bind(message_id.to_string())
    .bind(i64::from(attempt))
    .bind(now)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "DELETE FROM restarts WHERE message_id = ?1 AND attempt = ?2 AND outcome IS NULL
           AND NOT EXISTS (SELECT 1 FROM requests WHERE message_id = ?1 AND attempts >= ?2)",
    )
    .bind(message_id.to_string())
    .bind(i64::from(attempt))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Deletes at most `max_rows` final rows completed before `before`.
async fn prune(tx: &mut Tx<'_>, before: Timestamp, max_rows: u32) -> Result<u64, sqlx::Error> {
    let deleted = sqlx::query(
        "DELETE FROM requests WHERE id IN (
             SELECT id FROM requests WHERE completed_at < ?1
             ORDER BY completed_at LIMIT ?2)",
    )
    .bind(before.as_millis())
    .bind(i64::from(max_rows))
    .execute(&mut **tx)
    .await?;
    // The journal and decisions of what is gone, and journal rows older
    // than the retention (the counting guards look back far less).
    sqlx::query(
        "DELETE FROM restarts WHERE claimed_at < ?1
            OR message_id NOT IN (SELECT message_id FROM requests WHERE message_id IS NOT NULL)",
    )
    .bind(before.as_millis())
    .execute(&mut **tx)
    .await?;
    for table in ["decisions", "deferrals"] {
        sqlx::query(&format!(
            "DELETE FROM {table}
             WHERE message_id NOT IN (SELECT message_id FROM requests WHERE message_id IS NOT NULL)"
        ))
        .execute(&mut **tx)
        .await?;
    }
    Ok(deleted.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::super::contract;
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
        let full = sqlx::migrate!("./migrations/sqlite");
        let old = sqlx::migrate::Migrator {
            migrations: std::borrow::Cow::Owned(full.migrations[..2].to_vec()),
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
}
