//! Mayhem Mandrill: restarts hosts on request, concurrently and durably.
//!
//! Code map (see ARCHITECTURE.md for the invariants):
//! - [`domain`]: restart requests parsed and validated at the edge, outcomes. No I/O.
//! - [`worker`]: the heart. Pull loop, supervisor, flow control, per-message
//!   handling (lease extension, save ∥ restart, record, settle), shutdown.
//! - [`broker`], [`store`], [`restarter`]: the three seams, a trait each, one
//!   file per adapter. [`sqlite`]: what the SQLite queue and store share
//!   (one group-commit writer per database file).
//! - [`safety`]: the guards (eligibility, the calendar), pure, with an
//!   injected clock; the worker asks them before reserving and again right
//!   before the restart.
//! - [`service`]: builds adapters from a [`config::Config`] and runs the worker
//!   with its companions; shuts down in order.
//! - [`admin`]: the operator's HTTP surface (metrics, health, JSON API).
//! - [`notify`]: webhooks told of restarts, failures, dead letters and the
//!   kill switch, from a bounded queue that never holds the pipeline.
//! - [`cli`]: subcommands, signals, runtime, exit codes. [`config`]: layered
//!   typed settings. [`telemetry`]: logging. [`debug`]: stall detector,
//!   status line. [`simulate`]: demo publisher. [`stats`]: counters.
//!   [`backoff`]: exponential backoff.
#![deny(missing_docs)]

pub mod admin;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod config;
pub mod debug;
pub mod domain;
pub mod notify;
pub mod pattern;
pub mod restarter;
pub mod safety;
pub mod service;
pub mod simulate;
pub mod sqlite;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod worker;
