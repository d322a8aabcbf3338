//! The counting guards: a rate limit per group, a cooldown per host, a
//! global rate limit, and the disruption budget per group.
//!
//! They count restarts, so they are decided where the restarts are counted:
//! inside the store's claim transaction ([`check`], called by every store
//! with the [`Usage`] it read in that transaction), which also writes the
//! claim to the restart journal. Two instances, or two deliveries, can
//! therefore never both take the last slot. This module resolves the
//! settings into the numbers a claim carries ([`Limits`]) and holds the one
//! rule.
//!
//! The settings resolved and the one counting rule they feed belong
//! together, so one file past 400 lines.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::Timestamp;
use crate::settings::duration::{count, per};
use crate::settings::settings;

settings! {
    /// `[safety.rate]`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct RateSettings {
        /// Restarts per group per window (unset: 1 with a real backend, else
        /// unlimited; 0 unlimited).
        ///
        /// The real backend's default is Chaos Monkey's one per group per day.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub group_max: Option<u32> = None,
        /// The window `group_max` and `global_max` count over.
        #[serde(with = "crate::settings::duration")]
        pub window: Duration = Duration::from_secs(24 * 3600),
        /// Least time between two restarts of one host (0s: none).
        #[serde(with = "crate::settings::duration")]
        pub host_cooldown: Duration = Duration::ZERO,
        /// Restarts per window over all groups (unset or 0: unlimited).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub global_max: Option<u32> = None,
    }
}

settings! {
    /// `[safety.budget]`: how many hosts of a group may be disrupted at once.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct BudgetSettings {
        /// Hosts per group disrupted at once (unset: 1 with a real backend
        /// unless `max_disrupted_percent` is set, else unlimited; 0
        /// unlimited).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_disrupted: Option<u32> = None,
        /// Hosts per group disrupted at once, as a percentage of the group's
        /// size (rounded down), for the groups in `group_sizes`.
        ///
        /// A group whose size is unknown is deferred: the budget fails closed.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_disrupted_percent: Option<u32> = None,
        /// Group name → number of hosts, for `max_disrupted_percent`.
        pub group_sizes: BTreeMap<String, u32> = BTreeMap::new(),
        /// How long a host whose restart ended without a verified recovery
        /// (unrecovered, failed, outcome unknown) still counts as disrupted.
        #[serde(with = "crate::settings::duration")]
        pub forget_after: Duration = Duration::from_secs(3600),
        /// How soon a request the budget deferred is tried again.
        #[serde(with = "crate::settings::duration")]
        pub retry: Duration = BUDGET_RETRY,
        /// Without a verification probe (`verify.probe = "none"`), how long
        /// a host whose restart the backend reported done still counts as
        /// disrupted, by this budget and the zone's (0s: not at all).
        ///
        /// The backend's "done" means the reboot was issued, not that the
        /// host is back: a host takes a minute or more to reboot and its
        /// services longer to come back and rejoin, so 5 minutes covers a
        /// typical reboot with room. Without it the next host of the group
        /// could be restarted at once and the budget would protect
        /// nothing. With a probe, the probe decides and this is not used.
        /// A host counts at most `forget_after` after its claim.
        #[serde(with = "crate::settings::duration")]
        pub settle: Duration = DEFAULT_SETTLE,
        /// Hosts of one zone (as the inventory places them) disrupted at
        /// once, over all groups (unset or 0: no zone budget).
        ///
        /// Counted as `max_disrupted` is, among the hosts the inventory
        /// gives a zone; a request without a zone is not held by it.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_disrupted_per_zone: Option<u32> = None,
    }
}

/// What one claim enforces, resolved for the request's group: plain
/// numbers, so that it travels with the claim to any store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Limits {
    /// Restarts of the group per `window`.
    pub group_max: Option<u32>,
    /// Restarts of all groups per `window`.
    pub global_max: Option<u32>,
    /// The window both rates count over.
    pub window: Duration,
    /// Least time between two restarts of one host.
    pub host_cooldown: Option<Duration>,
    /// Other hosts of the group that may be disrupted while this one is
    /// restarted, plus one: the group's budget.
    pub budget: Option<u32>,
    /// How long an unverified end still counts as a disruption.
    pub forget_after: Duration,
    /// How soon a request the budget deferred is tried again.
    pub budget_retry: Duration,
    /// Hosts of the request's zone ([`crate::domain::RestartRequest::zone`])
    /// that may be disrupted at once, over all groups; only for requests
    /// the inventory places in a zone.
    pub zone_budget: Option<u32>,
    /// Restarts the request's verified requester may claim per
    /// `requester_window`, over all groups and instances.
    pub requester_max: Option<u32>,
    /// The window `requester_max` counts over.
    pub requester_window: Duration,
    /// How long a host whose restart ended `restarted` without a
    /// verification probe still counts as disrupted (zero: not at all,
    /// as when a probe verified its recovery).
    pub settle: Duration,
}

impl Limits {
    /// No counting guard: the claim need not read the journal.
    pub(crate) const NONE: Self = Self {
        group_max: None,
        global_max: None,
        window: Duration::ZERO,
        host_cooldown: None,
        budget: None,
        forget_after: Duration::ZERO,
        budget_retry: BUDGET_RETRY,
        zone_budget: None,
        requester_max: None,
        requester_window: Duration::ZERO,
        settle: Duration::ZERO,
    };

    /// Whether any counting guard is on.
    pub(crate) fn is_active(&self) -> bool {
        self.group_max.is_some()
            || self.global_max.is_some()
            || self.host_cooldown.is_some()
            || self.budget.is_some()
            || self.zone_budget.is_some()
            || self.requester_max.is_some()
    }

    /// Whether any counting guard applies to `subject`: the zone budget
    /// only to a request the inventory places in a zone, the requester
    /// quota only to a signed one. A store reads the journal (and takes the
    /// guards' locks) only then, so an unsigned, zoneless request costs no
    /// more with those limits on than with them off.
    pub(crate) fn is_active_for(&self, subject: Subject<'_>) -> bool {
        self.group_max.is_some()
            || self.global_max.is_some()
            || self.host_cooldown.is_some()
            || self.budget.is_some()
            || self.counts_zone(subject)
            || self.counts_requester(subject)
    }

    /// Whether the zone budget applies to `subject` (so its zone's
    /// disrupted hosts must be read).
    pub(crate) fn counts_zone(&self, subject: Subject<'_>) -> bool {
        self.zone_budget.is_some() && subject.zone.is_some()
    }

    /// Whether the requester quota applies to `subject` (so its
    /// requester's claims must be read).
    pub(crate) fn counts_requester(&self, subject: Subject<'_>) -> bool {
        self.requester_max.is_some() && subject.requester.is_some()
    }
}

/// What a claim transaction read from the restart journal, excluding the
/// claim being decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Usage {
    /// Restarts of the group claimed within the window.
    pub group_claims: u32,
    /// The oldest of them (milliseconds since the epoch).
    pub group_oldest: Option<i64>,
    /// Restarts of any group claimed within the window.
    pub global_claims: u32,
    /// The oldest of them.
    pub global_oldest: Option<i64>,
    /// The last restart of this host claimed.
    pub host_last: Option<i64>,
    /// Other hosts of the group disrupted now.
    pub disrupted: u32,
    /// Other hosts of the request's zone disrupted now (any group).
    pub zone_disrupted: u32,
    /// Restarts the request's requester claimed within its window.
    pub requester_claims: u32,
    /// The oldest of them.
    pub requester_oldest: Option<i64>,
    /// Another request's claim of this host whose outcome is not in and
    /// whose hold is not over: its restart may be running now. Read on
    /// every claim, counting guards or none ([`check_host_busy`]).
    pub host_held: Option<HostHold>,
}

/// A claim that holds a host: another request's restart of it, claimed and
/// not yet ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostHold {
    /// The request that claimed it.
    pub message_id: uuid::Uuid,
    /// When its hold ends, by the store's clock (milliseconds since the
    /// epoch): then a restart whose outcome was never recorded (its handler
    /// died) stops holding the host, as it stops holding its own request.
    pub until: i64,
}

/// Who and what a claim counts against: the keys the journal is read by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Subject<'a> {
    /// The request's group, as the operator decides it.
    pub group: &'a str,
    /// The machine to restart: the instance, or, for an alias, the name
    /// its machine is counted by ([`crate::domain::RestartRequest::machine`]).
    pub instance: &'a str,
    /// The instance's zone, if the inventory gives one.
    pub zone: Option<&'a str>,
    /// The verified requester, if the request was signed.
    pub requester: Option<&'a str>,
}

impl<'a> Subject<'a> {
    /// The keys of `request` (whose group the worker has assigned).
    pub(crate) fn of(request: &'a crate::domain::RestartRequest) -> Self {
        Self {
            group: request.group(),
            instance: request.machine(),
            zone: request.zone.as_deref(),
            requester: request.requester.as_deref(),
        }
    }
}

/// A counting guard that says not yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Which guard: `host busy`, `rate limit`, `host cooldown`, `global
    /// rate limit`, `disruption budget`, `zone budget`, `requester quota`.
    pub guard: &'static str,
    /// In plain words, with when it could pass.
    pub reason: String,
    /// Until it could pass.
    pub wait: Duration,
}

/// How long an unverified restart counts as a disruption by default
/// (`safety.budget.settle`): longer than a typical reboot and its services'
/// return.
pub(crate) const DEFAULT_SETTLE: Duration = Duration::from_secs(300);

/// How soon a deferral by the budget is retried by default
/// (`safety.budget.retry`): a disruption ends when a host recovers, which
/// no clock predicts.
pub(crate) const BUDGET_RETRY: Duration = Duration::from_secs(15);

/// The guard no setting turns off: a host is never restarted for one
/// request while another request's claim of it holds (`held`, as the
/// claim read it), whatever the rate limits, the cooldown and the budget
/// say; the budget counts only the group's other hosts, and the cooldown
/// is off by default. Deferred until the other restart ends: polled every
/// `retry` (the budget's, as no clock predicts when a restart ends), and
/// never past the other claim's hold.
pub(crate) fn check_host_busy(
    instance: &str,
    message_id: uuid::Uuid,
    held: Option<HostHold>,
    retry: Duration,
    now: i64,
) -> Result<(), Refusal> {
    let Some(held) = held.filter(|held| held.message_id != message_id && held.until > now) else {
        return Ok(());
    };
    let left = Duration::from_millis(held.until.saturating_sub(now).unsigned_abs());
    Err(Refusal {
        guard: "host busy",
        reason: format!(
            "deferred: {instance} is being restarted for request {}, whose claim holds it \
             until its outcome is recorded or at the latest {}; one host is never restarted \
             twice at once",
            held.message_id,
            crate::domain::Timestamp::from_millis(held.until)
        ),
        wait: left.min(retry).max(Duration::from_millis(1)),
    })
}

/// The one rule: whether restarting `request` (in `group`) at `now` stays
/// within `limits`, given `usage`. `Ok` with a summary of what was used
/// (recorded with the claim), or the guard that refuses.
pub(crate) fn check(
    limits: &Limits,
    subject: Subject<'_>,
    usage: &Usage,
    now: i64,
) -> Result<String, Refusal> {
    let Subject {
        group,
        instance,
        zone,
        requester,
    } = subject;
    let window = per(limits.window);
    let until = |from: i64, after: Duration| {
        let at = from.saturating_add(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
        (
            at,
            Duration::from_millis(at.saturating_sub(now).max(1).unsigned_abs()),
        )
    };
    let at = |millis: i64| crate::domain::Timestamp::from_millis(millis).to_string();
    let mut used = Vec::new();
    if let (Some(cooldown), Some(last)) = (limits.host_cooldown, usage.host_last) {
        let (free, wait) = until(last, cooldown);
        if free > now {
            return Err(Refusal {
                guard: "host cooldown",
                reason: format!(
                    "deferred by host cooldown: {instance} was restarted at {}, less than \
                     safety.rate.host_cooldown ({}) ago; it may be restarted again at {}",
                    at(last),
                    humantime::format_duration(cooldown),
                    at(free)
                ),
                wait,
            });
        }
    }
    if let Some(max) = limits.group_max {
        if usage.group_claims >= max {
            let (free, wait) = until(usage.group_oldest.unwrap_or(now), limits.window);
            return Err(Refusal {
                guard: "rate limit",
                reason: format!(
                    "deferred by rate limit: group {group} had {} of its {} per {window}; \
                     a slot frees at {}",
                    usage.group_claims,
                    count(max, "restart"),
                    at(free)
                ),
                wait,
            });
        }
        used.push(format!(
            "group {group}: restart {} of {max} per {window}",
            usage.group_claims + 1
        ));
    }
    if let Some(max) = limits.global_max {
        if usage.global_claims >= max {
            let (free, wait) = until(usage.global_oldest.unwrap_or(now), limits.window);
            return Err(Refusal {
                guard: "global rate limit",
                reason: format!(
                    "deferred by global rate limit: {} of {} per {window} over all groups; a \
                     slot frees at {}",
                    usage.global_claims,
                    count(max, "restart"),
                    at(free)
                ),
                wait,
            });
        }
        used.push(format!(
            "restart {} of {max} per {window} over all groups",
            usage.global_claims + 1
        ));
    }
    if let (Some(max), Some(requester)) = (limits.requester_max, requester) {
        let window = per(limits.requester_window);
        if usage.requester_claims >= max {
            let (free, wait) = until(
                usage.requester_oldest.unwrap_or(now),
                limits.requester_window,
            );
            return Err(Refusal {
                guard: "requester quota",
                reason: format!(
                    "deferred by requester quota: requester {requester} had {} of its {} per \
                     {window}; a slot frees at {}",
                    usage.requester_claims,
                    count(max, "restart"),
                    at(free)
                ),
                wait,
            });
        }
        used.push(format!(
            "requester {requester}: restart {} of {max} per {window}",
            usage.requester_claims + 1
        ));
    }
    if let (Some(budget), Some(zone)) = (limits.zone_budget, zone) {
        if usage.zone_disrupted >= budget {
            return Err(Refusal {
                guard: "zone budget",
                reason: format!(
                    "deferred by zone budget: {} of zone {zone}'s {} that may be disrupted at \
                     once already are (restarting, or not verified recovered)",
                    usage.zone_disrupted,
                    count(budget, "host")
                ),
                wait: limits.budget_retry,
            });
        }
        used.push(format!(
            "zone budget: {} of {} of zone {zone} disrupted with this one",
            usage.zone_disrupted + 1,
            count(budget, "host")
        ));
    }
    if let Some(budget) = limits.budget {
        if usage.disrupted >= budget {
            return Err(Refusal {
                guard: "disruption budget",
                reason: format!(
                    "deferred by disruption budget: {} of group {group}'s {} that may be \
                     disrupted at once already are (restarting, or not verified recovered)",
                    usage.disrupted,
                    count(budget, "host")
                ),
                wait: limits.budget_retry,
            });
        }
        used.push(format!(
            "budget: {} of {} of group {group} disrupted with this one",
            usage.disrupted + 1,
            count(budget, "host")
        ));
    }
    if used.is_empty() {
        Ok("allowed".to_owned())
    } else {
        Ok(format!("allowed: {}", used.join("; ")))
    }
}

/// The limits in words: what `policy check` prints.
pub(crate) fn describe(limits: &Limits) -> String {
    let window = per(limits.window);
    let mut parts = Vec::new();
    if let Some(max) = limits.group_max {
        parts.push(format!("at most {} per {window}", count(max, "restart")));
    }
    if let Some(max) = limits.global_max {
        parts.push(format!(
            "at most {} per {window} over all groups",
            count(max, "restart")
        ));
    }
    if let Some(cooldown) = limits.host_cooldown {
        parts.push(format!(
            "{} between restarts of a host",
            humantime::format_duration(cooldown)
        ));
    }
    if let Some(budget) = limits.budget {
        parts.push(format!(
            "at most {} disrupted at once",
            count(budget, "host")
        ));
    }
    if let Some(budget) = limits.zone_budget {
        parts.push(format!(
            "at most {} of a zone disrupted at once",
            count(budget, "host")
        ));
    }
    if let Some(max) = limits.requester_max {
        parts.push(format!(
            "at most {} per {} by one requester",
            count(max, "restart"),
            per(limits.requester_window)
        ));
    }
    parts.join(", ")
}

/// Where the store's `group_usage` counts from, as the claim's counting
/// guards do (the store's `UsageBinds`): `status`, `/metrics` and the
/// dashboard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UsageStarts {
    /// Restarts claimed after this count in the rate window.
    pub window: Timestamp,
    /// Hosts restarted after this may still be disrupted (the budgets'
    /// memory, `forget_after`).
    pub memory: Timestamp,
    /// A host whose latest restart ended `restarted` after this is still
    /// settling, so disrupted.
    pub settled_after: Timestamp,
}

impl UsageStarts {
    /// Everything since `since`, no host settling.
    #[cfg(test)]
    pub(crate) fn since(since: Timestamp) -> Self {
        Self {
            window: since,
            memory: since,
            settled_after: Timestamp::from_millis(i64::MAX),
        }
    }
}

#[cfg(test)]
mod tests;
