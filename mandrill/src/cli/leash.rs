//! `mandrill leash` and `mandrill unleash`: the leash recorded in the
//! shared store, beside the kill switch, so that every instance using it
//! obeys one audited word (who, why, when) from its next claim on. See
//! `safety::leash` for how it meets each instance's own `safety.dry_run`.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::switch::{open, who_and_why};
use super::{ConfigArgs, OutcomeUnknown, command, string};

/// `mandrill leash`
#[derive(Debug, Args)]
pub(crate) struct LeashArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Why, for the record and `mandrill status`.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Who, for the record (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

/// `mandrill unleash`
#[derive(Debug, Args)]
pub(crate) struct UnleashArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Why real restarts now: required, for the record and `mandrill status`.
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Who, for the record (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

pub(super) fn leash(args: &LeashArgs) -> ExitCode {
    turn(&args.config, &args.db, &args.by, args.reason.clone(), true)
}

pub(super) fn unleash(args: &UnleashArgs) -> ExitCode {
    if args.reason.trim().is_empty() {
        eprintln!(
            "mandrill: unleash needs a reason (--reason): who asked for real restarts, and why"
        );
        return ExitCode::from(2);
    }
    turn(
        &args.config,
        &args.db,
        &args.by,
        Some(args.reason.clone()),
        false,
    )
}

/// Records the leash (`leashed`) or its release, saying what it was.
fn turn(
    config: &ConfigArgs,
    db: &Option<String>,
    by: &Option<String>,
    reason: Option<String>,
    leashed: bool,
) -> ExitCode {
    let sources = config.sources(vec![("store.url", string(db))]);
    command(sources, |config| async move {
        let (by, reason) = who_and_why(by, &reason)?;
        let store = open(&config).await?;
        // What it was, for the operator: read before, so a failed read
        // turns nothing.
        let before = store.switch().await.context("cannot read the leash");
        let result = match before {
            Ok(_) => store.set_leash(leashed, &by, &reason).await,
            Err(error) => {
                store.close().await;
                return Err(error);
            }
        };
        store.close().await;
        let what = if leashed { "leash" } else { "unleash" };
        match result {
            Ok(()) => {}
            // Sent, but unanswered: either may be true now.
            Err(error) if error.outcome_unknown() => {
                return Err(OutcomeUnknown(format!(
                    "{what}: outcome unknown, the leash may or may not have turned ({}); \
                     check with `mandrill status`",
                    error.with_causes()
                ))
                .into());
            }
            Err(error) => return Err(error).context("cannot turn the leash"),
        }
        let was = match before.ok().and_then(|switch| switch.leash) {
            Some(record) => format!(
                "it was {} by {} ({}) since {}",
                if record.leashed {
                    "leashed"
                } else {
                    "unleashed"
                },
                record.by,
                record.reason,
                record.since
            ),
            None => "before, no operator had turned it: each instance followed its own \
                     safety.dry_run"
                .to_owned(),
        };
        if leashed {
            println!(
                "leashed by {by} ({reason}): every instance using this store records restarts \
                 as dry runs from its next claim, none is issued; {was}"
            );
        } else {
            println!(
                "unleashed by {by} ({reason}): every instance using this store issues the \
                 restarts its guards allow from its next claim, whatever its safety.dry_run \
                 or --unleash; {was}"
            );
        }
        Ok(())
    })
}
