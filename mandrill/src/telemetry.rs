//! Logging: one line per step, text or JSON, written by a background thread
//! so that a slow terminal or pipe never blocks message handling (the
//! tutorial's profiling lesson: the hot line was the logging call).
//!
//! Every line passes a [`Redactor`] on its way out, so that a secret of the
//! configuration never reaches the log, even when it is quoted by an error
//! from a library (a connection error repeating its URL). Colours only when
//! standard error is a terminal.

use std::io::{self, IsTerminal as _, Write};
use std::sync::{Arc, PoisonError, RwLock};

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, reload};

use crate::config::{LogFormat, LogSettings, Redactor};

/// Replaces the log filter.
type SetFilter = Box<dyn Fn(EnvFilter) -> Result<(), reload::Error> + Send + Sync>;

/// Keeps the log writer alive; dropping it flushes every buffered line.
pub(crate) struct Telemetry {
    _flush_on_drop: WorkerGuard,
    set_filter: SetFilter,
    redactor: Arc<RwLock<Redactor>>,
}

impl Telemetry {
    /// Installs the global subscriber, writing to standard error with every
    /// secret `redactor` knows masked; with `step_timings` (debug mode),
    /// each message's steps are timed (see [`crate::diagnostics::StepTimings`]).
    pub(crate) fn init(
        config: &LogSettings,
        redactor: Redactor,
        step_timings: bool,
    ) -> anyhow::Result<Self> {
        let (writer, guard) = NonBlockingBuilder::default()
            // Back-pressure rather than silently dropping lines.
            .lossy(false)
            .finish(io::stderr());
        let redactor = Arc::new(RwLock::new(redactor));
        let writer = Scrubbed {
            inner: writer,
            redactor: redactor.clone(),
        };
        let filter = EnvFilter::try_new(&config.level)?;
        let (filter, handle) = reload::Layer::new(filter);
        let steps = step_timings.then_some(crate::diagnostics::StepTimings);
        let format = match config.format {
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(io::stderr().is_terminal())
                .with_target(false)
                .boxed(),
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(writer)
                .boxed(),
        };
        // The filter applies to every layer: a callsite it disables costs
        // nothing anywhere.
        #[cfg(not(feature = "console"))]
        tracing_subscriber::registry()
            .with(filter)
            .with(format)
            .with(steps)
            .try_init()?;
        // tokio-console reads tokio's own trace-level spans, which the log
        // must not print: the filter applies to the log lines only.
        #[cfg(feature = "console")]
        tracing_subscriber::registry()
            .with(format.with_filter(filter))
            .with(
                console_subscriber::ConsoleLayer::builder()
                    .with_default_env()
                    .spawn(),
            )
            .with(steps)
            .try_init()?;
        Ok(Self {
            _flush_on_drop: guard,
            set_filter: Box::new(move |filter| handle.reload(filter)),
            redactor,
        })
    }

    /// Changes the filter, e.g. on a configuration reload.
    pub(crate) fn set_level(&self, level: &str) -> anyhow::Result<()> {
        (self.set_filter)(EnvFilter::try_new(level)?)?;
        Ok(())
    }

    /// Masks these secrets too (a reload may bring new ones; the old ones
    /// are still in use until a restart).
    pub(crate) fn add_secrets(&self, more: &Redactor) {
        let mut redactor = self
            .redactor
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *redactor = redactor.union(more);
    }
}

/// A writer maker whose writers mask secrets.
struct Scrubbed<M> {
    inner: M,
    redactor: Arc<RwLock<Redactor>>,
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Scrubbed<M> {
    type Writer = ScrubbedWriter<'a, M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedWriter {
            inner: self.inner.make_writer(),
            redactor: &self.redactor,
        }
    }
}

/// Writes one formatted log line at a time (the fmt layer writes each event
/// with one `write_all`), so a secret is never split between two writes.
struct ScrubbedWriter<'a, W> {
    inner: W,
    redactor: &'a RwLock<Redactor>,
}

impl<W: Write> Write for ScrubbedWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let redactor = self.redactor.read().unwrap_or_else(PoisonError::into_inner);
        if redactor.is_empty() {
            return self.inner.write(buf);
        }
        let text = String::from_utf8_lossy(buf);
        self.inner.write_all(redactor.scrub(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubbed_writer_masks_secrets_in_each_write() {
        let redactor = RwLock::new(Redactor::new(["hunter2".to_owned()]));
        let mut out = Vec::new();
        let mut writer = ScrubbedWriter {
            inner: &mut out,
            redactor: &redactor,
        };
        let line = b"cannot connect to nats://u:hunter2@h: refused\n";
        assert_eq!(writer.write(line).unwrap(), line.len());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cannot connect to nats://u:****@h: refused\n"
        );
    }
}
