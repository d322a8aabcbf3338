//! An in-process store, for tests with paused time and for the pipeline
//! benchmark. Nothing survives the process.
//!
//! Rows are kept compact (the instance name is derived from the hostname,
//! times are milliseconds) because the benchmark holds one per message
//! (`row.rs`); the journal the counting guards read is in `journal.rs`,
//! each shard keeping its own requests' attempts beside their rows.
//! Maps hash with foldhash, not SipHash: they are hit on every message, and
//! their keys are random ids.

mod hot;
mod journal;
mod row;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use foldhash::{HashMap, HashMapExt};
use uuid::Uuid;

use self::journal::{Attempts, Decisions};
use self::row::{Clock, Row};
use super::{
    Claim, ClaimTerms, ClaimToken, Decision, GroupPause, GroupUsage, HistoryEntry, Recorded,
    ReportAttempt, ReportData, ReportDecision, Store, StoreError, Story, Switch, SwitchExpected,
    Timestamp,
};
use crate::domain::{Outcome, RestartRequest, Status};

/// Independent shards, so that handlers on different threads rarely wait
/// for each other.
const SHARDS: usize = 16;

/// See the module docs.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// Rows and their attempts, sharded by id. A `std::sync::Mutex`:
    /// critical sections are short and never await. Whoever locks more
    /// than one shard at once locks them in index order.
    shards: [Mutex<Shard>; SHARDS],
    /// Rejected payloads, with the id salvaged from them if any. Kept
    /// apart: a rejection never counts as the record of a request.
    rejected: Mutex<Vec<(Option<Uuid>, Row)>>,
    /// Its notion of now.
    clock: Clock,
    /// The kill switch.
    switch: Mutex<Switch>,
    /// `switch.paused`, written under its lock: a claim reads this flag and
    /// locks (and clones) the switch only when it is set.
    paused: AtomicBool,
    /// The group pauses.
    group_pauses: Mutex<Vec<GroupPause>>,
    /// Whether `group_pauses` has any, written under its lock: a claim
    /// locks them only when it is set.
    groups_paused: AtomicBool,
    /// The decisions and deferrals. Locked after a shard, never before.
    decisions: Mutex<Decisions>,
    /// The hosts some request's claim holds, sharded by the host's name:
    /// what a claim of another request for the same host must find. Locked
    /// after the request's shard (or every shard), before the decisions.
    held: [Mutex<HeldHosts>; SHARDS],
    /// Campaigns by id, as the SQL stores' rows (times to the millisecond).
    campaigns: Mutex<HashMap<Uuid, super::campaigns::CampaignRow>>,
}

/// Instance name → the claim that holds it; an entry is removed when that
/// claim's outcome is recorded or its claim given back, and replaced by the
/// next claim once its hold is over (a handler that died records nothing).
type HeldHosts = HashMap<Box<str>, crate::safety::limits::HostHold>;

/// One shard: its requests' rows, and the journal of their attempts. A
/// claim without counting guards locks its request's shard alone; with
/// them it locks every shard (in order), so that what they count and the
/// claim they allow are one atomic step, as in the SQL stores' claim
/// transaction.
#[derive(Debug, Default)]
struct Shard {
    rows: HashMap<Uuid, Row>,
    attempts: Attempts,
}

type ShardGuard<'a> = std::sync::MutexGuard<'a, Shard>;

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose clock reads `wall` (milliseconds since the
    /// epoch) now and advances with tokio's: tests whose guards' clock
    /// follows tokio from a fixed instant read the same time here.
    #[cfg(test)]
    pub(crate) fn with_clock_at(wall: i64) -> Self {
        Self {
            clock: Clock::at(wall),
            ..Self::default()
        }
    }

    /// An empty store with room for `requests` requests before it grows.
    pub fn with_capacity(requests: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| {
                // Random ids fill the shards unevenly (by a few standard
                // deviations, ~sqrt(n / SHARDS)): an eighth more room keeps
                // every shard's list from doubling, a copy of its whole
                // length, near the end of a run.
                let share = requests / SHARDS;
                Mutex::new(Shard {
                    rows: HashMap::with_capacity(share + share / 8 + 16),
                    attempts: Attempts::with_capacity(share + share / 8 + 16),
                })
            }),
            rejected: Mutex::default(),
            clock: Clock::default(),
            switch: Mutex::default(),
            paused: AtomicBool::new(false),
            group_pauses: Mutex::default(),
            groups_paused: AtomicBool::new(false),
            decisions: Mutex::default(),
            held: Default::default(),
            campaigns: Mutex::default(),
        }
    }

    fn decisions(&self) -> std::sync::MutexGuard<'_, Decisions> {
        self.decisions
            .lock()
            .expect("memory store decisions poisoned")
    }

    /// Every entry recorded with a message id.
    pub fn entries(&self) -> Vec<HistoryEntry> {
        (0..SHARDS)
            .flat_map(|n| {
                let shard = self.shards[n].lock().expect("memory store shard poisoned");
                shard
                    .rows
                    .iter()
                    .map(|(id, row)| row.entry(Some(*id)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The shard of `id`: the last byte is random in version 4 and version 7
    /// UUIDs (the ones mandrill mints), so it spreads ids evenly.
    fn shard_of(id: &Uuid) -> usize {
        usize::from(id.as_bytes()[15]) % SHARDS
    }

    fn shard(&self, id: &Uuid) -> ShardGuard<'_> {
        // No critical section here can panic halfway through an update.
        self.shards[Self::shard_of(id)]
            .lock()
            .expect("memory store shard poisoned")
    }

    /// The held hosts of `instance`'s shard. The shard is picked by a
    /// fixed hash: every claim of the host must find the same one.
    fn held(&self, instance: &str) -> std::sync::MutexGuard<'_, HeldHosts> {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::with_seed(0).hash_one(instance);
        // The low bits of a 64-bit hash: the remainder fits any usize.
        let shard = usize::try_from(hash % SHARDS as u64).unwrap_or(0);
        self.held[shard]
            .lock()
            .expect("memory store held hosts poisoned")
    }

    /// Every shard, locked in order.
    fn all_shards(&self) -> Vec<ShardGuard<'_>> {
        self.shards
            .iter()
            .map(|shard| shard.lock().expect("memory store shard poisoned"))
            .collect()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError> {
        MemoryStore::lookup(self, message_id).await
    }

    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        MemoryStore::claim_restart(self, request, terms, token).await
    }

    async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
    ) -> Result<(), StoreError> {
        MemoryStore::release_claim(self, request, attempt).await
    }

    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError> {
        MemoryStore::record_outcome(self, request, attempt, outcome).await
    }

    async fn record_rejection(
        &self,
        message_id: Option<Uuid>,
        reason: &str,
        _payload: &[u8],
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut row = Row::new(None, Status::Rejected, now);
        row.attempts = 1;
        row.set_last_error(Some(Box::from(reason)));
        row.completed_at = Some(now).into();
        self.rejected
            .lock()
            .expect("memory store poisoned")
            .push((message_id, row));
        Ok(())
    }

    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError> {
        let mut entries = self.entries();
        entries.extend(
            self.rejected
                .lock()
                .expect("memory store poisoned")
                .iter()
                .map(|(id, row)| row.entry(*id)),
        );
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.updated_at));
        entries.truncate(limit);
        Ok(entries)
    }

    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        self.decisions()
            .decide(request.message_id, attempt, decision, now);
        Ok(())
    }

    async fn group_usage(
        &self,
        window_start: Timestamp,
        memory_start: Timestamp,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError> {
        let shards = self.all_shards();
        Ok(journal::group_usage(
            shards.iter().map(|shard| &shard.attempts),
            window_start,
            memory_start,
        ))
    }

    async fn report(&self, since: Timestamp) -> Result<ReportData, StoreError> {
        let since = since.as_millis();
        let shards = self.all_shards();
        let mut attempts: Vec<ReportAttempt> = shards
            .iter()
            .flat_map(|shard| shard.attempts.report(&shard.rows, since))
            .collect();
        attempts.sort_by_key(|a| (a.claimed_at, a.message_id, a.attempt));
        let mut decisions = Vec::new();
        for (id, list) in &self.decisions().decisions {
            let shard = &shards[Self::shard_of(id)];
            let row = shard.rows.get(id);
            let entry = row.map(|row| row.entry(Some(*id)));
            let group = row
                .and_then(|row| shard.attempts.attempts_of(row.latest).pop())
                .map(|attempt| attempt.group);
            for decision in list.iter().filter(|d| d.at.as_millis() >= since) {
                decisions.push(ReportDecision {
                    message_id: *id,
                    at: decision.at,
                    verdict: decision.verdict.clone(),
                    guard: decision.guard.clone(),
                    reason: decision.reason.clone(),
                    instance_name: entry.as_ref().and_then(|e| e.instance_name.clone()),
                    group: group.clone(),
                    requested_by: entry.as_ref().and_then(|e| e.requested_by.clone()),
                });
            }
        }
        // Recorded in order per request; across requests, by time (the
        // SQL stores' insertion order breaks ties there, the id here).
        decisions.sort_by_key(|d| (d.at, d.message_id));
        let mut campaigns = self
            .campaigns
            .lock()
            .expect("memory store campaigns poisoned")
            .values()
            .filter(|row| row.2 >= since)
            .cloned()
            .map(super::Campaign::from_row)
            .collect::<Result<Vec<_>, _>>()?;
        campaigns.sort_by_key(|c| (c.created_at, c.id));
        Ok(ReportData {
            attempts,
            decisions,
            campaigns,
        })
    }

    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError> {
        Ok(self
            .decisions()
            .deferrals
            .get(&message_id)
            .copied()
            .unwrap_or(0))
    }

    async fn record_campaign(&self, campaign: &super::Campaign) -> Result<(), StoreError> {
        let mut campaigns = self
            .campaigns
            .lock()
            .expect("memory store campaigns poisoned");
        if campaigns.contains_key(&campaign.id) {
            return Err(StoreError::Corrupt(format!(
                "campaign {} is recorded already",
                campaign.id
            )));
        }
        campaigns.insert(campaign.id, campaign.to_row());
        Ok(())
    }

    async fn decisions(&self, message_id: Uuid) -> Result<Vec<super::DecisionRecord>, StoreError> {
        Ok(self
            .decisions()
            .decisions
            .get(&message_id)
            .cloned()
            .unwrap_or_default())
    }

    async fn campaign(&self, id: Uuid) -> Result<Option<super::Campaign>, StoreError> {
        let row = self
            .campaigns
            .lock()
            .expect("memory store campaigns poisoned")
            .get(&id)
            .cloned();
        row.map(super::Campaign::from_row).transpose()
    }

    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError> {
        let (entry, attempts) = {
            let shard = self.shard(&message_id);
            let Some(row) = shard.rows.get(&message_id) else {
                return Ok(None);
            };
            (
                row.entry(Some(message_id)),
                shard.attempts.attempts_of(row.latest),
            )
        };
        let decisions = self
            .decisions()
            .decisions
            .get(&message_id)
            .cloned()
            .unwrap_or_default();
        Ok(Some(Story {
            entry,
            attempts,
            decisions,
        }))
    }

    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError> {
        let now = self.clock.now();
        let mut shard = self.shard(&request.message_id);
        let row = shard
            .rows
            .entry(request.message_id)
            .or_insert_with(|| Row::new(Some(request.hostname.as_str()), Status::Received, now));
        Ok(Timestamp::from_millis(row.received_at))
    }

    async fn switch(&self) -> Result<Switch, StoreError> {
        Ok(self.switch.lock().expect("memory store poisoned").clone())
    }

    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        let mut switch = self.switch.lock().expect("memory store poisoned");
        // Before the lock is released, so that once this returns every claim
        // sees it.
        self.paused.store(paused, Ordering::Release);
        *switch = Switch {
            paused,
            by: Some(by.to_owned()),
            reason: Some(reason.to_owned()),
            since: Some(Timestamp::from_millis(self.clock.now())),
        };
        Ok(())
    }

    async fn set_switch_if(
        &self,
        expected: SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut switch = self.switch.lock().expect("memory store poisoned");
        let found = match expected {
            SwitchExpected::Running => !switch.paused,
            SwitchExpected::PausedBy(name) => switch.paused && switch.by.as_deref() == Some(name),
        };
        if found {
            self.paused.store(paused, Ordering::Release);
            *switch = Switch {
                paused,
                by: Some(by.to_owned()),
                reason: Some(reason.to_owned()),
                since: Some(Timestamp::from_millis(self.clock.now())),
            };
        }
        Ok(found)
    }

    async fn group_pauses(&self) -> Result<Vec<GroupPause>, StoreError> {
        let mut pauses = self
            .group_pauses
            .lock()
            .expect("memory store poisoned")
            .clone();
        pauses.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(pauses)
    }

    async fn set_group_pause(
        &self,
        group: &str,
        pause: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        let mut pauses = self.group_pauses.lock().expect("memory store poisoned");
        let found = pauses.iter().position(|paused| paused.group == group);
        let changed = match (pause, found) {
            (Some((by, reason)), None) => {
                pauses.push(GroupPause {
                    group: group.to_owned(),
                    by: by.to_owned(),
                    reason: reason.to_owned(),
                    since: Timestamp::from_millis(self.clock.now()),
                });
                true
            }
            (None, Some(at)) => {
                pauses.swap_remove(at);
                true
            }
            _ => false,
        };
        // Before the lock is released, as `set_switch`.
        self.groups_paused
            .store(!pauses.is_empty(), Ordering::Release);
        Ok(changed)
    }

    async fn recent_recoveries(
        &self,
        group: &str,
        limit: u32,
    ) -> Result<Vec<Option<std::time::Duration>>, StoreError> {
        let mut found: Vec<(i64, Option<std::time::Duration>)> = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().expect("memory store shard poisoned");
            found.extend(shard.attempts.recoveries(&shard.rows, group));
        }
        found.sort_by_key(|(claimed_at, _)| std::cmp::Reverse(*claimed_at));
        Ok(found
            .into_iter()
            .take(limit as usize)
            .map(|(_, after)| after)
            .collect())
    }

    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError> {
        let before = before.as_millis();
        let budget = u64::from(max_rows);
        let mut removed = 0;
        let mut keep = |row: &Row| {
            let old = row.completed_at.get().is_some_and(|at| at < before);
            if old && removed < budget {
                removed += 1;
                false
            } else {
                true
            }
        };
        self.rejected
            .lock()
            .expect("memory store poisoned")
            .retain(|(_, row)| keep(row));
        let mut gone = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.lock().expect("memory store shard poisoned");
            let Shard { rows, attempts } = &mut *shard;
            rows.retain(|id, row| {
                keep(row) || {
                    gone.push(*id);
                    false
                }
            });
            attempts.compact(rows, before);
        }
        let mut decisions = self.decisions();
        for id in &gone {
            decisions.decisions.remove(id);
            decisions.deferrals.remove(id);
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
