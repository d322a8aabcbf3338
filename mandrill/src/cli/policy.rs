//! `mandrill policy check`: the verdicts the configured guards would give,
//! now or at a given time, without acting.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use jiff::Timestamp;
use serde_json::{Value, json};

use super::{BadInput, ConfigArgs, command};
use crate::config::Config;
use crate::domain::InstanceName;
use crate::safety::Verdict;

/// `mandrill policy`
#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Print the verdict of each guard (eligibility, calendar) for each
    /// instance name, now or at `--at`, without acting.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The moment to judge, RFC 3339 (e.g. 2026-11-23T08:59:59Z); default now.
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    /// One JSON object per name instead of text.
    #[arg(long)]
    json: bool,
    /// Instance names to judge.
    #[arg(value_name = "INSTANCE_NAME", required = true)]
    names: Vec<String>,
}

/// Runs `mandrill policy …`.
pub fn main(args: &PolicyArgs) -> ExitCode {
    match &args.command {
        PolicyCommand::Check(check) => {
            let sources = check.config.sources(Vec::new());
            command(sources, |config| async move { print_check(&config, check) })
        }
    }
}

fn print_check(config: &Config, args: &CheckArgs) -> anyhow::Result<()> {
    let at = match &args.at {
        Some(raw) => raw.parse::<Timestamp>().map_err(|error| {
            BadInput(format!(
                "--at {raw:?} is not an rfc 3339 timestamp: {error}"
            ))
        })?,
        None => Timestamp::now(),
    };
    let names = args
        .names
        .iter()
        .map(|raw| {
            InstanceName::parse(raw).map_err(|why| BadInput(format!("instance name {raw:?} {why}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let policy = config.worker_config().policy.current();
    let calendar = policy.guards.calendar.as_ref();
    let mut out = std::io::stdout().lock();
    for name in &names {
        let eligibility = policy.eligibility.check(name.as_str());
        let timed = calendar.map(|calendar| calendar.verdict(at));
        if args.json {
            let eligibility = match &eligibility {
                Ok(()) => json!({ "verdict": "allow" }),
                Err(reason) => json!({ "verdict": "deny", "reason": reason }),
            };
            let calendar = match (&timed, calendar) {
                (Some(Verdict::Defer { until, reason }), _) => {
                    json!({ "verdict": "defer", "until": until.to_string(), "reason": reason })
                }
                (_, Some(calendar)) => {
                    json!({ "verdict": "allow", "calendar": calendar.describe() })
                }
                (_, None) => json!({ "verdict": "allow", "calendar": Value::Null }),
            };
            let line = json!({
                "instance": name.as_str(),
                "at": at.to_string(),
                "eligibility": eligibility,
                "calendar": calendar,
                "dry_run": policy.dry_run,
            });
            writeln!(out, "{line}")?;
            continue;
        }
        writeln!(out, "{name}")?;
        match &eligibility {
            Ok(()) => writeln!(out, "  eligibility: allow")?,
            Err(reason) => {
                let reason = reason.strip_prefix("denied: ").unwrap_or(reason);
                writeln!(out, "  eligibility: deny: {reason}")?;
            }
        }
        match (&timed, calendar) {
            (Some(Verdict::Defer { until, reason }), Some(calendar)) => {
                let reason = reason
                    .strip_prefix("deferred by calendar: ")
                    .unwrap_or(reason);
                writeln!(
                    out,
                    "  calendar: defer until {}: {reason}",
                    calendar.local(*until)
                )?;
            }
            (_, Some(calendar)) => writeln!(out, "  calendar: allow ({})", calendar.describe())?,
            (_, None) => writeln!(out, "  calendar: allow (no calendar configured)")?,
        }
    }
    Ok(())
}
