//! `mandrill policy check`: the verdicts the configured guards would give,
//! now or at a given time, without acting; `mandrill policy replay`: what a
//! candidate policy would have decided about the requests recorded lately.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use jiff::Timestamp;
use serde_json::{Value, json};

use super::{BadInput, ConfigArgs, command, string};
use crate::config::Config;
use crate::domain::InstanceName;
use crate::safety::{Placement, Verdict};

/// `mandrill policy`
#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Print the verdict of each guard (eligibility, calendar, expiry) for
    /// each instance name, now or at `--at`, without acting.
    Check(CheckArgs),
    /// Re-evaluate the requests recorded since `--since` under this policy
    /// (`--config FILE`) and print those it would have decided differently.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
struct ReplayArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The store holding the history: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// How far back, e.g. `7d`, `12h`.
    #[arg(long, value_name = "DURATION")]
    since: String,
    /// One JSON object per changed decision, then a summary object.
    #[arg(long)]
    json: bool,
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
pub(super) fn main(args: &PolicyArgs) -> ExitCode {
    match &args.command {
        PolicyCommand::Check(check) => {
            let sources = check.config.sources(Vec::new());
            command(sources, |config| async move {
                print_check(&config, check).await
            })
        }
        PolicyCommand::Replay(replay) => {
            let sources = replay
                .config
                .sources(vec![("store.url", string(&replay.db))]);
            command(sources, |config| async move {
                super::replay::run(&config, replay.since.as_str(), replay.json).await
            })
        }
    }
}

async fn print_check(config: &Config, args: &CheckArgs) -> anyhow::Result<()> {
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
    let policy = super::inventory::policy_with_inventory(config).await?;
    let calendar = policy.guards.calendar.as_ref();
    let rules = config.parse_rules();
    let mut out = std::io::stdout().lock();
    for name in &names {
        // Placed as the worker places a request: the operator's group (the
        // inventory's, with one), or why it is not counted at all.
        let mut request = super::inventory::request_for(name, &rules);
        let placed = policy.place(&mut request);
        let eligibility = match &placed {
            Err(Placement::Denied { reason, .. }) => Err(reason.clone()),
            _ => policy
                .eligibility
                .check(name.as_str())
                .and_then(|()| policy.check_other_names(&request)),
        };
        let timed = calendar.map(|calendar| calendar.verdict(at));
        // A request published at `at` and held by every guard from then on
        // is recorded expired at this moment (the worker's one rule).
        let expires = policy.guards.expires_at(at);
        let max_defer = humantime::format_duration(policy.guards.max_defer).to_string();
        let group = request.group().to_owned();
        let inventory = match (&placed, &policy.inventory) {
            (_, None) => None,
            (Ok(()), Some(_)) => Some(json!({
                "verdict": "allow",
                "group": group,
                "zone": request.zone,
            })),
            (Err(Placement::Denied { reason, .. }), Some(_)) => {
                Some(json!({ "verdict": "deny", "reason": reason }))
            }
            (Err(Placement::Deferred { reason, .. }), Some(_)) => {
                Some(json!({ "verdict": "defer", "reason": reason }))
            }
        };
        let limits = match policy.limits(&group) {
            Ok(limits) if limits.is_active() => crate::safety::limits::describe(&limits),
            Ok(_) => "none".to_owned(),
            Err(reason) => reason,
        };
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
                "group": group,
                "inventory": inventory,
                "limits": limits,
                "expires_at": expires.to_string(),
                "max_defer": max_defer,
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
        match calendar {
            Some(calendar) => writeln!(
                out,
                "  expiry: published then, expires {} if still waiting (safety.max_defer {max_defer} \
                 of open calendar time; closed time does not count)",
                calendar.local(expires)
            )?,
            None => writeln!(
                out,
                "  expiry: published then, expires {expires} if still waiting (safety.max_defer \
                 {max_defer})"
            )?,
        }
        match &placed {
            Ok(()) if policy.inventory.is_some() => writeln!(
                out,
                "  inventory: listed, group {group}{}",
                request
                    .zone
                    .as_deref()
                    .map_or_else(String::new, |zone| format!(", zone {zone}"))
            )?,
            Ok(()) => {}
            Err(Placement::Denied { reason, .. } | Placement::Deferred { reason, .. }) => {
                writeln!(out, "  inventory: {reason}")?;
            }
        }
        writeln!(
            out,
            "  limits: group {group}: {limits} (counted against the store when claimed)"
        )?;
    }
    Ok(())
}
