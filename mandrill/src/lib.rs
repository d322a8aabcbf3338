//! Mayhem Mandrill: restarts hosts on request, concurrently and durably.
//!
//! Every module is private; the crate root re-exports, below, what the
//! binary, the integration tests and the benchmark use, and nothing else.
//!
//! Code map (see ARCHITECTURE.md for the invariants):
//! - `domain`: restart requests parsed and validated at the edge, outcomes. No I/O.
//! - `worker`: the heart. Pull loop, supervisor, flow control, per-message
//!   handling (lease extension, save ∥ restart, record, settle), shutdown.
//! - `broker`, `store`, `restarter`: the three seams, a trait each, one
//!   file per adapter, each held as a trait object. `sqlite`: the SQLite
//!   adapter behind both the broker and the store seam (a queue and a store
//!   sharing one group-commit writer per database file).
//! - `safety`: the guards (eligibility, the calendar), pure, with an
//!   injected clock; the worker asks them before reserving and again right
//!   before the restart.
//! - `inventory`: the operator's hosts, groups and zones (`[inventory]`):
//!   parsers per format (pure), the sources at the edge, the copy the
//!   worker reads and the task that refreshes it.
//! - `schedule`: `[[schedule]]`, mandrill choosing victims: a plan every
//!   instance computes alike (a Poisson process over the calendar's open
//!   time, victims drawn from the inventory), and the companion that
//!   publishes each slot as a signed request through every guard.
//!   `campaign`: restarts over a share of a group, chosen at random when
//!   it starts; where each target stands (`campaign status`, `wait`).
//! - `service`: builds adapters from a `Config` and runs the worker
//!   with its companions; shuts down in order.
//! - `admin`: the operator's HTTP surface (metrics, health, JSON API).
//! - `report`: the game-day report (`mandrill report`), aggregated from the
//!   store's plain rows and rendered as Markdown, HTML with SVG charts, JSON.
//! - `notify`: webhooks told of restarts, failures, dead letters and the
//!   kill switch, from a bounded queue that never holds the pipeline.
//! - `cli`: subcommands, signals, runtime, exit codes. `config`: layered
//!   typed settings, built from sections some of which the adapters own;
//!   `settings`: what both share (secrets, redaction, the `settings!`
//!   declaration that makes field docs the help). `telemetry`: logging. `diagnostics`: stall detector,
//!   status line. `demo`: demo publisher. `stats`: counters.
//!   `backoff`: exponential backoff. `causes`: an error and its causes
//!   on one line. `reference`: the parts of docs/ generated from the code.
#![deny(missing_docs)]
// Items are `pub` only where the crate exports them (test helpers excepted).
#![cfg_attr(not(test), warn(unreachable_pub))]

// Every module is private: the `pub use` lines below are the whole API.
mod admin;
mod backoff;
mod broker;
mod campaign;
mod causes;
mod cli;
mod config;
mod demo;
mod diagnostics;
mod domain;
mod inventory;
mod migrations;
mod notify;
mod pattern;
mod reference;
mod report;
mod restarter;
mod safety;
mod schedule;
mod service;
mod settings;
mod sqlite;
mod stats;
mod store;
mod telemetry;
mod worker;

/// The binary's entry point: subcommands, signals, runtime, exit codes.
pub use cli::main;

/// A random tutorial-style request, as `mandrill run --simulate` publishes.
pub use demo::random_request;
/// The domain: requests parsed and validated at the edge, and outcomes.
pub use domain::{
    Domain, Hostname, InstanceName, JointAck, Outcome, ParseRules, RestartRequest, Restarted,
    SigningKey, Status, Timestamp,
};

/// The broker seam and its adapters (the benchmark and tests open them
/// directly, as the service does).
pub use broker::nats::{Credentials, DEAD_LETTER_REASON_HEADER, NatsBroker, NatsOptions};
/// Pub/Sub: the broker, its options, and the `pubsub://PROJECT/PREFIX` parser.
pub use broker::pubsub::{
    PubSubBroker, PubSubOptions, PubSubSettings, PullMode, settings::parse_url as parse_pubsub_url,
};
/// The broker traits, and the in-memory and SQLite brokers.
pub use broker::{Broker, Close, Consumer, MemoryBroker, Publisher};
/// The SQLite queue and store, one adapter over one file.
pub use sqlite::{SqliteBroker, SqliteOptions, SqliteStore};

/// The PostgreSQL store's defaults, for tools that set up a database as it does.
pub use store::postgres::{
    DEFAULT_WRITERS as POSTGRES_DEFAULT_WRITERS, SESSION_SETTINGS as POSTGRES_SESSION_SETTINGS,
};
/// The store seam: the trait, what its methods take and give, and its adapters.
pub use store::{
    Claim, ClaimTerms, ClaimToken, DEFAULT_TIMEOUT, Decision, GroupUsage, HistoryEntry,
    MemoryStore, PostgresStore, Recorded, ReportData, Store, StoreError, Story, Switch,
    SwitchExpected,
};

/// The restarter seam, the ssh backend and its host map, and the simulation.
pub use restarter::{
    RestartError, Restarter, SimulatedRestarter, Simulation, SshRestarter, SshSettings,
    hosts::{HostEntry, HostMap},
};

/// Exponential backoff, as the worker's configuration takes it.
pub use backoff::Backoff;
/// Webhooks told of restarts and failures.
pub use notify::{EventKind, Format, Notifier, NotifierSettings, NotifyEntry};
/// The policy the worker asks before a restart: requesters and their keys.
pub use safety::{Policy, PolicyHandle, RequesterSettings, Requesters};
/// The `[[schedule]]` plan, computed alike on every instance.
pub use schedule::{DEFAULT_MAX_LATENESS, Plan, ScheduleSettings};
/// The worker's counters.
pub use stats::Stats;
/// The worker, its configuration and its shutdown signal.
pub use worker::{Shutdown, Worker, WorkerConfig};

/// The configuration: loaded from file, environment and overrides; secrets
/// never printed.
pub use config::{Config, Sources};
/// A secret setting, masked when printed.
pub use settings::Secret;

/// The parts of docs/ generated from the code.
pub use reference::{
    commands as commands_reference, metrics as metrics_reference, settings as settings_reference,
};

/// The PostgreSQL store's schema, for tools (the benchmark's ceiling) that
/// set up a database the way the store does.
pub fn postgres_migrations() -> &'static sqlx::migrate::Migrator {
    migrations::postgres()
}
