//! Mayhem Mandrill: restarts hosts on request, concurrently and durably.
//!
//! Code map (see ARCHITECTURE.md for the invariants):
//! - [`domain`]: restart requests parsed and validated at the edge, outcomes. No I/O.
//! - [`worker`]: the heart. Pull loop, supervisor, flow control, per-message
//!   handling (lease extension, save ∥ restart, record, settle), shutdown.
//! - [`broker`], [`store`], [`restarter`]: the three seams, a trait each, one
//!   file per adapter; everyone holds an adapter as a trait object. [`sqlite`]: what the SQLite queue and store share
//!   (one group-commit writer per database file).
//! - [`safety`]: the guards (eligibility, the calendar), pure, with an
//!   injected clock; the worker asks them before reserving and again right
//!   before the restart.
//! - [`inventory`]: the operator's hosts, groups and zones (`[inventory]`):
//!   parsers per format (pure), the sources at the edge, the copy the
//!   worker reads and the task that refreshes it.
//! - [`schedule`]: `[[schedule]]`, mandrill choosing victims: a plan every
//!   instance computes alike (a Poisson process over the calendar's open
//!   time, victims drawn from the inventory), and the companion that
//!   publishes each slot as a signed request through every guard.
//!   [`campaign`]: restarts over a share of a group, chosen at random when
//!   it starts; where each target stands (`campaign status`, `wait`).
//! - [`service`]: builds adapters from a [`config::Config`] and runs the worker
//!   with its companions; shuts down in order.
//! - [`admin`]: the operator's HTTP surface (metrics, health, JSON API).
//! - `report`: the game-day report (`mandrill report`), aggregated from the
//!   store's plain rows and rendered as Markdown, HTML with SVG charts, JSON.
//! - [`notify`]: webhooks told of restarts, failures, dead letters and the
//!   kill switch, from a bounded queue that never holds the pipeline.
//! - [`cli`]: subcommands, signals, runtime, exit codes. [`config`]: layered
//!   typed settings, built from sections some of which the adapters own;
//!   [`settings`]: what both share (secrets, redaction, the `settings!`
//!   declaration that makes field docs the help). [`telemetry`]: logging. [`diagnostics`]: stall detector,
//!   status line. [`demo`]: demo publisher. [`stats`]: counters.
//!   [`backoff`]: exponential backoff. [`causes`]: an error and its causes
//!   on one line. [`reference`]: the parts of docs/ generated from the code.
#![deny(missing_docs)]
// Items are `pub` only where the crate exports them (test helpers excepted).
#![cfg_attr(not(test), warn(unreachable_pub))]

// The API: the seams and their adapters, the domain, configuration, the
// service that wires them, and the worker. Everything else is private; what
// of it the binary, the benchmark or a library user needs is re-exported
// below, on purpose.
pub mod broker;
pub mod config;
pub mod domain;
pub mod inventory;
pub mod notify;
pub mod reference;
pub mod restarter;
pub mod safety;
pub mod schedule;
pub mod service;
pub mod settings;
pub mod store;
pub mod worker;

mod admin;
mod backoff;
mod campaign;
mod causes;
mod cli;
mod demo;
mod diagnostics;
mod migrations;
mod pattern;
mod report;
mod sqlite;
mod stats;
mod telemetry;

pub use backoff::Backoff;
pub use cli::main;
pub use demo::random_request;
pub use sqlite::JointAck;
pub use stats::Stats;

/// The PostgreSQL store's schema, for tools (the benchmark's ceiling) that
/// set up a database the way the store does.
pub fn postgres_migrations() -> &'static sqlx::migrate::Migrator {
    migrations::postgres()
}
