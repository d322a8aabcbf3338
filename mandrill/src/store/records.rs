//! What a store recorded, read from outside the crate: the integration
//! tests check the binary's work through it, as `mandrill history`,
//! `explain` and `report` read it. Reads only: nothing outside the crate
//! writes a store but the service.

use std::sync::Arc;

use uuid::Uuid;

use super::{HistoryEntry, PostgresStore, ReportData, Store, StoreError, Story};
use crate::domain::Timestamp;
use crate::sqlite::SqliteStore;

/// A store opened to read what was recorded.
pub struct Records(Arc<dyn Store>);

impl Records {
    /// Opens the store at `url` (`sqlite:PATH` or `postgres://…`) with one
    /// connection.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let store: Arc<dyn Store> = if url.starts_with("postgres") {
            Arc::new(PostgresStore::connect(url, 1).await?)
        } else {
            Arc::new(SqliteStore::connect(url, 1).await?)
        };
        Ok(Self(store))
    }

    /// The newest `limit` entries, newest first.
    pub async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        self.0.history(limit).await
    }

    /// One request's story: its record and the guards' decisions.
    pub async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        self.0.story(message_id).await
    }

    /// The report's rows since `since`.
    pub async fn report(&self, since: Timestamp) -> Result<ReportData, StoreError> {
        self.0.report(since).await
    }

    /// Closes the store's connections.
    pub async fn close(self) {
        self.0.close().await;
    }
}
