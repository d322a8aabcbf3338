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
//! Secrets (`nats.password`, `nats.token`, credentials in `broker.url` and
//! `store.url`) are never echoed: errors name their key only, and
//! [`Config::redactor`] masks them in anything printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::broker::pubsub::{self, PubSubSettings};
use crate::domain::{Domain, ParseRules};
use crate::notify::{NotifierSettings, NotifyEntry};
use crate::restarter::hosts::HostEntry;
use crate::restarter::verify::ProbeKind;
use crate::restarter::{CommandSettings, HttpSettings, SshSettings, VerifySettings};
use crate::safety::{
    BudgetSettings, Calendar, CalendarSettings, Clock, Counting, Eligibility, Guards, Policy,
    PolicyHandle, RateSettings, StopConditionSettings, StopConditions,
};
use crate::worker::WorkerConfig;

pub mod redact;

pub use redact::{Redactor, redact_url};

/// The whole configuration. Each part of the service receives only its section.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where requests come from.
    pub broker: BrokerConfig,
    /// Where outcomes are recorded.
    pub store: StoreConfig,
    /// How messages are handled.
    pub worker: WorkerSection,
    /// How payloads are validated.
    pub message: MessageConfig,
    /// What restarts hosts.
    pub restarter: RestarterConfig,
    /// The built-in demo publisher.
    pub simulate: SimulateConfig,
    /// Logging.
    pub log: LogConfig,
    /// Debugging aids.
    pub debug: DebugConfig,
    /// The operator's HTTP surface (`[admin]`): metrics, health, status.
    pub admin: AdminConfig,
    /// NATS JetStream, when `broker.url` is `nats://…`.
    pub nats: NatsConfig,
    /// Recovery verification after each restart (`[verify]`).
    pub verify: VerifySettings,
    /// Safety guards.
    pub safety: SafetyConfig,
    /// Where instances are really reached (`[[hosts]]`): pattern → address,
    /// port, user. Unmapped instances are `{instance_name}.{message.domain}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostEntry>,
    /// Webhooks told of restarts, failures and the kill switch (`[[notify]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<NotifyEntry>,
    /// The notifications' queue and shutdown bound (`[notifier]`).
    pub notifier: NotifierSettings,
}

/// A value that must never reach a log: its `Debug` is `****`. It is still
/// serialised (configuration diffs compare values, and log only key names).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("****")
    }
}

/// `[nats]`: the stream and durable consumer every instance shares, and how
/// to reach the server. `broker.ack_deadline` is the consumer's ack wait; the
/// consumer redelivers without limit (`max_deliver = -1`), since the worker
/// keeps `broker.max_deliveries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// The stream holding requests (created if missing, work-queue retention).
    pub stream: String,
    /// The subject requests are published on.
    pub subject: String,
    /// The durable pull consumer shared by every instance.
    pub consumer: String,
    /// Where dead letters are copied with their reason (stream `{stream}_DEAD`).
    pub dead_letter_subject: String,
    /// Unacknowledged deliveries allowed across all instances.
    pub max_ack_pending: i64,
    /// User, with `password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Password, with `user`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// Token authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A `.creds` file (JWT and nkey seed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creds_file: Option<PathBuf>,
    /// Require TLS.
    pub tls: bool,
    /// Extra root certificates (PEM) for TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            stream: "MANDRILL".into(),
            subject: "mandrill.requests".into(),
            consumer: "mandrill".into(),
            dead_letter_subject: "mandrill.dead".into(),
            max_ack_pending: 10_000,
            user: None,
            password: None,
            token: None,
            creds_file: None,
            tls: false,
            tls_ca_file: None,
        }
    }
}

/// `[broker]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `sqlite:PATH` (a durable queue, by default in the store's file),
    /// `nats://HOST:PORT` (JetStream, see `[nats]`) or `memory` (in-process,
    /// nothing survives the process).
    pub url: String,
    /// How long a delivery stays leased without an extension.
    #[serde(with = "duration")]
    pub ack_deadline: Duration,
    /// How long one pull waits for a first message.
    #[serde(with = "duration")]
    pub poll_wait: Duration,
    /// How often a waiting pull looks for messages published by other
    /// processes (SQLite only; this process's publishes wake it at once).
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// Deliveries of a message before the worker gives up on it, records why
    /// in the store and dead-letters it, on every broker: the backstop for a
    /// message whose handler keeps crashing, losing its lease or being
    /// deferred. Brokers never give up by themselves (the JetStream consumer
    /// is created with `max_deliver = -1`).
    pub max_deliveries: u32,
    /// `[broker.pubsub]`, when `url` is `pubsub://PROJECT/SUBSCRIPTION`.
    pub pubsub: PubSubSettings,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: "sqlite:mandrill.db".into(),
            ack_deadline: Duration::from_secs(10),
            poll_wait: Duration::from_secs(1),
            poll_interval: Duration::from_millis(100),
            max_deliveries: 10,
            pubsub: PubSubSettings::default(),
        }
    }
}

/// `[store]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite:PATH`, `postgres://…` or `memory`.
    pub url: String,
    /// Connections in the pool.
    pub max_connections: u32,
    /// PostgreSQL: writer tasks that commit claims and outcomes in groups,
    /// each with one pooled connection while it commits (at most
    /// `max_connections - 1` of them run).
    pub writers: u32,
    /// How long finished requests stay in the history; older ones are
    /// pruned in the background, a bounded number of rows per pass. `0s`
    /// keeps them forever.
    #[serde(with = "duration")]
    pub retention: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "sqlite:mandrill.db".into(),
            max_connections: 4,
            writers: crate::store::postgres::DEFAULT_WRITERS,
            retention: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

/// `[worker]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    /// Messages handled at once (reloadable).
    pub max_in_flight: usize,
    /// Most messages asked for in one pull.
    pub pull_batch: usize,
    /// Deliveries of a message before a failing restart is dead-lettered.
    pub max_attempts: u32,
    /// First redelivery delay after a failed restart; doubles per attempt.
    #[serde(with = "duration")]
    pub retry_initial: Duration,
    /// Longest redelivery delay.
    #[serde(with = "duration")]
    pub retry_max: Duration,
    /// Tries at recording an outcome before nacking.
    pub record_attempts: u32,
    /// Delay between those tries; doubles per try.
    #[serde(with = "duration")]
    pub record_backoff: Duration,
    /// A restart taking longer counts as failed.
    #[serde(with = "duration")]
    pub restart_timeout: Duration,
    /// Time in-flight work may take to finish on shutdown.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Lease extension interval; default a third of the ack deadline.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub lease_extension_interval: Option<Duration>,
    /// Consecutive pull failures before the service gives up.
    pub max_pull_failures: u32,
    /// First delay before restarting a failed pull loop; doubles, up to 30s.
    #[serde(with = "duration")]
    pub pull_backoff: Duration,
}

impl Default for WorkerSection {
    fn default() -> Self {
        Self {
            max_in_flight: 100,
            pull_batch: 32,
            max_attempts: 5,
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            record_attempts: 5,
            record_backoff: Duration::from_millis(100),
            restart_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            lease_extension_interval: None,
            max_pull_failures: 10,
            pull_backoff: Duration::from_millis(200),
        }
    }
}

/// `[message]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MessageConfig {
    /// Hostname = `{instance_name}.{domain}`.
    pub domain: String,
    /// Larger payloads are dead-lettered unread.
    pub max_payload_bytes: usize,
}

impl Default for MessageConfig {
    fn default() -> Self {
        Self {
            domain: "example.net".into(),
            max_payload_bytes: 4096,
        }
    }
}

/// Which restart backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RestarterKind {
    /// Waits asynchronously, fails at random.
    Simulate,
    /// Blocks a thread of the bounded blocking pool, fails at random.
    SimulateBlocking,
    /// Runs a program per restart, without a shell (`[restarter.command]`).
    Command,
    /// Runs a command on the host over SSH (`[restarter.ssh]`).
    Ssh,
    /// Calls a webhook (`[restarter.http]`).
    Http,
}

impl RestarterKind {
    /// Whether this backend touches real hosts.
    pub fn is_real(self) -> bool {
        matches!(self, Self::Command | Self::Ssh | Self::Http)
    }
}

/// `[restarter]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestarterConfig {
    /// `simulate` or `simulate-blocking`.
    pub kind: RestarterKind,
    /// Shortest simulated restart.
    #[serde(with = "duration")]
    pub min_latency: Duration,
    /// Longest simulated restart.
    #[serde(with = "duration")]
    pub max_latency: Duration,
    /// Probability in [0, 1] that a simulated restart fails.
    pub failure_rate: f64,
    /// Blocking restarts running at once (blocking kinds only).
    pub blocking_threads: usize,
    /// Append one line (the host) per restart issued to this file, before
    /// issuing it: an audit trail that survives the process being killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<PathBuf>,
    /// `[restarter.command]`: the `command` backend.
    pub command: CommandSettings,
    /// `[restarter.ssh]`: the `ssh` backend.
    pub ssh: SshSettings,
    /// `[restarter.http]`: the `http` backend.
    pub http: HttpSettings,
}

impl Default for RestarterConfig {
    fn default() -> Self {
        Self {
            kind: RestarterKind::Simulate,
            min_latency: Duration::ZERO,
            max_latency: Duration::from_secs(1),
            failure_rate: 0.1,
            blocking_threads: 16,
            journal: None,
            command: CommandSettings::default(),
            ssh: SshSettings::default(),
            http: HttpSettings::default(),
        }
    }
}

/// `[safety]`: what keeps a chaos tool harmless by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyConfig {
    /// Leashed: decide and record every restart as `dry-run` with the exact
    /// action it would take, and issue none. Unset means true with a real
    /// backend (command, ssh, http) and false with a simulated one;
    /// `mandrill run --unleash` sets it to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// Instance-name patterns that may be restarted. With a real backend,
    /// nothing is restarted until this names it.
    pub allow: Vec<String>,
    /// Instance-name patterns never restarted; deny wins over allow.
    pub deny: Vec<String>,
    /// Turn the kill switch on (every instance) when a restarted host does
    /// not come back healthy; `mandrill resume` turns it off.
    pub pause_on_unrecovered: bool,
    /// How often a running service reads the kill switch (pulling pauses
    /// within this of `mandrill pause`; claims read it at once).
    #[serde(with = "duration")]
    pub poll_interval: Duration,
    /// `[safety.calendar]`: when restarts may happen. Unset means Monday to
    /// Friday 09:00–15:00 UTC with a real backend, always with a simulated
    /// one. See `safety::calendar`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<CalendarSettings>,
    /// A request still deferred this long after it was published is
    /// recorded `expired` and acked: a restart wanted yesterday is not one
    /// to issue today.
    #[serde(with = "duration")]
    pub max_defer: Duration,
    /// Group name → instance-name patterns; a request's group is the one
    /// its message names, else the first group here (by name) with a
    /// matching pattern, else its instance name without the last `-suffix`.
    pub groups: BTreeMap<String, Vec<String>>,
    /// `[safety.rate]`: restarts per group and in all per window, and a
    /// cooldown per host. See `safety::limits`.
    pub rate: RateSettings,
    /// `[safety.budget]`: hosts per group disrupted at once.
    pub budget: BudgetSettings,
    /// `[[safety.stop_conditions]]`: checks run right before each restart;
    /// one that fails, errs or times out defers it (fail closed).
    pub stop_conditions: Vec<StopConditionSettings>,
    /// How soon a delivery a stop condition deferred comes back.
    #[serde(with = "duration")]
    pub stop_retry: Duration,
    /// While this file exists, restarts are paused (the kill switch, set
    /// by `pause-file`); removing it resumes them. Its directory must exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_file: Option<PathBuf>,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        Self {
            dry_run: None,
            allow: Vec::new(),
            deny: Vec::new(),
            pause_on_unrecovered: true,
            poll_interval: Duration::from_secs(1),
            calendar: None,
            max_defer: Duration::from_secs(24 * 3600),
            groups: BTreeMap::new(),
            rate: RateSettings::default(),
            budget: BudgetSettings::default(),
            stop_conditions: Vec::new(),
            stop_retry: Duration::from_secs(30),
            pause_file: None,
        }
    }
}

/// `[simulate]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulateConfig {
    /// Publish random requests into the broker (demo mode).
    pub enabled: bool,
    /// Requests per second (reloadable).
    pub rate: f64,
    /// Fraction of published payloads that are deliberately malformed.
    pub malformed_rate: f64,
}

impl Default for SimulateConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            rate: 2.0,
            malformed_rate: 0.0,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per step.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter, e.g. `info` or `mandrill=debug` (reloadable).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// `[debug]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DebugConfig {
    /// Warn when the runtime falls this far behind (blocking code on it).
    #[serde(with = "duration")]
    pub stall_threshold: Duration,
    /// Log a status line (counters, in-flight messages) this often; `0s` never.
    #[serde(with = "duration")]
    pub status_interval: Duration,
    /// Debug mode (`mandrill run --debug`): see [`DebugConfig::stall_threshold`]
    /// and [`DebugConfig::status_interval`] for what it lowers.
    pub enabled: bool,
}

impl DebugConfig {
    /// The stall threshold in effect: at most 10ms in debug mode (asyncio's
    /// debug mode reports callbacks over 100ms, which is this service's
    /// default already).
    pub fn stall_threshold(&self) -> Duration {
        if self.enabled {
            self.stall_threshold.min(Duration::from_millis(10))
        } else {
            self.stall_threshold
        }
    }

    /// The status line's period in effect: at most 10s in debug mode, even
    /// if it was turned off.
    pub fn status_interval(&self) -> Duration {
        match self.status_interval {
            interval if !self.enabled => interval,
            interval if interval.is_zero() => Duration::from_secs(10),
            interval => interval.min(Duration::from_secs(10)),
        }
    }
}

impl Default for DebugConfig {
    fn default() -> Self {
        Self {
            stall_threshold: Duration::from_millis(100),
            status_interval: Duration::from_secs(60),
            enabled: false,
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// `IP:PORT` the admin server listens on; `""` disables it.
    pub listen: String,
    /// Bearer token for protected endpoints; required off loopback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            // Loopback only, and a port no common service or well-known
            // exporter uses (not in /etc/services; 8080, 9090, 9100 are).
            listen: "127.0.0.1:9730".into(),
            token: None,
        }
    }
}

impl AdminConfig {
    /// The address to listen on, `None` if disabled. Checked by
    /// [`Config::validate`]: off loopback only with a token.
    pub fn address(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        if self.listen.is_empty() {
            return Ok(None);
        }
        let address: std::net::SocketAddr = self.listen.parse().map_err(|_| {
            ConfigError::invalid(
                "admin.listen",
                format!(
                    "{:?} is not IP:PORT (e.g. 127.0.0.1:9730), or \"\" to disable",
                    self.listen
                ),
            )
        })?;
        match &self.token {
            Some(token) if token.0.is_empty() => {
                Err(ConfigError::invalid("admin.token", "must not be empty"))
            }
            None if !address.ip().is_loopback() => Err(ConfigError::invalid(
                "admin.token",
                format!(
                    "required when admin.listen ({address}) is not a loopback address: \
                     anyone who can reach it could read the service's history"
                ),
            )),
            _ => Ok(Some(address)),
        }
    }
}

/// Upper and lower bounds of the settings, so that no value can make the
/// service panic or allocate without limit. Each says why.
pub mod limits {
    use std::time::Duration;

    /// Longest duration of any setting: far beyond any useful value, and
    /// short enough that adding it to a clock reading, or counting it in
    /// milliseconds, never overflows.
    pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
    /// Longest `store.retention`.
    pub const MAX_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    /// Shortest lease (`broker.ack_deadline`). A lease is extended every
    /// third of it, and the extension must reach the broker (a SQLite group
    /// commit with its fsync, a NATS round trip) before the lease runs out:
    /// below a second, one slow fsync or scheduling stall lets a lease lapse
    /// while its restart runs, and another consumer restarts the host again.
    pub const MIN_ACK_DEADLINE: Duration = Duration::from_secs(1);
    /// Most messages in flight: each holds a task and a lease, and the flow
    /// control semaphore cannot count past `usize::MAX >> 3`.
    pub const MAX_IN_FLIGHT: usize = 1_000_000;
    /// Most messages asked for in one pull (brokers size buffers by it).
    pub const MAX_PULL_BATCH: usize = 10_000;
    /// Largest database pool: the pool sets up a slot per connection up
    /// front, and PostgreSQL's own default limit is 100 connections.
    pub const MAX_CONNECTIONS: u32 = 1_000;
    /// Most `store.writers`.
    pub const MAX_STORE_WRITERS: u32 = 64;
    /// Most blocking restarts at once: tokio's blocking pool has 512 threads.
    pub const MAX_BLOCKING_THREADS: usize = 512;
    /// Largest payload accepted: NATS's own maximum `max_payload` (64 MiB).
    pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
    /// Fastest demo publisher, per second.
    pub const MAX_SIMULATE_RATE: f64 = 1_000_000.0;
    /// Shortest stall threshold: a zero one counts every poll as a stall.
    pub const MIN_STALL_THRESHOLD: Duration = Duration::from_millis(1);
}

/// Settings that a reload (SIGHUP) applies without a restart, besides
/// `[safety]` (see [`reloads`]).
pub const RELOADABLE: &[&str] = &["log.level", "worker.max_in_flight", "simulate.rate"];

/// The `[safety]` settings a reload does not apply: the switch's polling
/// and the pause file's watch are set up once, at start.
const SAFETY_NEEDS_RESTART: &[&str] = &["safety.poll_interval", "safety.pause_file"];

/// Whether a reload (SIGHUP) applies `key` without a restart: the
/// [`RELOADABLE`] settings, and the safety policy (every `safety.` key but
/// `safety.poll_interval` and `safety.pause_file`).
pub fn reloads(key: &str) -> bool {
    RELOADABLE.contains(&key)
        || (key.starts_with("safety.") && !SAFETY_NEEDS_RESTART.contains(&key))
}

/// A configuration that cannot be used, naming the key or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("config file {path} is not valid toml: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// An environment variable does not name a setting.
    #[error("environment variable {name}: {why}")]
    Environment {
        /// The variable.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// A `--set` flag is not `KEY=VALUE` (only the part before any `=` is
    /// kept: the value may be a secret).
    #[error("--set {0:?}: expected SECTION.KEY=VALUE")]
    Override(String),
    /// A key is unknown or its value has the wrong type.
    #[error("invalid configuration at `{key}`: {message}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    fn invalid(key: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

/// Keys whose values are always strings: taken as written from the
/// environment and `--set`, so that `nats.password=12345` is a password and
/// not a number.
const STRING_KEYS: &[&str] = &[
    "broker.url",
    "broker.pubsub.topic",
    "broker.pubsub.dead_letter_topic",
    "broker.pubsub.dead_letter_subscription",
    "broker.pubsub.endpoint",
    "broker.pubsub.credentials_file",
    "store.url",
    "nats.user",
    "nats.password",
    "nats.token",
    "message.domain",
    "log.level",
    "admin.listen",
    "admin.token",
];

/// Keys holding secrets: an error about one never shows its value.
pub const SECRET_KEYS: &[&str] = &["nats.password", "nats.token", "admin.token"];

/// A raw value from the environment or `--set`, typed for its key.
fn value_for(key: &str, raw: &str) -> toml::Value {
    if STRING_KEYS.contains(&key) {
        toml::Value::String(raw.to_owned())
    } else {
        parse_scalar(raw)
    }
}

/// Where configuration comes from, so that a reload can read it all again.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// A TOML file, if any.
    pub file: Option<PathBuf>,
    /// `MANDRILL_SECTION__KEY` variables.
    pub environment: Vec<(String, String)>,
    /// From flags, as dotted key and value; applied last.
    pub overrides: Vec<(String, toml::Value)>,
}

impl Sources {
    /// The configuration variables of this process: `MANDRILL_SECTION__KEY`,
    /// and names that look like a setting misspelt (`MANDRILL_WORKER_MAX_IN_FLIGHT`),
    /// which [`Sources::load`] reports. Other `MANDRILL_*` names, such as the
    /// tests' `MANDRILL_TEST_POSTGRES`, are not configuration.
    pub fn process_environment() -> Result<Vec<(String, String)>, ConfigError> {
        let mut variables = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|name| is_config_variable(name)) else {
                continue;
            };
            let value = value.into_string().map_err(|_| ConfigError::Environment {
                name: name.to_owned(),
                why: "value is not valid UTF-8".into(),
            })?;
            variables.push((name.to_owned(), value));
        }
        Ok(variables)
    }

    /// Reads every layer and builds the configuration.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut table = match &self.file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        for (name, raw) in &self.environment {
            let key = env_key(name)?;
            set_dotted(&mut table, &key, value_for(&key, raw)).map_err(|why| {
                ConfigError::Environment {
                    name: name.clone(),
                    why,
                }
            })?;
        }
        for (key, value) in &self.overrides {
            set_dotted(&mut table, key, value.clone())
                .map_err(|why| ConfigError::invalid(key, why))?;
        }
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
                let key = error.path().to_string();
                // The toml error may add a second line of context ("in `worker`")
                // that the key already says.
                let message = error.into_inner().to_string();
                let first_line = message.lines().next().unwrap_or_default();
                if SECRET_KEYS.contains(&key.as_str()) {
                    // Serde quotes the value it could not use.
                    return ConfigError::invalid(
                        &key,
                        "expected a string (the value is a secret and not shown)",
                    );
                }
                ConfigError::invalid(&key, first_line)
            })?;
        config.validate()?;
        Ok(config)
    }
}

/// Parses a `--set SECTION.KEY=VALUE` flag.
pub fn parse_override(raw: &str) -> Result<(String, toml::Value), ConfigError> {
    let (key, value) = raw
        .split_once('=')
        .ok_or_else(|| ConfigError::Override(raw.to_owned()))?;
    if !is_setting_path(key) {
        return Err(ConfigError::Override(format!("{key}=…")));
    }
    let key = key.trim();
    Ok((key.to_owned(), value_for(key, value.trim())))
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|error| ConfigError::Syntax {
            path: path.to_owned(),
            // Not the error's Display: it quotes the offending line, which
            // may hold a password.
            message: match error.span() {
                Some(span) => {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                    format!("line {line}, column {column}: {}", error.message())
                }
                None => error.message().to_owned(),
            },
        })
}

/// Whether an environment variable belongs to the configuration layer (see
/// [`Sources::process_environment`]).
fn is_config_variable(name: &str) -> bool {
    match name.strip_prefix("MANDRILL_") {
        Some(rest) => rest.contains("__") || misspelt_setting(rest).is_some(),
        None => false,
    }
}

/// The setting `rest` (a variable name less `MANDRILL_`) seems to mean when
/// written with single underscores: `WORKER_MAX_IN_FLIGHT` or `MAX_IN_FLIGHT`.
fn misspelt_setting(rest: &str) -> Option<&'static str> {
    let rest = rest.to_ascii_lowercase();
    SETTING_DOCS.iter().map(|(key, _)| *key).find(|key| {
        let (section, field) = key.split_once('.').unwrap_or_default();
        rest == field || rest == format!("{section}_{field}")
    })
}

/// `MANDRILL_WORKER__MAX_IN_FLIGHT` → `worker.max_in_flight`.
fn env_key(name: &str) -> Result<String, ConfigError> {
    let rest = name.strip_prefix("MANDRILL_").unwrap_or(name);
    let parts: Vec<&str> = rest.split("__").collect();
    let key = parts.join(".").to_lowercase();
    if parts.iter().any(|p| p.is_empty()) || !is_setting_path(&key) {
        let why = match misspelt_setting(rest) {
            Some(key) => format!(
                "expected MANDRILL_SECTION__KEY; did you mean MANDRILL_{}?",
                key.replace('.', "__").to_ascii_uppercase()
            ),
            None => "expected MANDRILL_SECTION__KEY, e.g. MANDRILL_WORKER__MAX_IN_FLIGHT".into(),
        };
        return Err(ConfigError::Environment {
            name: name.to_owned(),
            why,
        });
    }
    Ok(key)
}

/// Settings whose values are maps (name → value), not sections.
const MAP_SETTINGS: &[&str] = &[
    "restarter.command.env",
    "restarter.http.headers",
    "safety.groups",
    "safety.budget.group_sizes",
];

/// Sections that hold sections of their own (`[broker.pubsub]`).
const SUBSECTIONS: &[&str] = &[
    "broker.pubsub",
    "restarter.command",
    "restarter.ssh",
    "restarter.http",
    "safety.rate",
    "safety.budget",
];

/// `section.key`, or `section.subsection.key` for a known subsection.
fn is_setting_path(key: &str) -> bool {
    match key.rsplit_once('.') {
        Some((section, _)) if !section.contains('.') => true,
        Some((section, _)) => SUBSECTIONS.contains(&section.trim()),
        None => false,
    }
}

/// A value as TOML if it reads as a TOML scalar (number, bool), else a string.
fn parse_scalar(raw: &str) -> toml::Value {
    format!("value = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut table| table.remove("value"))
        .filter(|value| !value.is_table())
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Sets `section.key` or `section.subsection.key` (`broker.pubsub.topic`).
fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').collect();
    let Some((field, sections)) = parts.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(format!("{key:?} is not SECTION.KEY"));
    };
    let mut table = table;
    for (depth, section) in sections.iter().enumerate() {
        let entry = table
            .entry((*section).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = entry else {
            return Err(format!(
                "`{}` is not a section",
                sections[..=depth].join(".")
            ));
        };
        table = inner;
    }
    table.insert((*field).to_owned(), value);
    Ok(())
}

impl Config {
    /// Checks what types alone cannot, naming the key at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn at_least_one(key: &str, value: u64) -> Result<(), ConfigError> {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
            Ok(())
        }
        fn probability(key: &str, value: f64) -> Result<(), ConfigError> {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::invalid(
                    key,
                    format!("{value} is not in [0, 1]"),
                ));
            }
            Ok(())
        }
        fn positive(key: &str, value: Duration) -> Result<(), ConfigError> {
            if value.is_zero() {
                return Err(ConfigError::invalid(key, "must be longer than 0s"));
            }
            Ok(())
        }
        fn at_most(key: &str, value: u64, max: u64) -> Result<(), ConfigError> {
            if value > max {
                return Err(ConfigError::invalid(
                    key,
                    format!("{value} is above the maximum of {max}"),
                ));
            }
            Ok(())
        }
        let w = &self.worker;
        let size = |value: usize| value as u64;
        at_least_one("worker.max_in_flight", size(w.max_in_flight))?;
        at_most(
            "worker.max_in_flight",
            size(w.max_in_flight),
            size(limits::MAX_IN_FLIGHT),
        )?;
        at_least_one("worker.pull_batch", size(w.pull_batch))?;
        at_most(
            "worker.pull_batch",
            size(w.pull_batch),
            size(limits::MAX_PULL_BATCH),
        )?;
        at_least_one("worker.max_attempts", w.max_attempts.into())?;
        at_least_one("worker.record_attempts", w.record_attempts.into())?;
        at_least_one("worker.max_pull_failures", w.max_pull_failures.into())?;
        at_least_one("store.max_connections", self.store.max_connections.into())?;
        at_most(
            "store.max_connections",
            self.store.max_connections.into(),
            limits::MAX_CONNECTIONS.into(),
        )?;
        at_least_one("store.writers", self.store.writers.into())?;
        at_most(
            "store.writers",
            self.store.writers.into(),
            limits::MAX_STORE_WRITERS.into(),
        )?;
        at_least_one(
            "message.max_payload_bytes",
            size(self.message.max_payload_bytes),
        )?;
        at_most(
            "message.max_payload_bytes",
            size(self.message.max_payload_bytes),
            size(limits::MAX_PAYLOAD_BYTES),
        )?;
        at_least_one(
            "restarter.blocking_threads",
            size(self.restarter.blocking_threads),
        )?;
        at_most(
            "restarter.blocking_threads",
            size(self.restarter.blocking_threads),
            size(limits::MAX_BLOCKING_THREADS),
        )?;
        for (key, value) in self.durations() {
            if value > limits::MAX_DURATION {
                return Err(ConfigError::invalid(key, "is longer than 365 days"));
            }
        }
        // Audit history may be kept for years; bounded so that "now minus
        // retention" never overflows.
        if self.store.retention > limits::MAX_RETENTION {
            return Err(ConfigError::invalid(
                "store.retention",
                "is longer than 100 years",
            ));
        }
        if self.broker.ack_deadline < limits::MIN_ACK_DEADLINE {
            return Err(ConfigError::invalid(
                "broker.ack_deadline",
                "must be at least 1s: a shorter lease can lapse before its extension lands, \
                 and another consumer would restart the host again",
            ));
        }
        positive("broker.poll_interval", self.broker.poll_interval)?;
        if self.broker.max_deliveries < w.max_attempts {
            return Err(ConfigError::invalid(
                "broker.max_deliveries",
                format!(
                    "{} is below worker.max_attempts ({}): the worker's last attempt would never come",
                    self.broker.max_deliveries, w.max_attempts
                ),
            ));
        }
        positive("worker.restart_timeout", w.restart_timeout)?;
        if let Some(interval) = w.lease_extension_interval
            && (interval > self.broker.ack_deadline / 2 || interval.is_zero())
        {
            return Err(ConfigError::invalid(
                "worker.lease_extension_interval",
                "must be above 0s and at most half of broker.ack_deadline, \
                 so that an extension lands before the lease runs out",
            ));
        }
        if self.debug.stall_threshold < limits::MIN_STALL_THRESHOLD {
            return Err(ConfigError::invalid(
                "debug.stall_threshold",
                "must be at least 1ms",
            ));
        }
        self.validate_urls()?;
        self.validate_restarter()?;
        Eligibility::new(
            &self.safety.allow,
            &self.safety.deny,
            self.restarter.kind.is_real(),
        )
        .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        self.calendar()
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        self.counting()
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        StopConditions::new(&self.safety.stop_conditions)
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        positive("safety.stop_retry", self.safety.stop_retry)?;
        if let Some(path) = &self.safety.pause_file
            && (path.as_os_str().is_empty() || path.file_name().is_none())
        {
            return Err(ConfigError::invalid(
                "safety.pause_file",
                "must name a file (its directory is watched)",
            ));
        }
        probability("restarter.failure_rate", self.restarter.failure_rate)?;
        probability("simulate.malformed_rate", self.simulate.malformed_rate)?;
        if self.restarter.min_latency > self.restarter.max_latency {
            return Err(ConfigError::invalid(
                "restarter.min_latency",
                "is longer than restarter.max_latency",
            ));
        }
        if !(self.simulate.rate.is_finite()
            && self.simulate.rate > 0.0
            && self.simulate.rate <= limits::MAX_SIMULATE_RATE)
        {
            return Err(ConfigError::invalid(
                "simulate.rate",
                "must be above 0 and at most 1000000",
            ));
        }
        let nats = &self.nats;
        for (key, value) in [
            ("nats.stream", &nats.stream),
            ("nats.subject", &nats.subject),
            ("nats.consumer", &nats.consumer),
            ("nats.dead_letter_subject", &nats.dead_letter_subject),
        ] {
            if value.trim().is_empty() || value.contains(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    key,
                    "must be a non-empty name without spaces",
                ));
            }
        }
        if nats.subject == nats.dead_letter_subject {
            return Err(ConfigError::invalid(
                "nats.dead_letter_subject",
                "must differ from nats.subject",
            ));
        }
        at_least_one(
            "nats.max_ack_pending",
            nats.max_ack_pending.max(0).unsigned_abs(),
        )?;
        if nats.user.is_some() != nats.password.is_some() {
            return Err(ConfigError::invalid(
                "nats.password",
                "nats.user and nats.password go together",
            ));
        }
        let methods = [
            nats.user.is_some(),
            nats.token.is_some(),
            nats.creds_file.is_some(),
        ];
        if methods.iter().filter(|&&set| set).count() > 1 {
            return Err(ConfigError::invalid(
                "nats.token",
                "choose one of nats.user/password, nats.token and nats.creds_file",
            ));
        }
        Domain::parse(&self.message.domain)
            .map_err(|why| ConfigError::invalid("message.domain", why))?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|error| ConfigError::invalid("log.level", error.to_string()))?;
        self.admin.address()?;
        self.validate_notify()?;
        Ok(())
    }

    /// `[[notify]]` entries and `[notifier]`; errors name `notify[i].key`
    /// and never quote a URL.
    fn validate_notify(&self) -> Result<(), ConfigError> {
        for (i, entry) in self.notify.iter().enumerate() {
            entry
                .validate()
                .map_err(|(key, why)| ConfigError::invalid(&format!("notify[{i}].{key}"), why))?;
            if entry.timeout > limits::MAX_DURATION {
                return Err(ConfigError::invalid(
                    &format!("notify[{i}].timeout"),
                    "is longer than 365 days",
                ));
            }
        }
        let capacity = self.notifier.queue_capacity;
        if capacity == 0 || capacity > crate::notify::MAX_QUEUE_CAPACITY {
            return Err(ConfigError::invalid(
                "notifier.queue_capacity",
                format!(
                    "must be between 1 and {}",
                    crate::notify::MAX_QUEUE_CAPACITY
                ),
            ));
        }
        Ok(())
    }

    /// Every duration setting with its key.
    fn durations(&self) -> Vec<(&'static str, Duration)> {
        let (b, w, r, d) = (&self.broker, &self.worker, &self.restarter, &self.debug);
        let mut durations = vec![
            ("broker.ack_deadline", b.ack_deadline),
            ("broker.poll_wait", b.poll_wait),
            ("broker.poll_interval", b.poll_interval),
            ("worker.retry_initial", w.retry_initial),
            ("worker.retry_max", w.retry_max),
            ("worker.record_backoff", w.record_backoff),
            ("worker.restart_timeout", w.restart_timeout),
            ("worker.shutdown_grace", w.shutdown_grace),
            ("worker.pull_backoff", w.pull_backoff),
            ("restarter.min_latency", r.min_latency),
            ("restarter.max_latency", r.max_latency),
            ("debug.stall_threshold", d.stall_threshold),
            ("debug.status_interval", d.status_interval),
            ("restarter.command.timeout", r.command.timeout),
            ("restarter.ssh.connect_timeout", r.ssh.connect_timeout),
            ("restarter.ssh.timeout", r.ssh.timeout),
            ("restarter.ssh.idle_timeout", r.ssh.idle_timeout),
            (
                "restarter.ssh.server_alive_interval",
                r.ssh.server_alive_interval,
            ),
            ("restarter.http.timeout", r.http.timeout),
            ("verify.initial_delay", self.verify.initial_delay),
            ("verify.interval", self.verify.interval),
            ("verify.probe_timeout", self.verify.probe_timeout),
            ("verify.timeout", self.verify.timeout),
            ("safety.poll_interval", self.safety.poll_interval),
            ("safety.stop_retry", self.safety.stop_retry),
            ("notifier.flush_timeout", self.notifier.flush_timeout),
        ];
        if let Some(interval) = w.lease_extension_interval {
            durations.push(("worker.lease_extension_interval", interval));
        }
        durations
    }

    /// The calendar guard: as configured; Chaos Monkey's (Mon–Fri
    /// 09:00–15:00 UTC) when unset with a real backend; none when unset
    /// with a simulated one.
    pub fn calendar(&self) -> Result<Option<Calendar>, (String, String)> {
        match &self.safety.calendar {
            Some(settings) => Calendar::new(settings).map(Some),
            None if self.restarter.kind.is_real() => Ok(Some(Calendar::chaos_monkey())),
            None => Ok(None),
        }
    }

    /// The counting guards, with the strict defaults for a real backend.
    pub fn counting(&self) -> Result<Counting, (String, String)> {
        Counting::new(
            &self.safety.groups,
            &self.safety.rate,
            &self.safety.budget,
            self.restarter.kind.is_real(),
        )
    }

    /// Whether restarts are only decided and recorded, not issued.
    pub fn dry_run(&self) -> bool {
        self.safety
            .dry_run
            .unwrap_or_else(|| self.restarter.kind.is_real())
    }

    /// The chosen backend's section, verification and the host map; and
    /// that the worker waits longer for a restart than the backend and the
    /// verification may take, so that an issued restart is never cut off
    /// by the worker and retried (a second restart of a host that was fine).
    fn validate_restarter(&self) -> Result<(), ConfigError> {
        let r = &self.restarter;
        fn in_section(name: &'static str) -> impl Fn((&str, String)) -> ConfigError {
            move |(key, why)| ConfigError::invalid(&format!("restarter.{name}.{key}"), why)
        }
        let (backend, backend_keys) = match r.kind {
            // A simulated restart that outlasts the worker's wait is a
            // simulated time-out, nothing more.
            RestarterKind::Simulate | RestarterKind::SimulateBlocking => (Duration::ZERO, ""),
            RestarterKind::Command => {
                r.command.validate().map_err(in_section("command"))?;
                (r.command.timeout, "restarter.command.timeout")
            }
            RestarterKind::Ssh => {
                r.ssh.validate().map_err(in_section("ssh"))?;
                // Connecting may take up to twice connect_timeout (a retry).
                let longest = r
                    .ssh
                    .connect_timeout
                    .saturating_mul(2)
                    .saturating_add(r.ssh.timeout);
                (
                    longest,
                    "2 × restarter.ssh.connect_timeout + restarter.ssh.timeout",
                )
            }
            RestarterKind::Http => {
                r.http.validate().map_err(in_section("http"))?;
                (r.http.timeout, "restarter.http.timeout")
            }
        };
        self.verify
            .validate()
            .map_err(|(key, why)| ConfigError::invalid(&format!("verify.{key}"), why))?;
        crate::restarter::hosts::HostMap::new(&self.hosts)
            .map_err(|why| ConfigError::invalid("hosts", why))?;
        let verification = if self.verify.probe == ProbeKind::None {
            Duration::ZERO
        } else {
            self.verify
                .initial_delay
                .saturating_add(self.verify.timeout)
                .saturating_add(self.verify.probe_timeout)
        };
        let needed = backend.saturating_add(verification);
        if self.worker.restart_timeout <= needed {
            return Err(ConfigError::invalid(
                "worker.restart_timeout",
                format!(
                    "{} must be longer than the restart can take, {} ({}{}verify.initial_delay \
                     + verify.timeout + verify.probe_timeout when verifying): otherwise the \
                     worker cuts an issued restart short and retries it",
                    humantime::format_duration(self.worker.restart_timeout),
                    humantime::format_duration(needed),
                    backend_keys,
                    if backend_keys.is_empty() {
                        ""
                    } else {
                        ", plus "
                    },
                ),
            ));
        }
        Ok(())
    }

    /// `broker.url` and `store.url` name something this build supports.
    fn validate_urls(&self) -> Result<(), ConfigError> {
        let broker = self.broker.url.as_str();
        let nats = broker.starts_with("nats://") || broker.starts_with("tls://");
        if broker.starts_with("pubsub:") {
            return self.validate_pubsub();
        }
        if !(broker == "memory" || broker.starts_with("sqlite:") || nats) {
            return Err(ConfigError::invalid(
                "broker.url",
                format!(
                    "{:?} is not supported: use sqlite:PATH, nats://HOST:PORT, \
                     pubsub://PROJECT/SUBSCRIPTION or memory",
                    redact_url(broker)
                ),
            ));
        }
        if nats {
            for server in broker.split(',') {
                let parsed = url::Url::parse(server.trim()).map_err(|error| {
                    ConfigError::invalid(
                        "broker.url",
                        format!("{:?} is not a valid url: {error}", redact_url(server)),
                    )
                })?;
                if parsed.host_str().is_none_or(str::is_empty) {
                    return Err(ConfigError::invalid(
                        "broker.url",
                        format!("{:?} names no host", redact_url(server)),
                    ));
                }
                let has_credentials = !parsed.username().is_empty();
                let nats = &self.nats;
                if has_credentials
                    && (nats.user.is_some() || nats.token.is_some() || nats.creds_file.is_some())
                {
                    return Err(ConfigError::invalid(
                        "broker.url",
                        "has credentials, and so do nats.user/password, nats.token or \
                         nats.creds_file: choose one",
                    ));
                }
            }
        }
        let store = self.store.url.as_str();
        let postgres = store.starts_with("postgres://") || store.starts_with("postgresql://");
        if !(store == "memory" || store.starts_with("sqlite:") || postgres) {
            return Err(ConfigError::invalid(
                "store.url",
                format!(
                    "{:?} is not supported: use sqlite:PATH, postgres://… or memory",
                    redact_url(store)
                ),
            ));
        }
        if postgres && let Err(error) = url::Url::parse(store) {
            return Err(ConfigError::invalid(
                "store.url",
                format!("{:?} is not a valid url: {error}", redact_url(store)),
            ));
        }
        Ok(())
    }

    /// `pubsub://PROJECT/SUBSCRIPTION` and `[broker.pubsub]`, and the bounds
    /// the service puts on a subscription (the emulator does not enforce them).
    fn validate_pubsub(&self) -> Result<(), ConfigError> {
        let broker = &self.broker;
        pubsub::settings::parse_url(&broker.url)
            .map_err(|why| ConfigError::invalid("broker.url", why))?;
        broker
            .pubsub
            .validate()
            .map_err(|(key, why)| ConfigError::invalid(&format!("broker.pubsub.{key}"), why))?;
        let (min, max) = (pubsub::MIN_ACK_DEADLINE, pubsub::MAX_ACK_DEADLINE);
        if !(min..=max).contains(&broker.ack_deadline) {
            return Err(ConfigError::invalid(
                "broker.ack_deadline",
                format!("must be between {min:?} and {max:?} on Pub/Sub"),
            ));
        }
        Ok(())
    }

    /// Masks every secret of this configuration: passwords, tokens and
    /// secret parameters in `broker.url` and `store.url`, `nats.password`
    /// and `nats.token`.
    pub fn redactor(&self) -> Redactor {
        let mut secrets = redact::url_secrets(&self.broker.url);
        secrets.extend(redact::url_secrets(&self.store.url));
        for secret in [&self.nats.password, &self.nats.token, &self.admin.token]
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

    /// The worker's part.
    pub fn worker_config(&self) -> WorkerConfig {
        let w = &self.worker;
        WorkerConfig {
            max_in_flight: w.max_in_flight,
            pull_batch: w.pull_batch,
            max_attempts: w.max_attempts,
            max_deliveries: self.broker.max_deliveries,
            retry_backoff: Backoff {
                initial: w.retry_initial,
                max: w.retry_max,
            },
            record_attempts: w.record_attempts,
            record_backoff: Backoff {
                initial: w.record_backoff,
                max: w.record_backoff.saturating_mul(16),
            },
            restart_timeout: w.restart_timeout,
            shutdown_grace: w.shutdown_grace,
            lease_extension_interval: w.lease_extension_interval,
            max_pull_failures: w.max_pull_failures,
            pull_backoff: Backoff {
                initial: w.pull_backoff,
                max: Duration::from_secs(30),
            },
            parse: self.parse_rules(),
            switch_poll_interval: self.safety.poll_interval,
            // Validated in `validate`; should an invalid one get here, fail
            // closed: leashed, nobody eligible.
            policy: PolicyHandle::new(self.policy().unwrap_or_else(|_| Policy {
                dry_run: true,
                eligibility: Eligibility::nobody(),
                pause_on_unrecovered: true,
                ..Policy::default()
            })),
        }
    }

    /// The safety policy: what the worker decides with, and what a reload
    /// of `[safety]` replaces. Fails naming the key, as `validate` does.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
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
                clock: Clock::System,
            },
            pause_on_unrecovered: self.safety.pause_on_unrecovered,
            stop_conditions: StopConditions::new(&self.safety.stop_conditions).map_err(invalid)?,
            stop_retry: self.safety.stop_retry,
        })
    }

    /// How payloads are validated.
    pub fn parse_rules(&self) -> ParseRules {
        ParseRules {
            // Validated in `validate`; the fallback is unreachable in practice.
            domain: Domain::parse(&self.message.domain).unwrap_or_default(),
            max_payload_bytes: self.message.max_payload_bytes,
        }
    }

    /// Every setting as `section.key = value`, for diffs on reload.
    pub fn flatten(&self) -> BTreeMap<String, String> {
        let mut flat = BTreeMap::new();
        // A struct of plain fields always serialises to a table.
        let toml::Value::Table(sections) =
            toml::Value::try_from(self).expect("config serialises to toml")
        else {
            unreachable!("config serialises to a table");
        };
        fn walk(prefix: &str, table: toml::Table, flat: &mut BTreeMap<String, String>) {
            for (key, value) in table {
                let key = format!("{prefix}.{key}");
                match value {
                    // A setting whose value is a map is one setting.
                    toml::Value::Table(inner) if !MAP_SETTINGS.contains(&key.as_str()) => {
                        walk(&key, inner, flat);
                    }
                    value => {
                        flat.insert(key, value.to_string());
                    }
                }
            }
        }
        for (section, fields) in sections {
            match fields {
                toml::Value::Table(fields) => walk(&section, fields, &mut flat),
                // `[[hosts]]`: one setting, compared whole.
                value => {
                    flat.insert(section, value.to_string());
                }
            }
        }
        flat
    }

    /// The keys whose values differ between two configurations.
    pub fn changed_keys(&self, other: &Config) -> Vec<String> {
        let (old, new) = (self.flatten(), other.flatten());
        let keys: std::collections::BTreeSet<&String> = old
            .keys()
            .chain(new.keys())
            .filter(|k| old.get(*k) != new.get(*k))
            .collect();
        keys.into_iter().cloned().collect()
    }
}

/// Every setting with its default and meaning, for `mandrill run --help`.
pub fn settings_help() -> String {
    let defaults = Config::default().flatten();
    let mut text = String::from(
        "Settings (config file `[section] key = value`, environment MANDRILL_SECTION__KEY, \
         or --set section.key=value; later layers win; durations like 500ms, 10s, 2m, \
         at most 365 days; passwords and tokens, also in URLs, are never printed):\n",
    );
    for (key, doc) in SETTING_DOCS {
        let default = defaults
            .get(*key)
            .cloned()
            .unwrap_or_else(|| "(unset)".into());
        text.push_str(&format!("  {key:<34} {doc} [default: {default}]\n"));
    }
    text.push_str(&format!(
        "Reloaded on SIGHUP without a restart: {}, and [safety] but for {}.\n",
        RELOADABLE.join(", "),
        SAFETY_NEEDS_RESTART.join(", ")
    ));
    text
}

const SETTING_DOCS: &[(&str, &str)] = &[
    (
        "broker.url",
        "`sqlite:PATH` (durable queue), `nats://[USER:PASSWORD@]HOST:PORT` (JetStream), \
         `pubsub://PROJECT/SUBSCRIPTION` (Google Cloud Pub/Sub) or `memory`",
    ),
    (
        "broker.ack_deadline",
        "lease length without an extension (at least 1s)",
    ),
    ("broker.poll_wait", "how long one pull waits for a message"),
    (
        "broker.poll_interval",
        "how often a waiting pull checks for other processes' messages",
    ),
    (
        "broker.max_deliveries",
        "deliveries before the worker records a message as failed and dead-letters it",
    ),
    (
        "broker.pubsub.topic",
        "Pub/Sub topic requests are published to (created with the subscription)",
    ),
    (
        "broker.pubsub.dead_letter_topic",
        "Pub/Sub topic dead letters are copied to, with their reason as an attribute",
    ),
    (
        "broker.pubsub.dead_letter_subscription",
        "Pub/Sub subscription keeping the dead letters (for dead-letters and requeue)",
    ),
    (
        "broker.pubsub.endpoint",
        "http://HOST:PORT of an emulator, or a regional host name (default: \
         PUBSUB_EMULATOR_HOST, else pubsub.googleapis.com)",
    ),
    (
        "broker.pubsub.credentials_file",
        "service-account key file (default: Application Default Credentials)",
    ),
    (
        "broker.pubsub.pull",
        "`unary` (Pull calls) or `streaming` (StreamingPull)",
    ),
    ("store.url", "`sqlite:PATH`, `postgres://…` or `memory`"),
    ("store.max_connections", "database pool size (1-1000)"),
    (
        "store.writers",
        "PostgreSQL: tasks committing claims and outcomes in groups (1-64; at most max_connections - 1 run)",
    ),
    (
        "store.retention",
        "how long finished requests stay in the history (0s: forever; at most 100 years)",
    ),
    (
        "worker.max_in_flight",
        "messages handled at once (1-1000000)",
    ),
    ("worker.pull_batch", "most messages per pull (1-10000)"),
    (
        "worker.max_attempts",
        "deliveries before a failing restart is dead-lettered",
    ),
    (
        "worker.retry_initial",
        "first redelivery delay after a failed restart (doubles)",
    ),
    ("worker.retry_max", "longest redelivery delay"),
    (
        "worker.record_attempts",
        "tries at recording an outcome before nacking",
    ),
    (
        "worker.record_backoff",
        "first delay between those tries (doubles)",
    ),
    (
        "worker.restart_timeout",
        "a slower restart counts as failed",
    ),
    (
        "worker.shutdown_grace",
        "time in-flight work gets on shutdown",
    ),
    (
        "worker.lease_extension_interval",
        "default: a third of broker.ack_deadline; at most half of it",
    ),
    (
        "worker.max_pull_failures",
        "consecutive pull failures before giving up",
    ),
    (
        "worker.pull_backoff",
        "first delay before restarting the pull loop (doubles)",
    ),
    ("message.domain", "hostname = instance_name.domain"),
    (
        "message.max_payload_bytes",
        "larger payloads are dead-lettered (at most 64 MiB)",
    ),
    (
        "restarter.kind",
        "simulate | simulate-blocking | command | ssh | http",
    ),
    ("restarter.min_latency", "shortest simulated restart"),
    ("restarter.max_latency", "longest simulated restart"),
    (
        "restarter.failure_rate",
        "probability a simulated restart fails",
    ),
    (
        "restarter.blocking_threads",
        "blocking restarts at once (1-512)",
    ),
    (
        "restarter.journal",
        "file to append each restart issued to (audit); default none",
    ),
    (
        "restarter.command.argv",
        "program and argument templates ({host} {instance_name} {message_id} {group}); no shell",
    ),
    (
        "restarter.command.timeout",
        "kill the process group after this",
    ),
    ("restarter.command.working_dir", "directory to run in"),
    (
        "restarter.command.env_allow",
        "inherited environment variables kept; the rest is cleared",
    ),
    ("restarter.command.env", "extra fixed environment variables"),
    (
        "restarter.command.max_output",
        "bytes of stdout and of stderr kept with the outcome",
    ),
    (
        "restarter.command.permanent_exit_codes",
        "exit codes that mean: do not retry",
    ),
    (
        "restarter.ssh.argv",
        "remote command templates, each shell-quoted as one argument",
    ),
    ("restarter.ssh.user", "login user (the host map's wins)"),
    ("restarter.ssh.allow_root", "allow logging in as root"),
    (
        "restarter.ssh.key_file",
        "private key; default the agent and ssh's own keys",
    ),
    ("restarter.ssh.agent_socket", "ssh-agent socket"),
    (
        "restarter.ssh.known_hosts_file",
        "host keys checked strictly; required",
    ),
    ("restarter.ssh.port", "port (the host map's wins)"),
    ("restarter.ssh.connect_timeout", "limit on connecting"),
    ("restarter.ssh.timeout", "limit on the remote command"),
    (
        "restarter.ssh.max_connections",
        "connections open at once; reserve waits beyond",
    ),
    (
        "restarter.ssh.idle_timeout",
        "close a host's connection unused this long",
    ),
    ("restarter.ssh.server_alive_interval", "keepalive period"),
    (
        "restarter.ssh.reboot_drops_connection",
        "a connection dropped by the rebooting host counts as restarted",
    ),
    (
        "restarter.ssh.max_output",
        "bytes of output kept with the outcome",
    ),
    (
        "restarter.ssh.permanent_exit_codes",
        "remote exit codes that mean: do not retry",
    ),
    ("restarter.http.method", "HTTP method"),
    ("restarter.http.url", "URL template; required"),
    (
        "restarter.http.body",
        "body template, values JSON-escaped; \"\" for none",
    ),
    ("restarter.http.headers", "header name -> value template"),
    (
        "restarter.http.hmac_secret_file",
        "file holding the HMAC-SHA256 key (never printed)",
    ),
    (
        "restarter.http.hmac_secret_env",
        "environment variable holding the HMAC-SHA256 key",
    ),
    (
        "restarter.http.hmac_header",
        "signature header: sha256=<hex>",
    ),
    ("restarter.http.timeout", "limit on the whole call"),
    (
        "restarter.http.ca_file",
        "extra PEM CA certificates to trust",
    ),
    ("verify.probe", "none | tcp | http | command"),
    ("verify.port", "tcp probe: port on the host"),
    ("verify.url", "http probe: URL template"),
    ("verify.expect_status", "http probe: healthy statuses"),
    (
        "verify.argv",
        "command probe: argv template, exit 0 = healthy",
    ),
    ("verify.initial_delay", "wait before the first probe"),
    ("verify.interval", "between probes (jittered)"),
    ("verify.probe_timeout", "limit on one probe"),
    (
        "verify.timeout",
        "give up after this: the host is recorded unrecovered",
    ),
    (
        "verify.expect_down",
        "a healthy probe counts only after a failed one",
    ),
    (
        "safety.dry_run",
        "record restarts as dry-run, issue none (default: true with a real backend; run --unleash)",
    ),
    (
        "safety.allow",
        "instance-name patterns that may be restarted (a real backend restarts nothing until set)",
    ),
    (
        "safety.deny",
        "instance-name patterns never restarted; wins over allow",
    ),
    (
        "safety.pause_on_unrecovered",
        "pause every instance when a restarted host does not come back",
    ),
    (
        "safety.poll_interval",
        "how often the kill switch is read; 0s only at each claim",
    ),
    (
        "safety.calendar.weekdays",
        "days restarts may happen, [\"mon\", …] (unset with a real backend: Mon–Fri 09:00–15:00 UTC)",
    ),
    (
        "safety.calendar.hours",
        "time-of-day windows, [\"09:00-15:00\"], to the second, 24:00 allowed",
    ),
    (
        "safety.calendar.timezone",
        "IANA zone the calendar is read in (default UTC)",
    ),
    (
        "safety.calendar.excluded_dates",
        "no restarts on these dates: \"2026-12-24\" once, \"12-25\" yearly",
    ),
    (
        "safety.calendar.freezes",
        "[[safety.calendar.freezes]] from, to (RFC 3339 or local), name: no restarts in between",
    ),
    (
        "safety.max_defer",
        "a request deferred this long after it was published is recorded expired",
    ),
    (
        "safety.groups",
        "group → instance patterns, { web = [\"web-*\"] } (default group: name without -suffix)",
    ),
    (
        "safety.rate.group_max",
        "restarts per group per window (unset: 1 with a real backend, else unlimited; 0 unlimited)",
    ),
    (
        "safety.rate.window",
        "the window group_max and global_max count over (default 1d)",
    ),
    (
        "safety.rate.host_cooldown",
        "least time between two restarts of one host (default 0s: none)",
    ),
    (
        "safety.rate.global_max",
        "restarts per window over all groups (unset or 0: unlimited)",
    ),
    (
        "safety.budget.max_disrupted",
        "hosts per group disrupted at once (unset: 1 with a real backend, else unlimited)",
    ),
    (
        "safety.budget.max_disrupted_percent",
        "hosts per group disrupted at once, % of its size (rounded down)",
    ),
    (
        "safety.budget.group_sizes",
        "group → number of hosts, for max_disrupted_percent",
    ),
    (
        "safety.budget.retry",
        "how soon a request the budget deferred is tried again (15s)",
    ),
    (
        "safety.budget.forget_after",
        "how long an unverified end (unrecovered, failed, unknown) counts as disrupted (1h)",
    ),
    (
        "safety.stop_conditions",
        "[[safety.stop_conditions]] name, http = URL (expect_status, default 200) or command = [argv], \
         timeout (default 5s): checked before each restart; failing defers it",
    ),
    (
        "safety.stop_retry",
        "a delivery a stop condition deferred comes back after this",
    ),
    (
        "safety.pause_file",
        "while this file exists, restarts are paused (its directory is watched; not reloaded)",
    ),
    (
        "hosts",
        "[[hosts]] pattern = \"cattle-*\", address, port, user: where instances are reached",
    ),
    (
        "notify",
        "[[notify]] url (a secret, never logged), format = \"json\" | \"slack\", events = \
         [\"restarted\", \"failed\", \"dead-lettered\", \"unrecovered\", \"paused\", \"resumed\"], \
         timeout: webhooks told of what happened",
    ),
    (
        "notifier.queue_capacity",
        "notifications waiting to be sent; beyond it they are dropped (counted), never waited for",
    ),
    (
        "notifier.flush_timeout",
        "how long shutdown waits for queued notifications; the rest are dropped (counted)",
    ),
    ("simulate.enabled", "publish random requests (demo)"),
    ("simulate.rate", "requests per second (at most 1000000)"),
    (
        "simulate.malformed_rate",
        "fraction of malformed demo payloads",
    ),
    ("log.format", "text | json"),
    ("log.level", "tracing filter, e.g. info or mandrill=debug"),
    (
        "debug.stall_threshold",
        "warn when the runtime lags this much",
    ),
    ("debug.status_interval", "status line period; 0s disables"),
    (
        "debug.enabled",
        "debug mode (run --debug): stall threshold at most 10ms, status line with runtime \
         metrics every 10s at most, per-message step timings at debug level",
    ),
    (
        "admin.listen",
        "`IP:PORT` of the admin server (/metrics, /healthz, /readyz, /api); \"\" disables it",
    ),
    (
        "admin.token",
        "bearer token for the admin server's protected endpoints; required off loopback",
    ),
    (
        "nats.stream",
        "JetStream stream holding requests (created if missing)",
    ),
    ("nats.subject", "subject requests are published on"),
    (
        "nats.consumer",
        "durable pull consumer shared by every instance",
    ),
    (
        "nats.dead_letter_subject",
        "dead letters with their reason (stream {stream}_DEAD)",
    ),
    (
        "nats.max_ack_pending",
        "unacknowledged deliveries across all instances",
    ),
    ("nats.user", "user name (with nats.password)"),
    ("nats.password", "password (never logged)"),
    ("nats.token", "token (never logged)"),
    ("nats.creds_file", "a .creds file (JWT and nkey seed)"),
    ("nats.tls", "require TLS"),
    ("nats.tls_ca_file", "extra root certificates (PEM)"),
];

/// Durations as human-readable strings (`500ms`, `10s`, `2m`).
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises as e.g. `10s`.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_duration(*value))
    }

    /// Parses e.g. `10s`, `1m 30s`, `250ms`.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e})")))
    }

    /// The same, for optional durations.
    pub mod option {
        use super::*;

        /// Serialises `Some` as e.g. `10s`.
        pub fn serialize<S: Serializer>(
            value: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(value) => super::serialize(value, serializer),
                None => serializer.serialize_none(),
            }
        }

        /// Parses e.g. `10s`.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            super::deserialize(deserializer).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(
        file: Option<&str>,
        env: &[(&str, &str)],
        flags: &[&str],
    ) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mandrill.toml");
        if let Some(text) = file {
            std::fs::write(&path, text).unwrap();
        }
        Sources {
            file: file.map(|_| path.clone()),
            environment: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            overrides: flags.iter().map(|f| parse_override(f).unwrap()).collect(),
        }
        .load()
    }

    #[test]
    fn admin_off_loopback_needs_a_token_and_the_token_is_masked() {
        let default = load(None, &[], &[]).unwrap();
        assert_eq!(
            default.admin.address().unwrap(),
            Some("127.0.0.1:9730".parse().unwrap())
        );
        let disabled = load(None, &[], &["admin.listen="]).unwrap();
        assert_eq!(disabled.admin.address().unwrap(), None);
        let open = load(None, &[], &["admin.listen=0.0.0.0:9730"]).unwrap_err();
        assert!(open.to_string().contains("admin.token"), "{open}");
        let empty = load(None, &[], &["admin.listen=[::]:1", "admin.token="]).unwrap_err();
        assert!(empty.to_string().contains("admin.token"), "{empty}");
        let bad = load(None, &[], &["admin.listen=localhost"]).unwrap_err();
        assert!(bad.to_string().contains("admin.listen"), "{bad}");
        let numeric = load(None, &[("MANDRILL_ADMIN__TOKEN", "12345")], &[]).unwrap();
        assert_eq!(numeric.admin.token, Some(Secret("12345".into())));
        let config = load(
            None,
            &[("MANDRILL_ADMIN__TOKEN", "s3cret-admin")],
            &["admin.listen=0.0.0.0:0"],
        )
        .unwrap();
        assert!(!format!("{config:?}").contains("s3cret-admin"));
        assert!(
            !config
                .redactor()
                .scrub("token s3cret-admin")
                .contains("s3cret-admin")
        );
    }

    #[test]
    fn notify_entries_are_checked_by_index_and_their_urls_masked() {
        let webhook = "https://hooks.example/services/T0/B0/s3cret-hook";
        let config = load(
            Some(&format!(
                "[[notify]]\nurl = \"{webhook}\"\nformat = \"slack\"\n\
                 events = [\"paused\", \"unrecovered\"]\n\
                 [[notify]]\nurl = \"http://127.0.0.1:9/hook\"\nevents = [\"restarted\"]\n\
                 timeout = \"2s\"\n[notifier]\nflush_timeout = \"1s\"\n"
            )),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(config.notify.len(), 2);
        assert_eq!(config.notify[0].format, crate::notify::Format::Slack);
        assert_eq!(config.notify[1].timeout, Duration::from_secs(2));
        assert_eq!(config.notifier.flush_timeout, Duration::from_secs(1));
        assert!(!format!("{config:?}").contains("s3cret-hook"));
        let redactor = config.redactor();
        for text in [webhook, "POST /services/T0/B0/s3cret-hook failed"] {
            assert!(!redactor.scrub(text).contains("s3cret-hook"), "{text}");
        }
        let cases = [
            (
                "[[notify]]\nurl = \"https://h/s3cret-hook\"\nevents = [\"restarted\", \"exploded\"]\n",
                "notify[0].events[1]",
            ),
            (
                "[[notify]]\nurl = \"https://h/x\"\nevents = [\"paused\"]\n\
                 [[notify]]\nurl = \"ftp://h/s3cret-hook\"\nevents = [\"paused\"]\n",
                "notify[1].url",
            ),
            (
                "[[notify]]\nurl = \"https://h/s3cret-hook\"\nevents = []\n",
                "notify[0].events",
            ),
            ("[[notify]]\nevents = [\"paused\"]\n", "notify[0]"),
            (
                "[notifier]\nqueue_capacity = 0\n",
                "notifier.queue_capacity",
            ),
        ];
        for (file, key) in cases {
            let error = load(Some(file), &[], &[]).unwrap_err().to_string();
            assert!(error.contains(key), "{file:?}: {error}");
            assert!(!error.contains("s3cret-hook"), "{error}");
        }
    }

    #[test]
    fn flags_beat_environment_beat_file_beat_defaults() {
        let config = load(
            Some("[worker]\nmax_in_flight = 5\nmax_attempts = 7\nshutdown_grace = \"3s\"\n"),
            &[
                ("MANDRILL_WORKER__MAX_ATTEMPTS", "8"),
                ("MANDRILL_LOG__LEVEL", "debug"),
            ],
            &["worker.max_attempts=9"],
        )
        .unwrap();
        assert_eq!(config.worker.max_in_flight, 5);
        assert_eq!(config.worker.max_attempts, 9);
        assert_eq!(config.worker.shutdown_grace, Duration::from_secs(3));
        assert_eq!(config.log.level, "debug");
        assert_eq!(
            config.worker.pull_batch,
            WorkerSection::default().pull_batch
        );
    }

    #[test]
    fn unknown_key_is_named_whatever_layer_it_came_from() {
        let from_file = load(Some("[worker]\nmax_in_flght = 5\n"), &[], &[]).unwrap_err();
        assert!(
            from_file.to_string().contains("max_in_flght"),
            "{from_file}"
        );
        let from_env = load(None, &[("MANDRILL_WORKER__MAX_IN_FLGHT", "5")], &[]).unwrap_err();
        assert!(from_env.to_string().contains("max_in_flght"), "{from_env}");
        let section = load(Some("[wroker]\nx = 1\n"), &[], &[]).unwrap_err();
        assert!(section.to_string().contains("wroker"), "{section}");
        let shape = load(None, &[("MANDRILL_MAX_IN_FLIGHT", "5")], &[]).unwrap_err();
        assert!(
            shape.to_string().contains("MANDRILL_MAX_IN_FLIGHT"),
            "{shape}"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            (
                "[worker]\nmax_in_flight = \"many\"\n",
                "worker.max_in_flight",
            ),
            ("[worker]\nmax_in_flight = 0\n", "worker.max_in_flight"),
            ("[broker]\nack_deadline = \"soon\"\n", "broker.ack_deadline"),
            (
                "[restarter]\nfailure_rate = 2.0\n",
                "restarter.failure_rate",
            ),
            ("[message]\ndomain = \"bad_domain\"\n", "message.domain"),
            ("[restarter]\nkind = \"teleport\"\n", "restarter.kind"),
            ("[restarter]\nkind = \"ssh\"\n", "restarter.ssh."),
            (
                "[restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"x\", \"{hostname}\"]\n",
                "restarter.command.argv",
            ),
            (
                "[restarter]\nkind = \"http\"\n[restarter.http]\nurl = \"ftp://x/{host}\"\n",
                "restarter.http.url",
            ),
            // Verification must fit inside the worker's wait for a restart.
            (
                "[verify]\nprobe = \"tcp\"\nport = 22\ntimeout = \"60s\"\n",
                "worker.restart_timeout",
            ),
            ("[verify]\nprobe = \"tcp\"\n", "verify.port"),
            ("[[hosts]]\npattern = \"\"\n", "hosts"),
            ("[log]\nformat = \"xml\"\n", "log.format"),
            ("[broker]\nmax_deliveries = 2\n", "broker.max_deliveries"),
            ("[broker]\npoll_interval = \"0s\"\n", "broker.poll_interval"),
            ("[broker]\nurl = \"kafka://x\"\n", "broker.url"),
            ("[store]\nurl = \"mysql://x\"\n", "store.url"),
        ];
        for (file, key) in cases {
            let error = load(Some(file), &[], &[]).unwrap_err().to_string();
            assert!(error.contains(key), "{file:?}: {error}");
        }
        let syntax = load(Some("[worker\n"), &[], &[]).unwrap_err().to_string();
        assert!(syntax.contains("not valid toml"), "{syntax}");
    }

    #[test]
    fn pubsub_settings_come_from_every_layer_and_are_bounded() {
        let config = load(
            Some(
                "[broker]\nurl = \"pubsub://proj/requests\"\n\
                 [broker.pubsub]\ntopic = \"from-file\"\npull = \"streaming\"\n",
            ),
            &[("MANDRILL_BROKER__PUBSUB__DEAD_LETTER_TOPIC", "from-env")],
            &["broker.pubsub.dead_letter_subscription=dead-from-flag"],
        )
        .unwrap();
        let pubsub = &config.broker.pubsub;
        assert_eq!(pubsub.topic, "from-file");
        assert_eq!(pubsub.dead_letter_topic, "from-env");
        assert_eq!(pubsub.pull, crate::broker::pubsub::PullMode::Streaming);
        // Taken as a string even though it starts like a number (and then
        // refused by Pub/Sub's naming rule, naming the key).
        let error = load(
            None,
            &[],
            &[
                "broker.url=pubsub://proj/requests",
                "broker.pubsub.topic=123",
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("broker.pubsub.topic"), "{error}");
        let cases = [
            ("broker.url=pubsub://proj", "broker.url"),
            ("broker.ack_deadline=5s", "broker.ack_deadline"),
            ("broker.ack_deadline=11m", "broker.ack_deadline"),
            (
                "broker.pubsub.endpoint=http://nohost",
                "broker.pubsub.endpoint",
            ),
            (
                "broker.pubsub.dead_letter_topic=mandrill-requests",
                "broker.pubsub.dead_letter_topic",
            ),
        ];
        for (flag, key) in cases {
            let flags = ["broker.url=pubsub://proj/requests", flag];
            let error = load(None, &[], &flags).unwrap_err().to_string();
            assert!(error.contains(key), "{flag}: {error}");
        }
        // Not checked unless Pub/Sub is the broker.
        load(None, &[], &["broker.pubsub.topic=x"]).unwrap();
    }

    #[test]
    fn every_setting_is_documented_in_help() {
        let documented: Vec<&str> = SETTING_DOCS.iter().map(|(k, _)| *k).collect();
        let mut config = Config::default();
        config.worker.lease_extension_interval = Some(Duration::from_secs(1));
        config.restarter.journal = Some(PathBuf::from("restarts.log"));
        config.nats.user = Some("u".into());
        config.nats.password = Some(Secret("p".into()));
        config.nats.token = Some(Secret("t".into()));
        config.nats.creds_file = Some(PathBuf::from("x.creds"));
        config.nats.tls_ca_file = Some(PathBuf::from("ca.pem"));
        config.restarter.command.working_dir = Some(PathBuf::from("/"));
        config.restarter.ssh.user = Some("chaos".into());
        config.restarter.ssh.key_file = Some(PathBuf::from("id"));
        config.restarter.ssh.agent_socket = Some(PathBuf::from("agent"));
        config.restarter.ssh.known_hosts_file = Some(PathBuf::from("known_hosts"));
        config.restarter.http.hmac_secret_file = Some(PathBuf::from("key"));
        config.restarter.http.hmac_secret_env = Some("KEY".into());
        config.restarter.http.ca_file = Some(PathBuf::from("ca.pem"));
        config.verify.port = Some(22);
        config.safety.dry_run = Some(true);
        config.safety.rate.group_max = Some(1);
        config.safety.rate.global_max = Some(10);
        config.safety.budget.max_disrupted = Some(1);
        config.safety.budget.max_disrupted_percent = Some(20);
        config.safety.pause_file = Some(PathBuf::from("/run/mandrill/PAUSE"));
        config.safety.calendar = Some(CalendarSettings {
            weekdays: Some(vec!["mon".into()]),
            hours: Some(vec!["09:00-15:00".into()]),
            timezone: Some("UTC".into()),
            ..CalendarSettings::default()
        });
        config.admin.token = Some(Secret("t".into()));
        config.verify.url = Some("http://{host}/".into());
        config.hosts = vec![HostEntry {
            pattern: "cattle-*".into(),
            address: None,
            port: None,
            user: None,
        }];
        config.notify = vec![crate::notify::NotifyEntry {
            url: Secret("https://hooks.example/x".into()),
            format: crate::notify::Format::Json,
            events: vec![crate::notify::EventKind::Paused],
            timeout: Duration::from_secs(5),
        }];
        config.broker.pubsub.endpoint = Some("http://127.0.0.1:8085".into());
        config.broker.pubsub.credentials_file = Some(PathBuf::from("key.json"));
        for key in config.flatten().keys() {
            assert!(
                documented.contains(&key.as_str()),
                "{key} is not in SETTING_DOCS"
            );
        }
        let flat = config.flatten();
        let undocumented: Vec<&&str> = documented
            .iter()
            .filter(|key| !flat.contains_key(**key))
            .collect();
        assert!(
            undocumented.is_empty(),
            "documented but no setting: {undocumented:?}"
        );
        assert_eq!(documented.len(), flat.len());
    }

    #[test]
    fn a_real_backend_is_leashed_and_restarts_no_one_until_told() {
        let simulated = Config::default();
        assert!(!simulated.dry_run());
        let mut real = Config::default();
        real.restarter.kind = RestarterKind::Command;
        assert!(real.dry_run(), "a real backend defaults to a dry run");
        assert!(
            real.worker_config()
                .policy
                .current()
                .eligibility
                .check("cattle-ab12")
                .is_err(),
            "and nothing is eligible until safety.allow names it"
        );
        real.safety.dry_run = Some(false);
        real.safety.allow = vec!["cattle-*".into()];
        assert!(!real.dry_run());
        assert!(
            real.worker_config()
                .policy
                .current()
                .eligibility
                .check("cattle-ab12")
                .is_ok()
        );
        let error = load(Some("[safety]\nallow = [\"\"]\n"), &[], &[]).unwrap_err();
        assert!(error.to_string().contains("safety.allow[0]"), "{error}");
    }

    #[test]
    fn counting_guards_load_from_every_source_and_name_bad_keys() {
        let file = "[safety]\ngroups = { web = [\"frontend-*\"] }\n\
                    [safety.rate]\ngroup_max = 5\nwindow = \"1h\"\n\
                    [safety.budget]\nmax_disrupted_percent = 20\n\
                    group_sizes = { web = 10 }\n";
        let config = load(
            Some(file),
            &[("MANDRILL_SAFETY__RATE__HOST_COOLDOWN", "10m")],
            &["safety.rate.global_max=50"],
        )
        .unwrap();
        assert_eq!(config.safety.rate.group_max, Some(5));
        assert_eq!(config.safety.rate.host_cooldown, Duration::from_secs(600));
        assert_eq!(config.safety.rate.global_max, Some(50));
        let counting = config.counting().unwrap();
        let limits = counting.limits("web").unwrap();
        assert_eq!(limits.budget, Some(2));
        assert_eq!(limits.window, Duration::from_secs(3600));
        let error = load(
            Some("[safety.budget]\nmax_disrupted_percent = 150\n"),
            &[],
            &[],
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("safety.budget.max_disrupted_percent"),
            "{error}"
        );
        let error = load(Some("[safety]\ngroups = { web = [\"\"] }\n"), &[], &[]).unwrap_err();
        assert!(
            error.to_string().contains("safety.groups.web[0]"),
            "{error}"
        );
        // A real backend counts by default: Chaos Monkey's one per group
        // per day, one host of a group disrupted at once.
        let mut real = Config::default();
        real.restarter.kind = RestarterKind::Command;
        let limits = real.counting().unwrap().limits("cattle").unwrap();
        assert_eq!(limits.group_max, Some(1));
        assert_eq!(limits.window, Duration::from_secs(24 * 3600));
        assert_eq!(limits.budget, Some(1));
        assert!(
            !Config::default()
                .counting()
                .unwrap()
                .limits("cattle")
                .unwrap()
                .is_active()
        );
    }

    #[test]
    fn a_real_backend_gets_chaos_monkeys_calendar_unless_one_is_configured() {
        assert!(Config::default().calendar().unwrap().is_none());
        let mut real = Config::default();
        real.restarter.kind = RestarterKind::Command;
        let default = real.calendar().unwrap().unwrap();
        assert_eq!(default.describe(), "Mon–Fri 09:00–15:00 UTC");
        let file = "[safety]\nmax_defer = \"2h\"\n[safety.calendar]\n\
                    weekdays = [\"sat\"]\ntimezone = \"Europe/Stockholm\"\n\
                    [[safety.calendar.freezes]]\nfrom = \"2026-12-20T00:00\"\n\
                    to = \"2027-01-04T00:00\"\nname = \"year-end\"\n";
        let config = load(Some(file), &[], &[]).unwrap();
        assert_eq!(config.safety.max_defer, Duration::from_secs(7200));
        let calendar = config.calendar().unwrap().unwrap();
        assert_eq!(calendar.describe(), "Sat 09:00–15:00 Europe/Stockholm");
        let error = load(Some("[safety.calendar]\nhours = [\"9-5\"]\n"), &[], &[]).unwrap_err();
        assert!(
            error.to_string().contains("safety.calendar.hours[0]"),
            "{error}"
        );
    }

    #[test]
    fn stop_conditions_and_the_pause_file_load_and_bad_ones_name_the_key() {
        let file = "[safety]\nstop_retry = \"10s\"\npause_file = \"/run/mandrill/PAUSE\"\n\
                    [[safety.stop_conditions]]\nname = \"alerts\"\nhttp = \"http://127.0.0.1:9093/firing\"\n\
                    [[safety.stop_conditions]]\nname = \"deploys\"\ncommand = [\"true\"]\ntimeout = \"2s\"\n";
        let config = load(Some(file), &[], &[]).unwrap();
        assert_eq!(config.safety.stop_conditions.len(), 2);
        assert_eq!(
            config.safety.stop_conditions[1].timeout,
            Duration::from_secs(2)
        );
        let policy = config.policy().unwrap();
        assert_eq!(policy.stop_retry, Duration::from_secs(10));
        assert!(!policy.stop_conditions.is_empty());
        for (file, key) in [
            (
                "[[safety.stop_conditions]]\nname = \"x\"\nhttp = \"nope\"\n",
                "safety.stop_conditions[0].http",
            ),
            (
                "[[safety.stop_conditions]]\nname = \"x\"\nurl = \"http://a/\"\n",
                "safety.stop_conditions",
            ),
            ("[safety]\nstop_retry = \"0s\"\n", "safety.stop_retry"),
            ("[safety]\npause_file = \"/\"\n", "safety.pause_file"),
        ] {
            let error = load(Some(file), &[], &[]).unwrap_err().to_string();
            assert!(error.contains(key), "{file}: {error}");
        }
    }

    #[test]
    fn a_reload_applies_safety_but_its_poll_and_pause_file() {
        for key in [
            "log.level",
            "safety.deny",
            "safety.calendar.hours",
            "safety.stop_conditions",
        ] {
            assert!(reloads(key), "{key}");
        }
        for key in [
            "broker.ack_deadline",
            "safety.poll_interval",
            "safety.pause_file",
        ] {
            assert!(!reloads(key), "{key}");
        }
    }

    #[test]
    fn changed_keys_lists_what_a_reload_changes() {
        let old = Config::default();
        let mut new = old.clone();
        new.worker.max_in_flight = 7;
        new.broker.ack_deadline = Duration::from_secs(30);
        assert_eq!(
            old.changed_keys(&new),
            ["broker.ack_deadline", "worker.max_in_flight"]
        );
    }

    /// Extremes of every bounded setting: each is refused naming its key, or
    /// accepted; none panics.
    #[test]
    fn extremes_are_refused_naming_their_key() {
        let huge = "18446744073709551615";
        let refused = [
            ("worker.max_in_flight", huge),
            ("worker.max_in_flight", "9223372036854775807"),
            ("worker.max_in_flight", "1000001"),
            ("worker.max_in_flight", "-1"),
            ("worker.pull_batch", "10001"),
            ("restarter.blocking_threads", "9223372036854775807"),
            ("restarter.blocking_threads", "513"),
            ("store.max_connections", "4000000000"),
            ("store.max_connections", "1001"),
            ("store.writers", "0"),
            ("store.writers", "65"),
            ("message.max_payload_bytes", "9223372036854775807"),
            ("worker.shutdown_grace", "1000000000years"),
            ("worker.shutdown_grace", "366days"),
            ("worker.restart_timeout", "1000000000years"),
            ("worker.retry_max", "99999999999999999999years"),
            ("broker.ack_deadline", "5ms"),
            ("broker.ack_deadline", "999ms"),
            ("broker.ack_deadline", "1000000000years"),
            ("broker.poll_wait", "1000000000years"),
            ("worker.lease_extension_interval", "6s"),
            ("worker.lease_extension_interval", "0s"),
            ("debug.stall_threshold", "0s"),
            ("debug.status_interval", "1000000000years"),
            ("simulate.rate", "1e300"),
            ("simulate.rate", "nan"),
            ("simulate.rate", "inf"),
            ("restarter.failure_rate", "nan"),
            ("restarter.failure_rate", "-0.1"),
            ("nats.max_ack_pending", "-5"),
            ("broker.url", "kafka://x"),
            ("broker.url", "nats://"),
            ("broker.url", "nats://u:p@h:4222,nats://h:notaport"),
            ("store.url", "mysql://u:p@h/db"),
            ("store.url", "postgres://u:p@[::1"),
            ("log.level", "[[["),
        ];
        for (key, value) in refused {
            let flag = format!("{key}={value}");
            let error = load(None, &[], &[&flag]).unwrap_err().to_string();
            assert!(error.contains(key), "{flag}: {error}");
        }
        let accepted = [
            ("worker.max_in_flight", "1000000"),
            ("worker.pull_batch", "10000"),
            ("restarter.blocking_threads", "512"),
            ("store.max_connections", "1000"),
            ("store.writers", "64"),
            ("message.max_payload_bytes", "67108864"),
            ("worker.shutdown_grace", "365days"),
            ("broker.ack_deadline", "1s"),
            ("worker.lease_extension_interval", "5s"),
            ("simulate.rate", "1000000"),
            ("broker.url", "nats://u:p@h:4222,nats://h:4223"),
            ("broker.url", "tls://h"),
            ("store.url", "postgresql://u@h/db?sslmode=require"),
        ];
        for (key, value) in accepted {
            let flag = format!("{key}={value}");
            let config = load(None, &[], &[&flag]).unwrap_or_else(|e| panic!("{flag}: {e}"));
            let _ = config.worker_config();
        }
    }

    #[test]
    fn lease_extension_must_land_well_inside_the_lease() {
        let error = load(
            None,
            &[],
            &[
                "broker.ack_deadline=2s",
                "worker.lease_extension_interval=1500ms",
            ],
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("worker.lease_extension_interval"),
            "{error}"
        );
    }

    #[test]
    fn secret_values_are_never_echoed_in_errors() {
        const CANARY: &str = "31337424242";
        // As numbers they are still passwords: taken as strings.
        let config = load(
            None,
            &[],
            &[&format!("nats.password={CANARY}"), "nats.user=u"],
        )
        .unwrap();
        assert_eq!(config.nats.password, Some(Secret(CANARY.into())));
        let config = load(None, &[("MANDRILL_NATS__TOKEN", CANARY)], &[]).unwrap();
        assert_eq!(config.nats.token, Some(Secret(CANARY.into())));
        // A file gives them a type: the error names the key, not the value.
        let errors = [
            load(Some(&format!("[nats]\npassword = {CANARY}\n")), &[], &[]),
            load(Some(&format!("[nats]\ntoken = [{CANARY}]\n")), &[], &[]),
            load(Some(&format!("[nats]\npassword = \"{CANARY}\n")), &[], &[]),
            load(
                Some(&format!("[nats]\npassword = {CANARY}{CANARY}x\n")),
                &[],
                &[],
            ),
            load(None, &[], &[&format!("broker.url=kafka://u:{CANARY}@h")]),
            load(
                None,
                &[],
                &[&format!("store.url=mysql://h/?password={CANARY}")],
            ),
            load(
                None,
                &[],
                &[&format!("store.url=postgres://u:{CANARY}@[::1")],
            ),
        ];
        for error in errors {
            let error = error.unwrap_err().to_string();
            assert!(!error.contains(CANARY), "{error}");
        }
        let flag = parse_override(&format!("nats.password.x={CANARY}")).unwrap_err();
        assert!(!flag.to_string().contains(CANARY), "{flag}");
    }

    #[test]
    fn redactor_masks_every_secret_of_the_configuration() {
        let config = load(
            None,
            &[],
            &[
                "broker.url=nats://nu:np%40ss@h:4222",
                "store.url=postgres://pu:pp@db/x?sslpassword=sp&sslmode=require",
            ],
        )
        .unwrap();
        let redactor = config.redactor();
        let text = "nats://nu:np%40ss@h np@ss postgres://pu:pp@db/x?sslpassword=sp";
        let scrubbed = redactor.scrub(text);
        for secret in ["np%40ss", "np@ss", ":pp@", "=sp"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        assert!(scrubbed.contains("require") || !text.contains("require"));
    }

    #[test]
    fn only_section_key_variables_are_configuration() {
        for name in [
            "MANDRILL_TEST_POSTGRES",
            "MANDRILL_TEST_NATS",
            "MANDRILL_CONFIG",
            "MANDRILL_TESTING",
            "PATH",
        ] {
            assert!(!is_config_variable(name), "{name}");
        }
        for name in [
            "MANDRILL_WORKER__MAX_IN_FLIGHT",
            "MANDRILL_WORKER_MAX_IN_FLIGHT",
            "MANDRILL_MAX_IN_FLIGHT",
            "MANDRILL_NOPE__X",
        ] {
            assert!(is_config_variable(name), "{name}");
        }
        let error = load(None, &[("MANDRILL_WORKER_MAX_IN_FLIGHT", "5")], &[]).unwrap_err();
        assert!(
            error.to_string().contains("MANDRILL_WORKER__MAX_IN_FLIGHT"),
            "{error}"
        );
    }

    mod property {
        use proptest::prelude::*;

        use super::super::*;

        /// A value as an operator might type it, or anything at all.
        fn raw_value() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                any::<u64>().prop_map(|n| n.to_string()),
                any::<f64>().prop_map(|x| x.to_string()),
                Just("nan".to_owned()),
                Just("-inf".to_owned()),
                any::<bool>().prop_map(|b| b.to_string()),
                (
                    any::<u64>(),
                    prop::sample::select(vec!["ns", "ms", "s", "m", "h", "days", "years", ""])
                )
                    .prop_map(|(n, unit)| format!("{n}{unit}")),
                (0u64..100_000, prop::sample::select(vec!["ms", "s", "m"]))
                    .prop_map(|(n, unit)| format!("{n}{unit}")),
                prop::sample::select(vec![
                    "memory",
                    "sqlite:x.db",
                    "nats://h:4222",
                    "postgres://u:p@h/d",
                    "kafka://x",
                    "nats://",
                    "simulate",
                    "json",
                    "text",
                    "info",
                ])
                .prop_map(str::to_owned),
                ".*",
            ]
        }

        /// Loads `flags` the way the property below does; the error's text.
        fn load_flags(
            flags: &[(&str, String)],
            through_environment: bool,
        ) -> Result<Config, String> {
            let mut sources = Sources::default();
            for (key, raw) in flags {
                if through_environment {
                    let name = format!("MANDRILL_{}", key.replace('.', "__").to_ascii_uppercase());
                    sources.environment.push((name, raw.clone()));
                } else {
                    let pair =
                        parse_override(&format!("{key}={raw}")).map_err(|e| e.to_string())?;
                    sources.overrides.push(pair);
                }
            }
            sources.load().map_err(|e| e.to_string())
        }

        fn settings() -> impl Strategy<Value = Vec<(&'static str, String)>> {
            let keys: Vec<&'static str> = SETTING_DOCS.iter().map(|(key, _)| *key).collect();
            prop::collection::vec((prop::sample::select(keys), raw_value()), 0..8)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Arbitrary values for any keys never panic: either a
            /// configuration that validates and whose every duration can be
            /// added to a clock reading, or an error naming a key.
            #[test]
            fn loader_never_panics_and_names_the_key(
                flags in settings(),
                through_environment in any::<bool>(),
            ) {
                let mut sources = Sources::default();
                for (key, raw) in &flags {
                    if through_environment {
                        let name = format!("MANDRILL_{}", key.replace('.', "__").to_ascii_uppercase());
                        sources.environment.push((name, raw.clone()));
                    } else {
                        match parse_override(&format!("{key}={raw}")) {
                            Ok(pair) => sources.overrides.push(pair),
                            Err(error) => {
                                prop_assert!(error.to_string().contains(key));
                                return Ok(());
                            }
                        }
                    }
                }
                match sources.load() {
                    Ok(config) => {
                        prop_assert!(config.validate().is_ok());
                        let now = std::time::Instant::now();
                        for (key, duration) in config.durations() {
                            prop_assert!(now.checked_add(duration).is_some(), "{key}");
                            prop_assert!(
                                tokio::time::Instant::now().checked_add(duration).is_some(),
                                "{key}"
                            );
                        }
                        let worker = config.worker_config();
                        let _ = tokio::sync::Semaphore::new(worker.max_in_flight);
                        let _ = tokio::sync::Semaphore::new(config.restarter.blocking_threads);
                        let _ = config.flatten();
                        let _ = config.redactor();
                    }
                    Err(error) => {
                        let text = error.to_string();
                        // The restart-timeout cross-check names the setting to
                        // raise, whichever of its inputs (restarter.max_latency,
                        // a backend's timeout, verify.*) was set.
                        prop_assert!(
                            flags.iter().any(|(key, _)| text.contains(key))
                                || text.contains("MANDRILL_")
                                || text.contains("worker.restart_timeout"),
                            "{text}"
                        );
                        // The same load without the secrets: a value the
                        // message contains anyway (a variant name, another
                        // flag's value) is not an echo of the secret.
                        let public: Vec<(&str, String)> = flags
                            .iter()
                            .filter(|(key, _)| !SECRET_KEYS.contains(key))
                            .cloned()
                            .collect();
                        let text_without_secrets = load_flags(&public, through_environment)
                            .err()
                            .unwrap_or_default();
                        let shown = |raw: &String| {
                            flags.iter().any(|(key, other)| !SECRET_KEYS.contains(key) && other.contains(raw.as_str()))
                                || text_without_secrets.contains(raw.as_str())
                        };
                        for (key, raw) in &flags {
                            if SECRET_KEYS.contains(key) && raw.len() >= 4 && !shown(raw) {
                                prop_assert!(!text.contains(raw.as_str()), "{text}");
                            }
                        }
                    }
                }
            }
        }
    }
}
