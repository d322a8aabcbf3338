//! The memory store's rows and its clock.

use uuid::Uuid;

use crate::domain::Status;
use crate::store::{HistoryEntry, Timestamp};

/// The wall clock at creation, advanced by tokio's clock: the same as the
/// wall clock in a running service, and paused with the rest of a test that
/// pauses time, so that claim holds expire in step with leases there.
#[derive(Debug)]
pub(super) struct Clock {
    wall_at_start: i64,
    start: tokio::time::Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            wall_at_start: Timestamp::now().as_millis(),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock {
    pub(super) fn now(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.wall_at_start.saturating_add(elapsed)
    }
}

/// One request as the memory store keeps it.
#[derive(Debug)]
pub(super) struct Row {
    /// `None` for rejected payloads.
    pub(super) hostname: Option<Box<str>>,
    pub(super) status: Status,
    pub(super) attempts: u32,
    /// When the hold of the last claim expires; `None` once its outcome is in.
    pub(super) claim_until: Option<i64>,
    pub(super) last_error: Option<Box<str>>,
    /// The rarely set fields, boxed together: the benchmark holds a row per
    /// message.
    pub(super) extra: Option<Box<Extra>>,
    pub(super) received_at: i64,
    pub(super) updated_at: i64,
    pub(super) completed_at: Option<i64>,
}

/// What few requests carry.
#[derive(Debug, Default)]
pub(super) struct Extra {
    pub(super) requested_by: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) output: Option<String>,
    pub(super) recovered_after: Option<std::time::Duration>,
}

impl Row {
    pub(super) fn new(hostname: Option<&str>, status: Status, now: i64) -> Self {
        Self {
            hostname: hostname.map(Box::from),
            status,
            attempts: 0,
            claim_until: None,
            last_error: None,
            extra: None,
            received_at: now,
            updated_at: now,
            completed_at: None,
        }
    }

    pub(super) fn entry(&self, message_id: Option<Uuid>) -> HistoryEntry {
        HistoryEntry {
            message_id,
            instance_name: self
                .hostname
                .as_deref()
                .and_then(|host| host.split('.').next())
                .map(str::to_owned),
            hostname: self.hostname.as_deref().map(str::to_owned),
            status: self.status,
            attempts: self.attempts,
            requested_by: self.extra.as_ref().and_then(|e| e.requested_by.clone()),
            reason: self.extra.as_ref().and_then(|e| e.reason.clone()),
            last_error: self.last_error.as_deref().map(str::to_owned),
            output: self.extra.as_ref().and_then(|e| e.output.clone()),
            recovered_after: self.extra.as_ref().and_then(|e| e.recovered_after),
            received_at: Timestamp::from_millis(self.received_at),
            updated_at: Timestamp::from_millis(self.updated_at),
            completed_at: self.completed_at.map(Timestamp::from_millis),
        }
    }
}
