//! The scheduler (`[[schedule]]`): mandrill choosing its own victims, as
//! Chaos Monkey does. Pure here: the plan (when each restart is due, and
//! whom it picks) is a function of a seed, the schedule, the calendar and
//! the inventory, so that every instance, at any time, computes the same
//! slots; `task.rs` is the service companion that publishes each slot as
//! one signed request, through the broker and every guard. docs/scheduling.md
//! has the model.
//!
//! Times: a Poisson process over the calendar's open time. Wall-clock time
//! is cut into UTC hours; in each, exponential gaps (mean
//! `mean_time_between`) are drawn over the hour's open seconds and mapped
//! back to the wall clock through the calendar's open spans. Restarting
//! the gaps at each hour's start loses nothing (the exponential has no
//! memory), and makes each hour computable on its own: no walk from an
//! epoch, a calendar change moves only the hours it changes, and a short
//! mean costs at most an hour's draws at a time.
//!
//! Randomness: every draw is SHA-256 of the seed and what the draw is for
//! (the schedule, the hour, the draw's index; a host, a slot), so that it
//! is the same on every instance and in every version that keeps the
//! scheme, with no generator state to share. A victim's score mixes its
//! host's digest with its slot's (one digest per host and one per slot,
//! not one per pair: a week over 90,000 hosts stays well under a second).
//!
//! One file past 400 lines: when and whom are drawn from one seed with one
//! scheme, and apart they could drift from each other.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::safety::Calendar;

mod outlook;
mod task;

#[cfg(test)]
pub(crate) use outlook::PlannedSlot;
pub(crate) use outlook::{Outlook, Planned};
pub(crate) use task::{Scheduled, run};

/// How long after its time a slot may still be published by default: a
/// restart of the service (or a stalled process) within it loses nothing;
/// beyond it, the slot is recorded as missed, never replayed.
pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_secs(5 * 60);

/// Shortest `mean_time_between`: a schedule is a slow drip of chaos, and a
/// shorter mean would only fill the queue with deferrals.
pub(crate) const MIN_MEAN_TIME_BETWEEN: Duration = Duration::from_secs(1);

/// How far ahead a next slot is looked for, in buckets (a calendar open
/// one hour a year still has its slots found).
const HORIZON_BUCKETS: i64 = 400 * 24;

/// The buckets the draws restart in: UTC hours.
const BUCKET_SECONDS: i64 = 3_600;

/// One `[[schedule]]` entry, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSettings {
    /// Unique; named in each request's reason and in its message id.
    pub name: String,
    /// The inventory group victims are drawn from.
    pub group: String,
    /// The mean time between restarts, counted over the calendar's open
    /// time only (`"2days"` with Mon–Fri 09:00–15:00 is one every 12 open
    /// hours, about every other working day).
    #[serde(with = "crate::settings::duration")]
    pub mean_time_between: Duration,
    /// The `[[requesters]]` name its requests are signed as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    /// That requester's private key (as `mandrill keygen` writes it). Its
    /// bytes also seed the plan: every instance signing with it computes
    /// the same plan, and nobody without it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// How late after its time a slot may still be published (default
    /// 5 min); a slot later than that is recorded as missed.
    #[serde(
        default = "default_max_lateness",
        with = "crate::settings::duration",
        skip_serializing_if = "is_default_max_lateness"
    )]
    pub max_lateness: Duration,
}

fn default_max_lateness() -> Duration {
    DEFAULT_MAX_LATENESS
}

fn is_default_max_lateness(value: &Duration) -> bool {
    *value == DEFAULT_MAX_LATENESS
}

/// A schedule's plan: what every instance computes alike.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The schedule's name.
    pub name: String,
    /// The group victims are drawn from.
    pub group: String,
    /// The mean time between restarts, over open time.
    pub mean_time_between: Duration,
    /// How late a slot may still be published.
    pub max_lateness: Duration,
    /// SHA-256 of the seed: keys every draw.
    key: [u8; 32],
    /// The UUIDv5 namespace of this plan's message ids.
    namespace: Uuid,
}

/// One planned restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The schedule's name.
    pub schedule: String,
    /// When it is due, to the millisecond.
    pub at: Timestamp,
    /// Its request's id: the same on every instance, so the store's
    /// idempotency makes it happen once.
    pub message_id: Uuid,
}

impl Slot {
    /// The reason its request carries: what `mandrill explain` shows.
    pub fn reason(&self) -> String {
        format!(
            "scheduled by [[schedule]] {}, slot {}",
            self.schedule, self.at
        )
    }

    /// The schedule and the slot a request's reason names, if it is a
    /// slot's [`reason`](Self::reason). Free text: only the message id,
    /// checked with [`Plan::is_slot`], proves it.
    pub fn named_in(reason: &str) -> Option<(&str, Timestamp)> {
        let named = reason.strip_prefix("scheduled by [[schedule]] ")?;
        let (schedule, at) = named.rsplit_once(", slot ")?;
        Some((schedule, at.parse().ok()?))
    }
}

impl Plan {
    /// The plan of `settings`, seeded by `seed` (the key file's bytes, or
    /// empty: then the plan follows from the configuration alone).
    pub fn new(settings: &ScheduleSettings, seed: &[u8]) -> Self {
        let key: [u8; 32] = Sha256::new()
            .chain_update(b"mandrill schedule seed\0")
            .chain_update(seed)
            .finalize()
            .into();
        let namespace = Uuid::from_bytes(
            Sha256::new()
                .chain_update(key)
                .chain_update(b"namespace")
                .finalize()[..16]
                .try_into()
                .expect("a SHA-256 digest has 16 bytes and more"),
        );
        Self {
            name: settings.name.clone(),
            group: settings.group.clone(),
            mean_time_between: settings.mean_time_between,
            max_lateness: settings.max_lateness,
            key,
            namespace,
        }
    }

    /// The slots due in `[from, until)`, in order. `calendar`: `None`
    /// means always open.
    pub fn slots(
        &self,
        calendar: Option<&Calendar>,
        from: Timestamp,
        until: Timestamp,
    ) -> Vec<Slot> {
        let mut slots = Vec::new();
        let (first, last) = (bucket_of(from), bucket_of(until));
        for bucket in first..=last {
            slots.extend(
                self.bucket(calendar, bucket)
                    .into_iter()
                    .filter(|slot| from <= slot.at && slot.at < until),
            );
        }
        slots
    }

    /// The first slot due after `after` (not at it), looking a year ahead.
    pub fn next_after(&self, calendar: Option<&Calendar>, after: Timestamp) -> Option<Slot> {
        let first = bucket_of(after);
        (first..first + HORIZON_BUCKETS).find_map(|bucket| {
            self.bucket(calendar, bucket)
                .into_iter()
                .find(|s| s.at > after)
        })
    }

    /// The slots of one bucket (UTC hours since the Unix epoch).
    fn bucket(&self, calendar: Option<&Calendar>, bucket: i64) -> Vec<Slot> {
        let (Ok(start), Ok(end)) = (
            Timestamp::from_second(bucket * BUCKET_SECONDS),
            Timestamp::from_second((bucket + 1) * BUCKET_SECONDS),
        ) else {
            return Vec::new();
        };
        let spans = match calendar {
            Some(calendar) => calendar.open_spans(start, end),
            None => vec![(start, end)],
        };
        let open: f64 = spans
            .iter()
            .map(|&(from, to)| to.duration_since(from).as_secs_f64())
            .sum();
        let mean = self.mean_time_between.as_secs_f64();
        let mut slots = Vec::new();
        let mut elapsed = 0.0;
        for draw in 0u64.. {
            let uniform = self.uniform(b"gap", &bucket.to_be_bytes(), draw);
            // -ln(1 - u) for u in [0, 1): an exponential gap, never infinite.
            elapsed += -(1.0 - uniform).ln() * mean;
            if elapsed >= open {
                break;
            }
            if let Some(at) = wall_clock(&spans, elapsed) {
                let at = truncate_to_millis(at);
                // Two slots in one millisecond would be one request.
                if slots.last().is_none_or(|last: &Slot| last.at != at) {
                    slots.push(self.slot(at));
                }
            }
        }
        slots
    }

    /// Whether `message_id` is the id of this plan's slot at `at` (which
    /// nobody without the seed can mint).
    pub fn is_slot(&self, at: Timestamp, message_id: Uuid) -> bool {
        self.slot(at).message_id == message_id
    }

    /// The slot due `at`, with its message id.
    pub fn slot(&self, at: Timestamp) -> Slot {
        let name = format!("{}\n{}", self.name, at.as_millisecond());
        Slot {
            schedule: self.name.clone(),
            at,
            message_id: uuid_v5(self.namespace, name.as_bytes()),
        }
    }

    /// The victim of `slot` among `hosts` (the group's hosts in the
    /// inventory): see [`Self::victim_among`]; keys every host first.
    pub fn victim<'a>(
        &self,
        slot: &Slot,
        hosts: impl IntoIterator<Item = &'a str>,
        eligible: impl FnMut(&str) -> bool,
    ) -> Option<String> {
        let keyed: Vec<(u64, &str)> = hosts.into_iter().map(|h| (self.key(h), h)).collect();
        self.victim_among(slot, &keyed, |host| *host, eligible)
            .map(|host| (*host).to_owned())
    }

    /// A host's key, from the seed, the schedule and its name: computed
    /// once per host and inventory, not per slot (a digest per host and
    /// slot made a week's preview over 90,000 hosts take seconds).
    pub fn key(&self, host: &str) -> u64 {
        let digest = Sha256::new()
            .chain_update(self.key)
            .chain_update(b"victim\0")
            .chain_update(self.name.as_bytes())
            .chain_update([0])
            .chain_update(host.as_bytes())
            .finalize();
        u64::from_be_bytes(digest[..8].try_into().expect("8 of 32 bytes"))
    }

    /// The victim of `slot` among `keyed` hosts (each with its
    /// [`key`](Self::key)): each host's score mixes its key with the
    /// slot's, and the lowest-scored one `eligible` admits is chosen. Every
    /// instance ranks alike, and a host joining or leaving the group does
    /// not reorder the others. The lowest is one pass (usually it is
    /// eligible); past it, the rest are ranked with a heap, never a sort of
    /// the whole group per slot. Scores tie only on a 64-bit collision; then
    /// the name, then the position, decides.
    pub fn victim_among<'a, T>(
        &self,
        slot: &Slot,
        keyed: &'a [(u64, T)],
        name: impl Fn(&T) -> &str,
        mut eligible: impl FnMut(&str) -> bool,
    ) -> Option<&'a T> {
        let mix = self.slot_key(slot);
        // The pass reads the keys alone: a host's name is behind a pointer,
        // and reading it for each host of each slot (to order ties that
        // almost never come) made a week's preview over 90,000 hosts wait
        // on memory, 2.2 s against 0.26 s (docs/benchmarks.md).
        let mut lowest: Option<(u64, usize)> = None;
        for (i, (key, host)) in keyed.iter().enumerate() {
            let score = fmix64(key ^ mix);
            lowest = match lowest {
                Some((best, j))
                    if best < score || (best == score && name(&keyed[j].1) <= name(host)) =>
                {
                    Some((best, j))
                }
                _ => Some((score, i)),
            };
        }
        let (_, lowest) = lowest?;
        if eligible(name(&keyed[lowest].1)) {
            return Some(&keyed[lowest].1);
        }
        let ranked = keyed
            .iter()
            .enumerate()
            .map(|(i, (key, host))| (fmix64(key ^ mix), name(host), i));
        let mut rest: BinaryHeap<_> = ranked
            .filter(|(_, _, i)| *i != lowest)
            .map(Reverse)
            .collect();
        while let Some(Reverse((_, host, i))) = rest.pop() {
            if eligible(host) {
                return Some(&keyed[i].1);
            }
        }
        None
    }

    /// The slot's part of every host's score.
    fn slot_key(&self, slot: &Slot) -> u64 {
        let digest = Sha256::new()
            .chain_update(self.key)
            .chain_update(b"victim slot\0")
            .chain_update(self.name.as_bytes())
            .chain_update([0])
            .chain_update(slot.at.as_millisecond().to_be_bytes())
            .finalize();
        u64::from_be_bytes(digest[..8].try_into().expect("8 of 32 bytes"))
    }

    /// A uniform draw in `[0, 1)` for `purpose`, `context` and `index`.
    fn uniform(&self, purpose: &[u8], context: &[u8], index: u64) -> f64 {
        let digest = Sha256::new()
            .chain_update(self.key)
            .chain_update(purpose)
            .chain_update([0])
            .chain_update(self.name.as_bytes())
            .chain_update([0])
            .chain_update(context)
            .chain_update(index.to_be_bytes())
            .finalize();
        let bits = u64::from_be_bytes(digest[..8].try_into().expect("8 of 32 bytes")) >> 11;
        bits as f64 / (1u64 << 53) as f64
    }
}

/// MurmurHash3's 64-bit finalizer: a bijection whose every output bit
/// depends on every input bit, so keys XORed with one slot's key are
/// ordered afresh for each slot.
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The bucket `at` falls in.
fn bucket_of(at: Timestamp) -> i64 {
    at.as_second().div_euclid(BUCKET_SECONDS)
}

/// The instant `open_seconds` of open time into `spans`.
fn wall_clock(spans: &[(Timestamp, Timestamp)], mut open_seconds: f64) -> Option<Timestamp> {
    for &(from, to) in spans {
        let length = to.duration_since(from).as_secs_f64();
        if open_seconds < length {
            return from
                .checked_add(SignedDuration::from_secs_f64(open_seconds))
                .ok()
                .filter(|&at| at < to);
        }
        open_seconds -= length;
    }
    None
}

fn truncate_to_millis(at: Timestamp) -> Timestamp {
    Timestamp::from_millisecond(at.as_millisecond()).unwrap_or(at)
}

/// A name-based UUID (RFC 9562 version 5: SHA-1 of the namespace and the
/// name).
pub(crate) fn uuid_v5(namespace: Uuid, name: &[u8]) -> Uuid {
    use sha1::Sha1;
    let digest = Sha1::new()
        .chain_update(namespace.as_bytes())
        .chain_update(name)
        .finalize();
    uuid::Builder::from_sha1_bytes(digest[..16].try_into().expect("16 of 20 bytes")).into_uuid()
}

/// Checks `[[schedule]]` entries alone (what needs no other section):
/// names valid and unique, a group, a mean of at least a second, a
/// lateness bound. The error names the key.
pub(crate) fn validate(entries: &[ScheduleSettings]) -> Result<(), (String, String)> {
    let mut seen = std::collections::HashSet::new();
    for (index, entry) in entries.iter().enumerate() {
        let at = |key: &str| format!("schedule[{index}].{key}");
        crate::domain::InstanceName::parse(&entry.name)
            .map_err(|why| (at("name"), format!("{:?} {why}", entry.name)))?;
        if !seen.insert(entry.name.as_str()) {
            return Err((at("name"), format!("{:?} is configured twice", entry.name)));
        }
        if entry.group.trim().is_empty() {
            return Err((at("group"), "must name an inventory group".into()));
        }
        if entry.mean_time_between < MIN_MEAN_TIME_BETWEEN {
            return Err((
                at("mean_time_between"),
                "must be at least 1s (of calendar-open time)".into(),
            ));
        }
        if entry.max_lateness.is_zero() {
            return Err((at("max_lateness"), "must be longer than 0s".into()));
        }
        // A slot is signed as of its time, valid for a day: published later,
        // it would be rejected as expired.
        if entry.max_lateness > crate::domain::signed::MAX_LIFETIME {
            return Err((
                at("max_lateness"),
                "must be at most 1day: a slot's token, signed as of its time, is valid for a day"
                    .into(),
            ));
        }
        if entry.requester.is_some() != entry.key_file.is_some() {
            let missing = if entry.requester.is_some() {
                "key_file"
            } else {
                "requester"
            };
            return Err((
                at(missing),
                "requester and key_file go together: the name it signs as, and its key".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
