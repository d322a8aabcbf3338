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
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&story)?)?;
        } else {
            out.write_all(story.explain().as_bytes())?;
        }
        Ok(())
    })
}
