//! `mandrill campaign start`, `status` and `stop`: restarts over a share of
//! an inventory group, resolved when the campaign starts, recorded in the
//! store, and published as one signed request per target through the
//! configured broker, where every guard decides them like any other
//! request (docs/campaigns.md); stopped by recording its unissued targets
//! `cancelled` in the store.
//!
//! One command's three verbs, so one file past 400 lines.

use std::collections::HashSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, Subcommand};
use uuid::Uuid;

use super::{BadInput, ConfigArgs, command, string};
use crate::broker::BrokerUrl;
use crate::campaign::{self, Size};
use crate::config::Config;
use crate::domain::Timestamp;
use crate::domain::printable;
use crate::domain::{Hostname, InstanceName, RestartRequest, SigningKey};
use crate::safety::Policy;
use crate::service;
use crate::store::{Campaign, CampaignTarget, Store};

/// `mandrill campaign`
#[derive(Debug, Args)]
pub(crate) struct CampaignArgs {
    #[command(subcommand)]
    command: CampaignCommand,
}

#[derive(Debug, Subcommand)]
enum CampaignCommand {
    /// Restart a share of a group: targets drawn at random among its eligible hosts, printed, recorded and published (the campaign id on the last line).
    Start(StartArgs),
    /// Where each target of a campaign stands, and why; and the campaign's verdict.
    Status(StatusArgs),
    /// Stop a campaign: its targets not yet issued are recorded cancelled (on every instance, however late their messages come); restarts in flight finish.
    Stop(StopArgs),
}

#[derive(Debug, Args)]
struct StopArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Why, for the record (`campaign status`, `wait`, `explain`).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Who, for the record (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
    /// The campaign's id.
    #[arg(value_name = "ID")]
    id: String,
}

#[derive(Debug, Args)]
struct StartArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The queue the requests are published into [setting: broker.url].
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// The shared store the campaign is recorded in [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The inventory group the targets are drawn from.
    #[arg(long, value_name = "G")]
    group: String,
    /// How many hosts of the group.
    #[arg(
        long,
        value_name = "N",
        required_unless_present = "percent",
        conflicts_with = "percent"
    )]
    count: Option<usize>,
    /// What percentage of the group's hosts in the inventory (rounded down, at least one).
    #[arg(long, value_name = "P")]
    percent: Option<u32>,
    /// Spread the targets over this long: target i is due at start + i·D/N (its signed request's `not_before`).
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    spread: Option<Duration>,
    /// Print the targets and stop: nothing recorded, nothing published.
    #[arg(long)]
    preview: bool,
    /// Allow more than half of the group.
    #[arg(long)]
    allow_majority: bool,
    /// Sign each request as this requester (`[[requesters]]`), with --key-file.
    #[arg(
        long = "as",
        value_name = "NAME",
        required_unless_present = "preview",
        requires = "key_file"
    )]
    as_requester: Option<String>,
    /// The requester's private key, PKCS#8 PEM, for --as.
    #[arg(long, value_name = "FILE", requires = "as_requester")]
    key_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The campaign's id.
    #[arg(value_name = "ID")]
    id: String,
}

/// How many of the newest requests are read to find hosts being restarted
/// now (passed over; the guards would defer them anyway).
const RECENT_REQUESTS: usize = 500;

/// Runs `mandrill campaign …`.
pub(super) fn main(args: &CampaignArgs) -> ExitCode {
    match &args.command {
        CampaignCommand::Start(args) => {
            let sources = args.config.sources(vec![
                ("broker.url", string(&args.broker)),
                ("store.url", string(&args.db)),
            ]);
            command(sources, |config| start(config, args))
        }
        CampaignCommand::Status(args) => {
            let sources = args.config.sources(vec![("store.url", string(&args.db))]);
            command(sources, |config| status(config, args))
        }
        CampaignCommand::Stop(args) => {
            let sources = args.config.sources(vec![("store.url", string(&args.db))]);
            command(sources, |config| stop(config, args))
        }
    }
}

/// `campaign start`.
async fn start(config: Config, args: &StartArgs) -> anyhow::Result<()> {
    let size = match (args.count, args.percent) {
        (Some(0), _) => bail!(BadInput("--count must be at least 1".into())),
        (Some(count), _) => Size::Count(count),
        (None, Some(percent)) if (1..=100).contains(&percent) => Size::Percent(percent),
        (None, Some(percent)) => bail!(BadInput(format!("--percent {percent} must be 1 to 100"))),
        // clap requires one of them.
        (None, None) => bail!(BadInput("give --count N or --percent P".into())),
    };
    let policy = super::inventory::policy_with_inventory(&config).await?;
    let spread = args.spread.unwrap_or_default();
    let longest = policy
        .guards
        .max_defer
        .min(crate::domain::signed::MAX_LIFETIME);
    if spread > longest {
        bail!(BadInput(format!(
            "--spread {} is longer than a request may wait: safety.max_defer ({}) and a signed \
             request's lifetime (24h) bound it",
            humantime::format_duration(spread),
            humantime::format_duration(policy.guards.max_defer),
        )));
    }
    let signing = super::publish::signing_key(&config, &args.as_requester, &args.key_file)?;
    let requester = signing.as_ref().map(|(name, _)| name.as_str());
    let (group_size, mut eligible) = eligible(&policy, &config, &args.group, requester)?;
    let count = size.of(group_size);
    if campaign::is_majority(count, group_size) && !args.allow_majority {
        bail!(BadInput(format!(
            "{count} of group {}'s {} is a majority (more than half); pass --allow-majority \
             if that is meant",
            args.group,
            crate::settings::duration::count(group_size as u64, "host"),
        )));
    }
    let enough = |eligible: &[String], restarting: &str| {
        if count > eligible.len() {
            bail!(BadInput(format!(
                "{count} targets asked, but only {} of group {}'s {group_size} hosts are \
                 eligible now (in the inventory, allowed by safety.allow/deny and the \
                 requester{restarting})",
                eligible.len(),
                args.group,
            )));
        }
        Ok(())
    };
    enough(&eligible, "")?;
    // The store is opened (hosts restarting now are read) only for real,
    // once the request is known to be sound: a preview or a refusal opens
    // nothing, so it cannot create or migrate a database.
    let (store, url) = if args.preview {
        (None, None)
    } else {
        if config.store.url == "memory" {
            bail!(BadInput(
                "store.url is memory: a campaign is recorded in a shared store (sqlite:PATH or \
                 postgres://…), where `campaign status` and `wait` read it"
                    .into()
            ));
        }
        let url = super::queue_url(&config)?;
        let store = super::switch::open(&config).await?;
        let busy = busy_hosts(&*store).await;
        let busy = match busy {
            Ok(busy) => busy,
            Err(error) => {
                store.close().await;
                return Err(error);
            }
        };
        eligible.retain(|name| !busy.contains(name));
        if let Err(error) = enough(&eligible, ", not restarting already") {
            store.close().await;
            return Err(error);
        }
        (Some(store), Some(url))
    };
    let targets = campaign::choose(&eligible, count, &mut rand::rng());
    let now = SystemTime::now();
    let id = crate::domain::new_message_id(now, &mut rand::rng());
    let start = jiff::Timestamp::try_from(now).context("the system clock is out of range")?;
    let due = campaign::due_times(start, spread, targets.len());
    let record = Campaign {
        id,
        group: args.group.clone(),
        created_at: Timestamp::from_millis(start.as_millisecond()),
        requester: requester.map(str::to_owned),
        targets: targets
            .iter()
            .zip(&due)
            .map(|(name, due)| CampaignTarget {
                instance_name: name.clone(),
                message_id: campaign::message_id(id, name),
                due_at: Timestamp::from_millis(due.as_millisecond()),
            })
            .collect(),
        stopped: None,
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "campaign over group {}: {count} of {group_size} hosts ({} eligible{})",
        args.group,
        eligible.len(),
        if args.preview {
            "; hosts restarting now are passed over when it starts"
        } else {
            ""
        }
    )?;
    // What the guards say about each target now: from the store this
    // campaign is recorded in (a preview reads it only if it exists).
    let reading = match &store {
        Some(store) => Some(store.clone()),
        None if config.store.url != "memory"
            && super::missing_sqlite_file(&config.store.url).is_none() =>
        {
            super::switch::open(&config).await.ok()
        }
        None => None,
    };
    let forecasts = forecasts(
        &policy,
        &config,
        &record,
        requester,
        reading.as_deref(),
        start,
    )
    .await;
    // The leash every instance obeys: the operator's record in the store,
    // else each one's own (this configuration's).
    let leash_record = match &reading {
        Some(reading) => reading.switch().await.ok().and_then(|switch| switch.leash),
        None => None,
    };
    if let (Some(reading), None) = (&reading, &store) {
        reading.close().await;
    }
    let local = |at: jiff::Timestamp| match &policy.guards.calendar {
        Some(calendar) => calendar.local(at),
        None => at.to_string(),
    };
    for (target, forecast) in record.targets.iter().zip(&forecasts) {
        writeln!(
            out,
            "  {}  due {}  {}  {}",
            target.instance_name,
            target.due_at,
            target.message_id,
            forecast.said(start, local)
        )?;
    }
    for (target, forecast) in record.targets.iter().zip(&forecasts) {
        if let Some(too_late) = &forecast.too_late {
            eprintln!(
                "mandrill: warning: {} would wait past its horizon: {too_late}",
                target.instance_name
            );
        }
    }
    if reading.is_none() {
        eprintln!(
            "mandrill: note: the store was not read (none yet): the counting guards and \
             pauses are not in these verdicts"
        );
    }
    match &leash_record {
        Some(record) if record.leashed => eprintln!(
            "mandrill: note: the service is leashed (by {}: {}): each target is recorded as a \
             dry run and nothing is restarted until `mandrill unleash`",
            record.by, record.reason
        ),
        None if policy.dry_run => eprintln!(
            "mandrill: note: safety.dry_run is on in this configuration and no operator has \
             unleashed the service in the store: each target is recorded as a dry run and \
             nothing is restarted until `mandrill unleash --reason …`"
        ),
        _ => {}
    }
    if args.preview {
        writeln!(out, "preview: nothing recorded, nothing published")?;
        return Ok(());
    }
    let (Some(store), Some(url), Some((name, key))) = (store, url, &signing) else {
        // Not a preview: both opened above, and clap requires --as.
        bail!(BadInput("--as NAME --key-file FILE are required".into()));
    };
    let rules = config.parse_rules();
    let payloads = record
        .targets
        .iter()
        .enumerate()
        .map(|(index, target)| {
            let instance = InstanceName::parse(&target.instance_name)
                .map_err(|why| anyhow::anyhow!("{}: {why}", target.instance_name))?;
            let request = RestartRequest {
                message_id: target.message_id,
                hostname: Hostname::new(&instance, &rules.domain),
                instance_name: instance,
                requested_by: None,
                // What a stop records for a target no instance received.
                reason: Some(record.target_reason(index)),
                published_at: Some(now),
                group: None,
                requested_group: None,
                zone: None,
                requester: None,
                signature: None,
                reach: None,
                machine: None,
                // The first is due at once; only later ones carry a time.
                not_before: (index > 0 && !spread.is_zero()).then(|| SystemTime::from(due[index])),
                reply_to: None,
            };
            Ok(sign(key, name, &request, now))
        })
        .collect::<anyhow::Result<Vec<Bytes>>>()?;
    // The broker first: a campaign recorded with nowhere to publish would
    // read in progress for good, each target "published".
    let broker = match service::open_publisher(&config).await {
        Ok(broker) => broker,
        Err(error) => {
            store.close().await;
            return Err(error.context("nothing was recorded or published"));
        }
    };
    let recorded = store.record_campaign(&record).await;
    store.close().await;
    if let Err(error) = recorded {
        broker.close().await;
        return Err(error)
            .context("cannot record the campaign in the store; nothing was published");
    }
    let payloads = payloads.into_iter();
    let published = if let BrokerUrl::Sqlite { .. } = url {
        super::publish::publish_in_batches(&*broker, payloads).await
    } else {
        super::publish::publish_each(&*broker, payloads, None).await
    };
    broker.close().await;
    published.with_context(|| {
        format!("campaign {id} is recorded, but its requests could not all be published")
    })?;
    writeln!(
        out,
        "published {}",
        super::publish::requests(record.targets.len())
    )?;
    writeln!(out, "{id}")?;
    Ok(())
}

/// Each target's forecast ([`campaign::forecast`]), in order: the
/// calendar and the target's due time; with `store`, the kill switch and
/// the group's pause, and the counting guards on what they read now, each
/// target counted as restarted for those after it once it would run.
async fn forecasts(
    policy: &Policy,
    config: &Config,
    record: &Campaign,
    requester: Option<&str>,
    store: Option<&dyn Store>,
    now: jiff::Timestamp,
) -> Vec<campaign::Forecast> {
    let paused = match store {
        None => None,
        Some(store) => {
            let switch = store.switch().await.ok().filter(|switch| switch.paused);
            let group = store
                .group_pauses()
                .await
                .ok()
                .and_then(|pauses| pauses.into_iter().find(|p| p.group == record.group));
            switch
                .map(|switch| {
                    format!(
                        "deferred by kill switch: restarts {}",
                        switch.paused_reason()
                    )
                })
                .or_else(|| {
                    group.map(|g| format!("deferred by group pause: {}", g.deferred_reason()))
                })
        }
    };
    let token_ends = now
        .saturating_add(
            jiff::SignedDuration::try_from(crate::domain::signed::MAX_LIFETIME)
                .unwrap_or(jiff::SignedDuration::MAX),
        )
        .unwrap_or(now);
    let rules = config.parse_rules();
    // The targets before it that would run: when, and in which zone.
    let mut ahead: Vec<(i64, Option<String>)> = Vec::new();
    let mut forecasts = Vec::with_capacity(record.targets.len());
    for target in &record.targets {
        let due = jiff::Timestamp::from_millisecond(target.due_at.as_millis()).unwrap_or(now);
        // Parsed when it was found eligible.
        let Ok(instance) = InstanceName::parse(&target.instance_name) else {
            forecasts.push(campaign::Forecast {
                held_by: vec!["not a valid instance name".into()],
                runs_at: None,
                too_late: None,
            });
            continue;
        };
        let mut request = super::inventory::request_for(&instance, &rules);
        request.requester = requester.map(str::to_owned);
        // Placed as the worker places it: its group and zone.
        let _ = policy.place(&mut request);
        let limits = policy.limits(request.group()).ok().map(|mut limits| {
            policy.requesters.limit(&request, &mut limits);
            limits
        });
        let usage = match (store, &limits) {
            (Some(store), Some(limits)) if limits.is_active() => {
                store.usage(&request, limits).await.ok()
            }
            // No store yet: nothing recorded, so only the campaign's own
            // targets count against the limits.
            (None, Some(limits)) if limits.is_active() => {
                Some(crate::safety::limits::Usage::default())
            }
            _ => None,
        };
        let counted = match (&limits, usage) {
            (Some(limits), Some(mut usage)) => {
                // The targets before it that would run, counted as restarts.
                let earlier = u32::try_from(ahead.len()).unwrap_or(u32::MAX);
                let first = ahead.iter().map(|(at, _)| *at).min();
                // Those still disrupting its host's group when it is due: run
                // less than the settle (a second at least) before.
                let due_at = due.max(now).as_millisecond();
                let settle = i64::try_from(limits.settle.max(Duration::from_secs(1)).as_millis())
                    .unwrap_or(i64::MAX);
                let overlapping: Vec<_> = ahead
                    .iter()
                    .filter(|(at, _)| at.saturating_add(settle) > due_at)
                    .collect();
                let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                usage.disrupted = usage.disrupted.saturating_add(count(overlapping.len()));
                let same_zone = overlapping
                    .iter()
                    .filter(|(_, zone)| zone.is_some() && *zone == request.zone)
                    .count();
                usage.zone_disrupted = usage.zone_disrupted.saturating_add(count(same_zone));
                usage.group_claims = usage.group_claims.saturating_add(earlier);
                usage.global_claims = usage.global_claims.saturating_add(earlier);
                usage.requester_claims = usage.requester_claims.saturating_add(earlier);
                let oldest = |old: Option<i64>| match (old, first) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                usage.group_oldest = oldest(usage.group_oldest);
                usage.global_oldest = oldest(usage.global_oldest);
                usage.requester_oldest = oldest(usage.requester_oldest);
                Some(campaign::Counted {
                    limits,
                    subject: crate::safety::limits::Subject::of(&request),
                    usage,
                })
            }
            _ => None,
        };
        let forecast = campaign::forecast(
            &policy.guards,
            counted.as_ref(),
            paused.clone(),
            due,
            now,
            token_ends,
        );
        if let (Some(at), None) = (forecast.runs_at, &forecast.too_late) {
            ahead.push((at.as_millisecond(), request.zone.clone()));
        }
        forecasts.push(forecast);
    }
    forecasts
}

/// `request` signed as `name`, valid for the longest lifetime: a target due
/// late in its spread must still verify then.
fn sign(key: &SigningKey, name: &str, request: &RestartRequest, now: SystemTime) -> Bytes {
    let mut wire = request.to_wire_request();
    // The verified requester replaces it anyway.
    wire.requested_by = None;
    let token = key
        .sign(&wire, name, now, crate::domain::signed::MAX_LIFETIME)
        // The key signed a probe when it was read; the claims are plain data.
        .expect("a key that signed its probe signs a request");
    Bytes::from(token)
}

/// The group's size in the inventory, and its hosts a campaign may target
/// now: placed by the inventory, allowed by `safety.allow`/`deny` and the
/// requester's `allow`. Sorted, so that only the draw is random.
fn eligible(
    policy: &Policy,
    config: &Config,
    group: &str,
    requester: Option<&str>,
) -> anyhow::Result<(usize, Vec<String>)> {
    let Some(inventory) = policy.inventory.as_ref() else {
        bail!(BadInput(
            "no [inventory]: a campaign draws its targets from the inventory's groups".into()
        ));
    };
    let snapshot = inventory
        .fresh()
        .map_err(|lookup| anyhow::anyhow!("inventory: {}", lookup.reason))?;
    let mut hosts: Vec<&str> = snapshot
        .inventory
        .hosts()
        .into_iter()
        .filter(|host| host.group.as_deref() == Some(group))
        // One entry per machine (its first name): aliases never pad the
        // group's size, nor make one machine two targets.
        .filter(|host| {
            snapshot
                .inventory
                .machine(&host.name)
                .is_none_or(|first| first == host.name)
        })
        .map(|host| host.name.as_str())
        .collect();
    if hosts.is_empty() {
        bail!(BadInput(format!(
            "group {group} has no host in the inventory ({})",
            snapshot.source
        )));
    }
    hosts.sort_unstable();
    let rules = config.parse_rules();
    let eligible = hosts
        .iter()
        .filter(|name| {
            let Ok(instance) = InstanceName::parse(name) else {
                return false;
            };
            let mut request = super::inventory::request_for(&instance, &rules);
            request.requester = requester.map(str::to_owned);
            policy.place(&mut request).is_ok()
                && policy.eligibility.check(name).is_ok()
                && policy.check_other_names(&request).is_ok()
                && policy
                    .requesters
                    .check(&request, group, std::time::SystemTime::now())
                    .is_ok()
        })
        .map(|name| (*name).to_owned())
        .collect();
    Ok((hosts.len(), eligible))
}

/// Hosts with a request still open in the store's recent history.
async fn busy_hosts(store: &dyn Store) -> anyhow::Result<HashSet<String>> {
    let entries = store
        .history(RECENT_REQUESTS)
        .await
        .context("cannot read the store's recent history")?;
    Ok(entries
        .into_iter()
        .filter(|entry| !entry.status.is_final())
        .filter_map(|entry| entry.instance_name)
        .collect())
}

/// A campaign id from the command line.
pub(super) fn parse_id(raw: &str) -> anyhow::Result<Uuid> {
    Uuid::parse_str(raw.trim())
        .map_err(|_| BadInput(format!("{raw:?} is not an id (a uuid)")).into())
}

/// `campaign status`.
async fn status(config: Config, args: &StatusArgs) -> anyhow::Result<()> {
    let id = parse_id(&args.id)?;
    let store = super::switch::open(&config).await?;
    let found = store.campaign(id).await;
    let judged = match found {
        Ok(Some(campaign)) => campaign::judge(&*store, &campaign)
            .await
            .map(|judged| Some((campaign, judged))),
        Ok(None) => Ok(None),
        Err(error) => Err(error.into()),
    };
    store.close().await;
    let Some((campaign, (targets, verdict))) = judged.context("cannot read the store")? else {
        bail!(BadInput(format!("no campaign {id} is recorded")));
    };
    let mut out = std::io::stdout().lock();
    // A record's error may quote a secret, as `history` masks.
    let redactor = config.redactor();
    if args.json {
        let json = campaign::status_json(&campaign, &targets, verdict).to_string();
        writeln!(out, "{}", redactor.scrub(&json))?;
        return Ok(());
    }
    writeln!(
        out,
        "campaign {} over group {}, started {} by {}: {} target(s)",
        campaign.id,
        campaign.group,
        campaign.created_at,
        campaign.requester.as_deref().unwrap_or("-"),
        targets.len()
    )?;
    if let Some(stop) = &campaign.stopped {
        writeln!(
            out,
            "stopped by {} at {}: {}",
            stop.by, stop.at, stop.reason
        )?;
    }
    for (target, standing) in &targets {
        writeln!(
            out,
            "  {}  {}  due {}  {}: {}",
            target.instance_name,
            target.message_id,
            target.due_at,
            standing.state,
            printable(&redactor.scrub(&standing.detail))
        )?;
    }
    writeln!(out, "verdict: {}", verdict.as_str())?;
    Ok(())
}

/// `campaign stop`: the targets not yet issued are recorded `cancelled`
/// (in the store, where every instance's claim finds them final); a
/// restart in flight finishes.
async fn stop(config: Config, args: &StopArgs) -> anyhow::Result<()> {
    let id = parse_id(&args.id)?;
    let by = args
        .by
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "an operator".into());
    let reason = args
        .reason
        .clone()
        .unwrap_or_else(|| "no reason given".into());
    if by.chars().chain(reason.chars()).any(char::is_control) || reason.chars().count() > 1024 {
        bail!(BadInput(
            "--by and --reason must be one line, the reason at most 1024 characters".into()
        ));
    }
    let store = super::switch::open(&config).await?;
    let stopped = store.stop_campaign(id, &by, &reason).await;
    let judged = match &stopped {
        Ok(Some((campaign, _))) => Some(campaign::judge(&*store, campaign).await),
        _ => None,
    };
    store.close().await;
    let (campaign, cancelled) = match stopped {
        Ok(Some(stopped)) => stopped,
        Ok(None) => bail!(BadInput(format!("no campaign {id} is recorded"))),
        Err(error) if error.outcome_unknown() => {
            return Err(super::OutcomeUnknown(format!(
                "campaign stop: outcome unknown, campaign {id} may or may not be stopped ({}); \
                 check with `mandrill campaign status {id}`",
                error.with_causes()
            ))
            .into());
        }
        Err(error) => return Err(error).context(format!("cannot stop campaign {id}")),
    };
    let mut out = std::io::stdout().lock();
    // A record's error may quote a secret, as `history` masks.
    let redactor = config.redactor();
    // The stop is recorded: `campaign.stopped` is the first one, kept.
    if let Some(stop) = &campaign.stopped {
        writeln!(
            out,
            "campaign {id} stopped by {} at {} ({}): {} target(s) cancelled now",
            stop.by,
            stop.at,
            stop.reason,
            cancelled.len()
        )?;
    }
    match judged {
        Some(Ok((targets, verdict))) => {
            for (target, standing) in &targets {
                writeln!(
                    out,
                    "  {}  {}  {}: {}",
                    target.instance_name,
                    target.message_id,
                    standing.state,
                    printable(&redactor.scrub(&standing.detail))
                )?;
            }
            writeln!(out, "verdict: {}", verdict.as_str())?;
        }
        Some(Err(error)) => {
            eprintln!("mandrill: stopped, but the targets could not be read back: {error:#}")
        }
        None => {}
    }
    Ok(())
}
