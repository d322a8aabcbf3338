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
    /// The request's message id; or a line `mandrill publish` printed
    /// (`MESSAGE_ID HOST`, as one argument or two), whose host is checked
    /// against the recorded one.
    #[arg(value_name = "MESSAGE_ID", num_args = 1..=2, required = true)]
    message_id: Vec<String>,
}

/// Prints the story of one request.
pub(super) fn main(args: &ExplainArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        let (id, host) = super::published_line(&args.message_id)?;
        let store = switch::open(&config).await?;
        let story = store.story(id).await.context("cannot read the store");
        store.close().await;
        let Some(story) = story? else {
            bail!(super::BadInput(format!("no request {id} is recorded")));
        };
        if let (Some(host), Some(recorded)) = (host, story.entry.hostname.as_deref())
            && host != recorded
        {
            bail!(super::BadInput(format!(
                "request {id} is recorded for host {recorded}, not {host}"
            )));
        }
        // Who signed it, as verified when it was claimed, else as its
        // row records it (a request denied or deferred before any claim
        // was verified all the same).
        let signer = story
            .attempts
            .iter()
            .find_map(|a| a.requester.as_deref())
            .or_else(|| {
                let entry = &story.entry;
                entry.requested_by.as_deref().filter(|_| entry.verified)
            });
        let scheduled = story
            .entry
            .reason
            .as_deref()
            .and_then(|reason| scheduled(&config, id, reason, signer));
        let mut out = std::io::stdout().lock();
        // As `history` does: a recorded error may quote a connection string.
        let redactor = config.redactor();
        if args.json {
            let mut json = serde_json::to_value(&story)?;
            if let (Some(object), Some(scheduled)) = (json.as_object_mut(), &scheduled) {
                object.insert("schedule".into(), serde_json::to_value(scheduled)?);
            }
            writeln!(out, "{}", redactor.scrub(&json.to_string()))?;
        } else {
            // The schedule's line right after who asked and why (a reason
            // that names a slot is always printed).
            for line in story.explain().lines() {
                writeln!(out, "{}", redactor.scrub(line))?;
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
/// configured plan: the reason is free text, and a slot's message id (a
/// UUIDv5 of the schedule's seed and the slot) may have been seen (on
/// `/api/status`, in the queue) and used by someone else; only the
/// schedule's requester's signature proves the schedule published it.
#[derive(Debug, serde::Serialize)]
struct Scheduled {
    name: String,
    slot: String,
    /// `Some(true)`: signed by the schedule's requester, and the message
    /// id is that slot's; `Some(false)`: not (`why` says which); `None`:
    /// not checked here (`why`).
    verified: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

impl Scheduled {
    fn describe(&self) -> String {
        let (name, slot) = (&self.name, &self.slot);
        match (self.verified, &self.why) {
            (Some(true), _) => format!(
                "scheduled by [[schedule]] {name}, slot {slot} (signed by its requester; its \
                 message id is that slot's)"
            ),
            (Some(false), why) => format!(
                "NOT a scheduled restart: the reason names [[schedule]] {name}, slot {slot}, \
                 but {}",
                why.as_deref().unwrap_or("it is not that slot's")
            ),
            (None, why) => format!(
                "scheduled by [[schedule]] {name}, slot {slot}, as its reason says (not checked: {})",
                why.as_deref().unwrap_or("unknown")
            ),
        }
    }
}

fn scheduled(
    config: &crate::config::Config,
    id: Uuid,
    reason: &str,
    signer: Option<&str>,
) -> Option<Scheduled> {
    let (name, at) = crate::schedule::Slot::named_in(reason)?;
    let (verified, why) = match config.schedules() {
        Err(error) => (
            None,
            Some(format!("the schedules cannot be read here: {error}")),
        ),
        Ok(schedules) => match schedules.iter().find(|s| s.plan.name == name) {
            Some(scheduled) => match proves_its_slot(scheduled.requester(), signer) {
                Err(why) => (Some(false), Some(why)),
                Ok(()) if !scheduled.plan.is_slot(at, id) => (
                    Some(false),
                    Some("the message id is not that slot's".to_owned()),
                ),
                Ok(()) => (Some(true), None),
            },
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

/// Whether a request signed by `signer` (`None`: unsigned) can be the
/// schedule's, which signs as `requester`: else why not. An unsigned
/// schedule's requests prove nothing (anyone who can publish could send
/// one under a slot's id).
fn proves_its_slot(requester: Option<&str>, signer: Option<&str>) -> Result<(), String> {
    match (requester, signer) {
        (Some(requester), Some(signer)) if requester == signer => Ok(()),
        (Some(requester), Some(signer)) => Err(format!(
            "it was signed by {signer}, not by the schedule's requester {requester}"
        )),
        (Some(requester), None) => Err(format!(
            "it was not signed (the schedule signs as {requester})"
        )),
        (None, _) => Err(
            "the schedule signs nothing, so nothing proves it sent this (anyone who can \
             publish could use a slot's id)"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::proves_its_slot;

    #[test]
    fn only_the_schedule_s_own_signature_proves_a_request_is_scheduled() {
        assert_eq!(proves_its_slot(Some("drip"), Some("drip")), Ok(()));
        let forged = proves_its_slot(Some("drip"), Some("mallory")).unwrap_err();
        assert!(forged.contains("signed by mallory"), "{forged}");
        let unsigned = proves_its_slot(Some("drip"), None).unwrap_err();
        assert!(unsigned.contains("not signed"), "{unsigned}");
        assert!(proves_its_slot(None, None).is_err());
        assert!(proves_its_slot(None, Some("drip")).is_err());
    }
}
