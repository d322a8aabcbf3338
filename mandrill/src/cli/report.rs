//! `mandrill report --since WHEN`: the game-day report (see
//! `crate::report`), from the store every instance shares.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};

use super::{ConfigArgs, command, missing_sqlite_file, string};
use crate::domain::Timestamp;
use crate::report::{CampaignReport, CampaignTargetReport, ObjectiveView, Report};
use crate::service;

/// `mandrill report`
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The start of the period: a duration back from now (`7d`, `24h`,
    /// `90m`) or an RFC 3339 time (`2026-11-20T09:00:00Z`).
    #[arg(long, value_name = "WHEN", value_parser = parse_since)]
    since: Since,
    /// `md` (tables), `html` (one self-contained page, charts as SVG) or
    /// `json`. Default: from the extension of --output, else md.
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Write the report to FILE rather than standard output.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// What the report is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Markdown tables.
    Md,
    /// One self-contained HTML page, no script.
    Html,
    /// One JSON object, its field names stable.
    Json,
}

/// The start of the period, as given.
#[derive(Debug, Clone, Copy)]
enum Since {
    /// This long before the report is made.
    Ago(Duration),
    /// This moment.
    At(Timestamp),
}

fn parse_since(raw: &str) -> Result<Since, String> {
    let raw = raw.trim();
    if let Ok(ago) = humantime::parse_duration(raw) {
        return Ok(Since::Ago(ago));
    }
    match jiff::Timestamp::from_str(raw) {
        Ok(at) => Ok(Since::At(Timestamp::from_millis(at.as_millisecond()))),
        Err(_) => Err(format!(
            "{raw:?} is neither a duration (7d, 24h) nor an RFC 3339 time (2026-11-20T09:00:00Z)"
        )),
    }
}

impl Format {
    /// The format `path`'s extension names, if it names one.
    fn of_path(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "html" | "htm" => Some(Self::Html),
            "json" => Some(Self::Json),
            "md" | "markdown" => Some(Self::Md),
            _ => None,
        }
    }
}

/// Writes the report.
pub(super) fn main(args: &ReportArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        let url = &config.store.url;
        if url == "memory" {
            bail!(super::BadInput(
                "store.url is memory: an in-memory store keeps nothing after its process".into()
            ));
        }
        if let Some(path) = missing_sqlite_file(url) {
            bail!(super::BadInput(format!(
                "no database at {path}: nothing has been recorded there (store.url {url:?})"
            )));
        }
        let until = Timestamp::now();
        let since = match args.since {
            Since::Ago(ago) => {
                let ago = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
                Timestamp::from_millis(until.as_millis().saturating_sub(ago))
            }
            Since::At(at) => at,
        };
        let store = service::open_store(&config.store).await?;
        let read = async {
            let data = store.report(since).await.context("cannot read the store")?;
            let mut campaigns = Vec::with_capacity(data.campaigns.len());
            for campaign in &data.campaigns {
                let (targets, verdict) = crate::campaign::judge(&*store, campaign).await?;
                campaigns.push(CampaignReport {
                    id: campaign.id,
                    group: campaign.group.clone(),
                    started_at: campaign.created_at,
                    requester: campaign.requester.clone(),
                    verdict,
                    targets: targets
                        .into_iter()
                        .map(|(target, standing)| CampaignTargetReport {
                            host: target.instance_name,
                            standing,
                        })
                        .collect(),
                });
            }
            anyhow::Ok((data, campaigns))
        }
        .await;
        store.close().await;
        let (data, campaigns) = read?;
        // Judged over the period's verified restarts (the running service
        // judges each over its last `over_last`).
        let objectives: Vec<ObjectiveView> = config
            .recovery_objective
            .iter()
            .map(|objective| ObjectiveView {
                group: objective.group.clone(),
                percentile: f64::from(objective.percentile),
                max: objective.max,
            })
            .collect();
        // A request never claimed has no recorded group: the operator's
        // inventory or `safety.groups` place it, as read now.
        let policy = match super::inventory::policy_with_inventory(&config).await {
            Ok(policy) => policy,
            Err(error) => {
                eprintln!(
                    "mandrill: warning: {error:#}; requests never claimed are placed by \
                     safety.groups only"
                );
                (*config.worker_config().policy.current()).clone()
            }
        };
        let place = |instance: &str| policy.operators_group(instance);
        let mut report = Report::build(&data, since, until, &objectives, &place);
        report.campaigns = campaigns;
        let format = args
            .format
            .or_else(|| args.output.as_deref().and_then(Format::of_path))
            .unwrap_or(Format::Md);
        let text = match format {
            Format::Md => crate::report::markdown(&report),
            Format::Html => crate::report::html(&report),
            Format::Json => serde_json::to_string_pretty(&report)? + "\n",
        };
        // A recorded error may quote a connection string.
        let text = config.redactor().scrub(&text).into_owned();
        match &args.output {
            Some(path) => std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?,
            None => {
                use std::io::Write as _;
                std::io::stdout().lock().write_all(text.as_bytes())?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_duration_back_or_an_rfc3339_time() {
        assert!(
            matches!(parse_since("7d"), Ok(Since::Ago(d)) if d == Duration::from_secs(7 * 86_400))
        );
        assert!(
            matches!(parse_since(" 24h "), Ok(Since::Ago(d)) if d == Duration::from_secs(86_400))
        );
        let Ok(Since::At(at)) = parse_since("2026-11-20T09:00:00+01:00") else {
            panic!("not a time")
        };
        assert_eq!(at.to_string(), "2026-11-20T08:00:00.000Z");
        let error = parse_since("last tuesday").unwrap_err();
        assert!(error.contains("RFC 3339"), "{error}");
    }

    #[test]
    fn the_output_file_s_extension_picks_the_format() {
        assert_eq!(Format::of_path(Path::new("r.html")), Some(Format::Html));
        assert_eq!(Format::of_path(Path::new("r.json")), Some(Format::Json));
        assert_eq!(Format::of_path(Path::new("r.txt")), None);
    }
}
