//! Points in time as the service records them: shown as RFC 3339, stored
//! as milliseconds since the Unix epoch.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

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
