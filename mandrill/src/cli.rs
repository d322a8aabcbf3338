//! The command line: `mandrill run` and `mandrill history`. The only module
//! that reads signals, builds the runtime and chooses exit codes.
//!
//! Exit codes: 0 after a clean shutdown; 1 when the service failed (could not
//! start, or stopped by itself); 2 for bad usage or configuration.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{error, info, warn};

use crate::config::{self, Config, ConfigError, LogFormat, RELOADABLE, Sources};
use crate::service::{self, Controls, Service};
use crate::telemetry::Telemetry;
use crate::worker::Shutdown;

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
    /// Consume restart requests until SIGTERM, SIGINT or SIGQUIT (SIGHUP reloads the config).
    Run(RunArgs),
    /// Print recorded requests and outcomes, newest first.
    History(HistoryArgs),
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
    /// Where requests come from: `memory` [setting: broker.url].
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// Where outcomes are recorded: `sqlite:PATH` or `memory` [setting: store.url].
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
}

/// `mandrill history`
#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The store to read: `sqlite:PATH` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// How many entries.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
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
            environment: Sources::process_environment(),
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
            ("simulate.enabled", self.simulate.map(|_| toml::Value::Boolean(true))),
            ("simulate.rate", self.simulate.map(toml::Value::Float)),
            (
                "worker.max_in_flight",
                self.max_in_flight
                    .map(|n| toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))),
            ),
            ("log.format", format.map(|f| toml::Value::String(f.into()))),
            ("log.level", string(&self.log_level)),
        ])
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(&args),
        Command::History(args) => history(&args),
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
    let telemetry = match Telemetry::init(&config.log) {
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
    let outcome = runtime.block_on(serve(config, &sources, &telemetry));
    // A blocking restart stuck in its thread must not hold the exit hostage:
    // every result it could produce has been given up on by now.
    runtime.shutdown_timeout(Duration::from_secs(1));
    let code = match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!("{error:#}");
            ExitCode::FAILURE
        }
    };
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

async fn serve(config: Config, sources: &Sources, telemetry: &Telemetry) -> anyhow::Result<()> {
    // Installed first, so that a signal during start-up is handled, not fatal.
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    let shutdown = Shutdown::new();
    let service = Service::build(config.clone()).await?;
    let controls = service.controls();
    let running = service.run(shutdown.clone());
    tokio::pin!(running);
    let mut current = config;
    loop {
        tokio::select! {
            outcome = &mut running => return outcome.map(drop),
            name = signals.next() => match name {
                "SIGHUP" => reload(sources, &mut current, &controls, telemetry),
                _ if !shutdown.is_requested() => {
                    info!(signal = name, "shutting down: stop pulling, let in-flight work finish");
                    shutdown.request();
                }
                "SIGTERM" | "SIGINT" => {
                    warn!(signal = name, "second signal: skipping the rest of the grace period");
                    shutdown.hurry();
                }
                _ => info!(signal = name, "already shutting down"),
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
    let changed = current.changed_keys(&new);
    if let Err(error) = telemetry.set_level(&new.log.level) {
        error!(%error, "cannot apply log.level");
    }
    controls.apply(&new);
    for key in &changed {
        if RELOADABLE.contains(&key.as_str()) {
            info!(key, "setting reloaded");
        } else {
            warn!(key, "setting changed, but takes effect only after a restart");
        }
    }
    info!(changed = changed.len(), "configuration reloaded");
    *current = new;
}

fn history(args: &HistoryArgs) -> ExitCode {
    let (_, config) = match load(args.config.sources(vec![("store.url", string(&args.db))])) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mandrill: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(print_history(&config, args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mandrill: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn print_history(config: &Config, args: &HistoryArgs) -> anyhow::Result<()> {
    let url = &config.store.url;
    if url == "memory" {
        bail!("store.url is memory: an in-memory store keeps no history after its process");
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.trim_start_matches("//");
        let path = path.split('?').next().unwrap_or(path);
        if path != ":memory:" && !std::path::Path::new(path).exists() {
            bail!("no database at {path}: nothing has been recorded there (store.url {url:?})");
        }
    }
    let store = service::open_store(&config.store).await?;
    let entries = store.history(args.limit).await.context("cannot read history")?;
    store.close().await;
    let mut out = std::io::stdout().lock();
    if args.json {
        for entry in &entries {
            serde_json::to_writer(&mut out, entry)?;
            writeln!(out)?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:<24}  {:<36}  {:<28}  {:<9}  {:>8}  {:<24}  ERROR",
        "RECEIVED", "MESSAGE_ID", "HOST", "STATUS", "ATTEMPTS", "COMPLETED"
    )?;
    for e in &entries {
        writeln!(
            out,
            "{:<24}  {:<36}  {:<28}  {:<9}  {:>8}  {:<24}  {}",
            e.received_at.to_string(),
            e.message_id.map_or_else(|| "-".to_owned(), |id| id.to_string()),
            e.hostname.as_deref().unwrap_or("-"),
            e.status.as_str(),
            e.attempts,
            e.completed_at.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            e.last_error.as_deref().unwrap_or(""),
        )?;
    }
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
            "mandrill", "run", "--simulate", "--db", "memory", "--max-in-flight", "7",
            "--set", "worker.max_attempts=2",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else { panic!("not run") };
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
