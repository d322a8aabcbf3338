//! Recovery objectives (`[[recovery_objective]]`, docs/operating.md): per
//! group, how fast its restarted hosts must come back, judged over its
//! latest verified restarts. Pure: the store gives the samples
//! (`Store::recent_recoveries`), [`judge`] the verdict; the
//! service's companion (`service/objectives.rs`) pauses a breached group
//! when told to.
//!
//! The percentile is the nearest rank: with `n` samples sorted, the
//! `p`-th percentile is the one of rank `ceil(p / 100 * n)`, an observed
//! recovery time, never an interpolation. A host that never came back
//! (`unrecovered`) is a sample of infinite recovery time: it sorts last,
//! and a percentile that reaches it breaches any objective.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::settings;

/// The most restarts one objective may be judged over.
pub(crate) const MAX_OVER_LAST: u32 = 10_000;

settings! {
    /// One `[[recovery_objective]]`.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct RecoveryObjective {
        /// The group judged (the inventory's, or `safety.groups`').
        pub group: String = String::new(),
        /// Which percentile of its recovery times must stay within `max`
        /// (1–100; nearest rank).
        pub percentile: u32 = 95,
        /// The objective: the longest that percentile may be, e.g. "2m".
        #[serde(with = "crate::settings::duration")]
        pub max: Duration = Duration::ZERO,
        /// How many of the group's latest verified restarts are judged
        /// (an unrecovered host counts, as never back).
        pub over_last: u32 = 20,
        /// Pause the group's restarts when the objective is breached, until
        /// `mandrill resume --group` (never by itself).
        pub pause_on_breach: bool = false,
    }
}

/// Checks what types cannot: `(key, why)`, the key as
/// `recovery_objective[N].field`.
pub(crate) fn validate(objectives: &[RecoveryObjective]) -> Result<(), (String, String)> {
    for (index, objective) in objectives.iter().enumerate() {
        let at = |key: &str| format!("recovery_objective[{index}].{key}");
        if objective.group.trim().is_empty() {
            return Err((at("group"), "must name a group".to_owned()));
        }
        if objectives[..index]
            .iter()
            .any(|other| other.group == objective.group)
        {
            return Err((
                at("group"),
                format!("{:?} has an objective already", objective.group),
            ));
        }
        if !(1..=100).contains(&objective.percentile) {
            return Err((at("percentile"), "must be between 1 and 100".to_owned()));
        }
        if objective.max.is_zero() {
            return Err((
                at("max"),
                "must be set and more than zero, e.g. \"2m\"".to_owned(),
            ));
        }
        if !(1..=MAX_OVER_LAST).contains(&objective.over_last) {
            return Err((
                at("over_last"),
                format!("must be between 1 and {MAX_OVER_LAST}"),
            ));
        }
    }
    Ok(())
}

/// A recovery time as judged: how long, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Recovery {
    /// Back after this long.
    After(Duration),
    /// Never back (`unrecovered`): longer than any objective.
    Never,
}

impl Recovery {
    /// Seconds, infinite for [`Recovery::Never`] (as Prometheus writes it:
    /// `+Inf`).
    pub(crate) fn seconds(self) -> f64 {
        match self {
            Self::After(after) => after.as_secs_f64(),
            Self::Never => f64::INFINITY,
        }
    }
}

impl std::fmt::Display for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::After(after) => write!(f, "{:.1}s", after.as_secs_f64()),
            Self::Never => f.write_str("unrecovered"),
        }
    }
}

impl Serialize for Recovery {
    /// Seconds, or `"unrecovered"`: JSON has no infinity.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::After(after) => serializer.serialize_f64(after.as_secs_f64()),
            Self::Never => serializer.serialize_str("unrecovered"),
        }
    }
}

/// An objective judged over its samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Judged {
    /// The group.
    pub group: String,
    /// The percentile judged.
    pub percentile: u32,
    /// The objective, in seconds.
    #[serde(serialize_with = "seconds")]
    pub max: Duration,
    /// Restarts judged (at most `over_last`).
    pub samples: usize,
    /// Of them, hosts that never came back.
    pub unrecovered: usize,
    /// The median, if there is any sample.
    pub p50: Option<Recovery>,
    /// The objective's percentile, if there is any sample.
    pub at_percentile: Option<Recovery>,
    /// Whether the objective is met; `None` with no sample (no verdict).
    pub met: Option<bool>,
}

fn seconds<S: serde::Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(value.as_secs_f64())
}

impl Judged {
    /// Breached: judged, and not met.
    pub(crate) fn breached(&self) -> bool {
        self.met == Some(false)
    }

    /// The verdict in words, for a log line, a pause's cause and `status`.
    pub(crate) fn describe(&self) -> String {
        match (&self.at_percentile, self.met) {
            (Some(at), Some(met)) => format!(
                "p{} recovery {} {} objective {:.1}s over the last {} verified restarts \
                 ({} unrecovered)",
                self.percentile,
                at,
                if met { "within" } else { "exceeds" },
                self.max.as_secs_f64(),
                self.samples,
                self.unrecovered,
            ),
            _ => format!(
                "no verified restart yet (objective {:.1}s)",
                self.max.as_secs_f64()
            ),
        }
    }
}

/// The nearest-rank `percentile` (1–100) of `sorted` (ascending), if any.
pub(crate) fn nearest_rank(sorted: &[Recovery], percentile: u32) -> Option<Recovery> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // ceil(p * n / 100), at least rank 1.
    let rank = (percentile.clamp(1, 100) as usize * n).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// `objective` judged over `samples` (the store's, newest first: `None`
/// for a host that never came back); at most `over_last` are used.
pub(crate) fn judge(objective: &RecoveryObjective, samples: &[Option<Duration>]) -> Judged {
    let mut sorted: Vec<Recovery> = samples
        .iter()
        .take(objective.over_last as usize)
        .map(|sample| sample.map_or(Recovery::Never, Recovery::After))
        .collect();
    sorted.sort_unstable();
    let at_percentile = nearest_rank(&sorted, objective.percentile);
    Judged {
        group: objective.group.clone(),
        percentile: objective.percentile,
        max: objective.max,
        samples: sorted.len(),
        unrecovered: sorted.iter().filter(|r| **r == Recovery::Never).count(),
        p50: nearest_rank(&sorted, 50),
        met: at_percentile.map(|at| at <= Recovery::After(objective.max)),
        at_percentile,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objective(percentile: u32, max_secs: u64, over_last: u32) -> RecoveryObjective {
        RecoveryObjective {
            group: "web".to_owned(),
            percentile,
            max: Duration::from_secs(max_secs),
            over_last,
            pause_on_breach: true,
        }
    }

    fn secs(values: &[u64]) -> Vec<Option<Duration>> {
        values
            .iter()
            .map(|s| Some(Duration::from_secs(*s)))
            .collect()
    }

    #[test]
    fn the_percentile_is_the_nearest_rank_an_observed_value() {
        let sorted: Vec<Recovery> = (1..=20)
            .map(|s| Recovery::After(Duration::from_secs(s)))
            .collect();
        // rank ceil(0.95 * 20) = 19, ceil(0.5 * 20) = 10, ceil(0.01 * 20) = 1.
        assert_eq!(nearest_rank(&sorted, 95), Some(sorted[18]));
        assert_eq!(nearest_rank(&sorted, 50), Some(sorted[9]));
        assert_eq!(nearest_rank(&sorted, 1), Some(sorted[0]));
        assert_eq!(nearest_rank(&sorted, 100), Some(sorted[19]));
        // Three samples: p95 is rank ceil(2.85) = 3, the largest.
        assert_eq!(nearest_rank(&sorted[..3], 95), Some(sorted[2]));
        assert_eq!(nearest_rank(&[], 95), None);
    }

    #[test]
    fn an_objective_is_met_at_its_bound_and_breached_past_it() {
        let judged = judge(&objective(95, 60, 20), &secs(&[10, 20, 60]));
        assert_eq!(judged.met, Some(true));
        assert_eq!(judged.p50, Some(Recovery::After(Duration::from_secs(20))));
        let judged = judge(&objective(95, 59, 20), &secs(&[10, 20, 60]));
        assert!(judged.breached());
        assert!(
            judged.describe().contains("exceeds"),
            "{}",
            judged.describe()
        );
    }

    #[test]
    fn an_unrecovered_host_is_an_infinite_sample() {
        let mut samples = secs(&[1; 19]);
        samples.push(None);
        // 1 in 20 never back: p95 (rank 19) is still 1 s, p100 is never.
        let judged = judge(&objective(95, 60, 20), &samples);
        assert_eq!(judged.met, Some(true));
        assert_eq!(judged.unrecovered, 1);
        let judged = judge(&objective(100, 3600, 20), &samples);
        assert_eq!(judged.at_percentile, Some(Recovery::Never));
        assert!(judged.breached());
        assert_eq!(Recovery::Never.seconds(), f64::INFINITY);
    }

    #[test]
    fn only_the_latest_over_last_restarts_are_judged() {
        // Newest first: the two recent ones are fast, the old ones slow.
        let judged = judge(&objective(95, 60, 2), &secs(&[5, 6, 600, 600]));
        assert_eq!(judged.samples, 2);
        assert_eq!(judged.met, Some(true));
    }

    #[test]
    fn no_sample_no_verdict() {
        let judged = judge(&objective(95, 60, 20), &[]);
        assert_eq!(judged.met, None);
        assert!(!judged.breached());
        assert_eq!(judged.p50, None);
    }

    #[test]
    fn bad_objectives_are_refused_naming_their_key() {
        let good = objective(95, 60, 20);
        assert_eq!(validate(std::slice::from_ref(&good)), Ok(()));
        let cases = [
            (
                RecoveryObjective {
                    group: " ".into(),
                    ..good.clone()
                },
                "recovery_objective[0].group",
            ),
            (
                RecoveryObjective {
                    percentile: 0,
                    ..good.clone()
                },
                "recovery_objective[0].percentile",
            ),
            (
                RecoveryObjective {
                    percentile: 101,
                    ..good.clone()
                },
                "recovery_objective[0].percentile",
            ),
            (
                RecoveryObjective {
                    max: Duration::ZERO,
                    ..good.clone()
                },
                "recovery_objective[0].max",
            ),
            (
                RecoveryObjective {
                    over_last: 0,
                    ..good.clone()
                },
                "recovery_objective[0].over_last",
            ),
        ];
        for (bad, key) in cases {
            assert_eq!(validate(&[bad]).unwrap_err().0, key);
        }
        let twice = [good.clone(), good];
        assert_eq!(
            validate(&twice).unwrap_err().0,
            "recovery_objective[1].group"
        );
    }
}
