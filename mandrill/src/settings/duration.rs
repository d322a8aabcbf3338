//! Durations as human-readable strings (`500ms`, `10s`, `2m`), for
//! `#[serde(with = "crate::settings::duration")]`; and as people read them
//! in a sentence: a window after "per" ([`per`]: `day`, `2 hours`) and the
//! count beside it ([`count`]: `1 restart`, `2 restarts`).

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

/// Parses e.g. `10s`, `1m 30s`, `250ms`; refuses one longer than [`MAX`],
/// whatever its key, so that no setting (one a validation forgot among
/// them) can overflow a clock when it is added to one.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    at_most(deserializer, MAX, "365 days")
}

fn at_most<'de, D: Deserializer<'de>>(
    deserializer: D,
    max: Duration,
    shown: &str,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    let value = humantime::parse_duration(&text)
        .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e})")))?;
    if value > max {
        return Err(serde::de::Error::custom(format!(
            "{text:?} is longer than {shown}"
        )));
    }
    Ok(value)
}

/// The same for the one setting measured in years, `store.retention`: at
/// most 100 years, so that "now minus retention" never overflows.
pub(crate) mod long {
    use super::*;

    /// Longest `store.retention`.
    pub(crate) const MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    pub(crate) use super::serialize;

    /// Parses e.g. `90days`, at most 100 years.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        at_most(deserializer, MAX, "100 years")
    }
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

/// A window as people read it after "per": `day`, `hour`, `2 hours`,
/// `90 seconds`; a window that is no whole number of one unit as it is
/// configured (`1h 30m`). `1day` read as "per 1day" was the writer's
/// format, not a reader's.
pub(crate) fn per(window: Duration) -> String {
    const UNITS: [(u64, &str); 5] = [
        (7 * 24 * 3600, "week"),
        (24 * 3600, "day"),
        (3600, "hour"),
        (60, "minute"),
        (1, "second"),
    ];
    let seconds = window.as_secs();
    if window.subsec_nanos() == 0 && seconds > 0 {
        for (size, unit) in UNITS {
            if seconds.is_multiple_of(size) {
                return match seconds / size {
                    1 => unit.to_owned(),
                    n => format!("{n} {unit}s"),
                };
            }
        }
    }
    humantime::format_duration(window).to_string()
}

/// `count` of `noun` as people write it: `1 restart`, `2 restarts`.
pub(crate) fn count(count: impl Into<u64>, noun: &str) -> String {
    match count.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_counts_read_as_people_write_them() {
        let per_each = |seconds: u64| per(Duration::from_secs(seconds));
        assert_eq!(per_each(24 * 3600), "day");
        assert_eq!(per_each(3600), "hour");
        assert_eq!(per_each(2 * 3600), "2 hours");
        assert_eq!(per_each(14 * 24 * 3600), "2 weeks");
        assert_eq!(per_each(90), "90 seconds");
        assert_eq!(per_each(5400), "90 minutes");
        assert_eq!(per(Duration::from_millis(1500)), "1s 500ms");
        assert_eq!(count(1u32, "restart"), "1 restart");
        assert_eq!(count(0u32, "restart"), "0 restarts");
        assert_eq!(count(5u32, "host"), "5 hosts");
    }
}
