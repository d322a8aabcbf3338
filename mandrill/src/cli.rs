//! The command line: `mandrill run`, `history`, `publish`, `dead-letters` and
//! `requeue`. The only module that reads signals, builds the runtime and
//! chooses exit codes.
//!
//! Exit codes: 0 after a clean shutdown (or a command done, or a shutdown
//! requested during start-up); 1 when the service or command failed (could
//! not start, stopped by itself, database error); 2 for bad usage,
//! configuration or input (nothing was published); 3 when the outcome is
//! unknown (`pause`, `resume`, `leash` or `unleash` sent, but the store did
//! not answer within `store.timeout`: it may or may not have turned); 130 when a
//! third signal cut the shutdown short.
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
use tracing::{error, info, warn};

use crate::broker::{BrokerUrl, Close as _, DeadLetterAdmin, DeadLetterEntry};
use crate::config::{self, Config, ConfigError, LogFormat, Sources, redact_url};
use crate::domain::{Hostname, InstanceName, RestartRequest, printable, random_instance_name};
use crate::service::{self, Controls, Service};
use crate::telemetry::Telemetry;
use crate::worker::Shutdown;

mod args;
mod campaign;
mod dead_letters;
mod explain;
mod history;
mod inventory;
mod keygen;
mod leash;
mod policy;
mod publish;
mod replay;
mod report;
mod run;
mod schedule;
mod signals;
mod switch;
mod wait;

use args::string;
pub(crate) use args::{
    ConfigArgs, DeadLettersArgs, HistoryArgs, PublishArgs, RequeueArgs, RunArgs,
};
pub(crate) use switch::{StatusArgs, SwitchArgs};

/// Mayhem Mandrill: restarts hosts on request, concurrently and durably.
#[derive(Debug, Parser)]
#[command(name = "mandrill", version)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Consume restart requests until SIGTERM, SIGINT or SIGQUIT (a second skips the grace period, a third exits at once; SIGHUP reloads the config).
    Run(RunArgs),
    /// Print recorded requests and outcomes, newest first.
    History(HistoryArgs),
    /// Publish restart requests into the queue, each checked first; prints each one's message id and host.
    Publish(PublishArgs),
    /// List the messages the queue gave up on, with the reasons.
    DeadLetters(DeadLettersArgs),
    /// Put dead-lettered messages back into the queue.
    Requeue(RequeueArgs),
    /// Stop every instance that uses this store from issuing restarts (the kill switch).
    Pause(SwitchArgs),
    /// Let restarts be issued again.
    Resume(SwitchArgs),
    /// Record restarts as dry runs on every instance that uses this store, until `mandrill unleash` (the leash, kept beside the kill switch).
    Leash(leash::LeashArgs),
    /// Let every instance that uses this store issue real restarts, whatever its safety.dry_run or --unleash: needs --reason.
    Unleash(leash::UnleashArgs),
    /// Show the mode, the leash, the kill switch and the eligibility rules.
    Status(StatusArgs),
    /// Ask the safety policy without acting: `mandrill policy check NAME…`.
    Policy(policy::PolicyArgs),
    /// Tell one request's story: every guard's verdict, every attempt, the outcome.
    Explain(explain::ExplainArgs),
    /// Print the operator's inventory: hosts, groups with sizes, zones, the source and its age.
    Inventory(inventory::InventoryArgs),
    /// Make a requester's Ed25519 key pair (NAME.key, NAME.pub) and print its [[requesters]] entry.
    Keygen(keygen::KeygenArgs),
    /// Restarts mandrill plans itself ([[schedule]]): `mandrill schedule preview`.
    Schedule(schedule::ScheduleArgs),
    /// The game-day report since a moment: per group, restarts, recovery times, unrecovered hosts, deferrals, denials.
    Report(report::ReportArgs),
    /// Restarts over a share of a group, resolved from the inventory: `mandrill campaign start|status|stop`.
    Campaign(campaign::CampaignArgs),
    /// Wait for a request or a campaign to be decided: exit 0 restarted (and recovered), 1 failed, 2 timed out, 3 the campaign was stopped.
    Wait(wait::WaitArgs),
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::run(&args),
        Command::History(args) => history::history(&args),
        Command::Policy(args) => policy::main(&args),
        Command::Publish(args) => {
            let sources = args
                .config
                .sources(vec![("broker.url", string(&args.broker))]);
            command(sources, |config| publish::publish(config, &args))
        }
        Command::DeadLetters(args) => {
            let sources = args
                .config
                .sources(vec![("broker.url", string(&args.broker))]);
            command(sources, |config| dead_letters::dead_letters(config, &args))
        }
        Command::Requeue(args) => {
            let sources = args
                .config
                .sources(vec![("broker.url", string(&args.broker))]);
            command(sources, |config| dead_letters::requeue(config, &args))
        }
        Command::Pause(args) => switch::switch(&args, true),
        Command::Resume(args) => switch::switch(&args, false),
        Command::Leash(args) => leash::leash(&args),
        Command::Unleash(args) => leash::unleash(&args),
        Command::Status(args) => switch::status(&args),
        Command::Explain(args) => explain::main(&args),
        Command::Inventory(args) => inventory::main(&args),
        Command::Schedule(args) => schedule::main(&args),
        Command::Report(args) => report::main(&args),
        Command::Campaign(args) => campaign::main(&args),
        Command::Wait(args) => wait::main(&args),
        Command::Keygen(args) => match keygen::keygen(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("mandrill: {error}");
                if error.is::<BadInput>() {
                    ExitCode::from(2)
                } else {
                    ExitCode::FAILURE
                }
            }
        },
    }
}

/// Loads the configuration, or says why not (exit code 2).
pub(super) fn load(sources: Result<Sources, ConfigError>) -> Result<(Sources, Config), ExitCode> {
    let loaded = sources.and_then(|sources| {
        let config = sources.load()?;
        Ok((sources, config))
    });
    loaded.map_err(|error| {
        eprintln!("mandrill: {}", error.with_causes());
        ExitCode::from(2)
    })
}

/// The file a `sqlite:PATH` url names, if it does not exist: reading
/// commands report that rather than create an empty database.
pub(super) fn missing_sqlite_file(url: &str) -> Option<String> {
    let path = url.strip_prefix("sqlite:")?.trim_start_matches("//");
    let path = path.split('?').next().unwrap_or(path);
    (path != ":memory:" && !std::path::Path::new(path).exists()).then(|| path.to_owned())
}

/// Exit code 2 for input or configuration that cannot be used, wherever it
/// was found (a `[[schedule]]` group the inventory lacks is found only
/// once the inventory is read), else 1. `deploy/mandrill.service` keeps
/// systemd from restarting on 2: a broken configuration stays down.
pub(super) fn failure_code(error: &anyhow::Error) -> ExitCode {
    let unusable = error
        .chain()
        .any(|cause| cause.is::<BadInput>() || cause.is::<ConfigError>());
    if unusable {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}

/// Input that cannot be used (exit code 2); nothing was changed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct BadInput(pub(super) String);

/// A change sent whose outcome is unknown (exit code 3): it may or may not
/// have been made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct OutcomeUnknown(pub(super) String);

/// Loads the configuration and runs a one-shot command on a small runtime.
pub(super) fn command<F, Fut>(sources: Result<Sources, ConfigError>, body: F) -> ExitCode
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
            // Each cause once (anyhow's `{:#}` repeats those an error also
            // writes into its own message, as sqlx's do).
            let message = crate::causes::WithCauses(&*error).to_string();
            eprintln!("mandrill: {}", redactor.scrub(&message));
            if error.is::<OutcomeUnknown>() {
                ExitCode::from(3)
            } else {
                failure_code(&error)
            }
        }
    }
}

/// An id as the commands that read the store take it (`wait`,
/// `explain`): a uuid, or a line `mandrill publish` printed, `<message id>
/// <host>`, given as one argument or two; the id and the host, if given.
pub(super) fn published_line(words: &[String]) -> Result<(uuid::Uuid, Option<String>), BadInput> {
    let joined = words.join(" ");
    let mut parts = joined.split_whitespace();
    let (Some(id), host, None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(BadInput(format!(
            "{joined:?} is not an id (a uuid), nor a line `mandrill publish` printed \
             (ID HOST)"
        )));
    };
    let id =
        uuid::Uuid::parse_str(id).map_err(|_| BadInput(format!("{id:?} is not an id (a uuid)")))?;
    Ok((id, host.map(str::to_owned)))
}

/// `broker.url` for the queue commands, refusing `memory` (it lives only
/// inside `mandrill run`).
pub(super) fn queue_url(config: &Config) -> anyhow::Result<BrokerUrl> {
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
