//! Configuration: one typed struct, layered file → environment → flags.
//!
//! Every layer is merged as a TOML table and deserialised once, so a bad key
//! or value is reported with its dotted path (`worker.max_in_flight`) whatever
//! layer it came from. Environment variables are `MANDRILL_SECTION__KEY`
//! (double underscore between section and key); other `MANDRILL_*` names
//! (`MANDRILL_TEST_POSTGRES`, …) are not configuration and are ignored, unless
//! they look like a setting with a single underscore, which is an error.
//! Unknown keys are errors. Every value is bounded to what the code can
//! handle, so that no input makes the service panic.
//!
//! Secrets (`broker.nats.password`, `broker.nats.token`, `admin.token`,
//! credentials in `broker.url` and `store.url`) are never echoed: errors name
//! their key only, and [`Config::redactor`] masks them in anything printed.
//!
//! The files: the model, one file per group of sections (`broker.rs`,
//! `worker.rs`, `restarter.rs`, `safety.rs`, `service.rs`), each section
//! declared once with [`settings!`](crate::settings) so that its field docs
//! are its help; the adapters' own sections (`[broker.sqlite]`,
//! `[broker.nats]`, `[broker.pubsub]`, the restarter backends) and the
//! guards' (`[safety.rate]`, …) live in their modules, which never import
//! this one. `load.rs` reads and layers the sources, `validate.rs` and `urls.rs` check what types cannot,
//! `docs.rs` is the help and docs/settings.md, `flat.rs` the flat view
//! reloads compare.

use serde::{Deserialize, Serialize};

use crate::inventory::InventorySettings;
use crate::notify::{NotifierSettings, NotifyEntry};
use crate::restarter::VerifySettings;
use crate::restarter::hosts::HostEntry;
use crate::safety::RequesterSettings;
use crate::safety::objectives::RecoveryObjective;
use crate::schedule::ScheduleSettings;
use crate::settings::settings;

mod broker;
mod docs;
mod error;
mod flat;
pub(crate) mod limits;
mod load;
mod restarter;
mod safety;
mod schedule;
mod service;
#[cfg(test)]
mod tests;
mod urls;
mod validate;
mod worker;

#[cfg(test)]
use crate::settings::Secret;
pub(crate) use crate::settings::{Redactor, redact, redact_url};
pub(crate) use broker::{BrokerSettings, StoreSettings};
pub(crate) use docs::settings_help;
pub use docs::settings_reference;
pub(crate) use error::ConfigError;
#[cfg(test)]
use load::SECRET_KEYS;
pub(crate) use load::{Sources, parse_override};
pub(crate) use restarter::{RestarterKind, RestarterSettings};
pub(crate) use safety::SafetySettings;
pub(crate) use schedule::schedule_groups_known;
pub(crate) use service::{
    AdminListen, AdminSettings, DebugSettings, LogFormat, LogSettings, SimulateSettings,
};
pub(crate) use worker::{MessageSettings, WorkerSettings};

settings! {
    /// The whole configuration. Each part of the service receives only its section.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct Config {
        /// Where requests come from.
        pub broker: BrokerSettings = BrokerSettings::default(),
        /// Where outcomes are recorded.
        pub store: StoreSettings = StoreSettings::default(),
        /// How messages are handled.
        pub worker: WorkerSettings = WorkerSettings::default(),
        /// How payloads are validated.
        pub message: MessageSettings = MessageSettings::default(),
        /// What restarts hosts.
        pub restarter: RestarterSettings = RestarterSettings::default(),
        /// The built-in demo publisher.
        pub simulate: SimulateSettings = SimulateSettings::default(),
        /// Logging.
        pub log: LogSettings = LogSettings::default(),
        /// Debugging aids.
        pub debug: DebugSettings = DebugSettings::default(),
        /// The operator's HTTP surface (`[admin]`): metrics, health, status.
        pub admin: AdminSettings = AdminSettings::default(),
        /// Recovery verification after each restart (`[verify]`).
        pub verify: VerifySettings = VerifySettings::default(),
        /// Safety guards.
        pub safety: SafetySettings = SafetySettings::default(),
        /// The operator's inventory (`[inventory]`): hosts, groups, zones.
        pub inventory: InventorySettings = InventorySettings::default(),
        /// `[[hosts]]` pattern = "cattle-*", address, port, user: where
        /// instances are reached.
        ///
        /// Unmapped instances are `{instance_name}.{message.domain}`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub hosts: Vec<HostEntry> = Vec::new(),
        /// `[[notify]]` url (a secret, never logged), format = "json" |
        /// "slack", events = ["restarted", "failed", "dead-lettered",
        /// "unrecovered", "paused", "resumed"], timeout: webhooks told of
        /// what happened.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub notify: Vec<NotifyEntry> = Vec::new(),
        /// The notifications' queue and shutdown bound (`[notifier]`).
        pub notifier: NotifierSettings = NotifierSettings::default(),
        /// `[[requesters]]` name, public_key (PEM) or public_key_file,
        /// allow = [instance patterns], groups = [names], [requesters.quota]
        /// max, window: who may sign requests, for what, how many.
        ///
        /// A signed request (a JWT, EdDSA or ES256) is verified against the
        /// key of the requester its `iss` names; see docs/safety.md.
        /// Reloaded on SIGHUP (key files are read again).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub requesters: Vec<RequesterSettings> = Vec::new(),
        /// `[[schedule]]` name, group, mean_time_between (of
        /// calendar-open time), requester and key_file (signed as),
        /// max_lateness: restarts mandrill plans itself.
        ///
        /// Times are a Poisson process over the calendar's open time,
        /// victims drawn from the group's eligible inventory hosts; see
        /// docs/scheduling.md. Read at start-up only.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub schedule: Vec<ScheduleSettings> = Vec::new(),
        /// `[[recovery_objective]]` group, percentile (95), max (e.g.
        /// "2m"), over_last (20), pause_on_breach (false): how fast a
        /// group's restarted hosts must come back.
        ///
        /// Judged over the group's last `over_last` verified restarts
        /// (nearest rank; an unrecovered host never came back); shown by
        /// `status`, `/metrics` and the dashboard; a breach with
        /// `pause_on_breach` pauses that group until `mandrill resume
        /// --group`. See docs/operating.md. Reloaded on SIGHUP.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub recovery_objective: Vec<RecoveryObjective> = Vec::new(),
    }
}

/// Settings that a reload (SIGHUP) applies without a restart, besides
/// `[safety]` (see [`reloads`]).
pub(crate) const RELOADABLE: &[&str] = &[
    "log.level",
    "worker.max_in_flight",
    "simulate.rate",
    "requesters",
    "broker.reply_to_allowed",
    "recovery_objective",
];

/// The `[safety]` settings a reload does not apply: the switch's polling
/// and the pause file's watch are set up once, at start.
const SAFETY_NEEDS_RESTART: &[&str] = &["safety.poll_interval", "safety.pause_file"];

/// Whether a reload (SIGHUP) applies `key` without a restart: the
/// [`RELOADABLE`] settings, the safety policy (every `safety.` key but
/// `safety.poll_interval` and `safety.pause_file`), and `[inventory]`.
pub(crate) fn reloads(key: &str) -> bool {
    RELOADABLE.contains(&key)
        || key.starts_with("inventory.")
        || (key.starts_with("safety.") && !SAFETY_NEEDS_RESTART.contains(&key))
}

impl Config {
    /// Masks every secret of this configuration: passwords, tokens and
    /// secret parameters in `broker.url` and `store.url`,
    /// `broker.nats.password`, `broker.nats.token`, `admin.token` and the
    /// webhooks' URLs.
    pub(crate) fn redactor(&self) -> Redactor {
        let nats = &self.broker.nats;
        let mut secrets = redact::url_secrets(&self.broker.url);
        secrets.extend(redact::url_secrets(&self.store.url));
        if let Some(url) = &self.inventory.url {
            secrets.extend(redact::url_secrets(url));
        }
        // A command's arguments are never shown, but what it writes to
        // stderr (kept in the read's error) may quote one: ansible names
        // the source it cannot parse, credentials and all.
        for argument in self.inventory.command.iter().skip(1) {
            secrets.extend(redact::url_secrets(argument));
        }
        for secret in [&nats.password, &nats.token, &self.admin.token]
            .into_iter()
            .flatten()
        {
            secrets.push(secret.0.clone());
        }
        for entry in &self.notify {
            secrets.extend(redact::webhook_secrets(&entry.url.0));
        }
        Redactor::new(secrets)
    }
}
