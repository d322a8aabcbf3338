//! What a store recorded, read from outside the crate: the integration
//! tests check the binary's work through it. The store is opened as
//! `mandrill history --db URL` opens it, and only read: nothing outside the
//! crate writes a store but the service.

use std::sync::Arc;

use uuid::Uuid;

use super::open_store;
use crate::config::StoreSettings;
use crate::domain::Timestamp;
use crate::store::{HistoryEntry, ReportData, Store, Story};

/// A store opened to read what was recorded.
pub struct Records(Arc<dyn Store>);

impl Records {
    /// Opens the store at `url` (`sqlite:PATH` or `postgres://…`) with
    /// `[store]`'s defaults.
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let settings = StoreSettings {
            url: url.to_owned(),
            ..StoreSettings::default()
        };
        Ok(Self(open_store(&settings).await?))
    }

    /// The newest `limit` entries, newest first.
    pub async fn history(&self, limit: usize) -> anyhow::Result<Vec<HistoryEntry>> {
        Ok(self.0.history(limit).await?)
    }

    /// One request's story: its record and the guards' decisions.
    pub async fn story(&self, message_id: Uuid) -> anyhow::Result<Option<Story>> {
        Ok(self.0.story(message_id).await?)
    }

    /// The report's rows since `since`.
    pub async fn report(&self, since: Timestamp) -> anyhow::Result<ReportData> {
        Ok(self.0.report(since).await?)
    }

    /// Closes the store's connections.
    pub async fn close(self) {
        self.0.close().await;
    }
}
