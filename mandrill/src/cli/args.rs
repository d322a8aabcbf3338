//! The arguments of each subcommand, and the settings they stand for.

use super::*;

/// Where configuration comes from; shared by every subcommand.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// A TOML configuration file.
    #[arg(long, env = "MANDRILL_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set any setting, e.g. `--set worker.max_attempts=3` (repeatable; wins over file and environment).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
}

/// `mandrill run`
#[derive(Debug, Args)]
#[command(after_long_help = config::settings_help())]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    /// Where requests come from: `sqlite:PATH`, `nats://HOST:PORT` or `memory` [setting: broker.url].
    #[arg(long, value_name = "URL")]
    pub(super) broker: Option<String>,
    /// Exit (0) once the queue has nothing visible, delayed or in flight.
    #[arg(long)]
    pub(super) until_idle: bool,
    /// Where outcomes are recorded: `sqlite:PATH`, `postgres://…` or `memory` [setting: store.url].
    #[arg(long, value_name = "URL")]
    pub(super) db: Option<String>,
    /// Publish random demo requests, RATE per second (default 2) [settings: simulate.enabled, simulate.rate].
    #[arg(long, value_name = "RATE", num_args = 0..=1, default_missing_value = "2")]
    pub(super) simulate: Option<f64>,
    /// Messages handled at once [setting: worker.max_in_flight].
    #[arg(long, value_name = "N")]
    pub(super) max_in_flight: Option<usize>,
    /// Log line format [setting: log.format].
    #[arg(long, value_enum)]
    pub(super) log_format: Option<LogFormat>,
    /// Log filter, e.g. `debug` or `mandrill=debug` [setting: log.level].
    #[arg(long, value_name = "FILTER")]
    pub(super) log_level: Option<String>,
    /// Act: this instance issues real restarts while no operator has turned
    /// the leash in the store (`mandrill leash`, `mandrill unleash`); a
    /// reload keeps it unless the file's own safety.dry_run changed.
    /// Without it a real backend only records what it would do, as
    /// `dry-run` [setting: safety.dry_run = false].
    #[arg(long)]
    pub(super) unleash: bool,
    /// Debug mode, like asyncio's: stalls over 10ms reported, a status line
    /// with the runtime's metrics every 10s, each message's step timings
    /// logged (at debug level: `mandrill=debug` unless `--log-level` or
    /// `--set log.level=…` says otherwise) [setting: debug.enabled].
    #[arg(long)]
    pub(super) debug: bool,
}

/// The log filter `--debug` sets.
const DEBUG_LOG_LEVEL: &str = "info,mandrill=debug";

/// `mandrill history`
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    /// The store to read: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    pub(super) db: Option<String>,
    /// How many entries.
    #[arg(long, default_value_t = 20)]
    pub(super) limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(super) json: bool,
}

/// `mandrill publish`
#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    /// The queue: `sqlite:PATH` or `nats://HOST:PORT` [setting: broker.url].
    #[arg(long, value_name = "URL")]
    pub(super) broker: Option<String>,
    /// Also publish one request per line of this file (`-` for standard
    /// input): an instance name, a JSON request as the worker accepts it, or
    /// a signed request (a compact JWS, published unchanged). Blank lines
    /// and lines starting with `#` are skipped.
    #[arg(long, value_name = "PATH")]
    pub(super) file: Option<PathBuf>,
    /// Also publish N random tutorial-style requests (`cattle-` + 4 characters).
    #[arg(long, value_name = "N")]
    pub(super) random: Option<usize>,
    /// Spread the requests at R per second, each committed as it is published,
    /// instead of all in one transaction.
    #[arg(long, value_name = "R")]
    pub(super) rate: Option<f64>,
    /// Sign each request as this requester (its `iss`; see `mandrill
    /// keygen` and `[[requesters]]`), with the private key in --key-file.
    #[arg(long = "as", value_name = "NAME", requires = "key_file")]
    pub(super) as_requester: Option<String>,
    /// The requester's private key, PKCS#8 PEM (Ed25519 or P-256), for --as.
    #[arg(long, value_name = "FILE", requires = "as_requester")]
    pub(super) key_file: Option<PathBuf>,
    /// How long a signed request stays valid (its `exp`; at most 24h).
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub(super) ttl: Duration,
    /// Ask for each request's verdict on this subject or topic (its
    /// `reply_to`, inside the signed claims with --as); the service sends
    /// it only where `broker.reply_to_allowed` admits it. For the requests
    /// made from instance names; a JSON or signed line says its own.
    #[arg(long, value_name = "SUBJECT")]
    pub(super) reply_to: Option<String>,
    /// One JSON object per request published (message_id, instance_name,
    /// host, signed, requester: the --as name, or a signed line's verified
    /// iss; reply_to) instead of `<message id> <host>` lines.
    #[arg(long)]
    pub(super) json: bool,
    /// Publish even what the service would refuse (unsigned where a
    /// signature is required, a key or requester it does not know, an
    /// expired token, a reply_to it does not allow): for testing its
    /// refusals. Malformed requests are still refused.
    #[arg(long)]
    pub(super) unchecked: bool,
    /// Instance names, one request each.
    #[arg(value_name = "INSTANCE_NAME")]
    pub(super) names: Vec<String>,
}

/// `mandrill dead-letters`
#[derive(Debug, Args)]
pub(crate) struct DeadLettersArgs {
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    /// The queue: `sqlite:PATH`, `nats://HOST:PORT` (its dead letters are on the `{stream}_DEAD` stream) or `pubsub://PROJECT/SUBSCRIPTION` (on `broker.pubsub.dead_letter_subscription`) [setting: broker.url].
    #[arg(long, value_name = "URL")]
    pub(super) broker: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(super) json: bool,
}

/// `mandrill requeue`
#[derive(Debug, Args)]
pub(crate) struct RequeueArgs {
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    /// The queue: `sqlite:PATH`, `nats://HOST:PORT` (its dead letters are on the `{stream}_DEAD` stream) or `pubsub://PROJECT/SUBSCRIPTION` (on `broker.pubsub.dead_letter_subscription`) [setting: broker.url].
    #[arg(long, value_name = "URL")]
    pub(super) broker: Option<String>,
    /// Every dead letter.
    #[arg(long, conflicts_with = "ids")]
    pub(super) all: bool,
    /// Dead-letter ids, as `mandrill dead-letters` lists them (SQLite: the row; NATS: the sequence in `{stream}_DEAD`; Pub/Sub: the copy's message id); one unknown id and nothing is requeued.
    #[arg(value_name = "ID", required_unless_present = "all")]
    pub(super) ids: Vec<String>,
}

impl ConfigArgs {
    pub(super) fn sources(
        &self,
        flags: Vec<(&str, Option<toml::Value>)>,
    ) -> Result<Sources, ConfigError> {
        let mut overrides = self
            .set
            .iter()
            .map(|raw| config::parse_override(raw))
            .collect::<Result<Vec<_>, _>>()?;
        overrides.extend(
            flags
                .into_iter()
                .filter_map(|(key, value)| value.map(|v| (key.to_owned(), v))),
        );
        Ok(Sources {
            file: self.config.clone(),
            environment: Sources::process_environment()?,
            overrides,
        })
    }
}

pub(super) fn string(value: &Option<String>) -> Option<toml::Value> {
    value.clone().map(toml::Value::String)
}

impl RunArgs {
    pub(super) fn sources(&self) -> Result<Sources, ConfigError> {
        let format = self.log_format.map(|f| match f {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        });
        self.config.sources(vec![
            ("broker.url", string(&self.broker)),
            ("store.url", string(&self.db)),
            (
                "simulate.enabled",
                self.simulate.map(|_| toml::Value::Boolean(true)),
            ),
            ("simulate.rate", self.simulate.map(toml::Value::Float)),
            (
                "worker.max_in_flight",
                self.max_in_flight
                    .map(|n| toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))),
            ),
            ("log.format", format.map(|f| toml::Value::String(f.into()))),
            ("log.level", string(&self.log_level)),
            (
                "safety.dry_run",
                self.unleash.then_some(toml::Value::Boolean(false)),
            ),
            (
                "debug.enabled",
                self.debug.then_some(toml::Value::Boolean(true)),
            ),
            ("log.level", self.debug_log_level()),
        ])
    }

    /// `--debug` shows mandrill's debug lines (the step timings), unless
    /// the level is given on the command line.
    fn debug_log_level(&self) -> Option<toml::Value> {
        let level_given = self.log_level.is_some()
            || self
                .config
                .set
                .iter()
                .any(|raw| raw.trim_start().starts_with("log.level"));
        (self.debug && !level_given).then(|| toml::Value::String(DEBUG_LOG_LEVEL.into()))
    }
}
