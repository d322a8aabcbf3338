//! The command line: `mandrill run`, `history`, `publish`, `dead-letters` and
//! `requeue`. The only module that reads signals, builds the runtime and
//! chooses exit codes.
//!
//! Exit codes: 0 after a clean shutdown (or a command done, or a shutdown
//! requested during start-up); 1 when the service or command failed (could
//! not start, stopped by itself, database error); 2 for bad usage,
//! configuration or input (nothing was published); 130 when a third signal
//! cut the shutdown short.
//!
//! Signals: the first SIGTERM, SIGINT or SIGQUIT starts a graceful shutdown
//! (during start-up: abandons it), the second skips the rest of the grace
//! period, the third exits at once. That is safe because nothing is acked
//! before its outcome is recorded: what was unsettled is redelivered.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{error, info, warn};

use uuid::Uuid;

use crate::broker::{
    BrokerError, BrokerUrl, Close as _, DeadLetterAdmin, DeadLetterEntry, DeadLetterRecord,
    Publisher, SqliteBroker,
};
use crate::config::{self, Config, ConfigError, LogFormat, RELOADABLE, Sources, redact_url};
use crate::domain::{Hostname, InstanceName, RestartRequest, random_instance_name};
use crate::service::{self, Controls, Service};
use crate::store::Timestamp;
use crate::telemetry::Telemetry;
use crate::worker::Shutdown;

mod switch;

pub use switch::{StatusArgs, SwitchArgs};
mod policy;

/// Mayhem Mandrill: restarts hosts on request, concurrently and durably.
#[derive(Debug, Parser)]
#[command(name = "mandrill", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume restart requests until SIGTERM, SIGINT or SIGQUIT (a second skips the grace period, a third exits at once; SIGHUP reloads the config).
    Run(RunArgs),
    /// Print recorded requests and outcomes, newest first.
    History(HistoryArgs),
    /// Publish restart requests into the queue, all in one transaction.
    Publish(PublishArgs),
    /// List the messages the queue gave up on, with the reasons.
    DeadLetters(DeadLettersArgs),
    /// Put dead-lettered messages back into the queue.
    Requeue(RequeueArgs),
    /// Stop every instance that uses this store from issuing restarts (the kill switch).
    Pause(SwitchArgs),
    /// Let restarts be issued again.
    Resume(SwitchArgs),
    /// Show the mode, the kill switch and the eligibility rules.
    Status(StatusArgs),
    /// Ask the safety policy without acting: `mandrill policy check NAME…`.
    Policy(policy::PolicyArgs),
}

/// Where configuration comes from; shared by every subcommand.
#[derive(Debug, Args)]
pub struct ConfigArgs {
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
pub struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Where requests come from: `sqlite:PATH`, `nats://HOST:PORT` or `memory` [setting: broker.url].
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// Exit (0) once the queue has nothing visible, delayed or in flight.
    #[arg(long)]
    until_idle: bool,
    /// Where outcomes are recorded: `sqlite:PATH`, `postgres://…` or `memory` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Publish random demo requests, RATE per second (default 2) [settings: simulate.enabled, simulate.rate].
    #[arg(long, value_name = "RATE", num_args = 0..=1, default_missing_value = "2")]
    simulate: Option<f64>,
    /// Messages handled at once [setting: worker.max_in_flight].
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,
    /// Log line format [setting: log.format].
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Log filter, e.g. `debug` or `mandrill=debug` [setting: log.level].
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Act: issue real restarts. Without it a real backend only records what
    /// it would do, as `dry-run` [setting: safety.dry_run = false].
    #[arg(long)]
    unleash: bool,
}

/// `mandrill history`
#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The store to read: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// How many entries.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// `mandrill publish`
#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The queue: `sqlite:PATH` or `nats://HOST:PORT` [setting: broker.url].
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// Also publish one request per line of this file (`-` for standard
    /// input): an instance name, or a JSON request as the worker accepts it.
    /// Blank lines and lines starting with `#` are skipped.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Also publish N random tutorial-style requests (`cattle-` + 4 characters).
    #[arg(long, value_name = "N")]
    random: Option<usize>,
    /// Spread the requests at R per second, each committed as it is published,
    /// instead of all in one transaction.
    #[arg(long, value_name = "R")]
    rate: Option<f64>,
    /// Instance names, one request each.
    #[arg(value_name = "INSTANCE_NAME")]
    names: Vec<String>,
}

/// `mandrill dead-letters`
#[derive(Debug, Args)]
pub struct DeadLettersArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The queue: `sqlite:PATH` or `pubsub://PROJECT/SUBSCRIPTION` (its dead letters are on `broker.pubsub.dead_letter_subscription`; a NATS queue keeps them on its `{stream}_DEAD` stream) [setting: broker.url].
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// `mandrill requeue`
#[derive(Debug, Args)]
pub struct RequeueArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The queue: `sqlite:PATH` or `pubsub://PROJECT/SUBSCRIPTION` (its dead letters are on `broker.pubsub.dead_letter_subscription`; a NATS queue keeps them on its `{stream}_DEAD` stream) [setting: broker.url].
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// Every dead letter.
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    /// Dead-letter ids, as `mandrill dead-letters` lists them (on Pub/Sub, the copy's message id).
    #[arg(value_name = "ID", required_unless_present = "all")]
    ids: Vec<i64>,
}

impl ConfigArgs {
    fn sources(&self, flags: Vec<(&str, Option<toml::Value>)>) -> Result<Sources, ConfigError> {
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

fn string(value: &Option<String>) -> Option<toml::Value> {
    value.clone().map(toml::Value::String)
}

impl RunArgs {
    fn sources(&self) -> Result<Sources, ConfigError> {
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
        ])
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(&args),
        Command::History(args) => history(&args),
        Command::Policy(args) => policy::main(&args),
        Command::Publish(args) => {
            let sources = args
                .config
                .sources(vec![("broker.url", string(&args.broker))]);
            command(sources, |config| publish(config, &args))
        }
        Command::DeadLetters(args) => {
            let sources = args
                .config
                .sources(vec![("broker.url", string(&args.broker))]);
            command(sources, |config| dead_letters(config, &args))
        }
        Command::Requeue(args) => {
            let sources = args
                .config
                .sources(vec![("broker.url", string(&args.broker))]);
            command(sources, |config| requeue(config, &args))
        }
        Command::Pause(args) => switch::switch(&args, true),
        Command::Resume(args) => switch::switch(&args, false),
        Command::Status(args) => switch::status(&args),
    }
}

fn load(sources: Result<Sources, ConfigError>) -> Result<(Sources, Config), ExitCode> {
    let loaded = sources.and_then(|sources| sources.load().map(|config| (sources, config)));
    loaded.map_err(|error| {
        eprintln!("mandrill: {error}");
        ExitCode::from(2)
    })
}

fn run(args: &RunArgs) -> ExitCode {
    let (sources, config) = match load(args.sources()) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    if args.until_idle
        && matches!(
            BrokerUrl::parse(&config.broker.url),
            Ok(BrokerUrl::PubSub { .. })
        )
    {
        // Refused rather than waiting forever: see `broker/pubsub.rs`.
        eprintln!(
            "mandrill: --until-idle is not supported on Pub/Sub: its API reports no backlog \
             (Cloud Monitoring's undelivered-messages count lags by minutes); stop the service \
             with SIGTERM instead"
        );
        return ExitCode::from(2);
    }
    let telemetry = match Telemetry::init(&config.log, config.redactor()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("mandrill: cannot set up logging: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("mandrill")
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(serve(config, &sources, &telemetry, args.until_idle));
    let at_once = matches!(outcome, Ok(Stopped::AtOnce));
    let code = match outcome {
        Ok(Stopped::Cleanly) => ExitCode::SUCCESS,
        Ok(Stopped::AtOnce) => ExitCode::from(130),
        Err(error) => {
            error!("{error:#}");
            ExitCode::FAILURE
        }
    };
    if at_once {
        // Nothing may delay this exit: tasks still running are dropped.
        runtime.shutdown_background();
    } else {
        // A blocking restart stuck in its thread must not hold the exit
        // hostage: every result it could produce has been given up on.
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
    info!("mandrill stopped");
    drop(telemetry); // flushes the log
    code
}

/// The signals mandrill acts on.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
    quit: Signal,
    hangup: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.quit.recv() => "SIGQUIT",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// How the service ended, when it was asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// Shut down in order (or never started, if asked during start-up).
    Cleanly,
    /// A third signal: exit now.
    AtOnce,
}

/// Counts SIGTERM, SIGINT and SIGQUIT and says what each one means.
#[derive(Debug, Default)]
struct Terminations(u32);

impl Terminations {
    /// Counts one more; logs and applies it. Returns whether to exit now.
    fn count(&mut self, signal: &str, shutdown: &Shutdown) -> bool {
        self.0 += 1;
        match self.0 {
            1 => {
                info!(
                    signal,
                    "shutting down: stop pulling, let in-flight work finish"
                );
                shutdown.request();
                false
            }
            2 => {
                warn!(
                    signal,
                    "second signal: skipping the rest of the grace period"
                );
                shutdown.hurry();
                false
            }
            _ => {
                warn!(
                    signal,
                    "third signal: exiting at once; unsettled deliveries will be redelivered"
                );
                true
            }
        }
    }
}

async fn serve(
    config: Config,
    sources: &Sources,
    telemetry: &Telemetry,
    until_idle: bool,
) -> anyhow::Result<Stopped> {
    // Installed before anything else, so that a signal during start-up is
    // handled at once rather than waiting for a connection to time out.
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    let shutdown = Shutdown::new();
    let mut terminations = Terminations::default();
    info!(
        broker = %redact_url(&config.broker.url),
        store = %redact_url(&config.store.url),
        "starting: connecting to the broker and the store"
    );
    let build = Service::build(config.clone());
    tokio::pin!(build);
    let mut reload_pending = false;
    let mut service = loop {
        tokio::select! {
            built = &mut build => break built?,
            name = signals.next() => match name {
                "SIGHUP" => {
                    info!("SIGHUP during start-up: reloading once started");
                    reload_pending = true;
                }
                _ => {
                    terminations.count(name, &shutdown);
                    // Dropping the start-up closes what it had opened; no
                    // message was pulled yet.
                    info!(signal = name, "shutdown requested during start-up: not starting");
                    return Ok(Stopped::Cleanly);
                }
            },
        }
    };
    if until_idle {
        service = service.stop_when_idle();
    }
    let controls = service.controls();
    let running = service.run(shutdown.clone());
    tokio::pin!(running);
    let mut current = config;
    if reload_pending {
        reload(sources, &mut current, &controls, telemetry);
    }
    loop {
        tokio::select! {
            outcome = &mut running => return outcome.map(|_| Stopped::Cleanly),
            name = signals.next() => match name {
                "SIGHUP" => reload(sources, &mut current, &controls, telemetry),
                _ => if terminations.count(name, &shutdown) {
                    return Ok(Stopped::AtOnce);
                },
            },
        }
    }
}

fn reload(sources: &Sources, current: &mut Config, controls: &Controls, telemetry: &Telemetry) {
    info!("SIGHUP: reloading configuration");
    let new = match sources.load() {
        Ok(new) => new,
        Err(error) => {
            error!(%error, "reload failed; keeping the running configuration");
            return;
        }
    };
    telemetry.add_secrets(&new.redactor());
    let changed = current.changed_keys(&new);
    if let Err(error) = telemetry.set_level(&new.log.level) {
        error!(%error, "cannot apply log.level");
    }
    controls.apply(&new);
    for key in &changed {
        if RELOADABLE.contains(&key.as_str()) {
            info!(key, "setting reloaded");
        } else {
            warn!(
                key,
                "setting changed, but takes effect only after a restart"
            );
        }
    }
    info!(changed = changed.len(), "configuration reloaded");
    *current = new;
}

fn history(args: &HistoryArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        print_history(&config, args).await
    })
}

async fn print_history(config: &Config, args: &HistoryArgs) -> anyhow::Result<()> {
    let url = &config.store.url;
    if url == "memory" {
        bail!("store.url is memory: an in-memory store keeps no history after its process");
    }
    if let Some(path) = missing_sqlite_file(url) {
        bail!("no database at {path}: nothing has been recorded there (store.url {url:?})");
    }
    let store = service::open_store(&config.store).await?;
    let entries = store
        .history(args.limit)
        .await
        .context("cannot read history")?;
    store.close().await;
    // A recorded error may quote a connection string.
    let redactor = config.redactor();
    let mut out = std::io::stdout().lock();
    if args.json {
        for entry in &entries {
            let line = serde_json::to_string(entry)?;
            writeln!(out, "{}", redactor.scrub(&line))?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:<24}  {:<36}  {:<28}  {:<11}  {:>8}  {:<24}  {:>9}  ERROR",
        "RECEIVED", "MESSAGE_ID", "HOST", "STATUS", "ATTEMPTS", "COMPLETED", "RECOVERED"
    )?;
    for e in &entries {
        writeln!(
            out,
            "{:<24}  {:<36}  {:<28}  {:<11}  {:>8}  {:<24}  {:>9}  {}",
            e.received_at.to_string(),
            e.message_id
                .map_or_else(|| "-".to_owned(), |id| id.to_string()),
            e.hostname.as_deref().unwrap_or("-"),
            e.status.as_str(),
            e.attempts,
            e.completed_at
                .map_or_else(|| "-".to_owned(), |t| t.to_string()),
            e.recovered_after
                .map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64())),
            redactor.scrub(e.last_error.as_deref().unwrap_or("")),
        )?;
    }
    Ok(())
}

/// The file a `sqlite:PATH` url names, if it does not exist: reading
/// commands report that rather than create an empty database.
fn missing_sqlite_file(url: &str) -> Option<String> {
    let path = url.strip_prefix("sqlite:")?.trim_start_matches("//");
    let path = path.split('?').next().unwrap_or(path);
    (path != ":memory:" && !std::path::Path::new(path).exists()).then(|| path.to_owned())
}

/// Input that cannot be used (exit code 2); nothing was changed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadInput(String);

/// Loads the configuration and runs a one-shot command on a small runtime.
fn command<F, Fut>(sources: Result<Sources, ConfigError>, body: F) -> ExitCode
where
    F: FnOnce(Config) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let (_, config) = match load(sources) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    // An error's sources (a driver's connection error) may quote a URL.
    let redactor = config.redactor();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mandrill: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(body(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mandrill: {}", redactor.scrub(&format!("{error:#}")));
            if error.is::<BadInput>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `broker.url` for the queue commands, refusing `memory` (it lives only
/// inside `mandrill run`).
fn queue_url(config: &Config) -> anyhow::Result<BrokerUrl> {
    let url = service::broker_url(config)?;
    if url == BrokerUrl::Memory {
        return Err(BadInput(
            "broker.url is memory: an in-memory queue lives only inside `mandrill run`; \
             use --broker sqlite:PATH"
                .into(),
        )
        .into());
    }
    Ok(url)
}

/// At most this many invalid lines are listed; the rest are counted.
const MAX_LISTED_ERRORS: usize = 20;

/// Most requests published in one SQLite transaction: `--random N` is
/// generated and published this many at a time, never all in memory.
const PUBLISH_BATCH: usize = 10_000;

/// Reads and validates every request first, then publishes them in
/// transactions of up to [`PUBLISH_BATCH`] (or, with `--rate`, one due group
/// at a time).
async fn publish(config: Config, args: &PublishArgs) -> anyhow::Result<()> {
    let url = queue_url(&config)?;
    if let Some(rate) = args.rate
        && !(rate.is_finite() && (0.001..=config::limits::MAX_SIMULATE_RATE).contains(&rate))
    {
        return Err(BadInput(format!("--rate {rate} must be between 0.001 and 1000000")).into());
    }
    let rules = config.parse_rules();
    let request = |name: InstanceName| {
        Bytes::from(
            RestartRequest {
                message_id: Uuid::new_v4(),
                hostname: Hostname::new(&name, &rules.domain),
                instance_name: name,
                requested_by: Some("mandrill-publish".into()),
                reason: None,
                published_at: Some(std::time::SystemTime::now()),
            }
            .to_wire(),
        )
    };
    let mut payloads = Vec::new();
    let mut errors = Vec::new();
    for (index, name) in args.names.iter().enumerate() {
        match InstanceName::parse(name) {
            Ok(name) => payloads.push(request(name)),
            Err(why) => errors.push(format!(
                "argument {}: instance name {name:?} {why}",
                index + 1
            )),
        }
    }
    if let Some(path) = &args.file {
        let (text, shown) = if path.as_os_str() == "-" {
            let text =
                std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?;
            (text, "stdin".to_owned())
        } else {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            (text, path.display().to_string())
        };
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{shown}:{}", index + 1);
            if line.starts_with('{') {
                // Published as written, so that fields this version does not
                // know travel on; validated as the worker will validate it.
                match RestartRequest::parse(line.as_bytes(), &rules) {
                    Ok(_) => payloads.push(Bytes::copy_from_slice(line.as_bytes())),
                    Err(rejection) => errors.push(format!("{at}: {rejection}")),
                }
            } else {
                match InstanceName::parse(line) {
                    Ok(name) => payloads.push(request(name)),
                    Err(why) => errors.push(format!("{at}: instance name {line:?} {why}")),
                }
            }
        }
    }
    if !errors.is_empty() {
        let mut message = format!(
            "{} invalid request(s); nothing was published:",
            errors.len()
        );
        for error in errors.iter().take(MAX_LISTED_ERRORS) {
            message.push_str("\n  ");
            message.push_str(error);
        }
        if errors.len() > MAX_LISTED_ERRORS {
            message.push_str(&format!(
                "\n  … and {} more",
                errors.len() - MAX_LISTED_ERRORS
            ));
        }
        return Err(BadInput(message).into());
    }
    let random = args.random.unwrap_or(0);
    if payloads.is_empty() && random == 0 {
        return Err(BadInput(
            "nothing to publish: give instance names, --file PATH or --random N".into(),
        )
        .into());
    }
    // Random requests are made as they are published, not all up front.
    let mut rng = rand::rng();
    let payloads = payloads
        .into_iter()
        .chain((0..random).map(move |_| request(random_instance_name(&mut rng))));
    let published = if let BrokerUrl::Sqlite { .. } = url {
        let broker = service::open_sqlite_broker(&config.broker).await?;
        let published = match args.rate {
            None => publish_in_batches(&broker, payloads).await,
            Some(rate) => publish_at_rate(&broker, payloads, rate).await,
        };
        broker.close().await;
        published
    } else if let (BrokerUrl::PubSub { .. }, None) = (&url, args.rate) {
        // Up to 1000 messages per call, never all in memory.
        let broker = service::open_pubsub_publisher(&config).await?;
        let mut payloads = payloads.peekable();
        let mut published = 0usize;
        let mut failure = None;
        while payloads.peek().is_some() {
            let batch: Vec<Bytes> = payloads.by_ref().take(PUBLISH_BATCH).collect();
            let size = batch.len();
            if let Err(error) = broker.publish_all(batch).await {
                if published > 0 {
                    eprintln!("mandrill: published {published} requests before failing");
                }
                failure = Some(error);
                break;
            }
            published += size;
        }
        broker.close().await;
        failure.map_or(Ok(published), Err)
    } else {
        // Other brokers have no multi-message transaction: every request was
        // validated above, and they are published one by one.
        let broker = service::open_publisher(&config).await?;
        let published = publish_each(&*broker, payloads, args.rate).await;
        broker.close().await;
        published
    };
    let published = published.context("cannot publish")?;
    println!("published {published} requests");
    Ok(())
}

/// Publishes in transactions of up to [`PUBLISH_BATCH`].
async fn publish_in_batches(
    broker: &SqliteBroker,
    payloads: impl Iterator<Item = Bytes>,
) -> Result<usize, BrokerError> {
    let mut payloads = payloads.peekable();
    let mut published = 0usize;
    while payloads.peek().is_some() {
        let batch: Vec<Bytes> = payloads.by_ref().take(PUBLISH_BATCH).collect();
        let size = batch.len();
        if let Err(error) = broker.publish_all(batch).await {
            if published > 0 {
                eprintln!("mandrill: published {published} requests before failing");
            }
            return Err(error);
        }
        published += size;
    }
    Ok(published)
}

/// Publishes one by one, at `rate` per second if given.
async fn publish_each(
    broker: &dyn Publisher,
    payloads: impl Iterator<Item = Bytes>,
    rate: Option<f64>,
) -> Result<usize, BrokerError> {
    let started = tokio::time::Instant::now();
    let mut count = 0;
    for (published, payload) in payloads.enumerate() {
        if let Some(rate) = rate {
            // Bounded: a far-off due time must not overflow the clock.
            let offset = Duration::try_from_secs_f64(published as f64 / rate)
                .unwrap_or(config::limits::MAX_DURATION)
                .min(config::limits::MAX_DURATION);
            let due = started + offset;
            tokio::time::sleep_until(due).await;
        }
        if let Err(error) = broker.publish(payload).await {
            eprintln!("mandrill: published {published} requests before failing");
            return Err(error);
        }
        count = published + 1;
    }
    Ok(count)
}

/// Publishes `rate` payloads per second: every tick, the ones due so far, in
/// one transaction.
async fn publish_at_rate(
    broker: &SqliteBroker,
    payloads: impl Iterator<Item = Bytes>,
    rate: f64,
) -> Result<usize, BrokerError> {
    const TICK: Duration = Duration::from_millis(10);
    let started = tokio::time::Instant::now();
    let mut pending = payloads.peekable();
    let mut published = 0usize;
    while pending.peek().is_some() {
        // At least one each round, so that a slow rate still starts at once.
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).saturating_sub(published);
        let group: Vec<Bytes> = pending.by_ref().take(due.min(PUBLISH_BATCH)).collect();
        published += group.len();
        broker.publish_all(group).await?;
        if pending.peek().is_some() {
            tokio::time::sleep(TICK).await;
        }
    }
    Ok(published)
}

/// The dead-letter administration `broker.url` names, refusing a queue
/// that has none here and a SQLite file that does not exist.
async fn open_dead_letter_admin(config: &Config) -> anyhow::Result<Arc<dyn DeadLetterAdmin>> {
    let url = &config.broker.url;
    if let BrokerUrl::Sqlite { url } = queue_url(config)?
        && let Some(path) = missing_sqlite_file(&url)
    {
        bail!("no database at {path}: nothing was ever queued there (broker.url {url:?})");
    }
    match service::open_dead_letter_admin(config).await? {
        Some(admin) => Ok(admin),
        None => Err(BadInput(format!(
            "broker.url {:?} is not supported here: use sqlite:PATH",
            redact_url(url)
        ))
        .into()),
    }
}

async fn dead_letters(config: Config, args: &DeadLettersArgs) -> anyhow::Result<()> {
    let admin = open_dead_letter_admin(&config).await?;
    let entries = admin.dead_letters().await;
    admin.close().await;
    let entries = entries.context("cannot read the dead letters")?;
    let mut out = std::io::stdout().lock();
    if !admin.keeps_records() {
        // Pub/Sub: what the dead-letter subscription holds (it stays there).
        for e in &entries {
            let payload = String::from_utf8_lossy(&e.payload);
            if args.json {
                let line = serde_json::json!({
                    "id": e.id,
                    "reason": e.reason,
                    "payload": payload,
                });
                serde_json::to_writer(&mut out, &line)?;
                writeln!(out)?;
            } else {
                let payload: String = payload.chars().take(80).collect();
                writeln!(
                    out,
                    "{:>20}  {:<50}  {}",
                    e.id.to_string(),
                    e.reason,
                    payload.escape_debug()
                )?;
            }
        }
        return Ok(());
    }
    let record = |e: &DeadLetterEntry| {
        e.record.unwrap_or(DeadLetterRecord {
            deliveries: 0,
            published_at: 0,
            dead_at: 0,
            payload_size: 0,
        })
    };
    if args.json {
        for entry in &entries {
            let r = record(entry);
            let line = serde_json::json!({
                "id": entry.id,
                "reason": entry.reason,
                "deliveries": r.deliveries,
                "published_at": Timestamp::from_millis(r.published_at),
                "dead_at": Timestamp::from_millis(r.dead_at),
                "payload": String::from_utf8_lossy(&entry.payload),
            });
            serde_json::to_writer(&mut out, &line)?;
            writeln!(out)?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:>6}  {:<24}  {:>10}  {:<50}  PAYLOAD",
        "ID", "DEAD_AT", "DELIVERIES", "REASON"
    )?;
    for e in &entries {
        let r = record(e);
        let payload: String = String::from_utf8_lossy(&e.payload)
            .chars()
            .take(80)
            .collect();
        writeln!(
            out,
            "{:>6}  {:<24}  {:>10}  {:<50}  {}",
            e.id.to_string(),
            Timestamp::from_millis(r.dead_at).to_string(),
            r.deliveries,
            e.reason,
            payload.escape_debug(),
        )?;
    }
    Ok(())
}

async fn requeue(config: Config, args: &RequeueArgs) -> anyhow::Result<()> {
    let admin = open_dead_letter_admin(&config).await?;
    let ids: Vec<String> = args.ids.iter().map(i64::to_string).collect();
    let requeued = admin.requeue((!args.all).then_some(ids.as_slice())).await;
    admin.close().await;
    let requeued = requeued.context("cannot requeue")?;
    println!("requeued {} dead letters", requeued.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_flags_become_settings() {
        let cli = Cli::try_parse_from([
            "mandrill",
            "run",
            "--simulate",
            "--db",
            "memory",
            "--max-in-flight",
            "7",
            "--set",
            "worker.max_attempts=2",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let mut sources = args.sources().unwrap();
        sources.environment.clear();
        let config = sources.load().unwrap();
        assert!(config.simulate.enabled);
        assert_eq!(config.simulate.rate, 2.0);
        assert_eq!(config.store.url, "memory");
        assert_eq!(config.worker.max_in_flight, 7);
        assert_eq!(config.worker.max_attempts, 2);
    }
}
