//! `mandrill explain MESSAGE_ID`: a request's whole story, from the store
//! every instance shares: each guard's verdict with its reason, each
//! restart attempt with what the guards said when they allowed it, and how
//! it ended.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use uuid::Uuid;

use super::{ConfigArgs, command, string, switch};

/// `mandrill explain`
#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The request's message id.
    #[arg(value_name = "MESSAGE_ID")]
    message_id: String,
}

/// Prints the story of one request.
pub(super) fn main(args: &ExplainArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        let Ok(id) = Uuid::parse_str(args.message_id.trim()) else {
            bail!(super::BadInput(format!(
                "{:?} is not a message id (a uuid)",
                args.message_id
            )));
        };
        let store = switch::open(&config).await?;
        let story = store.story(id).await.context("cannot read the store");
        store.close().await;
        let Some(story) = story? else {
            bail!(super::BadInput(format!("no request {id} is recorded")));
        };
        let scheduled = story
            .entry
            .reason
            .as_deref()
            .and_then(|reason| scheduled(&config, id, reason));
        let mut out = std::io::stdout().lock();
        if args.json {
            let mut json = serde_json::to_value(&story)?;
            if let (Some(object), Some(scheduled)) = (json.as_object_mut(), &scheduled) {
                object.insert("schedule".into(), serde_json::to_value(scheduled)?);
            }
            writeln!(out, "{json}")?;
        } else {
            // The schedule's line right after who asked and why (a reason
            // that names a slot is always printed).
            for line in story.explain().lines() {
                writeln!(out, "{line}")?;
                if let Some(scheduled) = &scheduled
                    && line.starts_with("  requested by")
                {
                    writeln!(out, "  {}", scheduled.describe())?;
                }
            }
        }
        Ok(())
    })
}

/// The schedule and slot a request's reason names, checked against the
/// configured plan: the reason is free text, but a slot's message id (a
/// UUIDv5 of the schedule's seed and the slot) is not.
#[derive(Debug, serde::Serialize)]
struct Scheduled {
    name: String,
    slot: String,
    /// `Some(true)`: the message id is that slot's; `Some(false)`: it is
    /// not (the reason only claims it); `None`: not checked here (`why`).
    verified: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

impl Scheduled {
    fn describe(&self) -> String {
        let (name, slot) = (&self.name, &self.slot);
        match (self.verified, &self.why) {
            (Some(true), _) => {
                format!(
                    "scheduled by [[schedule]] {name}, slot {slot} (its message id is that slot's)"
                )
            }
            (Some(false), _) => format!(
                "NOT a scheduled restart: the reason names [[schedule]] {name}, slot {slot}, \
                 but the message id is not that slot's"
            ),
            (None, why) => format!(
                "scheduled by [[schedule]] {name}, slot {slot}, as its reason says (not checked: {})",
                why.as_deref().unwrap_or("unknown")
            ),
        }
    }
}

fn scheduled(config: &crate::config::Config, id: Uuid, reason: &str) -> Option<Scheduled> {
    let (name, at) = crate::schedule::Slot::named_in(reason)?;
    let (verified, why) = match config.schedules() {
        Err(error) => (
            None,
            Some(format!("the schedules cannot be read here: {error}")),
        ),
        Ok(schedules) => match schedules.iter().find(|s| s.plan.name == name) {
            Some(scheduled) => (Some(scheduled.plan.is_slot(at, id)), None),
            None => (
                None,
                Some(format!("no [[schedule]] {name} is configured here")),
            ),
        },
    };
    Some(Scheduled {
        name: name.to_owned(),
        slot: at.to_string(),
        verified,
        why,
    })
}
