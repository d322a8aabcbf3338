//! Counters, progress display and the final summary.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;
use tracing_subscriber::fmt::MakeWriter;

use crate::broken::BrokenLinks;
use crate::config;

/// The kinds of per-URL failure counted in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// A status of 400 or more.
    Http(u16),
    /// The request timed out.
    Timeout,
    /// No connection could be made.
    Connect,
    /// More redirects than allowed.
    TooManyRedirects,
    /// The body exceeded the size limit.
    BodyTooLarge,
    /// Reading the body failed.
    Body,
    /// The HTML tokenizer gave up.
    Parse,
    /// Any other client error.
    Request,
    /// The page's task panicked (a bug, caught per page).
    Panic,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(status) => write!(f, "http {status}"),
            Self::Timeout => f.write_str("timeout"),
            Self::Connect => f.write_str("connect"),
            Self::TooManyRedirects => f.write_str("too many redirects"),
            Self::BodyTooLarge => f.write_str("body too large"),
            Self::Body => f.write_str("body"),
            Self::Parse => f.write_str("parse"),
            Self::Request => f.write_str("request"),
            Self::Panic => f.write_str("panic"),
        }
    }
}

/// What a run did; printed at the end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Pages fetched with a status below 400.
    pub pages: u64,
    /// Of those, pages that were not HTML and so not parsed.
    pub not_html: u64,
    /// Edges written.
    pub edges: u64,
    /// Failed URLs by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// URLs not fetched because robots.txt disallows them.
    pub robots_disallowed: u64,
    /// Retries after 429 or 503.
    pub retries: u64,
    /// Redirects out of the scope during recursion, reported as edges and
    /// not followed.
    pub redirects_not_followed: u64,
    /// Seed lines rejected as invalid.
    pub invalid_seeds: u64,
    /// Wall-clock time of the crawl.
    pub elapsed: Duration,
    /// Whether the run was cut short by Ctrl-C.
    pub interrupted: bool,
    /// The failed URLs with their referrers, when `--report` asked for them.
    pub broken: Option<BrokenLinks>,
}

impl Summary {
    /// Failed URLs, all kinds together.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// URLs that failed or that robots.txt forbade: what `--fail-on-broken` counts.
    pub fn broken_count(&self) -> u64 {
        self.error_count() + self.robots_disallowed
    }

    /// Counts one failure.
    pub fn count_error(&mut self, kind: ErrorKind) {
        *self.errors.entry(kind).or_default() += 1;
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} pages ({} not html), {} edges, {} errors",
            self.pages,
            self.not_html,
            self.edges,
            self.error_count()
        )?;
        if !self.errors.is_empty() {
            let kinds: Vec<String> = self
                .errors
                .iter()
                .map(|(kind, n)| format!("{kind}: {n}"))
                .collect();
            write!(f, " ({})", kinds.join(", "))?;
        }
        write!(
            f,
            ", {} disallowed by robots.txt, {} retries, ",
            self.robots_disallowed, self.retries,
        )?;
        if self.redirects_not_followed > 0 {
            write!(
                f,
                "{} redirects out of scope not followed, ",
                self.redirects_not_followed
            )?;
        }
        write!(
            f,
            "{} invalid input lines, in {:.1}s",
            self.invalid_seeds,
            self.elapsed.as_secs_f64()
        )?;
        if self.interrupted {
            f.write_str(" (interrupted)")?;
        }
        Ok(())
    }
}

/// Standard error, shared by log lines and the progress bar so that log
/// lines are printed above the bar instead of through it.
///
/// Pass a clone to `tracing_subscriber::fmt().with_writer(...)` and to
/// [`crate::run`].
#[derive(Debug, Clone, Default)]
pub struct Console {
    bar: Arc<OnceLock<ProgressBar>>,
}

/// One log event's bytes, written to standard error when dropped.
#[derive(Debug)]
pub struct ConsoleWriter {
    console: Console,
    buffer: Vec<u8>,
}

impl Write for ConsoleWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ConsoleWriter {
    fn drop(&mut self) {
        let write = || {
            // Nothing sensible can be done when standard error is gone.
            let _ = std::io::stderr().write_all(&self.buffer);
        };
        match self.console.bar.get() {
            Some(bar) if !bar.is_finished() => bar.suspend(write),
            _ => write(),
        }
    }
}

impl<'a> MakeWriter<'a> for Console {
    type Writer = ConsoleWriter;

    fn make_writer(&'a self) -> Self::Writer {
        ConsoleWriter {
            console: self.clone(),
            buffer: Vec::new(),
        }
    }
}

/// Progress as a bar on a terminal or periodic log lines.
#[derive(Debug)]
pub struct Progress {
    shown: Shown,
    started: Instant,
}

#[derive(Debug)]
enum Shown {
    Bar(ProgressBar),
    Log,
    Hidden,
}

/// How often plain log lines report progress.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

impl Progress {
    /// Chooses the display; `Auto` shows a bar only when standard error is a terminal.
    pub fn new(mode: config::Progress, console: &Console) -> Self {
        let bar_wanted = match mode {
            config::Progress::Auto => std::io::stderr().is_terminal(),
            config::Progress::Bar => true,
            config::Progress::Log | config::Progress::Never => false,
        };
        let shown = if bar_wanted {
            let style = ProgressStyle::with_template(
                "{spinner} {elapsed_precise} {pos}/{len} pages, {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
                .with_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            // A console already driving a bar (a second run in one process)
            // keeps its own; logs then go around this one, which is harmless.
            let _ = console.bar.set(bar.clone());
            Shown::Bar(bar)
        } else if mode == config::Progress::Never {
            Shown::Hidden
        } else {
            Shown::Log
        };
        Self {
            shown,
            started: Instant::now(),
        }
    }

    /// Updates the bar after an event.
    pub fn update(&self, summary: &Summary, queued: usize, in_flight: usize) {
        if let Shown::Bar(bar) = &self.shown {
            let done = summary.pages + summary.error_count() + summary.redirects_not_followed;
            bar.set_length(done + (queued + in_flight) as u64);
            bar.set_position(done);
            let seconds = self.started.elapsed().as_secs_f64().max(f64::EPSILON);
            bar.set_message(format!(
                "{:.0} pages/s, {queued} queued, {in_flight} in flight, {} errors",
                summary.pages as f64 / seconds,
                summary.error_count()
            ));
        }
    }

    /// Writes a progress log line, every [`LOG_INTERVAL`], when not on a terminal.
    pub fn log(&self, summary: &Summary, queued: usize, in_flight: usize) {
        if let Shown::Log = self.shown {
            let seconds = self.started.elapsed().as_secs_f64().max(f64::EPSILON);
            tracing::info!(
                "progress: {} pages, {} errors, {queued} queued, {in_flight} in flight, {:.1} pages/s",
                summary.pages,
                summary.error_count(),
                summary.pages as f64 / seconds
            );
        }
    }

    /// Removes the bar before the summary is printed.
    pub fn finish(&self) {
        if let Shown::Bar(bar) = &self.shown {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lists_errors_by_kind() {
        let mut summary = Summary {
            pages: 3,
            edges: 10,
            elapsed: Duration::from_millis(1500),
            ..Summary::default()
        };
        summary.count_error(ErrorKind::Http(404));
        summary.count_error(ErrorKind::Connect);
        summary.count_error(ErrorKind::Http(404));
        assert_eq!(
            summary.to_string(),
            "3 pages (0 not html), 10 edges, 3 errors (http 404: 2, connect: 1), \
             0 disallowed by robots.txt, 0 retries, 0 invalid input lines, in 1.5s"
        );
        summary.redirects_not_followed = 2;
        assert!(
            summary
                .to_string()
                .contains(", 0 retries, 2 redirects out of scope not followed, 0 invalid"),
            "{summary}"
        );
    }
}
