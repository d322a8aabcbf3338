//! Mayhem Mandrill: restarts hosts on request, concurrently and durably.
//!
//! Every module is private; the crate root re-exports, below, what the
//! binary and the integration tests use, and nothing else: the entry point,
//! a read-only view of what a store recorded, the SQLite queue (to publish
//! what `mandrill publish` refuses), the schedule's plan and the generated
//! docs. The benchmark (`bench`, behind the `bench` feature) is inside the
//! crate because it drives the worker below that.
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
#[cfg(feature = "bench")]
mod bench;
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

// The crate's shape, checked from its source.
#[cfg(test)]
mod tests;

/// The binary's entry point: subcommands, signals, runtime, exit codes.
pub use cli::main;

/// The benchmark's allocator: counts allocations while a run asks it to.
#[cfg(feature = "bench")]
pub use bench::CountingAllocator;
/// The pipeline benchmark (`benches/pipeline.rs` is its entry point).
#[cfg(feature = "bench")]
pub use bench::main as bench_main;

// What the integration tests read below the binary, and nothing else: each
// name here has a test in `tests/` that needs it.

/// What a store recorded, read as `mandrill history`, `explain` and
/// `report` read it.
pub use domain::{Status, Timestamp};
pub use service::Records;
pub use store::{HistoryEntry, ReportData, Story};

/// The SQLite queue, for writing payloads `mandrill publish` refuses.
pub use broker::Close;
pub use sqlite::{SqliteBroker, SqliteOptions};

/// The header a NATS dead letter's reason travels in.
pub use broker::nats::DEAD_LETTER_REASON_HEADER;

/// The `[[schedule]]` plan, computed alike on every instance.
pub use schedule::{DEFAULT_MAX_LATENESS, Plan, ScheduleSettings};

/// The parts of docs/ generated from the code.
pub use reference::{
    commands as commands_reference, metrics as metrics_reference, settings as settings_reference,
};
