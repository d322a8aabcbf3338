//! The `Store` seam: the durable record of what was requested and what was done.
//!
//! The store, not the process, carries the guarantees: the worker acks a
//! message only after [`Store::record_outcome`] returned, and a request whose
//! outcome is final is never restarted again ([`Store::lookup`]).

pub mod memory;
pub mod postgres;
pub mod sqlite;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::Serialize;
use uuid::Uuid;

use crate::domain::{Outcome, RestartRequest, Status};

pub use memory::MemoryStore;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// What went wrong talking to a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed the operation.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not make sense (e.g. an unknown status).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A batched write failed; every operation of the batch is told, and
    /// none of it was committed.
    #[error("database write failed: {0}")]
    Write(String),
    /// A batched read failed; every lookup of the batch is told.
    #[error("database read failed: {0}")]
    Read(String),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// A fault injected on purpose (tests, benchmarks).
    #[error("injected fault: {0}")]
    Injected(String),
}

/// Whether [`Store::record_outcome`] recorded anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The outcome is now recorded.
    Recorded,
    /// A final outcome was already recorded (by an earlier delivery or
    /// another instance); it was left as it was.
    AlreadyFinal(Status),
}

/// A point in time, shown as RFC 3339 and stored as milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(SystemTime);

impl Timestamp {
    /// Now, by the wall clock.
    pub fn now() -> Self {
        Self(SystemTime::now())
    }

    /// From milliseconds since the Unix epoch.
    pub fn from_millis(millis: i64) -> Self {
        Self(UNIX_EPOCH + Duration::from_millis(millis.max(0).unsigned_abs()))
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> i64 {
        let millis = self
            .0
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        i64::try_from(millis).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.0))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One request as recorded, for `mandrill history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// The request's id; `None` for a rejected payload without a readable one.
    pub message_id: Option<Uuid>,
    /// The instance, if the request was valid.
    pub instance_name: Option<String>,
    /// The host, if the request was valid.
    pub hostname: Option<String>,
    /// Where it stands.
    pub status: Status,
    /// Deliveries that reached the worker.
    pub attempts: u32,
    /// The last error, or the rejection reason.
    pub last_error: Option<String>,
    /// First seen.
    pub received_at: Timestamp,
    /// Last changed.
    pub updated_at: Timestamp,
    /// When it became final.
    pub completed_at: Option<Timestamp>,
}

/// The durable record of requests and outcomes. See the module docs.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The recorded status of a request, if it was ever recorded.
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError>;

    /// Records that delivery `attempt` of a request was received. Never
    /// downgrades a final status.
    async fn record_received(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError>;

    /// Records the outcome of delivery `attempt`, unless a final outcome is
    /// already recorded. Creates the row if `record_received` never did.
    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError>;

    /// Records a payload that was dead-lettered as malformed.
    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError>;

    /// The most recently updated entries, newest first.
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError>;

    /// Closes connections; called once, after the last write.
    async fn close(&self) {}
}

/// How much of a rejected payload is kept for diagnosis.
pub const REJECTED_PAYLOAD_EXCERPT: usize = 1024;

/// A lossy, bounded excerpt of a rejected payload.
pub fn payload_excerpt(payload: &[u8]) -> String {
    let cut = &payload[..payload.len().min(REJECTED_PAYLOAD_EXCERPT)];
    String::from_utf8_lossy(cut).into_owned()
}

#[cfg(test)]
pub(crate) mod contract {
    //! Behaviour every `Store` must have; each implementation's tests call these.

    use super::*;
    use crate::domain::{Domain, ParseRules};

    pub fn request(instance: &str) -> RestartRequest {
        let payload = format!(
            r#"{{"message_id":"{}","instance_name":"{instance}"}}"#,
            Uuid::new_v4()
        );
        let rules = ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 1024,
        };
        RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
    }

    pub async fn final_outcome_is_never_overwritten(store: &dyn Store) {
        let request = request("cattle-0001");
        assert_eq!(store.lookup(request.message_id).await.unwrap(), None);
        store.record_received(&request, 1).await.unwrap();
        assert_eq!(
            store.lookup(request.message_id).await.unwrap(),
            Some(Status::Received)
        );
        let failed = Outcome::Retrying {
            error: "boom".into(),
        };
        assert_eq!(
            store.record_outcome(&request, 1, &failed).await.unwrap(),
            Recorded::Recorded
        );
        store.record_received(&request, 2).await.unwrap();
        assert_eq!(
            store
                .record_outcome(&request, 2, &Outcome::Restarted)
                .await
                .unwrap(),
            Recorded::Recorded
        );
        // A late duplicate neither overwrites nor downgrades the final outcome.
        store.record_received(&request, 3).await.unwrap();
        assert_eq!(
            store
                .record_outcome(&request, 3, &Outcome::Failed { error: "x".into() })
                .await
                .unwrap(),
            Recorded::AlreadyFinal(Status::Restarted)
        );
        assert_eq!(
            store.lookup(request.message_id).await.unwrap(),
            Some(Status::Restarted)
        );
        let history = store.history(10).await.unwrap();
        let entry = history
            .iter()
            .find(|e| e.message_id == Some(request.message_id))
            .unwrap();
        assert_eq!(entry.status, Status::Restarted);
        assert_eq!(entry.attempts, 3);
        assert_eq!(entry.hostname.as_deref(), Some("cattle-0001.example.net"));
        assert!(entry.completed_at.is_some());
    }

    pub async fn outcome_without_received_creates_row(store: &dyn Store) {
        let request = request("cattle-0002");
        let outcome = Outcome::Failed {
            error: "gave up".into(),
        };
        assert_eq!(
            store.record_outcome(&request, 5, &outcome).await.unwrap(),
            Recorded::Recorded
        );
        let history = store.history(10).await.unwrap();
        let entry = history
            .iter()
            .find(|e| e.message_id == Some(request.message_id))
            .unwrap();
        assert_eq!(entry.status, Status::Failed);
        assert_eq!(entry.last_error.as_deref(), Some("gave up"));
    }

    pub async fn rejections_are_listed(store: &dyn Store) {
        store
            .record_rejection(None, "payload is not a valid request", b"garbage")
            .await
            .unwrap();
        let id = Uuid::new_v4();
        store
            .record_rejection(Some(id), "instance_name \"X\" is bad", b"{}")
            .await
            .unwrap();
        let history = store.history(10).await.unwrap();
        let rejected: Vec<_> = history
            .iter()
            .filter(|e| e.status == Status::Rejected)
            .collect();
        assert_eq!(rejected.len(), 2);
        assert!(rejected.iter().any(|e| e.message_id == Some(id)));
        assert_eq!(store.lookup(id).await.unwrap(), Some(Status::Rejected));
    }
}
