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
//!
//! Every call waits at most the store's timeout (`store.timeout`): a
//! writer waiting for another process's write lock (the busy timeout), or a
//! disk that stalls, fails the call as [`StoreError::TimedOut`] instead of
//! holding its caller (and shutdown) without bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::query_builder::Separated;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use sqlx::{QueryBuilder, Sqlite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::writer::{Job, MAX_BATCH};
use super::{FileAck, FileWriter, store_migrations};
use crate::domain::{Asked, JointAck, Outcome, RestartRequest, Status, Timestamp};
#[cfg(any(test, feature = "bench"))]
use crate::store::DEFAULT_TIMEOUT;
use crate::store::lookup::{Lookup, lookup_loop};
use crate::store::reads::sqlite as reads;
use crate::store::sql::{
    PAUSE_GROUP_SQL, RESUME_GROUP_SQL, SET_LEASH_SQL, SET_SWITCH_IF_SQL, SET_SWITCH_SQL,
};
use crate::store::{
    Claim, ClaimTerms, ClaimToken, Decision, GroupUsage, HistoryEntry, Recorded, ReportData, Store,
    StoreError, Story, Switch, SwitchExpected, UsageStarts, ask, payload_excerpt, within,
};
pub(crate) use writer::StorePart;
use writer::Write;

/// Rows per multi-row statement: at most 14 parameters each, well under
/// SQLite's limit of 32,766.
const ROWS_PER_STATEMENT: usize = 500;

/// A statement built around a `SELECT` of its rows
/// ([`upsert_journal`](crate::store::sql::upsert_journal), the outcomes'
/// `UPDATE … FROM`), split where the
/// rows go: here they are a `VALUES` list of bound parameters, its columns
/// named as the statement wants them, not a JSON array taken apart inside
/// SQLite (the JSON functions cost more than the writes themselves).
#[derive(Debug)]
struct AroundValues {
    head: String,
    tail: String,
}

impl AroundValues {
    fn new(statement: fn(&str) -> String, columns: &[&str]) -> Self {
        const ROWS: &str = "/* rows */";
        let names: Vec<String> = (1..)
            .zip(columns)
            .map(|(n, column)| format!("column{n} AS {column}"))
            .collect();
        let sql = statement(&format!("SELECT {} FROM ({ROWS})", names.join(", ")));
        // Each builder puts its rows in once.
        let (head, tail) = sql.split_once(ROWS).expect("the rows go in once");
        Self {
            head: head.to_owned(),
            tail: tail.to_owned(),
        }
    }

    /// The statement over `rows`, each pushed by `push_row` in the order of
    /// the columns.
    fn query<'a, I, F>(&self, rows: I, push_row: F) -> QueryBuilder<'a, Sqlite>
    where
        I: IntoIterator,
        F: FnMut(Separated<'_, 'a, Sqlite, &'static str>, I::Item),
    {
        let mut query = QueryBuilder::new(&self.head);
        query.push_values(rows, push_row);
        query.push(&self.tail);
        query
    }
}

mod claims;
mod outcomes;
#[cfg(test)]
mod tests;
mod writer;

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
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
    /// The most any call waits for its answer (`store.timeout`).
    timeout: Duration,
}

/// The statuses of the requests in the JSON array `$1` that are recorded.
/// One parameter whatever the batch's size (up to [`MAX_BATCH`] ids).
const LOOKUP_SQL: &str = "SELECT message_id, status FROM requests
    WHERE message_id IN (SELECT value FROM json_each($1))";

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite:PATH`, or
    /// `sqlite::memory:`) and brings its schema up to date; its calls are
    /// bounded by [`DEFAULT_TIMEOUT`].
    #[cfg(any(test, feature = "bench"))]
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(url, max_connections, DEFAULT_TIMEOUT).await
    }

    /// As [`SqliteStore::connect`], each call bounded by `timeout`.
    pub(crate) async fn connect_with(
        url: &str,
        max_connections: u32,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let options = crate::sqlite::connect_options(url)?;
        // An in-memory database exists once per connection: the writer must
        // share the pool's only connection there.
        let in_memory = url.contains(":memory:");
        let pool = crate::sqlite::open_pool(
            SqlitePoolOptions::new().max_connections(if in_memory {
                1
            } else {
                max_connections.max(1)
            }),
            &options,
        )
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
        let lookup_pool = pool.clone();
        tasks.spawn(lookup_loop(
            lookup_receiver,
            closing.clone(),
            MAX_BATCH,
            timeout,
            move |ids| {
                let pool = lookup_pool.clone();
                // A vector of strings always serialises.
                let ids = serde_json::to_string(&ids).expect("ids serialise");
                async move { sqlx::query_as(LOOKUP_SQL).bind(ids).fetch_all(&pool).await }
            },
        ));
        tasks.close();
        Ok(Self {
            pool,
            writer,
            closed: Arc::new(AtomicBool::new(false)),
            lookups,
            closing,
            tasks,
            timeout,
        })
    }

    /// Turns a flag of the control row (the kill switch, the leash) with
    /// who and why: `sql` binds `$1`–`$4` as [`SET_SWITCH_SQL`] does.
    async fn set_control(
        &self,
        sql: &'static str,
        on: bool,
        by: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query(sql)
                .bind(on)
                .bind(by)
                .bind(reason)
                .bind(Timestamp::now().as_millis())
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    /// `call`, bounded by the store's timeout.
    fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> {
        within(self.timeout, call)
    }

    /// Queues a write for the file's writer and waits until it committed,
    /// at most the store's timeout.
    fn call<'a, T: 'a>(
        &'a self,
        write: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Write,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + 'a {
        use futures::future::{Either, ready};
        if self.closed.load(Ordering::Acquire) {
            return Either::Left(ready(Err(StoreError::Closed)));
        }
        Either::Right(ask(self.timeout, self.writer.jobs(), |reply| {
            Job::B(write(reply))
        }))
    }

    /// The file's writer, to tell whether two users share it.
    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Arc<FileWriter> {
        &self.writer
    }

    /// Records an outcome, with `ack` in its transaction when it is the
    /// SQLite queue's ack of a delivery from this store's own file.
    async fn outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        let ack = ack
            .as_ref()
            .and_then(JointAck::open::<FileAck>)
            .and_then(|ack| ack.claim_for(&self.writer));
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
        ask(self.timeout, &self.lookups, |reply| (message_id, reply)).await
    }

    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        let request = request.clone();
        self.call(|reply| Write::Claim {
            request,
            terms,
            token,
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
        token: ClaimToken,
    ) -> Result<(), StoreError> {
        let message_id = request.message_id;
        self.call(|reply| Write::Release {
            message_id,
            attempt,
            token,
            reply,
        })
        .await
    }

    async fn record_rejection(
        &self,
        asked: &Asked,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let (reason, excerpt) = (reason.to_owned(), payload_excerpt(payload));
        let asked = asked.clone();
        self.call(|reply| Write::Rejection {
            asked,
            reason,
            excerpt,
            reply,
        })
        .await
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.bounded(reads::history(&self.pool, limit)).await
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<Recorded, StoreError> {
        let request = request.clone();
        let (verdict, guard, reason) = (
            decision.verdict.to_owned(),
            decision.guard.to_owned(),
            decision.reason.to_owned(),
        );
        self.call(|reply| Write::Decision {
            request,
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
        starts: UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError> {
        self.bounded(reads::group_usage(&self.pool, starts)).await
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.bounded(reads::deferrals(&self.pool, message_id)).await
    }

    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        self.bounded(reads::story(&self.pool, message_id)).await
    }

    async fn report(&self, since: Timestamp) -> Result<ReportData, StoreError> {
        self.bounded(reads::report(&self.pool, since)).await
    }

    async fn record_campaign(&self, campaign: &crate::store::Campaign) -> Result<(), StoreError> {
        self.bounded(reads::record_campaign(&self.pool, campaign))
            .await
    }

    async fn decisions(
        &self,
        message_id: Uuid,
    ) -> Result<Vec<crate::store::DecisionRecord>, StoreError> {
        self.bounded(reads::decisions(&self.pool, message_id)).await
    }

    async fn each_history(
        &self,
        limit: usize,
        decisions: bool,
        each: crate::store::EachEntry<'_>,
    ) -> Result<(), StoreError> {
        let setup = &[];
        reads::each_history(&self.pool, setup, self.timeout, limit, decisions, each).await
    }

    async fn campaign(&self, id: Uuid) -> Result<Option<crate::store::Campaign>, StoreError> {
        self.bounded(reads::campaign(&self.pool, id)).await
    }

    async fn usage(
        &self,
        request: &RestartRequest,
        limits: &crate::safety::Limits,
    ) -> Result<crate::safety::limits::Usage, StoreError> {
        self.bounded(async {
            let mut conn = self.pool.acquire().await?;
            let now = Timestamp::now().as_millis();
            Ok(reads::usage(&mut conn, request, limits, now).await?)
        })
        .await
    }

    async fn stop_campaign(
        &self,
        id: Uuid,
        by: &str,
        reason: &str,
    ) -> Result<Option<(crate::store::Campaign, Vec<Uuid>)>, StoreError> {
        // Rare: through the pool, waiting its turn for the write lock, as
        // `set_switch`; committed (and so seen by every claim after it)
        // when this returns.
        self.bounded(reads::stop_campaign(&self.pool, id, by, reason))
            .await
    }

    async fn campaigns_since(
        &self,
        since: Timestamp,
    ) -> Result<Vec<crate::store::Campaign>, StoreError> {
        self.bounded(reads::campaigns_since(&self.pool, since))
            .await
    }

    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        // Rare (deferrals of requests their publisher did not date): through
        // the pool, waiting its turn for the write lock, as `set_switch`.
        self.bounded(async {
            sqlx::query(&crate::store::sql::INSERT_REQUEST_SQL)
                .bind(request.message_id.to_string())
                .bind(request.instance_name.as_str())
                .bind(request.hostname.as_str())
                .bind(request.requested_by.as_deref())
                .bind(request.requester.as_deref())
                .bind(request.reason.as_deref())
                .bind(Timestamp::now().as_millis())
                .execute(&self.pool)
                .await?;
            reads::received_at(&self.pool, request.message_id).await
        })
        .await
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        self.bounded(reads::switch(&self.pool)).await
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        // Rare: through the pool, waiting its turn for the write lock like
        // any other writer; committed (and so seen by every claim after it)
        // when this returns.
        self.set_control(SET_SWITCH_SQL, paused, by, reason).await
    }

    async fn set_leash(&self, leashed: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        // As `set_switch`: committed, and so read by every claim after it,
        // when this returns.
        self.set_control(SET_LEASH_SQL, leashed, by, reason).await
    }

    async fn set_switch_if(
        &self,
        expected: SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let (was_paused, was_by) = match expected {
            SwitchExpected::Running => (false, ""),
            SwitchExpected::PausedBy(name) => (true, name),
        };
        // One statement: the check and the write under the same write lock.
        self.bounded(async {
            let done = sqlx::query(SET_SWITCH_IF_SQL)
                .bind(paused)
                .bind(by)
                .bind(reason)
                .bind(Timestamp::now().as_millis())
                .bind(was_paused)
                .bind(was_by)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn group_pauses(&self) -> Result<Vec<crate::store::GroupPause>, StoreError> {
        self.bounded(reads::group_pauses(&self.pool)).await
    }

    async fn set_group_pause(
        &self,
        group: &str,
        pause: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        // Rare: through the pool, as `set_switch`; committed (and so seen
        // by every claim after it) when this returns.
        self.bounded(async {
            let done = match pause {
                Some((by, reason)) => {
                    sqlx::query(PAUSE_GROUP_SQL)
                        .bind(group)
                        .bind(by)
                        .bind(reason)
                        .bind(Timestamp::now().as_millis())
                        .execute(&self.pool)
                        .await?
                }
                None => {
                    sqlx::query(RESUME_GROUP_SQL)
                        .bind(group)
                        .execute(&self.pool)
                        .await?
                }
            };
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn recent_recoveries(
        &self,
        group: &str,
        limit: u32,
    ) -> Result<Vec<Option<Duration>>, StoreError> {
        self.bounded(reads::recent_recoveries(&self.pool, group, limit))
            .await
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
        // Bounded: the writer commits what is queued first, on a disk that
        // may have stalled.
        let closed = tokio::time::timeout(self.timeout, async {
            if !self.closed.swap(true, Ordering::AcqRel) {
                self.writer.close().await;
            }
            self.closing.cancel();
            self.tasks.wait().await;
            self.pool.close().await;
        })
        .await;
        if closed.is_err() {
            self.closing.cancel();
            tracing::warn!(timeout = ?self.timeout, "the store did not close in time; leaving it");
        }
    }
}
