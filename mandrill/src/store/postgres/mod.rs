//! The scale-out store: PostgreSQL through sqlx, shared by many instances.
//!
//! PostgreSQL's own concurrency control is the arbiter: `message_id` is
//! unique, a claim or an outcome locks the request's row first, and an
//! outcome is written only over a status that is not final, so two instances
//! recording the same redelivered request cannot both record a first
//! outcome. Claims and outcomes are committed in groups by a few writer
//! tasks ([`writer`]); a claim that a counting guard must check keeps its
//! own transaction, with its advisory locks. Lookups are answered in groups
//! too ([`lookup`]). The pool is bounded; the writers and the lookup task
//! take from it one connection each, only while they run a batch, and the
//! writes that need a connection of their own take turns for the rest, so
//! no caller queues for the pool (where a wait past its acquire timeout
//! fails) however many handlers are in flight.

mod lookup;
mod writer;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{
    Claim, ClaimState, ClaimTerms, DECISION_SQL, Decision, HistoryEntry, Recorded,
    STORY_ATTEMPTS_SQL, STORY_DECISIONS_SQL, Store, StoreError, Story, Switch, Timestamp,
    USAGE_SQL, claim_decision, decide_claim, duration_of, payload_excerpt, switch_from,
    usage_binds, usage_from,
};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::safety::limits::Usage;

/// The stores' shared statements, with PostgreSQL's `$n` for SQLite's `?n`.
fn pg(sql: &'static str) -> &'static str {
    static CONVERTED: std::sync::LazyLock<std::collections::HashMap<&'static str, String>> =
        std::sync::LazyLock::new(|| {
            [
                USAGE_SQL,
                DECISION_SQL,
                super::DEFERRAL_SQL,
                super::GROUP_RESTARTS_SQL,
                super::GROUP_DISRUPTED_SQL,
                STORY_ATTEMPTS_SQL,
                STORY_DECISIONS_SQL,
            ]
            .into_iter()
            .map(|sql| (sql, sql.replace('?', "$")))
            .collect()
        });
    // Every shared statement is listed above; the contract tests run each.
    CONVERTED
        .get(sql)
        .unwrap_or_else(|| panic!("shared statement not converted for PostgreSQL: {sql}"))
}

/// Writer tasks when none is asked for: two commit about half again as
/// much as one on a loaded 2-core machine (docs/benchmarks.md), and more
/// only add contention for the rows and the pool.
pub const DEFAULT_WRITERS: u32 = 2;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// To the writer tasks.
    writes: mpsc::Sender<writer::Write>,
    /// To the lookup task.
    lookups: mpsc::Sender<lookup::Lookup>,
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
}

impl PostgresStore {
    /// Connects to `url` (`postgres://…`) with at most `max_connections`
    /// connections and [`DEFAULT_WRITERS`] writers, and brings the schema
    /// up to date.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(url, max_connections, DEFAULT_WRITERS).await
    }

    /// As [`PostgresStore::connect`], with `writers` writer tasks. Each
    /// holds a pooled connection only while it commits, and at least one
    /// connection is left to the reads and the guarded claims, so there are
    /// never more than `max_connections - 1` writers (but at least one).
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        writers: u32,
    ) -> Result<Self, StoreError> {
        let max_connections = max_connections.max(1);
        // Every statement planned for its own arrays and the table as it is
        // now: a generic plan cached while the table was small scans all of
        // it once it is large (the batches' statements take arrays).
        let options =
            PgConnectOptions::from_str(url)?.options([("plan_cache_mode", "force_custom_plan")]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
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
            ));
        }
        let (lookups, lookup_receiver) = mpsc::channel(lookup::MAX_BATCH * 4);
        tasks.spawn(lookup::lookup_loop(
            pool.clone(),
            lookup_receiver,
            closing.clone(),
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
        })
    }

    /// Waits for a turn to take a pooled connection; see `direct`.
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        self.direct.acquire().await.map_err(|_| StoreError::Closed)
    }

    /// Queues a write for the writers and waits until its batch committed.
    async fn call<T>(
        &self,
        write: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> writer::Write,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(write(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// A claim in its own transaction: the counting guards take advisory
    /// locks (global, group, host) that a batch must not interleave.
    async fn claim_alone(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
    ) -> Result<Claim, StoreError> {
        let now = Timestamp::now().as_millis();
        let id = request.message_id.to_string();
        let _turn = self.turn().await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO requests
                 (message_id, instance_name, hostname, requested_by, reason, status,
                  attempts, received_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, 'received', 0, $6, $6)
             ON CONFLICT (message_id) DO NOTHING",
        )
        .bind(&id)
        .bind(request.instance_name.as_str())
        .bind(request.hostname.as_str())
        .bind(request.requested_by.as_deref())
        .bind(request.reason.as_deref())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        // The row lock serialises claims of one request across instances.
        let (status, claimed, claim_until): (String, i32, Option<i64>) = sqlx::query_as(
            "SELECT status, attempts, claim_until FROM requests
             WHERE message_id = $1 FOR UPDATE",
        )
        .bind(&id)
        .fetch_one(&mut *tx)
        .await?;
        let state = ClaimState {
            status: status_from_name(&status)?,
            attempts: u32::try_from(claimed).unwrap_or(0),
            claim_until,
        };
        // A share lock: `set_switch` waits for claims in progress, and every
        // claim after it sees the switch as it left it.
        let (paused, by, why, since): (bool, Option<String>, Option<String>, i64) = sqlx::query_as(
            "SELECT paused, by_whom, reason, updated_at FROM control WHERE id = 1 FOR SHARE",
        )
        .fetch_one(&mut *tx)
        .await?;
        let switch = switch_from(paused, by, why, since);
        let usage = if terms.limits.is_active() && !switch.paused {
            // Serialise the claims that count against the same limits, on
            // every instance: global (when a global limit is set), then the
            // group, then the host; always in that order, so no two claims
            // wait for each other. Transaction-scoped advisory locks: no
            // table to keep, released by the commit.
            let mut keys = Vec::with_capacity(3);
            if terms.limits.global_max.is_some() {
                keys.push("mandrill:global".to_owned());
            }
            keys.push(format!("mandrill:group:{}", request.group()));
            keys.push(format!("mandrill:host:{}", request.instance_name));
            for key in keys {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
            }
            let (window_start, memory_start) = usage_binds(&terms.limits, now);
            let row = sqlx::query_as(pg(USAGE_SQL))
                .bind(request.group())
                .bind(request.instance_name.as_str())
                .bind(window_start)
                .bind(memory_start)
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
            usage_from(row)
        } else {
            Usage::default()
        };
        let (claim, write) = decide_claim(request, Some(state), &switch, now, terms, &usage);
        if let Some(decision) = claim_decision(&claim) {
            insert_decision(&mut tx, request.message_id, 0, decision, now).await?;
        }
        if let Some(write) = write {
            sqlx::query(
                "INSERT INTO restarts
                     (message_id, attempt, instance_name, grp, claimed_at, verdict)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (message_id, attempt) DO UPDATE SET
                     claimed_at = excluded.claimed_at, verdict = excluded.verdict,
                     outcome = NULL, settled_at = NULL",
            )
            .bind(&id)
            .bind(attempts(write.attempts))
            .bind(request.instance_name.as_str())
            .bind(request.group())
            .bind(now)
            .bind(&write.verdict)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE requests SET status = 'received', attempts = $2, claim_until = $3,
                     last_error = COALESCE($4, last_error), updated_at = $5
                 WHERE message_id = $1",
            )
            .bind(&id)
            .bind(attempts(write.attempts))
            .bind(write.claim_until)
            .bind(write.last_error)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(claim)
    }
}

fn status_from_name(name: &str) -> Result<Status, StoreError> {
    Status::from_name(name).ok_or_else(|| StoreError::Corrupt(format!("status {name:?}")))
}

fn entry_from_row(row: &PgRow) -> Result<HistoryEntry, StoreError> {
    let message_id: Option<String> = row.try_get("message_id")?;
    Ok(HistoryEntry {
        message_id: message_id
            .map(|id| {
                Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("message_id {id:?}")))
            })
            .transpose()?,
        instance_name: row.try_get("instance_name")?,
        hostname: row.try_get("hostname")?,
        status: status_from_name(row.try_get("status")?)?,
        attempts: row
            .try_get::<i32, _>("attempts")?
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

fn attempts(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}

#[async_trait]
impl Store for PostgresStore {
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
        if terms.limits.is_active() {
            return self.claim_alone(request, terms).await;
        }
        let request = request.clone();
        self.call(|reply| writer::Write::Claim {
            request,
            terms,
            reply,
        })
        .await
    }

    async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let _turn = self.turn().await?;
        let mut tx = self.pool.begin().await?;
        let released = sqlx::query(
            "UPDATE requests SET attempts = attempts - 1, claim_until = NULL, updated_at = $3
             WHERE message_id = $1 AND attempts = $2 AND $2 > 0 AND claim_until IS NOT NULL
               AND status IN ('received', 'retrying')
             RETURNING 1",
        )
        .bind(request.message_id.to_string())
        .bind(attempts(attempt))
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
        if released {
            sqlx::query(
                "DELETE FROM restarts WHERE message_id = $1 AND attempt = $2 AND outcome IS NULL",
            )
            .bind(request.message_id.to_string())
            .bind(attempts(attempt))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<(), StoreError> {
        let _turn = self.turn().await?;
        let mut tx = self.pool.begin().await?;
        let now = Timestamp::now().as_millis();
        insert_decision(&mut tx, request.message_id, attempt, decision, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, super::GroupUsage>, StoreError> {
        let restarts = sqlx::query_as(pg(super::GROUP_RESTARTS_SQL))
            .bind(window_start.as_millis())
            .fetch_all(&self.pool)
            .await?;
        let disrupted = sqlx::query_as(pg(super::GROUP_DISRUPTED_SQL))
            .bind(memory_start.as_millis())
            .fetch_all(&self.pool)
            .await?;
        Ok(super::group_usage_from(restarts, disrupted))
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        let count: Option<i32> =
            sqlx::query_scalar("SELECT count FROM deferrals WHERE message_id = $1")
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
             FROM requests WHERE message_id = $1",
        )
        .bind(&id)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let attempts = sqlx::query_as(pg(STORY_ATTEMPTS_SQL))
            .bind(&id)
            .fetch_all(&self.pool)
            .await?;
        let decisions = sqlx::query_as(pg(STORY_DECISIONS_SQL))
            .bind(&id)
            .fetch_all(&self.pool)
            .await?;
        Ok(Some(super::story_from(
            entry_from_row(&row)?,
            attempts,
            decisions,
        )))
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let (request, outcome) = (request.clone(), outcome.clone());
        self.call(|reply| writer::Write::Outcome {
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
        let now = Timestamp::now().as_millis();
        // PostgreSQL text cannot hold NUL; the excerpt is for humans anyway.
        let excerpt = payload_excerpt(payload).replace('\0', "\u{fffd}");
        let _turn = self.turn().await?;
        sqlx::query(
            "INSERT INTO requests
                 (rejected_id, status, attempts, last_error, payload, received_at, updated_at, completed_at)
             VALUES ($1, 'rejected', 1, $2, $3, $4, $4, $4)",
        )
        .bind(message_id.map(|id| id.to_string()))
        .bind(reason.replace('\0', "\u{fffd}"))
        .bind(excerpt)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT COALESCE(message_id, rejected_id) AS message_id, instance_name, hostname,
                    requested_by, reason, status, attempts, last_error, output,
                    recovered_after_ms, received_at, updated_at, completed_at
             FROM requests ORDER BY updated_at DESC, id DESC LIMIT $1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        let (paused, by, reason, since): (bool, Option<String>, Option<String>, i64) =
            sqlx::query_as("SELECT paused, by_whom, reason, updated_at FROM control WHERE id = 1")
                .fetch_one(&self.pool)
                .await?;
        Ok(switch_from(paused, by, reason, since))
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE control SET paused = $1, by_whom = $2, reason = $3, updated_at = $4 WHERE id = 1",
        )
        .bind(paused)
        .bind(by.replace('\0', "\u{fffd}"))
        .bind(reason.replace('\0', "\u{fffd}"))
        .bind(Timestamp::now().as_millis())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        // The rows are locked in id order first, as the writers lock them,
        // so that a pass and a batch never wait for each other in a cycle.
        let mut tx = self.pool.begin().await?;
        let doomed: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM requests WHERE id IN (
                 SELECT id FROM requests WHERE completed_at < $1
                 ORDER BY completed_at LIMIT $2)
             ORDER BY message_id FOR UPDATE",
        )
        .bind(before.as_millis())
        .bind(i64::from(max_rows))
        .fetch_all(&mut *tx)
        .await?;
        let deleted = sqlx::query("DELETE FROM requests WHERE id = ANY($1)")
            .bind(&doomed)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        // The journal and decisions of what is gone, and journal rows older
        // than the retention (the counting guards look back far less).
        sqlx::query(
            "DELETE FROM restarts r WHERE r.claimed_at < $1
                OR NOT EXISTS (SELECT 1 FROM requests q WHERE q.message_id = r.message_id)",
        )
        .bind(before.as_millis())
        .execute(&self.pool)
        .await?;
        for table in ["decisions", "deferrals"] {
            sqlx::query(&format!(
                "DELETE FROM {table} d
                 WHERE NOT EXISTS (SELECT 1 FROM requests q WHERE q.message_id = d.message_id)"
            ))
            .execute(&self.pool)
            .await?;
        }
        Ok(deleted.rows_affected())
    }

    async fn close(&self) {
        // The writers commit what is queued, then stop; a write queued
        // after that is answered `Closed`.
        self.closing.cancel();
        self.tasks.wait().await;
        self.pool.close().await;
    }
}

async fn insert_decision(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    message_id: Uuid,
    attempt: u32,
    decision: Decision<'_>,
    now: i64,
) -> Result<(), sqlx::Error> {
    if decision.verdict == "deferred" {
        sqlx::query(pg(super::DEFERRAL_SQL))
            .bind(message_id.to_string())
            .execute(&mut **tx)
            .await?;
    }
    sqlx::query(pg(DECISION_SQL))
        .bind(message_id.to_string())
        .bind(now)
        .bind(attempts(attempt))
        .bind(decision.verdict)
        .bind(decision.guard)
        .bind(decision.reason.replace('\0', "\u{fffd}"))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A throwaway PostgreSQL database for one test, dropped afterwards (one
/// copy, shared with the integration tests and the benchmark).
#[cfg(test)]
#[path = "../../../tests/services/postgres.rs"]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::testing::TestDatabase;
    use super::*;

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

    const TERMS: ClaimTerms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(3600),
        limits: crate::safety::Limits::NONE,
    };

    #[tokio::test]
    async fn concurrent_deliveries_through_the_batches_claim_and_record_once() {
        let database = TestDatabase::create().await;
        let first = PostgresStore::connect_with(&database.url, 4, 3)
            .await
            .unwrap();
        let second = PostgresStore::connect_with(&database.url, 4, 2)
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
                let claim = store.claim_restart(request, TERMS).await.unwrap();
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
        let store = PostgresStore::connect_with(&database.url, 4, 1)
            .await
            .unwrap();
        // A serialization failure: transient, and it fails the whole batch.
        sabotage_the_journal(&store, "40001", None).await;
        let requests: Vec<RestartRequest> = (0..30)
            .map(|n| contract::request(&format!("stall-{n:03}")))
            .collect();
        let claims =
            futures::future::join_all(requests.iter().map(|r| store.claim_restart(r, TERMS))).await;
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
                store.claim_restart(request, TERMS).await.unwrap(),
                Claim::Claimed {
                    attempt: 1,
                    unknown: None
                }
            );
        }
        store.close().await;
    }

    #[tokio::test]
    async fn a_write_refused_for_good_fails_only_its_own_caller() {
        let database = TestDatabase::create().await;
        let store = PostgresStore::connect_with(&database.url, 4, 1)
            .await
            .unwrap();
        let requests: Vec<RestartRequest> = (0..30)
            .map(|n| contract::request(&format!("flock-{n:03}")))
            .collect();
        let culprit = requests[7].message_id;
        // A check violation: permanent.
        sabotage_the_journal(&store, "23514", Some(culprit)).await;
        let claims =
            futures::future::join_all(requests.iter().map(|r| store.claim_restart(r, TERMS))).await;
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
        // Each handler used to take a pooled connection for its lookup, its
        // claim and its outcome: with thousands in flight and a few
        // connections, waits grew past the pool's acquire timeout. Now the
        // hot path holds one connection per writer and one for lookups.
        let database = TestDatabase::create().await;
        let store = PostgresStore::connect_with(&database.url, 32, 2)
            .await
            .unwrap();
        let requests: Vec<RestartRequest> = (0..600)
            .map(|n| contract::request(&format!("crowd-{n:04}")))
            .collect();
        let handled = futures::future::join_all(requests.iter().map(|request| {
            let store = &store;
            async move {
                assert_eq!(store.lookup(request.message_id).await.unwrap(), None);
                let Claim::Claimed { attempt, .. } =
                    store.claim_restart(request, TERMS).await.unwrap()
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
        for sql in [writer::LOCK_SQL, writer::OUTCOME_SQL] {
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
            .record_rejection(None, "payload is not valid utf-8", b"\0\xff")
            .await
            .unwrap();
        assert_eq!(store.history(1).await.unwrap()[0].status, Status::Rejected);
        store.close().await;
    }
}
