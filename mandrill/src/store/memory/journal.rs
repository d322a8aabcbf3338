//! The memory store's restart journal, decisions and deferrals: what the
//! SQL stores keep in `restarts`, `decisions` and `deferrals`, and the
//! counting guards' reads of it.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};
use uuid::Uuid;

use super::row::{Millis, Row};
use crate::domain::{RestartRequest, Status};
use crate::safety::limits::{Subject, Usage};
use crate::store::sql::NOT_ISSUED;
use crate::store::{
    AttemptRecord, ClaimTerms, ClaimToken, Decision, DecisionRecord, GroupUsage, ReportAttempt,
    Timestamp, UsageBinds, group_usage_from, usage_binds,
};

/// A shard's restart journal: one entry per claimed attempt, appended in
/// claim order (what the SQL stores keep in `restarts`). An append-only
/// list rather than a map keyed by id and attempt: a claim writes its entry
/// at the end, on pages already touched, where a map of a million entries
/// writes each into a random bucket of a table twice its size (and kept
/// one lock for every claim of every shard). A request's entries are
/// chained, newest first, from its row's `latest` link.
#[derive(Debug, Default)]
pub(super) struct Attempts {
    entries: Vec<Entry>,
}

/// An entry's place in its shard's journal, or none: a `u32`, so that a row
/// holds its link in 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Link(u32);

impl Link {
    pub(super) const NONE: Self = Self(u32::MAX);

    fn get(self) -> Option<usize> {
        (self != Self::NONE).then_some(self.0 as usize)
    }
}

#[derive(Debug)]
struct Entry {
    id: Uuid,
    attempt: u32,
    /// The request's previous entry.
    prev: Link,
    /// False once its claim was released: the SQL stores delete such a
    /// row; here it stays (out of every count) until a prune compacts.
    live: bool,
    row: JournalRow,
}

/// The decisions and deferrals of every request: written only off the hot
/// path (a refusal, a deferral), behind one lock taken after any shard.
#[derive(Debug, Default)]
pub(super) struct Decisions {
    pub(super) decisions: HashMap<Uuid, Vec<DecisionRecord>>,
    pub(super) deferrals: HashMap<Uuid, u32>,
}

/// One claimed attempt.
#[derive(Debug)]
pub(super) struct JournalRow {
    /// The instance's name, then the group's, then the request's zone and
    /// requester if it has them, in one allocation: a claim makes one of
    /// these per message.
    names: Box<str>,
    /// Where the group's name starts in `names`.
    group_at: u32,
    /// Where the zone starts, and the requester (each ends where the next
    /// starts, the requester at the end).
    zone_at: u32,
    requester_at: u32,
    /// Whether the request had a zone, a requester (an empty one is still
    /// one).
    has_zone: bool,
    has_requester: bool,
    pub(super) claimed_at: i64,
    /// What the counting guards said; empty (no allocation) without them.
    pub(super) verdict: Box<str>,
    pub(super) settled_at: Millis,
    pub(super) outcome: Option<Status>,
    /// The token of the call that claimed it.
    pub(super) token: ClaimToken,
    /// Whether its claim counted the attempt before it as issued with its
    /// outcome unknown.
    pub(super) unknown: bool,
}

impl JournalRow {
    /// An attempt of `request` claimed at `now` by the call `token`, its
    /// outcome not yet in.
    pub(super) fn claimed(
        request: &RestartRequest,
        now: i64,
        verdict: String,
        token: ClaimToken,
        unknown: bool,
    ) -> Self {
        let instance = request.instance_name.as_str();
        let group = request.group();
        let zone = request.zone.as_deref();
        let requester = request.requester.as_deref();
        let mut names = String::with_capacity(
            instance.len() + group.len() + zone.map_or(0, str::len) + requester.map_or(0, str::len),
        );
        // Names far shorter than 4 GiB: a message is at most a few KiB.
        let at = |names: &String| u32::try_from(names.len()).unwrap_or(u32::MAX);
        names.push_str(instance);
        let group_at = at(&names);
        names.push_str(group);
        let zone_at = at(&names);
        names.push_str(zone.unwrap_or_default());
        let requester_at = at(&names);
        names.push_str(requester.unwrap_or_default());
        Self {
            names: names.into_boxed_str(),
            group_at,
            zone_at,
            requester_at,
            has_zone: zone.is_some(),
            has_requester: requester.is_some(),
            claimed_at: now,
            verdict: verdict.into_boxed_str(),
            settled_at: Millis::NONE,
            outcome: None,
            token,
            unknown,
        }
    }

    /// The instance restarted.
    pub(super) fn instance(&self) -> &str {
        &self.names[..self.group_at as usize]
    }

    /// The instance's group.
    pub(super) fn group(&self) -> &str {
        &self.names[self.group_at as usize..self.zone_at as usize]
    }

    /// The request's zone, if it had one.
    fn zone(&self) -> Option<&str> {
        self.has_zone
            .then(|| &self.names[self.zone_at as usize..self.requester_at as usize])
    }

    /// The request's requester, if it had one.
    pub(super) fn requester(&self) -> Option<&str> {
        self.has_requester
            .then(|| &self.names[self.requester_at as usize..])
    }
}

/// Whether an attempt that ended so issued a restart (or may have): the
/// in-memory form of the rule in [`crate::store::USAGE_SQL`].
fn issued(outcome: Option<Status>) -> bool {
    !outcome.is_some_and(|status| NOT_ISSUED.contains(&status))
}

/// Whether a host whose latest attempt is `row` still counts as
/// disrupted: in flight or ended without a verified recovery, or ended
/// `restarted` after `settled_after` (see [`crate::store::UsageBinds`]).
/// The in-memory form of the rule in [`crate::store::USAGE_SQL`].
fn is_disrupting(row: &JournalRow, settled_after: i64) -> bool {
    match row.outcome {
        Some(Status::Restarted) => row.settled_at.get().is_some_and(|at| at > settled_after),
        outcome => issued(outcome),
    }
}

impl Attempts {
    /// Room for `attempts` entries before the list grows.
    pub(super) fn with_capacity(attempts: usize) -> Self {
        Self {
            entries: Vec::with_capacity(attempts),
        }
    }

    /// Appends a claimed attempt of the request whose newest entry is
    /// `latest`; returns the link to it, the request's newest now.
    pub(super) fn push(&mut self, id: Uuid, attempt: u32, latest: Link, row: JournalRow) -> Link {
        let link = Link(u32::try_from(self.entries.len()).expect("fewer than 2^32 attempts"));
        assert!(link != Link::NONE, "fewer than 2^32 - 1 attempts");
        self.entries.push(Entry {
            id,
            attempt,
            prev: latest,
            live: true,
            row,
        });
        link
    }

    /// The live entry of `attempt` in the chain from `latest`, if any. (At
    /// most one is live: an attempt is claimed again only after its claim
    /// was released, which marks its entry dead.)
    pub(super) fn find_mut(&mut self, latest: Link, attempt: u32) -> Option<&mut JournalRow> {
        let mut at = latest.get();
        while let Some(i) = at {
            let entry = &self.entries[i];
            if entry.live && entry.attempt == attempt {
                return Some(&mut self.entries[i].row);
            }
            at = entry.prev.get();
        }
        None
    }

    /// Takes the claim of `attempt` back out of the journal if its outcome
    /// is not in: what the SQL stores' release deletes.
    pub(super) fn release(&mut self, latest: Link, attempt: u32) {
        let mut at = latest.get();
        while let Some(i) = at {
            let entry = &mut self.entries[i];
            if entry.live && entry.attempt == attempt {
                if entry.row.outcome.is_none() {
                    entry.live = false;
                }
                return;
            }
            at = entry.prev.get();
        }
    }

    /// Moves every settled entry's end `by` milliseconds (tests: a settle
    /// that has passed).
    #[cfg(test)]
    pub(super) fn shift_settled(&mut self, by: i64) {
        for entry in &mut self.entries {
            if let Some(at) = entry.row.settled_at.get() {
                entry.row.settled_at = Some(at + by).into();
            }
        }
    }

    /// Moves every entry's claim `by` milliseconds (tests: a claim stamped
    /// by a clock ahead of the reader's).
    #[cfg(test)]
    pub(super) fn shift(&mut self, by: i64) {
        for entry in &mut self.entries {
            entry.row.claimed_at += by;
        }
    }

    /// The live entries.
    fn rows(&self) -> impl Iterator<Item = &JournalRow> {
        self.entries
            .iter()
            .filter(|entry| entry.live)
            .map(|entry| &entry.row)
    }

    /// The verified restarts of `group` among these entries, as
    /// [`crate::store::sql::RECOVERIES_SQL`] reads them: each one's claim
    /// time, and its recovery time from its request's row (`None`:
    /// unrecovered). `rows` are this shard's.
    pub(super) fn recoveries<'a>(
        &'a self,
        rows: &'a HashMap<Uuid, Row>,
        group: &'a str,
    ) -> impl Iterator<Item = (i64, Option<std::time::Duration>)> + 'a {
        self.entries
            .iter()
            .filter(move |entry| entry.live && entry.row.group() == group)
            .filter_map(move |entry| match entry.row.outcome {
                Some(Status::Unrecovered) => Some((entry.row.claimed_at, None)),
                Some(Status::Restarted) => {
                    let after = rows.get(&entry.id)?.extra.as_ref()?.recovered_after?;
                    Some((entry.row.claimed_at, Some(after)))
                }
                _ => None,
            })
    }

    /// A request's attempts, oldest first.
    pub(super) fn attempts_of(&self, latest: Link) -> Vec<AttemptRecord> {
        let mut attempts = Vec::new();
        let mut at = latest.get();
        while let Some(i) = at {
            let entry = &self.entries[i];
            if entry.live {
                let row = &entry.row;
                attempts.push(AttemptRecord {
                    attempt: entry.attempt,
                    group: row.group().to_owned(),
                    claimed_at: Timestamp::from_millis(row.claimed_at),
                    verdict: row.verdict.to_string(),
                    outcome: row.outcome,
                    settled_at: row.settled_at.get().map(Timestamp::from_millis),
                });
            }
            at = entry.prev.get();
        }
        attempts.sort_by_key(|a| a.attempt);
        attempts
    }

    /// The live entries claimed at `since` or later, for
    /// [`crate::store::Store::report`], with what their rows (`rows`) add
    /// as the SQL stores' join does.
    pub(super) fn report(&self, rows: &HashMap<Uuid, Row>, since: i64) -> Vec<ReportAttempt> {
        self.entries
            .iter()
            .filter(|entry| entry.live && entry.row.claimed_at >= since)
            .map(|entry| {
                let row = &entry.row;
                let request = rows.get(&entry.id);
                let extra = request.and_then(|r| r.extra.as_deref());
                let latest = request.is_some_and(|r| r.attempts == entry.attempt);
                ReportAttempt {
                    message_id: entry.id,
                    attempt: entry.attempt,
                    instance_name: row.instance().to_owned(),
                    group: row.group().to_owned(),
                    requester: row
                        .requester()
                        .or_else(|| extra.and_then(|e| e.requested_by.as_deref()))
                        .map(str::to_owned),
                    claimed_at: Timestamp::from_millis(row.claimed_at),
                    outcome: row.outcome,
                    settled_at: row.settled_at.get().map(Timestamp::from_millis),
                    recovered_after: extra.filter(|_| latest).and_then(|e| e.recovered_after),
                    last_error: extra
                        .filter(|_| latest)
                        .and_then(|e| e.last_error.as_deref())
                        .map(str::to_owned),
                }
            })
            .collect()
    }

    /// What a prune leaves: the live entries of requests still in `rows`
    /// claimed at `before` or later (as the SQL stores' cleanup), each
    /// request's chain linked anew from its row.
    pub(super) fn compact(&mut self, rows: &mut HashMap<Uuid, Row>, before: i64) {
        self.entries.retain(|entry| {
            entry.live && entry.row.claimed_at >= before && rows.contains_key(&entry.id)
        });
        for row in rows.values_mut() {
            row.latest = Link::NONE;
        }
        for (at, entry) in self.entries.iter_mut().enumerate() {
            let row = rows
                .get_mut(&entry.id)
                .expect("an entry is kept only with its row");
            entry.prev = row.latest;
            row.latest = Link(u32::try_from(at).expect("fewer than 2^32 attempts"));
        }
    }
}

/// What [`crate::store::USAGE_SQL`] reads, from every shard's journal (the
/// caller holds every shard's lock, so that the count and the claim that
/// follows it are atomic).
pub(super) fn usage<'a>(
    journals: impl Iterator<Item = &'a Attempts>,
    request: &RestartRequest,
    terms: &ClaimTerms,
    now: i64,
) -> Usage {
    let UsageBinds {
        window_start,
        memory_start,
        settled_after,
        requester_start,
    } = usage_binds(&terms.limits, now);
    let group = request.group();
    let instance = request.instance_name.as_str();
    // Only what the limits use, as the SQL stores read it.
    let subject = Subject::of(request);
    let zone = subject.zone.filter(|_| terms.limits.counts_zone(subject));
    let requester = subject
        .requester
        .filter(|_| terms.limits.counts_requester(subject));
    let mut usage = Usage::default();
    let mut latest: HashMap<&str, &JournalRow> = HashMap::new();
    for row in journals.flat_map(Attempts::rows) {
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
        // Every claim of the host, even one stamped after `now` (see
        // `USAGE_SQL`).
        if row.instance() == instance {
            usage.host_last = usage.host_last.max(Some(row.claimed_at));
        }
        if requester.is_some() && row.claimed_at > requester_start && row.requester() == requester {
            usage.requester_claims += 1;
            usage.requester_oldest = Some(
                usage
                    .requester_oldest
                    .map_or(row.claimed_at, |o: i64| o.min(row.claimed_at)),
            );
        }
    }
    for row in latest.values() {
        if row.instance() == instance
            || row.claimed_at <= memory_start
            || !is_disrupting(row, settled_after)
        {
            continue;
        }
        if row.group() == group {
            usage.disrupted = usage.disrupted.saturating_add(1);
        }
        if zone.is_some() && row.zone() == zone {
            usage.zone_disrupted = usage.zone_disrupted.saturating_add(1);
        }
    }
    usage
}

/// Each group's use of its limits, as the SQL stores' `GROUP_*_SQL` count
/// it, from every shard's journal.
pub(super) fn group_usage<'a>(
    journals: impl Iterator<Item = &'a Attempts>,
    window_start: Timestamp,
    memory_start: Timestamp,
) -> BTreeMap<String, GroupUsage> {
    let mut restarts: HashMap<String, i64> = HashMap::new();
    let mut latest: HashMap<&str, &JournalRow> = HashMap::new();
    for row in journals.flat_map(Attempts::rows) {
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
        // The settle is the claims' (as `GROUP_DISRUPTED_SQL`, which has
        // none): `i64::MAX`, no restarted host counts.
        if row.claimed_at > memory_start.as_millis() && is_disrupting(row, i64::MAX) {
            *disrupted.entry(row.group().to_owned()).or_default() += 1;
        }
    }
    group_usage_from(
        restarts.into_iter().collect(),
        disrupted.into_iter().collect(),
    )
}

impl Decisions {
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
}
