//! Logging: one line per step, text or JSON, written by a background thread
//! so that a slow terminal or pipe never blocks message handling (the
//! tutorial's profiling lesson: the hot line was the logging call).

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::config::{LogConfig, LogFormat};

/// Keeps the log writer alive; dropping it flushes every buffered line.
pub struct Telemetry {
    _flush_on_drop: WorkerGuard,
    filter: reload::Handle<EnvFilter, Registry>,
}

impl Telemetry {
    /// Installs the global subscriber, writing to standard error.
    pub fn init(config: &LogConfig) -> anyhow::Result<Self> {
        let (writer, guard) = NonBlockingBuilder::default()
            // Back-pressure rather than silently dropping lines.
            .lossy(false)
            .finish(std::io::stderr());
        let filter = EnvFilter::try_new(&config.level)?;
        let (filter, handle) = reload::Layer::new(filter);
        let format = match config.format {
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_target(false)
                .boxed(),
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(writer)
                .boxed(),
        };
        tracing_subscriber::registry()
            .with(filter)
            .with(format)
            .try_init()?;
        Ok(Self {
            _flush_on_drop: guard,
            filter: handle,
        })
    }

    /// Changes the filter, e.g. on a configuration reload.
    pub fn set_level(&self, level: &str) -> anyhow::Result<()> {
        self.filter.reload(EnvFilter::try_new(level)?)?;
        Ok(())
    }
}
