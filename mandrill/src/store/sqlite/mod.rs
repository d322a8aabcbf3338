//! The embedded default store: SQLite through sqlx, in WAL mode with
//! `synchronous = FULL`, so that a recorded outcome survives power loss.
//!
//! Writes are committed in groups by the file's writer ([`crate::sqlite`]),
//! shared with the SQLite queue when it uses the same file: it takes every
//! write queued (receipts, outcomes, rejections, and the queue's
//! operations), runs them in one `BEGIN IMMEDIATE` transaction and answers
//! each caller only after the commit. Many handlers' writes share one fsync,
//! and no caller hears "recorded" before it is durable. An outcome can carry
//! its message's ack ([`Store::record_outcome_acking`]): both commit, or
//! neither. Reads use a separate pool, so that they never wait behind a
//! batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{
    Claim, ClaimTerms, Decision, HistoryEntry, Recorded, Store, StoreError, Story, Switch,
    Timestamp, payload_excerpt, switch_from,
};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::sqlite::writer::{Job, MAX_BATCH};
use crate::sqlite::{FileWriter, JointAck, store_migrations};
use reads::{entry_from_row, lookup_loop};
pub(crate) use writer::StorePart;
use writer::Write;

/// Rows per multi-row statement: at most 13 parameters each, well under
/// SQLite's limit of 32,766.
const ROWS_PER_STATEMENT: usize = 500;

mod claims;
mod outcomes;
mod reads;
#[cfg(test)]
mod tests;
mod writer;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// For reads.
    pool: SqlitePool,
    /// The file's writer, shared with the queue when it uses the same file.
    writer: Arc<FileWriter>,
    /// Set by [`Store::close`]: later writes are refused.
    closed: Arc<AtomicBool>,
    /// To the lookup task, which answers many lookups with one query.
    lookups: mpsc::Sender<Lookup>,
    /// Stops the lookup task.
    closing: CancellationToken,
    /// The lookup task.
    tasks: TaskTracker,
}

/// A lookup waiting for its answer.
type Lookup = (Uuid, oneshot::Sender<Result<Option<Status>, StoreError>>);

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite:PATH`, or
    /// `sqlite::memory:`) and brings its schema up to date.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options = crate::sqlite::connect_options(url)?;
        // An in-memory database exists once per connection: the writer must
        // share the pool's only connection there.
        let in_memory = url.contains(":memory:");
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { max_connections.max(1) })
            .connect_with(options.clone())
            .await?;
        crate::sqlite::migrate(&pool, store_migrations()).await?;
        let writer = if in_memory {
            FileWriter::private(pool.clone())
        } else {
            FileWriter::open(&options).await?
        };
        let (lookups, lookup_receiver) = mpsc::channel(MAX_BATCH * 4);
        let closing = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(lookup_loop(pool.clone(), lookup_receiver, closing.clone()));
        tasks.close();
        Ok(Self {
            pool,
            writer,
            closed: Arc::new(AtomicBool::new(false)),
            lookups,
            closing,
            tasks,
        })
    }

    async fn call<T>(
        &self,
        write: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Write,
    ) -> Result<T, StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let (reply, answer) = oneshot::channel();
        if !self.writer.send(Job::B(write(reply))).await {
            return Err(StoreError::Closed);
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// The file's writer, to tell whether two users share it.
    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Arc<FileWriter> {
        &self.writer
    }

    /// Records an outcome, with `ack` in its transaction when it is for
    /// this store's own file.
    async fn outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        let ack = ack.filter(|ack| ack.is_for(&self.writer));
        let (request, outcome) = (request.clone(), outcome.clone());
        self.call(|reply| Write::Outcome {
            request,
            attempt,
            outcome,
            ack,
            reply,
        })
        .await
    }
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
        Ok(self.outcome(request, attempt, outcome, None).await?.0)
    }

    async fn record_outcome_acking(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        self.outcome(request, attempt, outcome, ack).await
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
    ) -> Result<std::collections::BTreeMap<String, crate::store::GroupUsage>, StoreError> {
        let restarts = sqlx::query_as(crate::store::GROUP_RESTARTS_SQL)
            .bind(window_start.as_millis())
            .fetch_all(&self.pool)
            .await?;
        let disrupted = sqlx::query_as(crate::store::GROUP_DISRUPTED_SQL)
            .bind(memory_start.as_millis())
            .fetch_all(&self.pool)
            .await?;
        Ok(crate::store::group_usage_from(restarts, disrupted))
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
        let attempts = sqlx::query_as(crate::store::STORY_ATTEMPTS_SQL)
            .bind(&id)
            .fetch_all(&self.pool)
            .await?;
        let decisions = sqlx::query_as(crate::store::STORY_DECISIONS_SQL)
            .bind(&id)
            .fetch_all(&self.pool)
            .await?;
        Ok(Some(crate::store::story_from(
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
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.writer.close().await;
        }
        self.closing.cancel();
        self.tasks.wait().await;
        self.pool.close().await;
    }
}
