//! Safety guards: who may be restarted at all (eligibility: a final deny),
//! when (the calendar: a defer until it opens), and how many (the counting
//! guards in `limits`: rate limits, host cooldown, disruption budget,
//! decided in the store's claim transaction, with the kill switch). Stop
//! conditions run after the claim, right before the restart. Everything a
//! reload may change, the instance's own leash (dry run) included, is one
//! [`Policy`], read by the worker through a [`PolicyHandle`]; `leash` says
//! how the leash an operator records in the store decides over it. Nothing here reads or writes the
//! store: the stores apply `limits` inside their claims.

pub(crate) mod calendar;
mod counting;
mod group_pause;
pub(crate) mod guards;
pub(crate) mod leash;
pub(crate) mod limits;
pub(crate) mod objectives;
pub(crate) mod policy;
mod reply_to;
pub(crate) mod requesters;
pub(crate) mod stop;

pub(crate) use calendar::{Calendar, CalendarSettings};
pub(crate) use counting::{Counting, group_mismatch};
pub(crate) use group_pause::GroupPause;
pub(crate) use guards::{Clock, Guards, Hold, Since};
pub(crate) use leash::{Leash, LeashRecord};
pub(crate) use limits::{BudgetSettings, Limits, RateSettings};
pub(crate) use policy::{Placement, Policy, PolicyHandle};
pub(crate) use reply_to::ReplyDestinations;
pub(crate) use requesters::{RequesterSettings, Requesters};
pub(crate) use stop::{StopConditionSettings, StopConditions};

use crate::pattern::Pattern;

/// What a guard that may wait says about a restart now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allow,
    /// Not now: try again at `until`, when the guard could pass.
    Defer {
        /// The next instant the guard opens.
        until: jiff::Timestamp,
        /// Why, in plain words, with when it opens.
        reason: String,
    },
}

/// Which instances may be restarted: `safety.allow` and `safety.deny`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Eligibility {
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
    /// With a real backend nothing is eligible until `allow` names it; with
    /// a simulated one an empty `allow` admits everything.
    require_allow: bool,
}

impl Eligibility {
    /// Parses the patterns; the error names the list and the index.
    pub(crate) fn new(
        allow: &[String],
        deny: &[String],
        require_allow: bool,
    ) -> Result<Self, (String, String)> {
        let parse = |list: &str, patterns: &[String]| {
            patterns
                .iter()
                .enumerate()
                .map(|(index, raw)| {
                    let key = || format!("safety.{list}[{index}]");
                    // Names are matched in lower case (an instance's name
                    // is, and another name is lowered when none matched as
                    // written): `DB-*` would deny nothing while looking
                    // like a protection.
                    if raw.bytes().any(|b| b.is_ascii_uppercase()) {
                        return Err((
                            key(),
                            format!(
                                "{raw:?} has capitals, and names are matched in lower case: \
                                 write {:?}",
                                raw.to_ascii_lowercase()
                            ),
                        ));
                    }
                    Pattern::parse(raw).map_err(|why| (key(), why))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            allow: parse("allow", allow)?,
            deny: parse("deny", deny)?,
            require_allow,
        })
    }

    /// Everything eligible: for tests and the simulated backends.
    pub(crate) fn everyone() -> Self {
        Self::default()
    }

    /// Nothing eligible.
    pub(crate) fn nobody() -> Self {
        Self {
            require_allow: true,
            ..Self::default()
        }
    }

    /// `Err` with the denial's reason when `other`, another name of the
    /// machine `instance` is (its address in the inventory, or an entry
    /// sharing that address), matches `safety.deny`: denying a machine by
    /// one name denies it by every name.
    ///
    /// `other` is matched as written and as the inventory tells machines
    /// apart (a DNS name in lower case, an IPv6 address in its canonical
    /// form): `DB-Primary.internal` is the machine `db-*` denies. (Allocates
    /// only for a name with capitals or an IPv6 address that no pattern
    /// matched as written.)
    pub(crate) fn check_other_name(&self, instance: &str, other: &str) -> Result<(), String> {
        let denied = |name: &str| self.deny.iter().find(|p| p.matches(name));
        let spelt_otherwise = || {
            let canonical = match other.parse::<std::net::Ipv6Addr>() {
                Ok(ip) => ip.to_string(),
                Err(_) if other.bytes().any(|b| b.is_ascii_uppercase()) => {
                    other.to_ascii_lowercase()
                }
                Err(_) => return None,
            };
            denied(&canonical)
        };
        if self.deny.is_empty() {
            return Ok(());
        }
        match denied(other).or_else(spelt_otherwise) {
            Some(pattern) => Err(format!(
                "denied by safety.deny: {instance} is the machine {other}, which matches \
                 \"{pattern}\""
            )),
            None => Ok(()),
        }
    }

    /// `Ok` if `instance` may be restarted, else the reason it may not, in
    /// plain words: what a denied request records.
    pub(crate) fn check(&self, instance: &str) -> Result<(), String> {
        if let Some(pattern) = self.deny.iter().find(|p| p.matches(instance)) {
            return Err(format!(
                "denied by safety.deny: {instance} matches \"{pattern}\""
            ));
        }
        if self.allow.is_empty() {
            if self.require_allow {
                return Err(format!(
                    "denied: {instance} is not eligible; with a real backend nothing is \
                     restarted until safety.allow names it"
                ));
            }
            return Ok(());
        }
        if self.allow.iter().any(|p| p.matches(instance)) {
            Ok(())
        } else {
            Err(format!(
                "denied: {instance} matches no safety.allow pattern"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(patterns: &[&str]) -> Vec<String> {
        patterns.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn deny_wins_and_a_real_backend_needs_an_allow_list() {
        let rules = Eligibility::new(&list(&["cattle-*"]), &list(&["cattle-db*"]), true).unwrap();
        assert!(rules.check("cattle-ab12").is_ok());
        let denied = rules.check("cattle-db01").unwrap_err();
        assert!(
            denied.contains("safety.deny") && denied.contains("cattle-db*"),
            "{denied}"
        );
        assert!(
            rules
                .check("pet-01")
                .unwrap_err()
                .contains("no safety.allow")
        );
        let leashed = Eligibility::new(&[], &[], true).unwrap();
        assert!(
            leashed
                .check("cattle-ab12")
                .unwrap_err()
                .contains("until safety.allow")
        );
        let simulated = Eligibility::new(&[], &list(&["pet-*"]), false).unwrap();
        assert!(simulated.check("cattle-ab12").is_ok());
        assert!(simulated.check("pet-01").is_err());
        let (key, _) = Eligibility::new(&list(&["a", ""]), &[], true).unwrap_err();
        assert_eq!(key, "safety.allow[1]");
    }

    #[test]
    fn deny_matches_every_other_name_of_the_machine() {
        let rules = Eligibility::new(&list(&["cattle-*"]), &list(&["db-*"]), true).unwrap();
        let denied = rules
            .check_other_name("cattle-a9", "db-primary.internal")
            .unwrap_err();
        assert!(
            denied.contains("cattle-a9") && denied.contains("db-primary.internal"),
            "{denied}"
        );
        assert!(rules.check_other_name("cattle-a9", "10.0.0.9").is_ok());
        // However the address is spelt: capitals, an IPv6 address written
        // long or in capitals.
        assert!(
            rules
                .check_other_name("cattle-a9", "DB-Primary.internal")
                .is_err()
        );
        let by_address = Eligibility::new(&list(&["cattle-*"]), &list(&["fd00::9"]), true).unwrap();
        for spelling in ["fd00::9", "FD00:0::9", "fd00:0:0:0:0:0:0:9"] {
            assert!(
                by_address.check_other_name("cattle-a9", spelling).is_err(),
                "{spelling}"
            );
        }
        assert!(by_address.check_other_name("cattle-a9", "fd00::10").is_ok());
    }
}
