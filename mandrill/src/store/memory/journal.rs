//! The memory store's restart journal, decisions and deferrals: what the
//! SQL stores keep in `restarts`, `decisions` and `deferrals`, and the
//! counting guards' reads of it.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};
use uuid::Uuid;

use super::row::Millis;
use crate::domain::{RestartRequest, Status};
use crate::safety::limits::Usage;
use crate::store::sql::NOT_ISSUED;
use crate::store::{
    AttemptRecord, ClaimTerms, Decision, DecisionRecord, GroupUsage, Timestamp, group_usage_from,
    usage_binds,
};

#[derive(Debug, Default)]
pub(super) struct Journal {
    pub(super) restarts: HashMap<(Uuid, u32), JournalRow>,
    pub(super) decisions: HashMap<Uuid, Vec<DecisionRecord>>,
    pub(super) deferrals: HashMap<Uuid, u32>,
}

/// One claimed attempt.
#[derive(Debug)]
pub(super) struct JournalRow {
    /// The instance's name, then the group's, in one allocation: a claim
    /// makes one of these per message.
    names: Box<str>,
    /// Where the group's name starts in `names`.
    group_at: u32,
    pub(super) claimed_at: i64,
    /// What the counting guards said; empty (no allocation) without them.
    pub(super) verdict: Box<str>,
    pub(super) settled_at: Millis,
    pub(super) outcome: Option<Status>,
}

impl JournalRow {
    /// An attempt claimed at `now`, its outcome not yet in.
    pub(super) fn claimed(instance: &str, group: &str, now: i64, verdict: String) -> Self {
        let mut names = String::with_capacity(instance.len() + group.len());
        names.push_str(instance);
        names.push_str(group);
        Self {
            names: names.into_boxed_str(),
            // A hostname label is at most 63 bytes.
            group_at: u32::try_from(instance.len()).unwrap_or(u32::MAX),
            claimed_at: now,
            verdict: verdict.into_boxed_str(),
            settled_at: Millis::NONE,
            outcome: None,
        }
    }

    /// The instance restarted.
    pub(super) fn instance(&self) -> &str {
        &self.names[..self.group_at as usize]
    }

    /// The instance's group.
    pub(super) fn group(&self) -> &str {
        &self.names[self.group_at as usize..]
    }
}

/// Whether an attempt that ended so issued a restart (or may have): the
/// in-memory form of the rule in [`crate::store::USAGE_SQL`].
fn issued(outcome: Option<Status>) -> bool {
    !outcome.is_some_and(|status| NOT_ISSUED.contains(&status))
}

/// Whether a host whose latest attempt ended so still counts as disrupted:
/// the in-memory form of the rule in [`crate::store::USAGE_SQL`].
fn is_disrupting(outcome: Option<Status>) -> bool {
    issued(outcome) && outcome != Some(Status::Restarted)
}

impl Journal {
    /// Room for `requests` claimed attempts before the map grows: growing a
    /// map of a million rows rehashes it while every claim waits.
    pub(super) fn with_capacity(requests: usize) -> Self {
        Self {
            restarts: HashMap::with_capacity(requests),
            ..Self::default()
        }
    }

    /// What [`crate::store::USAGE_SQL`] reads, from the rows in memory.
    pub(super) fn usage(&self, request: &RestartRequest, terms: &ClaimTerms, now: i64) -> Usage {
        let (window_start, memory_start) = usage_binds(&terms.limits, now);
        let group = request.group();
        let instance = request.instance_name.as_str();
        let mut usage = Usage::default();
        let mut latest: HashMap<&str, &JournalRow> = HashMap::new();
        for row in self.restarts.values() {
            let newest = latest.entry(row.instance()).or_insert(row);
            if row.claimed_at > newest.claimed_at {
                *newest = row;
            }
            if !issued(row.outcome) {
                continue;
            }
            if row.claimed_at > window_start {
                usage.global_claims += 1;
                usage.global_oldest = Some(
                    usage
                        .global_oldest
                        .map_or(row.claimed_at, |o: i64| o.min(row.claimed_at)),
                );
                if row.group() == group {
                    usage.group_claims += 1;
                    usage.group_oldest = Some(
                        usage
                            .group_oldest
                            .map_or(row.claimed_at, |o: i64| o.min(row.claimed_at)),
                    );
                }
            }
            if row.instance() == instance && row.claimed_at <= now {
                usage.host_last = usage.host_last.max(Some(row.claimed_at));
            }
        }
        usage.disrupted = latest
            .values()
            .filter(|row| {
                row.group() == group
                    && row.instance() != instance
                    && row.claimed_at > memory_start
                    && is_disrupting(row.outcome)
            })
            .count()
            .try_into()
            .unwrap_or(u32::MAX);
        usage
    }

    pub(super) fn decide(
        &mut self,
        message_id: Uuid,
        attempt: u32,
        decision: Decision<'_>,
        now: i64,
    ) {
        if decision.verdict == "deferred" {
            *self.deferrals.entry(message_id).or_default() += 1;
        }
        let list = self.decisions.entry(message_id).or_default();
        let repeat = list.last().is_some_and(|last| {
            last.verdict == decision.verdict
                && last.guard == decision.guard
                && last.reason == decision.reason
        });
        if !repeat && list.len() < 100 {
            list.push(DecisionRecord {
                at: Timestamp::from_millis(now),
                attempt,
                verdict: decision.verdict.to_owned(),
                guard: decision.guard.to_owned(),
                reason: decision.reason.to_owned(),
            });
        }
    }

    /// Each group's use of its limits, as the SQL stores' `GROUP_*_SQL`
    /// count it.
    pub(super) fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> BTreeMap<String, GroupUsage> {
        let mut restarts: HashMap<String, i64> = HashMap::new();
        let mut latest: HashMap<&str, &JournalRow> = HashMap::new();
        for row in self.restarts.values() {
            if row.claimed_at > window_start.as_millis() && issued(row.outcome) {
                *restarts.entry(row.group().to_owned()).or_default() += 1;
            }
            let newest = latest.entry(row.instance()).or_insert(row);
            if row.claimed_at > newest.claimed_at {
                *newest = row;
            }
        }
        let mut disrupted: HashMap<String, i64> = HashMap::new();
        for row in latest.values() {
            if row.claimed_at > memory_start.as_millis() && is_disrupting(row.outcome) {
                *disrupted.entry(row.group().to_owned()).or_default() += 1;
            }
        }
        group_usage_from(
            restarts.into_iter().collect(),
            disrupted.into_iter().collect(),
        )
    }

    /// A request's attempts, oldest first.
    pub(super) fn attempts_of(&self, message_id: Uuid) -> Vec<AttemptRecord> {
        let mut attempts: Vec<AttemptRecord> = self
            .restarts
            .iter()
            .filter(|((id, _), _)| *id == message_id)
            .map(|((_, attempt), row)| AttemptRecord {
                attempt: *attempt,
                group: row.group().to_owned(),
                claimed_at: Timestamp::from_millis(row.claimed_at),
                verdict: row.verdict.to_string(),
                outcome: row.outcome,
                settled_at: row.settled_at.get().map(Timestamp::from_millis),
            })
            .collect();
        attempts.sort_by_key(|a| a.attempt);
        attempts
    }
}
