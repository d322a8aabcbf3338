//! The embedded default store: SQLite through sqlx, in WAL mode with
//! `synchronous = FULL`, so that a recorded outcome survives power loss.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use uuid::Uuid;

use super::{HistoryEntry, Recorded, Store, StoreError, Timestamp, payload_excerpt};
use crate::domain::{Outcome, RestartRequest, Status};

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite:PATH`, or
    /// `sqlite::memory:`) and brings its schema up to date.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self { pool })
    }
}

const FINAL_STATUSES: &str = "('restarted', 'failed', 'rejected')";

fn entry_from_row(row: &SqliteRow) -> Result<HistoryEntry, StoreError> {
    let status: String = row.try_get("status")?;
    let message_id: Option<String> = row.try_get("message_id")?;
    Ok(HistoryEntry {
        message_id: message_id
            .map(|id| Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("message_id {id:?}"))))
            .transpose()?,
        instance_name: row.try_get("instance_name")?,
        hostname: row.try_get("hostname")?,
        status: Status::from_name(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("status {status:?}")))?,
        attempts: row.try_get::<i64, _>("attempts")?.try_into().unwrap_or(u32::MAX),
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
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM requests WHERE message_id = ?1")
                .bind(message_id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        status
            .map(|s| Status::from_name(&s).ok_or_else(|| StoreError::Corrupt(format!("status {s:?}"))))
            .transpose()
    }

    async fn record_received(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        let now = Timestamp::now().as_millis();
        sqlx::query(&format!(
            "INSERT INTO requests
                 (message_id, instance_name, hostname, requested_by, reason, status,
                  attempts, received_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'received', ?6, ?7, ?7)
             ON CONFLICT (message_id) DO UPDATE SET
                 attempts = max(requests.attempts, excluded.attempts),
                 updated_at = excluded.updated_at,
                 status = CASE WHEN requests.status IN {FINAL_STATUSES}
                               THEN requests.status ELSE 'received' END"
        ))
        .bind(request.message_id.to_string())
        .bind(request.instance_name.as_str())
        .bind(request.hostname.as_str())
        .bind(request.requested_by.as_deref())
        .bind(request.reason.as_deref())
        .bind(i64::from(attempt))
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        let now = Timestamp::now().as_millis();
        let status = outcome.status();
        let completed_at = status.is_final().then_some(now);
        // One statement, so that two deliveries of the same message (or two
        // instances) cannot both record a first final outcome.
        let updated: Option<String> = sqlx::query_scalar(&format!(
            "INSERT INTO requests
                 (message_id, instance_name, hostname, requested_by, reason, status,
                  attempts, last_error, received_at, updated_at, completed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)
             ON CONFLICT (message_id) DO UPDATE SET
                 status = excluded.status,
                 attempts = max(requests.attempts, excluded.attempts),
                 last_error = excluded.last_error,
                 updated_at = excluded.updated_at,
                 completed_at = excluded.completed_at
             WHERE requests.status NOT IN {FINAL_STATUSES}
             RETURNING status"
        ))
        .bind(request.message_id.to_string())
        .bind(request.instance_name.as_str())
        .bind(request.hostname.as_str())
        .bind(request.requested_by.as_deref())
        .bind(request.reason.as_deref())
        .bind(status.as_str())
        .bind(i64::from(attempt))
        .bind(outcome.error())
        .bind(now)
        .bind(completed_at)
        .fetch_optional(&self.pool)
        .await?;
        if updated.is_some() {
            return Ok(Recorded::Recorded);
        }
        let existing = self.lookup(request.message_id).await?.ok_or_else(|| {
            StoreError::Corrupt(format!("request {} vanished", request.message_id))
        })?;
        Ok(Recorded::AlreadyFinal(existing))
    }

    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        let now = Timestamp::now().as_millis();
        sqlx::query(
            "INSERT INTO requests
                 (message_id, status, attempts, last_error, payload, received_at, updated_at, completed_at)
             VALUES (?1, 'rejected', 1, ?2, ?3, ?4, ?4, ?4)
             ON CONFLICT (message_id) DO NOTHING",
        )
        .bind(message_id.map(|id| id.to_string()))
        .bind(reason)
        .bind(payload_excerpt(payload))
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
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
        self.pool.close().await;
    }
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
