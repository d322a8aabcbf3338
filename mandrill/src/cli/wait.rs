//! `mandrill wait ID [--timeout D]`: waits on the store for a request or a
//! campaign to be decided, for automation that must not poll with sleeps.
//! Exit 0 once every request is restarted (and recovered, where a probe
//! verifies it; with no probe a restart counts as recovered), 1 as soon as
//! one failed, ended unrecovered, was denied, rejected or expired, or was
//! only a dry run (nothing restarted), 2 when `--timeout` passes first (and
//! for bad usage), 3 when the campaign was stopped (`campaign stop`: its
//! unissued targets cancelled) and nothing failed. It reads only the store `store.url` names, with that
//! store's own credentials, so it works from any machine that reaches it.

use std::cell::Cell;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio::time::Instant;

use super::{ConfigArgs, command, string};
use crate::campaign::{AskedFor, Verdict};
use crate::domain::printable;
use crate::store::Store;

/// `mandrill wait`
#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Give up (exit 2) after this long; without it, wait until decided.
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// A campaign's id, or a request's message id; or a line `mandrill
    /// publish` printed (`MESSAGE_ID HOST`, as one argument or two): a
    /// record under the id for another host is another request's, and this
    /// one failed (it was refused).
    #[arg(value_name = "ID", num_args = 1..=2, required = true)]
    id: Vec<String>,
}

/// How often the store is read again.
const POLL: Duration = Duration::from_millis(500);

/// Exit code when the timeout passed first.
const TIMED_OUT: u8 = 2;

/// Exit code when the campaign was stopped (`campaign stop`) and nothing
/// failed: its targets not yet issued were cancelled.
const CANCELLED: u8 = 3;

/// Runs `mandrill wait`.
pub(super) fn main(args: &WaitArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    let code = Cell::new(0u8);
    let code_ref = &code;
    let ran = command(sources, move |config| async move {
        let (id, host) = super::published_line(&args.id)?;
        let store = super::switch::open(&config).await?;
        let asked = host.as_deref().map_or(AskedFor::Any, AskedFor::Host);
        let redactor = config.redactor();
        let waited = wait(&*store, id, asked, args.timeout, &redactor).await;
        store.close().await;
        code_ref.set(waited?);
        Ok(())
    });
    if ran != ExitCode::SUCCESS {
        return ran;
    }
    ExitCode::from(code.get())
}

/// Waits for `id` (a campaign's, else a request's) to be decided; the exit
/// code. A store that cannot be read is read again until the deadline:
/// a blip must not end a long wait.
async fn wait(
    store: &dyn Store,
    id: uuid::Uuid,
    asked: AskedFor<'_>,
    timeout: Option<Duration>,
    redactor: &crate::settings::Redactor,
) -> anyhow::Result<u8> {
    // What a line may hold: a record's error, which may quote a secret or
    // what a payload or a host wrote.
    let shown = |line: &str| printable(&redactor.scrub(line)).into_owned();
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let mut last_shown = String::new();
    loop {
        match decide(store, id, asked).await {
            Ok((Verdict::InProgress, lines)) => {
                let now_shown = lines.iter().map(|line| shown(line)).collect::<Vec<_>>();
                let now_shown = now_shown.join("\n");
                if now_shown != last_shown {
                    eprintln!("{now_shown}");
                    last_shown = now_shown;
                }
            }
            Ok((verdict, lines)) => {
                let mut out = std::io::stdout().lock();
                for line in &lines {
                    writeln!(out, "{}", shown(line))?;
                }
                writeln!(out, "verdict: {}", verdict.as_str())?;
                return Ok(match verdict {
                    Verdict::Failed => 1,
                    Verdict::Cancelled => CANCELLED,
                    Verdict::Succeeded | Verdict::InProgress => 0,
                });
            }
            Err(error) => eprintln!(
                "mandrill: {}; reading again",
                crate::causes::WithCauses(&*error)
            ),
        }
        if deadline.is_some_and(|deadline| Instant::now() + POLL > deadline) {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{last_shown}")?;
            writeln!(
                out,
                "timed out after {}: not decided yet",
                humantime::format_duration(timeout.unwrap_or_default())
            )?;
            return Ok(TIMED_OUT);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The verdict on `id` now, and a line per request saying where it stands
/// (the failed ones only, once failed). An id the store does not know is a
/// request no instance has received yet.
async fn decide(
    store: &dyn Store,
    id: uuid::Uuid,
    asked: AskedFor<'_>,
) -> anyhow::Result<(Verdict, Vec<String>)> {
    let found = store.campaign(id).await.context("cannot read the store")?;
    let Some(campaign) = found else {
        let standing = crate::campaign::standings(store, &[(id, asked)])
            .await?
            .pop()
            .context("one standing per request")?;
        let line = format!("request {id}: {}: {}", standing.state, standing.detail);
        return Ok((standing.verdict, vec![line]));
    };
    let (targets, verdict) = crate::campaign::judge(store, &campaign).await?;
    let mut lines: Vec<String> = campaign
        .stopped
        .iter()
        .map(|stop| format!("stopped by {} at {}: {}", stop.by, stop.at, stop.reason))
        .collect();
    lines.extend(
        targets
            .iter()
            .filter(|(_, standing)| {
                verdict != Verdict::Failed || standing.verdict == Verdict::Failed
            })
            .map(|(target, standing)| {
                format!(
                    "{} ({}): {}: {}",
                    target.instance_name, target.message_id, standing.state, standing.detail
                )
            }),
    );
    Ok((verdict, lines))
}
