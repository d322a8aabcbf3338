//! Groups, and the counting guards' settings resolved per request: which
//! group a request counts in and the [`Limits`] its claim carries.

use std::collections::BTreeMap;
use std::time::Duration;

use super::limits::*;
use crate::domain::{RestartRequest, Timestamp};
use crate::pattern::Pattern;

/// Groups and the counting guards' settings, resolved: what the worker asks
/// for each request's [`Limits`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Counting {
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
    /// How long a host counts as disrupted after a restart reported done,
    /// `safety.budget.settle`; zero once [`Self::verified_by_probe`] says a
    /// probe decides recovery.
    settle: Duration,
    zone_budget: Option<u32>,
}

/// `Err` with the denial's reason when the message names a group other than
/// `operators`, the one the operator's configuration (or inventory) gives
/// the instance; both names are in the reason.
pub(crate) fn group_mismatch(request: &RestartRequest, operators: &str) -> Result<(), String> {
    match request.requested_group.as_deref() {
        Some(named) if named != operators => Err(format!(
            "denied by group mismatch: the message names group {named} but {} is in group \
             {operators} (the operator's groups decide; a message's group is only checked)",
            request.instance_name
        )),
        _ => Ok(()),
    }
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
    pub(crate) fn new(
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
            settle: budget.settle,
            zone_budget: limit(budget.max_disrupted_per_zone, None),
        })
    }

    /// Whether a verification probe confirms each restart's recovery
    /// (`verify.probe` is not `none`): then a restart that ended
    /// `restarted` was seen healthy and stops counting as a disruption at
    /// once; without one, it counts for `safety.budget.settle`. Unless told
    /// so, the settle applies: the safe side.
    pub(crate) fn verified_by_probe(mut self, verified: bool) -> Self {
        if verified {
            self.settle = Duration::ZERO;
        }
        self
    }

    /// No counting guard at all.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Self {
            window: Duration::from_secs(24 * 3600),
            ..Self::default()
        }
    }

    /// The names of `safety.groups`.
    pub(crate) fn group_names(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().map(|(name, _)| name.as_str())
    }

    /// The operator's group of `instance`: the first configured group (by
    /// name) with a pattern matching it, else the name without its last
    /// `-suffix` (`cattle-a1` → `cattle`). A message's own `group` never
    /// enters into it.
    #[cfg(test)]
    pub(crate) fn group_of<'r>(&'r self, instance: &'r str) -> &'r str {
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

    /// Assigns the operator's group ([`Self::group_of`]) to
    /// `request.group`, so that everything that counts (the stores read
    /// `request.group()`) counts it there. `Err` with the denial's reason
    /// when the message names a different group: a publisher never picks
    /// the group whose limits it is counted against.
    pub(crate) fn assign(&self, request: &mut RestartRequest) -> Result<(), String> {
        // The name's default needs no copy: `request.group()` falls back to
        // it (so the common case allocates nothing per message).
        request.group = self
            .configured_group(request.instance_name.as_str())
            .map(str::to_owned);
        group_mismatch(request, request.group())
    }

    /// The first `safety.groups` entry with a pattern matching `instance`.
    pub(crate) fn configured_group(&self, instance: &str) -> Option<&str> {
        self.groups
            .iter()
            .find(|(_, patterns)| patterns.iter().any(|p| p.matches(instance)))
            .map(|(name, _)| name.as_str())
    }

    /// The limits a claim in `group` enforces, or why the budget cannot be
    /// known (a percentage of a group whose size is not configured): the
    /// request is then deferred, never let through.
    pub(crate) fn limits(&self, group: &str) -> Result<Limits, String> {
        self.limits_sized(group, self.sizes.get(group).copied())
    }

    /// As [`Self::limits`], with the group's size given (the inventory's).
    pub(crate) fn limits_sized(&self, group: &str, size: Option<u32>) -> Result<Limits, String> {
        let from_percent = match self.percent {
            None => None,
            Some(percent) => match size {
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
            zone_budget: self.zone_budget,
            settle: self.settle,
            ..Limits::NONE
        })
    }

    /// The window the rate limits count over.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// Where a group's use of its limits is read from at `now` (the
    /// store's `group_usage`), as the claim's guards read it: the rate
    /// window's start, the budgets' memory's and the settle's, as
    /// `status`, `/metrics` and the dashboard show it.
    pub(crate) fn usage_starts(&self, now: Timestamp) -> UsageStarts {
        let back = |d: Duration| {
            let d = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            Timestamp::from_millis(now.as_millis().saturating_sub(d))
        };
        UsageStarts {
            window: back(self.window),
            memory: back(self.forget_after),
            settled_after: if self.settle.is_zero() {
                Timestamp::from_millis(i64::MAX)
            } else {
                back(self.settle)
            },
        }
    }

    /// How far back the guards that are on read the restart journal: the
    /// rate window, the host cooldown and the budgets' memory (which also
    /// holds every row the settle reads: a host counts at most
    /// `forget_after` after its claim), whichever is longest (zero with
    /// none on). Pruning keeps at least this much.
    pub(crate) fn lookback(&self) -> Duration {
        let rate = (self.group_max.is_some() || self.global_max.is_some()).then_some(self.window);
        let budgets =
            self.max_disrupted.is_some() || self.percent.is_some() || self.zone_budget.is_some();
        let budget = budgets.then_some(self.forget_after.max(self.settle));
        [rate, self.host_cooldown, budget]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or_default()
    }

    /// The settings in words, for `mandrill status`.
    pub(crate) fn describe(&self) -> String {
        let window = crate::settings::duration::per(self.window);
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
        if let Some(zone_budget) = self.zone_budget {
            parts.push(format!("hosts disrupted per zone: {zone_budget}"));
        }
        let budgeted =
            self.max_disrupted.is_some() || self.percent.is_some() || self.zone_budget.is_some();
        if budgeted && !self.settle.is_zero() {
            parts.push(format!(
                "an unverified restart counts as disrupted for {}",
                humantime::format_duration(self.settle)
            ));
        }
        parts.join(", ")
    }
}
