//! The scale-out store: PostgreSQL through sqlx, shared by many instances.
//!
//! PostgreSQL's own concurrency control is the arbiter: `message_id` is
//! unique, a claim or an outcome locks the request's row first, and an
//! outcome is written only over a status that is not final, so two instances
//! recording the same redelivered request cannot both record a first
//! outcome. Claims and outcomes are committed in groups by a few writer
//! tasks ([`writer`], each batch one transaction: [`batch`]); a claim that
//! a counting guard must check keeps its own transaction, with its
//! advisory locks ([`claims`]). Lookups are answered in groups too
//! (`store/lookup.rs`); the reads and statements shared with the SQLite
//! store are in `store/reads.rs` and `store/sql.rs`. The pool is bounded;
//! each writer keeps one connection from batch to batch (taking it anew
//! for each batch cost two pings), the lookup task takes one while it runs
//! a batch, and the writes that need a connection of their own take turns
//! for the rest, so no caller queues for the pool (where a
//! wait past its acquire timeout fails) however many handlers are in
//! flight.
//!
//! Every call is bounded by the store's timeout (`store.timeout`), twice:
//! the server cancels a statement, a lock wait or a transaction left idle
//! ([`bounds`]), so that a slow database fails a call cleanly (rolled
//! back), and the client stops waiting at the timeout whatever the server
//! does ([`StoreError::TimedOut`]: a server stopped or behind a black hole
//! enforces none of its own limits). The writers bound each batch the same
//! way, and drop a connection whose batch timed out.

mod batch;
mod claims;
mod outcomes;
mod rows;
#[cfg(test)]
mod tests;
mod writer;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::lookup::{Lookup, lookup_loop};
use super::reads::postgres as reads;
use super::sql::{
    PAUSE_GROUP_SQL, REJECTION_SQL, RESUME_GROUP_SQL, SET_LEASH_SQL, SET_SWITCH_IF_SQL,
    SET_SWITCH_SQL,
};
use super::{
    Claim, ClaimTerms, ClaimToken, Decision, GroupUsage, HistoryEntry, Recorded, ReportData, Store,
    StoreError, Story, Switch, SwitchExpected, Timestamp, UsageStarts, ask, payload_excerpt,
    within,
};
use crate::domain::{Asked, Outcome, RestartRequest, Status};
#[cfg(test)]
use crate::store::DEFAULT_TIMEOUT;

/// After a prune removed requests: their journal rows, and journal rows
/// claimed before `$1` (the counting guards look back far less). Run on the
/// pool, outside the writers' transactions (SQLite's, inside its one
/// writer's, are bounded: `sqlite/store/outcomes.rs`).
const PRUNE_JOURNAL_SQL: &str = "DELETE FROM restarts AS r WHERE r.claimed_at < $1
    OR NOT EXISTS (SELECT 1 FROM requests q WHERE q.message_id = r.message_id)";

/// After a prune removed requests: their decisions and deferral counts,
/// one statement a table.
const PRUNE_ORPHANS_SQL: [&str; 2] = [
    "DELETE FROM decisions AS d
     WHERE NOT EXISTS (SELECT 1 FROM requests q WHERE q.message_id = d.message_id)",
    "DELETE FROM deferrals AS d
     WHERE NOT EXISTS (SELECT 1 FROM requests q WHERE q.message_id = d.message_id)",
];

/// Retention's pass: at most `$2` final rows completed before `$1`, locked
/// in the writers' order (by `message_id`), found by the index of
/// completed requests.
const PRUNE_REQUESTS_SQL: &str = "SELECT id FROM requests WHERE id IN (
         SELECT id FROM requests WHERE completed_at < $1
         ORDER BY completed_at LIMIT $2)
     ORDER BY message_id FOR UPDATE";

/// Writer tasks when none is asked for: two commit about half again as
/// much as one on a loaded 2-core machine (docs/benchmarks.md), and more
/// only add contention for the rows and the pool.
pub(crate) const DEFAULT_WRITERS: u32 = 2;

/// Most lookups answered by one query.
const MAX_LOOKUPS: usize = 1024;

/// The planner settings of every connection of the store (the benchmark's
/// ceiling (d) uses them too):
///
/// - `plan_cache_mode = force_custom_plan`: every statement planned for
///   its own arrays and the table as it is now; a generic plan cached
///   while the table was small scans all of it once it is large (the
///   batches' statements take arrays).
/// - `random_page_cost = 1.1` (PostgreSQL's default is 4, priced for
///   spinning disks): the store reads its rows by key, from pages its own
///   writes keep in the buffer cache. At 4, a batch of 300 ids against a
///   table of 15,000 rows was planned as a hash join over a scan of the
///   whole table (its lock, the claims' and the outcomes' updates, the
///   journal's settling), about 3 times slower than the index there and
///   growing with the table until ~100,000 rows, where the index wins
///   anyway (`tests/plan.rs`).
pub(crate) const SESSION_SETTINGS: [(&str, &str); 2] = [
    ("plan_cache_mode", "force_custom_plan"),
    ("random_page_cost", "1.1"),
];

/// The server's own bounds on every connection of the store, from the
/// store's `timeout`: a statement or a lock wait is cancelled at half of
/// it, so that a database that is slow but answers fails the call with a
/// definite error (the transaction rolled back) before the client gives up
/// on it; a session idle inside a transaction (its client gone, or its
/// answers lost) is ended at the timeout, so that the rows and advisory
/// locks it holds are freed for the other instances.
fn bounds(timeout: Duration) -> [(&'static str, String); 3] {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    [
        ("statement_timeout", millis(timeout / 2).to_string()),
        ("lock_timeout", millis(timeout / 2).to_string()),
        (
            "idle_in_transaction_session_timeout",
            millis(timeout).to_string(),
        ),
    ]
}

/// Makes a read transaction one snapshot (PostgreSQL's default takes
/// one per statement): the pages of a history read whole agree.
const READ_SNAPSHOT: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// The statuses of the requests `$1` that are recorded. A join on
/// `unnest`, as the writers' statements, so that the index is used.
const LOOKUP_SQL: &str = "SELECT r.message_id, r.status
    FROM unnest($1::text[]) AS u(id) JOIN requests r ON r.message_id = u.id";

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct PostgresStore {
    pool: PgPool,
    /// To the writer tasks.
    writes: mpsc::Sender<batch::Write>,
    /// To the lookup task.
    lookups: mpsc::Sender<Lookup>,
    /// Tells the writers to commit what is queued and stop.
    closing: CancellationToken,
    /// The writer tasks.
    tasks: TaskTracker,
    /// Admits the writes that take a pooled connection of their own
    /// (guarded claims, releases, decisions, rejections): as many as the
    /// connections the writers and the lookup task leave, so that however
    /// many handlers are in flight, none waits for the pool long enough for
    /// its acquire to time out; the rest wait here, in order, without one.
    direct: Arc<tokio::sync::Semaphore>,
    /// The most any call waits for its answer (`store.timeout`).
    timeout: Duration,
}

impl PostgresStore {
    /// Connects to `url` (`postgres://…`) with at most `max_connections`
    /// connections, [`DEFAULT_WRITERS`] writers and calls bounded by
    /// [`DEFAULT_TIMEOUT`], and brings the schema up to date.
    #[cfg(test)]
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(url, max_connections, DEFAULT_WRITERS, DEFAULT_TIMEOUT).await
    }

    /// As [`PostgresStore::connect`], with `writers` writer tasks, and
    /// every call bounded by `timeout` (see the module docs). Each writer
    /// keeps a pooled connection of its own, and at least one
    /// connection is left to the reads and the guarded claims, so there are
    /// never more than `max_connections - 1` writers (but at least one),
    /// and the pool has at least two connections (the configuration refuses
    /// fewer; with one, the writer kept it and every read waited forever).
    pub(crate) async fn connect_with(
        url: &str,
        max_connections: u32,
        writers: u32,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let max_connections = max_connections.max(2);
        let options = PgConnectOptions::from_str(url)?.options(SESSION_SETTINGS);
        // The schema is brought up to date on a connection of its own,
        // without the calls' bounds: a migration of a large table may
        // rightly take longer than any call. (Start-up is abandoned by a
        // signal if the database hangs meanwhile.)
        let mut migrating = within(timeout, async {
            Ok(PgConnection::connect_with(&options).await?)
        })
        .await?;
        crate::migrations::postgres().run(&mut migrating).await?;
        let _ = migrating.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10).min(timeout))
            .connect_with(options.options(bounds(timeout)))
            .await?;
        let writers = writers.min(max_connections - 1).max(1);
        let (writes, receiver) = mpsc::channel(writer::MAX_BATCH * 4);
        let queue: writer::Queue = Arc::new(tokio::sync::Mutex::new(receiver));
        let closing = CancellationToken::new();
        let tasks = TaskTracker::new();
        for _ in 0..writers {
            tasks.spawn(writer::write_loop(
                pool.clone(),
                queue.clone(),
                closing.clone(),
                timeout,
            ));
        }
        let (lookups, lookup_receiver) = mpsc::channel(MAX_LOOKUPS * 4);
        let lookup_pool = pool.clone();
        tasks.spawn(lookup_loop(
            lookup_receiver,
            closing.clone(),
            MAX_LOOKUPS,
            timeout,
            move |ids| {
                let pool = lookup_pool.clone();
                async move { sqlx::query_as(LOOKUP_SQL).bind(ids).fetch_all(&pool).await }
            },
        ));
        tasks.close();
        let direct = (max_connections - writers).saturating_sub(1).max(1);
        Ok(Self {
            pool,
            writes,
            lookups,
            direct: Arc::new(tokio::sync::Semaphore::new(direct as usize)),
            closing,
            tasks,
            timeout,
        })
    }

    /// Turns a flag of the control row (the kill switch, the leash) with
    /// who and why (PostgreSQL refuses NUL in text): `sql` binds `$1`–`$4`
    /// as [`SET_SWITCH_SQL`] does.
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
                .bind(by.replace('\0', "\u{fffd}"))
                .bind(reason.replace('\0', "\u{fffd}"))
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

    /// Waits for a turn to take a pooled connection; see `direct`.
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        self.direct.acquire().await.map_err(|_| StoreError::Closed)
    }

    /// Queues a write for the writers and waits until its batch committed,
    /// at most the store's timeout.
    fn call<'a, T: 'a>(
        &'a self,
        write: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> batch::Write,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + 'a {
        ask(self.timeout, &self.writes, write)
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        ask(self.timeout, &self.lookups, |reply| (message_id, reply)).await
    }

    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        // Claims a counting guard applies to take the guards' advisory
        // locks in a transaction of their own; the others go in batches.
        if terms
            .limits
            .is_active_for(crate::safety::limits::Subject::of(request))
        {
            // Boxed: its transaction's future is several times the size
            // of a batched claim's, and would size every claim's future.
            return Box::pin(self.bounded(self.claim_alone(request, terms, token))).await;
        }
        let request = request.clone();
        self.call(|reply| batch::Write::Claim {
            request,
            terms,
            token,
            reply,
        })
        .await
    }

    async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
        token: ClaimToken,
    ) -> Result<(), StoreError> {
        self.bounded(self.release(request, attempt, token)).await
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<Recorded, StoreError> {
        self.bounded(self.decide(request, attempt, decision)).await
    }

    async fn group_usage(
        &self,
        starts: UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError> {
        self.bounded(reads::group_usage(&self.pool, starts)).await
    }

    async fn report(&self, since: Timestamp) -> Result<ReportData, StoreError> {
        self.bounded(reads::report(&self.pool, since)).await
    }

    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        self.bounded(PostgresStore::first_received(self, request))
            .await
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.bounded(reads::deferrals(&self.pool, message_id)).await
    }

    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        self.bounded(reads::story(&self.pool, message_id)).await
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
        let setup = &[READ_SNAPSHOT];
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
        // Its own transaction: each target's row lock orders it against
        // that target's claims (which lock the row first), so a claim
        // after it finds the target final, and one before it holds it
        // (running: not cancelled).
        let (by, reason) = (
            by.replace('\0', "\u{fffd}"),
            reason.replace('\0', "\u{fffd}"),
        );
        self.bounded(reads::stop_campaign(&self.pool, id, &by, &reason))
            .await
    }

    async fn campaigns_since(
        &self,
        since: Timestamp,
    ) -> Result<Vec<crate::store::Campaign>, StoreError> {
        self.bounded(reads::campaigns_since(&self.pool, since))
            .await
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let (request, outcome) = (request.clone(), outcome.clone());
        self.call(|reply| batch::Write::Outcome {
            request,
            attempt,
            outcome,
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
        let now = Timestamp::now().as_millis();
        // PostgreSQL text cannot hold NUL; the excerpt is for humans anyway.
        let excerpt = payload_excerpt(payload).replace('\0', "\u{fffd}");
        self.bounded(async {
            let _turn = self.turn().await?;
            sqlx::query(REJECTION_SQL)
                .bind(asked.message_id.map(|id| id.to_string()))
                .bind(reason.replace('\0', "\u{fffd}"))
                .bind(excerpt)
                .bind(now)
                .bind(asked.instance_name.as_deref())
                .bind(asked.requested_by.as_deref())
                .bind(asked.reason.as_deref())
                .bind(asked.requester.as_deref())
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.bounded(reads::history(&self.pool, limit)).await
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        self.bounded(reads::switch(&self.pool)).await
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        self.set_control(SET_SWITCH_SQL, paused, by, reason).await
    }

    async fn set_leash(&self, leashed: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        // The control row's lock: waits for the claims in progress, which
        // read it under a share lock; every claim after sees the new leash.
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
        self.bounded(async {
            let done = sqlx::query(SET_SWITCH_IF_SQL)
                .bind(paused)
                .bind(by.replace('\0', "\u{fffd}"))
                .bind(reason.replace('\0', "\u{fffd}"))
                .bind(Timestamp::now().as_millis())
                .bind(was_paused)
                .bind(was_by.replace('\0', "\u{fffd}"))
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
        self.bounded(self.turn_group_pause(group, pause)).await
    }

    async fn recent_recoveries(
        &self,
        group: &str,
        limit: u32,
    ) -> Result<Vec<Option<std::time::Duration>>, StoreError> {
        self.bounded(reads::recent_recoveries(&self.pool, group, limit))
            .await
    }

    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        self.bounded(self.prune_rows(before, max_rows)).await
    }

    async fn close(&self) {
        // The writers commit what is queued, then stop; a write queued
        // after that is answered `Closed`. Bounded: a writer's batch and
        // the pool's goodbyes wait on a database that may not answer.
        self.closing.cancel();
        let closed = tokio::time::timeout(self.timeout, async {
            self.tasks.wait().await;
            self.pool.close().await;
        })
        .await;
        if closed.is_err() {
            tracing::warn!(timeout = ?self.timeout, "the store did not close in time; leaving it");
        }
    }
}

impl PostgresStore {
    /// As [`Store::set_group_pause`], unbounded. The kill switch's row is
    /// locked first, exclusively: every claim reads the group pauses after
    /// taking its share lock, so this waits for the claims in progress, and
    /// every claim after it sees the pause.
    async fn turn_group_pause(
        &self,
        group: &str,
        pause: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT 1 FROM control WHERE id = 1 FOR UPDATE")
            .execute(&mut *tx)
            .await?;
        let done = match pause {
            Some((by, reason)) => {
                sqlx::query(PAUSE_GROUP_SQL)
                    .bind(group.replace('\0', "\u{fffd}"))
                    .bind(by.replace('\0', "\u{fffd}"))
                    .bind(reason.replace('\0', "\u{fffd}"))
                    .bind(Timestamp::now().as_millis())
                    .execute(&mut *tx)
                    .await?
            }
            None => {
                sqlx::query(RESUME_GROUP_SQL)
                    .bind(group.replace('\0', "\u{fffd}"))
                    .execute(&mut *tx)
                    .await?
            }
        };
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// As [`Store::prune`], unbounded.
    async fn prune_rows(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        // The rows are locked in id order first, as the writers lock them,
        // so that a pass and a batch never wait for each other in a cycle.
        let mut tx = self.pool.begin().await?;
        let doomed: Vec<i64> = sqlx::query_scalar(PRUNE_REQUESTS_SQL)
            .bind(before.as_millis())
            .bind(i64::from(max_rows))
            .fetch_all(&mut *tx)
            .await?;
        let deleted = sqlx::query("DELETE FROM requests WHERE id = ANY($1)")
            .bind(&doomed)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        sqlx::query(PRUNE_JOURNAL_SQL)
            .bind(before.as_millis())
            .execute(&self.pool)
            .await?;
        for orphans in PRUNE_ORPHANS_SQL {
            sqlx::query(orphans).execute(&self.pool).await?;
        }
        Ok(deleted.rows_affected())
    }
}

/// A throwaway PostgreSQL database for one test, dropped afterwards: one
/// file shared with the integration tests and the benchmark. Included by
/// path, the one exception to the test layout: those build against the
/// library without `cfg(test)`, so they cannot reach a test-only module.
#[cfg(test)]
#[path = "../../../tests/services/postgres.rs"]
pub(crate) mod testing;
