//! Durations as human-readable strings (`500ms`, `10s`, `2m`), for
//! `#[serde(with = "crate::settings::duration")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Longest duration of any setting: far beyond any useful value, and
/// short enough that adding it to a clock reading, or counting it in
/// milliseconds, never overflows.
pub(crate) const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// Serialises as e.g. `10s`.
pub(crate) fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&humantime::format_duration(*value))
}

/// Parses e.g. `10s`, `1m 30s`, `250ms`.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e})")))
}

/// The same, for optional durations.
pub(crate) mod option {
    use super::*;

    /// Serialises `Some` as e.g. `10s`.
    pub(crate) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::serialize(value, serializer),
            None => serializer.serialize_none(),
        }
    }

    /// Parses e.g. `10s`.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::deserialize(deserializer).map(Some)
    }
}
