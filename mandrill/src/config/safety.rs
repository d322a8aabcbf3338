//! `[safety]`, and the safety policy built from it (what a SIGHUP replaces).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};
use crate::restarter::hosts::HostMap;
use crate::safety::requesters::AtFault;
use crate::safety::{
    BudgetSettings, Calendar, CalendarSettings, Clock, Counting, Eligibility, Guards, Policy,
    RateSettings, ReplyDestinations, Requesters, StopConditionSettings, StopConditions,
};
use crate::settings::{duration, settings};

settings! {
    /// `[safety]`: what keeps a chaos tool harmless by default.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct SafetySettings {
        /// This instance's own leash: record restarts as dry-run, issue none
        /// (default: true with a real backend); `mandrill unleash` overrides.
        ///
        /// Leashed, every restart is decided and recorded as `dry-run` with
        /// the exact action it would take. Unset means true with a real
        /// backend (command, ssh, http) and false with a simulated one;
        /// `mandrill run --unleash` sets it to false at start-up. A reload
        /// changes it only if the file's own value changed. The leash an
        /// operator records in the store (`mandrill leash`, `mandrill
        /// unleash --reason`) decides over it for every instance
        /// (docs/safety.md, "The leash").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub dry_run: Option<bool> = None,
        /// Instance-name patterns that may be restarted (a real backend
        /// restarts nothing until set).
        pub allow: Vec<String> = Vec::new(),
        /// Instance-name patterns never restarted; wins over allow.
        pub deny: Vec<String> = Vec::new(),
        /// Pause every instance when a restarted host does not come back
        /// healthy; `mandrill resume` resumes.
        pub pause_on_unrecovered: bool = true,
        /// How often a running service reads the kill switch (above 0s).
        ///
        /// Pulling pauses within this of `mandrill pause` and resumes within
        /// this of `mandrill resume`; claims read the switch at once.
        #[serde(with = "duration")]
        pub poll_interval: Duration = Duration::from_secs(1),
        /// `[safety.calendar]`: when restarts may happen.
        ///
        /// Unset means Monday to Friday 09:00–15:00 UTC with a real backend,
        /// always with a simulated one. See `safety::calendar`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub calendar: Option<CalendarSettings> = None,
        /// A request deferred this much open calendar time after it was
        /// published is recorded expired and acked.
        ///
        /// A restart wanted yesterday is not one to issue today; but time
        /// the calendar is closed does not count, so a request published
        /// on a Saturday waits for Monday's opening. Without a calendar all
        /// time counts. Without a published_at, or with one over 5 minutes
        /// ahead of the clock, counted from when the store first received
        /// the request.
        #[serde(with = "duration")]
        pub max_defer: Duration = Duration::from_secs(24 * 3600),
        /// The longest a deferred request waits before it is looked at
        /// again (above 0s), whatever its guard waits for.
        ///
        /// A reload, a `mandrill resume` or a slot freed early reaches a
        /// deferred request within this; each look records one more
        /// deferral.
        #[serde(with = "duration")]
        pub recheck: Duration = crate::safety::guards::DEFAULT_RECHECK,
        /// Group → instance patterns, { web = ["web-*"] } (default group:
        /// the instance name without its last -suffix).
        ///
        /// A request's group is the one its message names, else the first
        /// group here (by name) with a matching pattern.
        pub groups: BTreeMap<String, Vec<String>> = BTreeMap::new(),
        /// `[safety.rate]`: restarts per group and in all per window, and a
        /// cooldown per host. See `safety::limits`.
        pub rate: RateSettings = RateSettings::default(),
        /// `[safety.budget]`: hosts per group disrupted at once.
        pub budget: BudgetSettings = BudgetSettings::default(),
        /// [[safety.stop_conditions]] name, http = URL (expect_status,
        /// default 200; expect_empty_json_array = true: the body must be
        /// `[]` too, for alert APIs) or command = [argv], timeout (default 5s): checked
        /// right before each restart; one that fails, errs or times out
        /// defers it (fail closed).
        pub stop_conditions: Vec<StopConditionSettings> = Vec::new(),
        /// A delivery a stop condition deferred comes back after this.
        #[serde(with = "duration")]
        pub stop_retry: Duration = Duration::from_secs(30),
        /// Refuse unsigned requests (default: true with a real backend).
        ///
        /// Unset means true with a real backend (command, ssh, http) and
        /// false with a simulated one: an unsigned request is then
        /// `rejected` and dead-lettered. Set false explicitly to accept
        /// unsigned requests with a real backend (a loud warning at start).
        /// A `--set safety.require_signed=false` holds until a reload reads
        /// true from the file: the stricter wins.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub require_signed: Option<bool> = None,
        /// The audience signed requests must name in `aud` (unset: any).
        ///
        /// Binds a token to one deployment: with it set, a token whose
        /// `aud` names another audience, or none, is rejected, and
        /// `publish`, `campaign start` and `[[schedule]]` sign for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub audience: Option<String> = None,
        /// While this file exists, restarts are paused (its directory is
        /// watched and must exist; not reloaded).
        ///
        /// The kill switch, set by `pause-file@HOST:PATH`; removing the
        /// file resumes only if the pause in force is still that one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pause_file: Option<PathBuf> = None,
    }
}

impl Config {
    /// The calendar guard: as configured; Chaos Monkey's (Mon–Fri
    /// 09:00–15:00 UTC) when unset with a real backend; none when unset
    /// with a simulated one.
    pub(crate) fn calendar(&self) -> Result<Option<Calendar>, (String, String)> {
        match &self.safety.calendar {
            Some(settings) => {
                let calendar = Calendar::new(settings)?;
                if let Some(why) = calendar.never_opens_after(jiff::Timestamp::now()) {
                    return Err(("safety.calendar".into(), why));
                }
                Ok(Some(calendar))
            }
            None if self.restarter.kind.is_real() => Ok(Some(Calendar::chaos_monkey())),
            None => Ok(None),
        }
    }

    /// The counting guards, with the strict defaults for a real backend.
    pub(crate) fn counting(&self) -> Result<Counting, (String, String)> {
        Counting::new(
            &self.safety.groups,
            &self.safety.rate,
            &self.safety.budget,
            self.restarter.kind.is_real(),
        )
        .map(|counting| counting.verified_by_probe(self.verified_by_probe()))
    }

    /// Whether a verification probe confirms each restart's recovery
    /// (`[verify]`): without one, nothing is ever `unrecovered`, and a
    /// restart counts as a disruption for `safety.budget.settle`.
    pub(crate) fn verified_by_probe(&self) -> bool {
        self.verify.probe != crate::restarter::verify::ProbeKind::None
    }

    /// Whether restarts are only decided and recorded, not issued.
    pub(crate) fn dry_run(&self) -> bool {
        self.safety
            .dry_run
            .unwrap_or_else(|| self.restarter.kind.is_real())
    }

    /// Whether unsigned requests are refused: as set, else with a real
    /// backend.
    pub(crate) fn require_signed(&self) -> bool {
        self.safety
            .require_signed
            .unwrap_or_else(|| self.restarter.kind.is_real())
    }

    /// The safety policy: what the worker decides with, and what a reload
    /// of `[safety]` replaces. Fails naming the key, as `validate` does.
    pub(crate) fn policy(&self) -> Result<Policy, ConfigError> {
        let requesters = Requesters::new(&self.requesters, self.require_signed())
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        self.policy_with(requesters.for_audience(self.safety.audience.clone()))
    }

    /// As [`policy`](Self::policy), for a reload: a `[[requesters]]` entry
    /// whose key cannot be used (its file deleted, say) is left out, so
    /// that the running service stops trusting it rather than keeping the
    /// key it read before (fail closed). Also returns the left-out entries'
    /// (key, why), to be logged.
    pub(crate) fn reloaded_policy(&self) -> Result<(Policy, Vec<AtFault>), ConfigError> {
        let (requesters, left_out) =
            Requesters::without_unusable_keys(&self.requesters, self.require_signed())
                .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        let requesters = requesters.for_audience(self.safety.audience.clone());
        Ok((self.policy_with(requesters)?, left_out))
    }

    fn policy_with(&self, requesters: Requesters) -> Result<Policy, ConfigError> {
        let invalid = |(key, why): (String, String)| ConfigError::invalid(&key, why);
        Ok(Policy {
            dry_run: self.dry_run(),
            eligibility: Eligibility::new(
                &self.safety.allow,
                &self.safety.deny,
                self.restarter.kind.is_real(),
            )
            .map_err(invalid)?,
            guards: Guards {
                calendar: self.calendar().map_err(invalid)?,
                counting: self.counting().map_err(invalid)?,
                max_defer: self.safety.max_defer,
                recheck: self.safety.recheck,
                clock: Clock::System,
            },
            pause_on_unrecovered: self.safety.pause_on_unrecovered,
            stop_conditions: StopConditions::new(&self.safety.stop_conditions).map_err(invalid)?,
            stop_retry: self.safety.stop_retry,
            // The service's handle, set where the inventory is loaded.
            inventory: None,
            requesters: Arc::new(requesters),
            reply_to: ReplyDestinations::new(&self.broker.reply_to_allowed).map_err(invalid)?,
            recovery_objectives: self.recovery_objective.clone(),
            hosts: Arc::new(
                HostMap::new(&self.hosts).map_err(|why| ConfigError::invalid("hosts", why))?,
            ),
        })
    }
}
