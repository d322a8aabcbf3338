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

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::RestartRequest;
use crate::pattern::Pattern;
use crate::settings::settings;

settings! {
    /// `[safety.rate]`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct RateSettings {
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
    pub struct BudgetSettings {
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
    }
}

/// What one claim enforces, resolved for the request's group: plain
/// numbers, so that it travels with the claim to any store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
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
}

impl Limits {
    /// No counting guard: the claim need not read the journal.
    pub const NONE: Self = Self {
        group_max: None,
        global_max: None,
        window: Duration::ZERO,
        host_cooldown: None,
        budget: None,
        forget_after: Duration::ZERO,
        budget_retry: BUDGET_RETRY,
    };

    /// Whether any counting guard is on.
    pub fn is_active(&self) -> bool {
        self.group_max.is_some()
            || self.global_max.is_some()
            || self.host_cooldown.is_some()
            || self.budget.is_some()
    }
}

/// What a claim transaction read from the restart journal, excluding the
/// claim being decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
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
}

/// A counting guard that says not yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Which guard: `rate limit`, `host cooldown`, `global rate limit`,
    /// `disruption budget`.
    pub guard: &'static str,
    /// In plain words, with when it could pass.
    pub reason: String,
    /// Until it could pass.
    pub wait: Duration,
}

/// How soon a deferral by the budget is retried by default
/// (`safety.budget.retry`): a disruption ends when a host recovers, which
/// no clock predicts.
pub const BUDGET_RETRY: Duration = Duration::from_secs(15);

/// The one rule: whether restarting `request` (in `group`) at `now` stays
/// within `limits`, given `usage`. `Ok` with a summary of what was used
/// (recorded with the claim), or the guard that refuses.
pub fn check(
    limits: &Limits,
    group: &str,
    instance: &str,
    usage: &Usage,
    now: i64,
) -> Result<String, Refusal> {
    let window = humantime::format_duration(limits.window);
    let until = |from: i64, after: Duration| {
        let at = from.saturating_add(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
        (
            at,
            Duration::from_millis(at.saturating_sub(now).max(1).unsigned_abs()),
        )
    };
    let at = |millis: i64| crate::store::Timestamp::from_millis(millis).to_string();
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
                    "deferred by rate limit: group {group} had {} of its {max} restarts per \
                     {window}; a slot frees at {}",
                    usage.group_claims,
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
                    "deferred by global rate limit: {} of {max} restarts per {window} over all \
                     groups; a slot frees at {}",
                    usage.global_claims,
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
    if let Some(budget) = limits.budget {
        if usage.disrupted >= budget {
            return Err(Refusal {
                guard: "disruption budget",
                reason: format!(
                    "deferred by disruption budget: {} of group {group}'s {budget} hosts that may \
                     be disrupted at once already are (restarting, or not verified recovered)",
                    usage.disrupted
                ),
                wait: limits.budget_retry,
            });
        }
        used.push(format!(
            "budget: {} of {budget} hosts of group {group} disrupted with this one",
            usage.disrupted + 1
        ));
    }
    if used.is_empty() {
        Ok("allowed".to_owned())
    } else {
        Ok(format!("allowed: {}", used.join("; ")))
    }
}

/// The limits in words: what `policy check` prints.
pub fn describe(limits: &Limits) -> String {
    let window = humantime::format_duration(limits.window);
    let mut parts = Vec::new();
    if let Some(max) = limits.group_max {
        parts.push(format!("at most {max} restarts per {window}"));
    }
    if let Some(max) = limits.global_max {
        parts.push(format!(
            "at most {max} restarts per {window} over all groups"
        ));
    }
    if let Some(cooldown) = limits.host_cooldown {
        parts.push(format!(
            "{} between restarts of a host",
            humantime::format_duration(cooldown)
        ));
    }
    if let Some(budget) = limits.budget {
        parts.push(format!("at most {budget} hosts disrupted at once"));
    }
    parts.join(", ")
}

/// Groups and the counting guards' settings, resolved: what the worker asks
/// for each request's [`Limits`].
#[derive(Debug, Clone, Default)]
pub struct Counting {
    groups: Vec<(String, Vec<Pattern>)>,
    group_max: Option<u32>,
    global_max: Option<u32>,
    window: Duration,
    host_cooldown: Option<Duration>,
    max_disrupted: Option<u32>,
    percent: Option<u32>,
    sizes: BTreeMap<String, u32>,
    forget_after: Duration,
    budget_retry: Duration,
}

/// `0` means unlimited; unset takes the default.
fn limit(value: Option<u32>, default: Option<u32>) -> Option<u32> {
    match value {
        Some(0) => None,
        Some(n) => Some(n),
        None => default,
    }
}

impl Counting {
    /// Resolves the settings; `real` picks the strict defaults. The error
    /// names the setting.
    pub fn new(
        groups: &BTreeMap<String, Vec<String>>,
        rate: &RateSettings,
        budget: &BudgetSettings,
        real: bool,
    ) -> Result<Self, (String, String)> {
        let groups = groups
            .iter()
            .map(|(name, patterns)| {
                let patterns = patterns
                    .iter()
                    .enumerate()
                    .map(|(index, raw)| {
                        Pattern::parse(raw)
                            .map_err(|why| (format!("safety.groups.{name}[{index}]"), why))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok::<_, (String, String)>((name.clone(), patterns))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if rate.window.is_zero() {
            return Err(("safety.rate.window".into(), "must be more than 0s".into()));
        }
        if let Some(percent) = budget.max_disrupted_percent
            && !(1..=100).contains(&percent)
        {
            return Err((
                "safety.budget.max_disrupted_percent".into(),
                format!("{percent} is not a percentage from 1 to 100"),
            ));
        }
        let strict = |n| real.then_some(n);
        let max_disrupted_default = if budget.max_disrupted_percent.is_some() {
            None
        } else {
            strict(1)
        };
        Ok(Self {
            groups,
            group_max: limit(rate.group_max, strict(1)),
            global_max: limit(rate.global_max, None),
            window: rate.window,
            host_cooldown: (!rate.host_cooldown.is_zero()).then_some(rate.host_cooldown),
            max_disrupted: limit(budget.max_disrupted, max_disrupted_default),
            percent: budget.max_disrupted_percent,
            sizes: budget.group_sizes.clone(),
            forget_after: budget.forget_after,
            budget_retry: budget.retry.max(Duration::from_millis(1)),
        })
    }

    /// No counting guard at all.
    pub fn none() -> Self {
        Self {
            window: Duration::from_secs(24 * 3600),
            ..Self::default()
        }
    }

    /// The request's group: the message's own `group`, else the first
    /// configured group (by name) with a pattern matching the instance,
    /// else the instance name without its last `-suffix`.
    pub fn group<'r>(&'r self, request: &'r RestartRequest) -> &'r str {
        match request.group.as_deref() {
            Some(group) => group,
            None => self.group_of(request.instance_name.as_str()),
        }
    }

    /// The group of an instance when the message names none.
    pub fn group_of<'r>(&'r self, instance: &'r str) -> &'r str {
        self.groups
            .iter()
            .find(|(_, patterns)| patterns.iter().any(|p| p.matches(instance)))
            .map_or_else(
                || {
                    instance
                        .rsplit_once('-')
                        .map_or(instance, |(group, _)| group)
                },
                |(name, _)| name.as_str(),
            )
    }

    /// Names the request's group when a configured pattern decides it (the
    /// message did not name one), so that the store counts it there.
    pub fn assign(&self, request: &mut RestartRequest) {
        if request.group.is_some() {
            return;
        }
        let instance = request.instance_name.as_str();
        if let Some((name, _)) = self
            .groups
            .iter()
            .find(|(_, patterns)| patterns.iter().any(|p| p.matches(instance)))
        {
            request.group = Some(name.clone());
        }
    }

    /// The limits a claim in `group` enforces, or why the budget cannot be
    /// known (a percentage of a group whose size is not configured): the
    /// request is then deferred, never let through.
    pub fn limits(&self, group: &str) -> Result<Limits, String> {
        let from_percent = match self.percent {
            None => None,
            Some(percent) => match self.sizes.get(group) {
                Some(size) => Some(size.saturating_mul(percent) / 100),
                None => {
                    return Err(format!(
                        "deferred by disruption budget: safety.budget.max_disrupted_percent is \
                         {percent}% but the size of group {group} is unknown (set \
                         safety.budget.group_sizes.{group})"
                    ));
                }
            },
        };
        let budget = match (self.max_disrupted, from_percent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(Limits {
            group_max: self.group_max,
            global_max: self.global_max,
            window: self.window,
            host_cooldown: self.host_cooldown,
            budget,
            forget_after: self.forget_after,
            budget_retry: self.budget_retry,
        })
    }

    /// The window the rate limits count over.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How long an unverified end counts as a disruption.
    pub fn forget_after(&self) -> Duration {
        self.forget_after
    }

    /// The settings in words, for `mandrill status`.
    pub fn describe(&self) -> String {
        let window = humantime::format_duration(self.window);
        let or_unlimited = |n: Option<u32>, what: String| {
            n.map_or_else(|| format!("{what}: unlimited"), |n| format!("{what}: {n}"))
        };
        let mut parts = vec![
            or_unlimited(self.group_max, format!("restarts per group per {window}")),
            or_unlimited(self.global_max, format!("restarts per {window} in all")),
            self.host_cooldown.map_or_else(
                || "host cooldown: none".to_owned(),
                |c| format!("host cooldown: {}", humantime::format_duration(c)),
            ),
        ];
        let mut budget = or_unlimited(self.max_disrupted, "hosts disrupted per group".into());
        if let Some(percent) = self.percent {
            budget.push_str(&format!(" (and at most {percent}% of a group's size)"));
        }
        parts.push(budget);
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::request;

    const HOUR: i64 = 3_600_000;

    fn limits() -> Limits {
        Limits {
            group_max: Some(2),
            global_max: Some(3),
            window: Duration::from_secs(3600),
            host_cooldown: Some(Duration::from_secs(600)),
            budget: Some(1),
            forget_after: Duration::from_secs(3600),
            budget_retry: BUDGET_RETRY,
        }
    }

    #[test]
    fn each_counting_guard_defers_until_it_could_pass() {
        let now = 10 * HOUR;
        let free = Usage::default();
        let allowed = check(&limits(), "cattle", "cattle-1", &free, now).unwrap();
        assert!(allowed.contains("restart 1 of 2"), "{allowed}");
        assert!(allowed.contains("budget: 1 of 1"), "{allowed}");

        let cooling = Usage {
            host_last: Some(now - 60_000),
            ..free
        };
        let refused = check(&limits(), "cattle", "cattle-1", &cooling, now).unwrap_err();
        assert_eq!(refused.guard, "host cooldown");
        assert_eq!(refused.wait, Duration::from_secs(540));

        let full = Usage {
            group_claims: 2,
            group_oldest: Some(now - HOUR + 5_000),
            ..free
        };
        let refused = check(&limits(), "cattle", "cattle-1", &full, now).unwrap_err();
        assert_eq!(refused.guard, "rate limit");
        assert_eq!(refused.wait, Duration::from_secs(5));
        assert!(
            refused.reason.contains("group cattle had 2 of its 2"),
            "{}",
            refused.reason
        );

        let busy = Usage {
            global_claims: 3,
            global_oldest: Some(now - 1_000),
            ..free
        };
        assert_eq!(
            check(&limits(), "cattle", "cattle-1", &busy, now)
                .unwrap_err()
                .guard,
            "global rate limit"
        );

        let disrupted = Usage {
            disrupted: 1,
            ..free
        };
        let refused = check(&limits(), "cattle", "cattle-1", &disrupted, now).unwrap_err();
        assert_eq!(refused.guard, "disruption budget");
        assert_eq!(refused.wait, BUDGET_RETRY);

        assert_eq!(
            check(&Limits::NONE, "g", "h", &busy, now).unwrap(),
            "allowed"
        );
        assert!(!Limits::NONE.is_active() && limits().is_active());
    }

    #[test]
    fn groups_defaults_and_budgets_resolve_fail_closed() {
        let mut groups = BTreeMap::new();
        groups.insert("web".to_owned(), vec!["frontend-*".to_owned()]);
        let budget = BudgetSettings {
            max_disrupted_percent: Some(20),
            group_sizes: [("web".to_owned(), 10)].into(),
            ..BudgetSettings::default()
        };
        let counting = Counting::new(&groups, &RateSettings::default(), &budget, true).unwrap();
        assert_eq!(counting.group(&request("frontend-7")), "web");
        assert_eq!(counting.group(&request("cattle-ab12")), "cattle");
        let mut explicit = request("frontend-7");
        explicit.group = Some("canary".into());
        assert_eq!(counting.group(&explicit), "canary");

        let web = counting.limits("web").unwrap();
        assert_eq!(web.budget, Some(2), "20% of 10");
        assert_eq!(
            web.group_max,
            Some(1),
            "Chaos Monkey's default with a real backend"
        );
        let unknown = counting.limits("cattle").unwrap_err();
        assert!(unknown.contains("group_sizes.cattle"), "{unknown}");

        let simulated = Counting::new(
            &BTreeMap::new(),
            &RateSettings::default(),
            &BudgetSettings::default(),
            false,
        )
        .unwrap();
        assert!(!simulated.limits("cattle").unwrap().is_active());
        let real = Counting::new(
            &BTreeMap::new(),
            &RateSettings {
                group_max: Some(0),
                ..RateSettings::default()
            },
            &BudgetSettings::default(),
            true,
        )
        .unwrap();
        let limits = real.limits("cattle").unwrap();
        assert_eq!((limits.group_max, limits.budget), (None, Some(1)));

        let (key, _) = Counting::new(
            &BTreeMap::new(),
            &RateSettings::default(),
            &BudgetSettings {
                max_disrupted_percent: Some(0),
                ..BudgetSettings::default()
            },
            true,
        )
        .unwrap_err();
        assert_eq!(key, "safety.budget.max_disrupted_percent");
    }
}
