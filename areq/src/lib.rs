//! `areq` collects the links of web pages, concurrently and politely.
//!
//! It reads seed URLs, fetches them through one pooled HTTP client, extracts
//! links with a real HTML tokenizer and streams `source -> link` edges to an
//! output file, optionally following links recursively within a scope.
//!
//! Code map, from the edge inwards:
//!
//! - [`config`]: the command line, one `clap` struct used by the binary and
//!   the tests alike.
//! - [`seeds`]: parses the URL list (comments, blank lines, bad lines with
//!   their line numbers). Pure.
//! - [`extract`]: HTML bytes plus charset to absolute, fragment-free links.
//!   Pure; the only module that knows about `lol_html` and `encoding_rs`.
//! - [`scope`]: URL normalisation and the "should this link be followed"
//!   decision (`--scope`, `--include`, `--exclude`). Pure.
//! - [`robots`]: robots.txt rules for one origin. Pure; the only module that
//!   knows about `texting_robots`.
//! - [`frontier`]: per-host queues, the seen-set, per-host concurrency and
//!   delays, retries. Pure state machine driven by the crawler with explicit
//!   instants, so it is tested without a network or a clock.
//! - [`fetch`]: the HTTP client. The only module that knows about `reqwest`.
//! - [`output`]: the tsv/jsonl/dot writers, run on a blocking thread fed by
//!   a bounded channel so that edges are streamed, never accumulated.
//! - [`report`]: progress bar or log lines, counters and the final summary.
//! - [`broken`]: the broken-link report (`--report`). Pure.
//! - [`state`]: the resumable crawl's state in SQLite (`--state`); the only
//!   module that knows `rusqlite`, used only by the output writer thread.
//! - [`crawl`](mod@crawl): the scheduler loop tying it together; owns every spawned
//!   task and stops on a [`CancellationToken`](tokio_util::sync::CancellationToken).
//! - [`run()`]: the command line's run around it (URL list, output, report
//!   and state files).
#![deny(missing_docs)]

pub mod broken;
pub mod config;
pub mod crawl;
pub mod extract;
pub mod fetch;
pub mod frontier;
pub mod output;
pub mod report;
pub mod robots;
mod run;
pub mod scope;
pub mod seeds;
pub mod state;

pub use config::Config;
pub use crawl::crawl;
pub use report::{Console, Summary};
pub use run::run;
