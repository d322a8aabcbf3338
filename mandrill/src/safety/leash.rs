//! The leash: whether restarts are issued or only recorded as dry runs.
//!
//! Two words decide it, in this order (docs/safety.md, "The leash"):
//!
//! 1. the leash an operator turned in the store (`mandrill leash`,
//!    `mandrill unleash --reason`, the admin API), a [`LeashRecord`] every
//!    instance sharing the store obeys; each claim reads it in its own
//!    transaction, beside the kill switch;
//! 2. while no operator has turned it, the instance's own: `safety.dry_run`
//!    from its start-up layers (the file, the environment, `--unleash`;
//!    unset, leashed with a real backend), changed by a reload only when
//!    the file's own `safety.dry_run` changed ([`reloaded_dry_run`]).
//!
//! Pure: the store reads and writes the record, the worker and the admin
//! server ask [`leashed`] and [`Leash::of`].

use serde::Serialize;

use crate::domain::Timestamp;

/// The leash as an operator last turned it in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LeashRecord {
    /// Restarts are recorded as dry runs, none issued.
    pub leashed: bool,
    /// Who turned it.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When.
    pub since: Timestamp,
}

/// The one rule: the store's record when an operator turned the leash
/// (`record`, as the claim read it), else the instance's own (`own`,
/// `Policy::dry_run`).
pub(crate) fn leashed(record: Option<bool>, own: bool) -> bool {
    record.unwrap_or(own)
}

/// Where an instance's mode comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LeashFrom {
    /// The store's record: every instance sharing the store obeys it.
    Store,
    /// This instance's own start-up layers or reload, while no operator
    /// has turned the leash in the store.
    Instance,
}

/// Whether a running service is leashed, since when, by whom or what, and
/// why: what `/api/status` and `mandrill status` tell an operator, who must
/// not have to guess it from the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Leash {
    /// Restarts are recorded as dry runs, none issued.
    pub(crate) leashed: bool,
    /// When it became so.
    pub(crate) since: Timestamp,
    /// Who or what made it so: the operator who turned it in the store,
    /// else the start-up layer that set `safety.dry_run`, or a reload.
    pub(crate) by: String,
    /// Why, as the operator said; `None` for this instance's own.
    pub(crate) reason: Option<String>,
    /// Where it comes from.
    pub(crate) from: LeashFrom,
}

impl Leash {
    /// The mode in force: `record` if an operator turned the leash in the
    /// store, else the instance's `own`.
    pub(crate) fn of(own: &Leash, record: Option<&LeashRecord>) -> Leash {
        match record {
            Some(record) => Leash {
                leashed: record.leashed,
                since: record.since,
                by: record.by.clone(),
                reason: Some(record.reason.clone()),
                from: LeashFrom::Store,
            },
            None => own.clone(),
        }
    }

    /// In words: `LEASHED by ana (game day over) since …, recorded in the
    /// store`.
    pub(crate) fn describe(&self) -> String {
        let mode = if self.leashed { "LEASHED" } else { "UNLEASHED" };
        let why = self
            .reason
            .as_deref()
            .map_or_else(String::new, |reason| format!(" ({reason})"));
        let from = match self.from {
            LeashFrom::Store => "recorded in the store: every instance sharing it obeys",
            LeashFrom::Instance => {
                "this instance's own: no operator has turned the leash in the store"
            }
        };
        format!("{mode} by {}{why} since {}, {from}", self.by, self.since)
    }
}

/// What a reload does with `safety.dry_run`: `file_before` and `file_now`
/// are the values the file (with the environment) said at the last
/// applied configuration and now, `running` the value in force. The
/// running value stays unless the file's own changed; then the file's new
/// value wins, over a start-up flag too (`None`: the backend's default).
/// A routine reload (another key edited) never turns the leash.
pub(crate) fn reloaded_dry_run(
    file_before: Option<bool>,
    file_now: Option<bool>,
    running: Option<bool>,
) -> Option<bool> {
    if file_before == file_now {
        running
    } else {
        file_now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stores_record_decides_and_the_instances_own_only_without_one() {
        assert!(leashed(Some(true), false));
        assert!(!leashed(Some(false), true));
        assert!(leashed(None, true));
        assert!(!leashed(None, false));
        let own = Leash {
            leashed: true,
            since: Timestamp::from_millis(1),
            by: "the configuration file at start-up".into(),
            reason: None,
            from: LeashFrom::Instance,
        };
        assert_eq!(Leash::of(&own, None), own);
        let record = LeashRecord {
            leashed: false,
            by: "ana".into(),
            reason: "game day".into(),
            since: Timestamp::from_millis(2),
        };
        let by_store = Leash::of(&own, Some(&record));
        assert!(!by_store.leashed);
        assert_eq!(by_store.from, LeashFrom::Store);
        assert!(
            by_store
                .describe()
                .starts_with("UNLEASHED by ana (game day) since "),
            "{}",
            by_store.describe()
        );
    }

    /// The trap of issue 37: a file that keeps `dry_run = true` under
    /// `--unleash`, reloaded for another key, must not leash the service;
    /// only a change of the file's own value turns it.
    #[test]
    fn a_reload_turns_the_leash_only_when_the_files_own_value_changed() {
        // `dry_run = true` in the file, `--unleash` at start: false runs.
        assert_eq!(
            reloaded_dry_run(Some(true), Some(true), Some(false)),
            Some(false)
        );
        assert_eq!(reloaded_dry_run(None, None, Some(false)), Some(false));
        // The file's own value changed: it wins, over the flag too.
        assert_eq!(reloaded_dry_run(None, Some(true), Some(false)), Some(true));
        assert_eq!(
            reloaded_dry_run(Some(true), Some(false), Some(true)),
            Some(false)
        );
        // Taken out of the file: the backend's default again.
        assert_eq!(reloaded_dry_run(Some(false), None, Some(false)), None);
    }
}
