//! The memory store's rows and its clock.

use uuid::Uuid;

use super::journal::Link;
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
    /// Reads `wall` now, then advances with tokio's clock.
    #[cfg(test)]
    pub(super) fn at(wall: i64) -> Self {
        Self {
            wall_at_start: wall,
            start: tokio::time::Instant::now(),
        }
    }

    pub(super) fn now(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.wall_at_start.saturating_add(elapsed)
    }
}

/// A moment in milliseconds, or none: an `Option<i64>` in 8 bytes rather
/// than 16 (`i64::MIN`, which no clock reading is, stands for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Millis(i64);

impl Millis {
    pub(super) const NONE: Self = Self(i64::MIN);

    pub(super) fn get(self) -> Option<i64> {
        (self != Self::NONE).then_some(self.0)
    }
}

impl From<Option<i64>> for Millis {
    fn from(millis: Option<i64>) -> Self {
        millis.map_or(Self::NONE, Self)
    }
}

/// One request as the memory store keeps it: 72 bytes, as the benchmark
/// holds a row per message (the rarely set fields are boxed in `extra`,
/// optional times are [`Millis`]).
#[derive(Debug)]
pub(super) struct Row {
    /// `None` for rejected payloads.
    pub(super) hostname: Option<Box<str>>,
    /// The rarely set fields, boxed together.
    pub(super) extra: Option<Box<Extra>>,
    pub(super) received_at: i64,
    pub(super) updated_at: i64,
    /// When the hold of the last claim expires; none once its outcome is in.
    pub(super) claim_until: Millis,
    pub(super) completed_at: Millis,
    pub(super) attempts: u32,
    /// Its newest attempt in its shard's journal.
    pub(super) latest: Link,
    pub(super) status: Status,
}

/// What few requests carry (the benchmark's all do: a `requested_by`).
/// Boxed strings, 16 bytes each rather than a `String`'s 24: 80 bytes.
#[derive(Debug, Default)]
pub(super) struct Extra {
    pub(super) last_error: Option<Box<str>>,
    pub(super) requested_by: Option<Box<str>>,
    pub(super) reason: Option<Box<str>>,
    pub(super) output: Option<Box<str>>,
    pub(super) recovered_after: Option<std::time::Duration>,
}

impl Row {
    pub(super) fn new(hostname: Option<&str>, status: Status, now: i64) -> Self {
        Self {
            hostname: hostname.map(Box::from),
            extra: None,
            received_at: now,
            updated_at: now,
            claim_until: Millis::NONE,
            completed_at: Millis::NONE,
            attempts: 0,
            latest: Link::NONE,
            status,
        }
    }

    /// Sets the last error, keeping the other rare fields; allocates their
    /// box only for an error.
    pub(super) fn set_last_error(&mut self, error: Option<Box<str>>) {
        match (&mut self.extra, error) {
            (Some(extra), error) => extra.last_error = error,
            (None, None) => {}
            (extra @ None, error) => {
                *extra = Some(Box::new(Extra {
                    last_error: error,
                    ..Extra::default()
                }));
            }
        }
    }

    pub(super) fn entry(&self, message_id: Option<Uuid>) -> HistoryEntry {
        let extra = self.extra.as_deref();
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
            requested_by: extra.and_then(|e| e.requested_by.as_deref().map(str::to_owned)),
            reason: extra.and_then(|e| e.reason.as_deref().map(str::to_owned)),
            last_error: extra.and_then(|e| e.last_error.as_deref().map(str::to_owned)),
            output: extra.and_then(|e| e.output.as_deref().map(str::to_owned)),
            recovered_after: extra.and_then(|e| e.recovered_after),
            received_at: Timestamp::from_millis(self.received_at),
            updated_at: Timestamp::from_millis(self.updated_at),
            completed_at: self.completed_at.get().map(Timestamp::from_millis),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_stays_compact() {
        assert!(std::mem::size_of::<Row>() <= 72);
        assert!(std::mem::size_of::<Extra>() <= 80);
    }

    #[test]
    fn setting_the_last_error_keeps_the_other_rare_fields() {
        let mut row = Row::new(Some("cattle-0001.example.com"), Status::Received, 0);
        row.set_last_error(None);
        assert!(row.extra.is_none(), "no error, no box");
        row.set_last_error(Some("boom".into()));
        row.extra.as_mut().unwrap().reason = Some("why".into());
        row.set_last_error(None);
        let entry = row.entry(None);
        assert_eq!(
            (entry.last_error, entry.reason.as_deref()),
            (None, Some("why"))
        );
    }
}
