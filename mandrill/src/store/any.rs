//! [`AnyStore`]: the store the worker holds, dispatched statically.
//!
//! [`Store`] is an `#[async_trait]`, so every call through `dyn Store` boxes
//! its future: an allocation per claim and per outcome. The
//! worker's hot calls go through this enum instead: a `match`, then the
//! adapter's own unboxed `async fn`. Cold calls (history, story, prune, the
//! switch) go through the trait, boxing; so does [`Other`], for
//! test fakes and wrappers.
//!
//! The SQL stores' writes are boxed here all the same, for now: each
//! waits on its writer with the write (a cloned request) held across the
//! channel's send, a future of 1–2 KB. Inline, the enum's future would be
//! that large whichever store is in use, and every in-flight message's
//! handler holds it; boxed, they cost what the trait object did, and only
//! the memory store's calls (a hundred bytes) run unboxed.
//!
//! [`Other`]: AnyStore::Other

use std::any::Any;
use std::sync::Arc;

use uuid::Uuid;

use super::{
    Claim, ClaimTerms, ClaimToken, MemoryStore, PostgresStore, Recorded, SqliteStore, Store,
    StoreError, Switch, Timestamp,
};
use crate::domain::{Outcome, RestartRequest, Status};
use crate::sqlite::JointAck;

/// One of the stores this crate has, or any other behind `dyn Store`.
#[derive(Clone)]
pub enum AnyStore {
    /// The in-process store.
    Memory(Arc<MemoryStore>),
    /// A SQLite file.
    Sqlite(Arc<SqliteStore>),
    /// A PostgreSQL database.
    Postgres(Arc<PostgresStore>),
    /// Anything else (test fakes, wrappers): called through the trait, its
    /// futures boxed.
    Other(Arc<dyn Store>),
}

impl AnyStore {
    /// The same store as a trait object, for the callers that take one (the
    /// admin server, the CLI, the companions): no second indirection.
    pub fn as_dyn(&self) -> Arc<dyn Store> {
        match self {
            Self::Memory(store) => store.clone(),
            Self::Sqlite(store) => store.clone(),
            Self::Postgres(store) => store.clone(),
            Self::Other(store) => store.clone(),
        }
    }

    /// The trait object, borrowed, for the cold calls.
    fn store(&self) -> &dyn Store {
        match self {
            Self::Memory(store) => &**store,
            Self::Sqlite(store) => &**store,
            Self::Postgres(store) => &**store,
            Self::Other(store) => &**store,
        }
    }

    /// As [`Store::lookup`]. The SQL stores' lookups are boxed as their
    /// writes are: each holds its deadline's timer (`store.timeout`), some
    /// 700 bytes, which inline would be in every waiting handler.
    pub async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        match self {
            Self::Memory(store) => store.lookup(message_id).await,
            Self::Sqlite(store) => {
                let call = Box::pin(store.lookup(message_id));
                call.await
            }
            Self::Postgres(store) => {
                let call = Box::pin(store.lookup(message_id));
                call.await
            }
            Self::Other(store) => store.lookup(message_id).await,
        }
    }

    /// As [`Store::claim_restart`], with the terms borrowed: they are 112
    /// bytes, and a future holds what it is given by value for as long as it
    /// runs (this one's and the memory store's both, in every handler
    /// waiting on a claim).
    pub async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: &ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        match self {
            Self::Memory(store) => store.claim_restart(request, *terms, token).await,
            Self::Sqlite(store) => {
                let call = Box::pin(store.claim_restart(request, *terms, token));
                call.await
            }
            Self::Postgres(store) => {
                let call = Box::pin(store.claim_restart(request, *terms, token));
                call.await
            }
            Self::Other(store) => store.claim_restart(request, *terms, token).await,
        }
    }

    /// As [`Store::record_outcome`].
    pub async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        match self {
            Self::Memory(store) => store.record_outcome(request, attempt, outcome).await,
            Self::Sqlite(store) => {
                let call = Box::pin(store.record_outcome(request, attempt, outcome));
                call.await
            }
            Self::Postgres(store) => {
                let call = Box::pin(store.record_outcome(request, attempt, outcome));
                call.await
            }
            Self::Other(store) => store.record_outcome(request, attempt, outcome).await,
        }
    }

    /// As [`Store::record_outcome_acking`].
    pub async fn record_outcome_acking(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        match self {
            // Neither can commit an ack: the trait's default, unboxed.
            Self::Memory(store) => Ok((
                store.record_outcome(request, attempt, outcome).await?,
                false,
            )),
            Self::Postgres(store) => {
                let call = Box::pin(store.record_outcome(request, attempt, outcome));
                Ok((call.await?, false))
            }
            Self::Sqlite(store) => {
                let call = Box::pin(store.record_outcome_acking(request, attempt, outcome, ack));
                call.await
            }
            Self::Other(store) => {
                store
                    .record_outcome_acking(request, attempt, outcome, ack)
                    .await
            }
        }
    }

    /// As [`Store::release_claim`].
    pub async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        match self {
            Self::Memory(store) => store.release_claim(request, attempt).await,
            Self::Sqlite(store) => {
                let call = Box::pin(store.release_claim(request, attempt));
                call.await
            }
            Self::Postgres(store) => {
                let call = Box::pin(store.release_claim(request, attempt));
                call.await
            }
            Self::Other(store) => store.release_claim(request, attempt).await,
        }
    }

    /// As [`Store::record_decision`]; boxed (a refusal, not the hot path).
    pub async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: super::Decision<'_>,
    ) -> Result<(), StoreError> {
        self.store()
            .record_decision(request, attempt, decision)
            .await
    }

    /// As [`Store::record_rejection`]; boxed (a malformed payload).
    pub async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError> {
        self.store()
            .record_rejection(message_id, reason, payload)
            .await
    }

    /// As [`Store::deferrals`]; boxed (only for redeliveries).
    pub async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        self.store().deferrals(message_id).await
    }

    /// As [`Store::first_received`]; boxed (only for deferrals of requests
    /// whose `published_at` cannot date them).
    pub async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        self.store().first_received(request).await
    }

    /// As [`Store::report`]; boxed (`mandrill report`).
    pub async fn report(&self, since: Timestamp) -> Result<super::ReportData, StoreError> {
        self.store().report(since).await
    }

    /// As [`Store::group_pauses`]; boxed (read right before a restart,
    /// only when stop conditions ran).
    pub async fn group_pauses(&self) -> Result<Vec<super::GroupPause>, StoreError> {
        self.store().group_pauses().await
    }

    /// As [`Store::switch`]; boxed (read once a poll interval, and once
    /// before each restart issued).
    pub async fn switch(&self) -> Result<Switch, StoreError> {
        self.store().switch().await
    }

    /// As [`Store::set_switch`]; boxed (a stop condition tripped).
    pub async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        self.store().set_switch(paused, by, reason).await
    }

    /// As [`Store::set_switch_if`]; boxed (the pause file).
    pub async fn set_switch_if(
        &self,
        expected: super::SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        self.store()
            .set_switch_if(expected, paused, by, reason)
            .await
    }

    /// As [`Store::close`].
    pub async fn close(&self) {
        self.store().close().await;
    }
}

/// The typed variant for this crate's stores, [`AnyStore::Other`] for any
/// other: a caller passes its `Arc` and gets static dispatch where there is
/// one. (A `TypeId` check once, when the worker is built.)
impl<S: Store> From<Arc<S>> for AnyStore {
    fn from(store: Arc<S>) -> Self {
        let any: Arc<dyn Any + Send + Sync> = store.clone();
        if let Ok(memory) = any.clone().downcast::<MemoryStore>() {
            return Self::Memory(memory);
        }
        if let Ok(sqlite) = any.clone().downcast::<SqliteStore>() {
            return Self::Sqlite(sqlite);
        }
        if let Ok(postgres) = any.downcast::<PostgresStore>() {
            return Self::Postgres(postgres);
        }
        Self::Other(store)
    }
}

impl From<Arc<dyn Store>> for AnyStore {
    fn from(store: Arc<dyn Store>) -> Self {
        Self::Other(store)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::testing::request;

    fn size<T>(_: &T) -> usize {
        std::mem::size_of::<T>()
    }

    /// Every in-flight message's handler holds the largest of these (the
    /// enum's future is as large as its largest variant's): an unboxed SQL
    /// store's write (1–2 KB) would more than double it.
    #[tokio::test]
    async fn any_stores_futures_stay_small_whichever_store_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let sqlite = AnyStore::from(Arc::new(SqliteStore::connect(&url, 2).await.unwrap()));
        assert!(matches!(sqlite, AnyStore::Sqlite(_)));
        let request = request("cattle-0001");
        let terms = ClaimTerms {
            max_attempts: 3,
            hold: Duration::from_secs(1),
            limits: crate::safety::Limits::NONE,
        };
        let outcome = Outcome::restarted();
        let sizes = [
            size(&sqlite.claim_restart(&request, &terms, ClaimToken::new())),
            size(&sqlite.record_outcome(&request, 1, &outcome)),
            size(&sqlite.record_outcome_acking(&request, 1, &outcome, None)),
            size(&sqlite.release_claim(&request, 1)),
            size(&sqlite.lookup(request.message_id)),
        ];
        // Debug build: 64, 64, 128, 48, 64 bytes (a claim taking its terms
        // by value was 272; a SQL store's lookup unboxed, with its
        // deadline's timer, 968).
        assert!(sizes.iter().all(|&size| size <= 320), "{sizes:?}");
    }
}
