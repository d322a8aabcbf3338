//! `mandrill pause`, `resume` and `status`: the kill switch, kept in the
//! shared store so that every instance using it obeys at once.
//!
//! The switch's three commands and their group forms share one reading of
//! the store and the instances, so one file past 400 lines.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;

use super::{BadInput, ConfigArgs, OutcomeUnknown, command, string};
use crate::admin::{RunningModes, leashed_name};
use crate::config::Config;
use crate::service;

/// `mandrill pause` and `mandrill resume`
#[derive(Debug, Args)]
pub(crate) struct SwitchArgs {
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
    /// Only this group's restarts (the inventory's or `safety.groups`'),
    /// not the kill switch; an ansible parent group turns every group
    /// beneath it, and a group no request is counted in is refused;
    /// `resume --group` also lifts a pause a breached recovery objective
    /// made.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
}

/// `mandrill status`
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The shared store: `sqlite:PATH` or `postgres://…` [setting: store.url].
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Turns the kill switch on (`paused`) or off.
pub(super) fn switch(args: &SwitchArgs, paused: bool) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        let (by, reason) = who_and_why(&args.by, &args.reason)?;
        let store = open(&config).await?;
        if let Some(group) = &args.group {
            return pause_group(&config, &*store, group, paused, &by, &reason).await;
        }
        if !paused {
            // Nothing to resume is said as such, and nothing is written (a
            // turn recorded would tell `resumed` to every notifier). A
            // pause made after this read is someone else's: left on.
            let switch = store.switch().await.context("cannot read the kill switch");
            if matches!(switch, Ok(ref switch) if !switch.paused) {
                store.close().await;
                println!(
                    "nothing was paused: restarts were not paused, and no resume was recorded"
                );
                return Ok(());
            }
        }
        let result = store.set_switch(paused, &by, &reason).await;
        store.close().await;
        match result {
            Ok(()) => {}
            // Sent, but unanswered: saying "failed" could leave an operator
            // believing restarts run when they are paused, or the reverse.
            Err(error) if error.outcome_unknown() => {
                let what = if paused { "pause" } else { "resume" };
                return Err(OutcomeUnknown(format!(
                    "{what}: outcome unknown, the kill switch may or may not have turned \
                     ({}); check with `mandrill status`",
                    error.with_causes()
                ))
                .into());
            }
            Err(error) => return Err(error).context("cannot turn the kill switch"),
        }
        if paused {
            println!(
                "paused by {by} ({reason}): no instance using this store claims another restart"
            );
        } else {
            println!("resumed by {by} ({reason}): restarts may be claimed again");
        }
        Ok(())
    })
}

/// Who and why, from `--by` (else `$USER`) and `--reason`: each one line,
/// the reason at most 1024 characters.
pub(super) fn who_and_why(
    by: &Option<String>,
    reason: &Option<String>,
) -> anyhow::Result<(String, String)> {
    let by = by
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "an operator".into());
    let reason = reason.clone().unwrap_or_else(|| "no reason given".into());
    if by.chars().chain(reason.chars()).any(char::is_control) || reason.chars().count() > 1024 {
        bail!("--by and --reason must be one line, the reason at most 1024 characters");
    }
    Ok((by, reason))
}

/// Pauses (`paused`) or resumes one group's restarts, or every group
/// beneath an ansible parent group; closes `store`.
async fn pause_group(
    config: &Config,
    store: &dyn crate::store::Store,
    group: &str,
    paused: bool,
    by: &str,
    reason: &str,
) -> anyhow::Result<()> {
    if group.is_empty() || group.chars().any(char::is_control) || group.chars().count() > 256 {
        store.close().await;
        bail!("--group must name a group on one line");
    }
    let groups = match groups_to_turn(config, store, group, paused).await {
        Ok(groups) => groups,
        Err(error) => {
            store.close().await;
            return Err(error);
        }
    };
    if groups.parent {
        println!(
            "{group} is an ansible parent group: its hosts are counted in the groups beneath \
             it, so each of {} is {}",
            groups.groups.join(", "),
            if paused { "paused" } else { "resumed" }
        );
    }
    for group in &groups.groups {
        let result = store
            .set_group_pause(group, paused.then_some((by, reason)))
            .await;
        let changed = match result {
            Ok(changed) => changed,
            Err(error) => {
                store.close().await;
                if error.outcome_unknown() {
                    let what = if paused { "pause" } else { "resume" };
                    return Err(OutcomeUnknown(format!(
                        "{what} --group {group}: outcome unknown, the group's pause may or may \
                         not have turned ({}); check with `mandrill status`",
                        error.with_causes()
                    ))
                    .into());
                }
                return Err(error).context(format!("cannot turn the pause of group {group}"));
            }
        };
        match (paused, changed) {
            (true, true) => println!(
                "group {group} paused by {by} ({reason}): no instance using this store claims \
                 another restart of its hosts"
            ),
            (true, false) => println!("group {group} was paused already (its first cause stays)"),
            (false, true) => {
                println!("group {group} resumed by {by}: its restarts may be claimed again")
            }
            (false, false) => println!("group {group} was not paused"),
        }
    }
    store.close().await;
    Ok(())
}

/// The groups `--group group` turns ([`crate::safety::Policy::group_pause`]),
/// with the inventory read now. A resume also takes a group paused under
/// exactly that name (the inventory may have dropped it since). An
/// inventory that cannot be read refuses nothing: the group is turned as
/// named, and stderr says so.
async fn groups_to_turn(
    config: &Config,
    store: &dyn crate::store::Store,
    group: &str,
    paused: bool,
) -> anyhow::Result<crate::safety::GroupPause> {
    let as_named = crate::safety::GroupPause {
        groups: vec![group.to_owned()],
        parent: false,
    };
    let mut policy = (*config.worker_config().policy.current()).clone();
    match super::inventory::load(config).await {
        Ok(inventory) => policy.inventory = inventory.map(|(_, handle)| handle),
        Err(error) => {
            eprintln!(
                "mandrill: cannot read the inventory to check group {group} ({error:#}); \
                 turning it as named"
            );
            return Ok(as_named);
        }
    }
    match policy.group_pause(group) {
        Ok(groups) => Ok(groups),
        Err(why) if !paused => {
            let pauses = store
                .group_pauses()
                .await
                .context("cannot read the group pauses")?;
            if pauses.iter().any(|pause| pause.group == group) {
                Ok(as_named)
            } else {
                bail!(BadInput(why))
            }
        }
        Err(why) => bail!(BadInput(why)),
    }
}

/// Prints the mode, the kill switch and the eligibility rules.
pub(super) fn status(args: &StatusArgs) -> ExitCode {
    let sources = args.config.sources(vec![("store.url", string(&args.db))]);
    command(sources, |config| async move {
        let store = open(&config).await?;
        let switch = store.switch().await.context("cannot read the kill switch");
        let group_pauses = store
            .group_pauses()
            .await
            .context("cannot read the group pauses");
        let objectives = service::objectives::judge_all(&*store, &config.recovery_objective)
            .await
            .context("cannot read the recovery times");
        let mut policy = (*config.worker_config().policy.current()).clone();
        let starts = (policy.guards.counting).usage_starts(crate::domain::Timestamp::now());
        let usage = store
            .group_usage(starts)
            .await
            .context("cannot read the restart journal");
        store.close().await;
        let (switch, usage, group_pauses, objectives) =
            (switch?, usage?, group_pauses?, objectives?);
        // Each instance's admin port depends on who started first (a
        // range): the instances say which they took.
        let instances_dir = config.admin_instances_dir();
        // What each instance does, from itself: the file read here may
        // not be what runs (`--unleash`, a reload since).
        let instances = match &instances_dir {
            Some(dir) => crate::admin::instance_modes(dir).await,
            None => Vec::new(),
        };
        // The inventory read once, as `mandrill inventory` does: this
        // process cannot see a running service's copy (its
        // mandrill_inventory_* metrics do), but it can say whether the
        // source answers now and what it lists.
        let inventory = match super::inventory::load(&config).await {
            Ok(Some((source, handle))) => {
                let hosts = handle.current().map_or(0, |s| s.inventory.len());
                let groups = handle.current().map_or(0, |s| s.inventory.groups().len());
                policy.inventory = Some(handle);
                Some(serde_json::json!({
                    "source": source.to_string(),
                    "hosts": hosts,
                    "groups": groups,
                    "error": null,
                }))
            }
            Ok(None) => None,
            Err(error) => Some(serde_json::json!({
                "source": crate::inventory::Source::of(&config.inventory).map(|s| s.to_string()),
                "error": format!("{error:#}"),
            })),
        };
        let counting = &policy.guards.counting;
        let limits = counting.describe();
        let calendar = policy.guards.calendar.as_ref().map(|calendar| {
            (
                calendar.describe(),
                calendar.now_in_words(jiff::Timestamp::now()),
            )
        });
        let budget = |group: &str| policy.limits(group).ok().and_then(|limits| limits.budget);
        // What every instance should run: the leash an operator turned in
        // the store, else each one's own (the configuration read here).
        let (configured, said_by) = match &switch.leash {
            Some(record) => (
                leashed_name(record.leashed),
                "the leash recorded in the store",
            ),
            None => (leashed_name(config.dry_run()), "the configuration"),
        };
        let what_runs = RunningModes::of(instances.iter().map(|(_, mode)| mode));
        // Who may ask: each requester with its reach and quota.
        let requesters: Vec<String> = config
            .requesters
            .iter()
            .map(|r| {
                let groups = if r.groups.is_empty() {
                    String::new()
                } else {
                    format!(", groups {:?}", r.groups)
                };
                let quota = r.quota.as_ref().map_or_else(String::new, |q| {
                    format!(
                        ", {} per {}",
                        q.max,
                        crate::settings::duration::per(q.window)
                    )
                });
                format!("{} (allow {:?}{groups}{quota})", r.name, r.allow)
            })
            .collect();
        let signed = if config.require_signed() {
            "required"
        } else {
            "not required (unsigned requests accepted)"
        };
        let schedules = next_planned(&config, &policy);
        let mut out = std::io::stdout().lock();
        if args.json {
            let status = serde_json::json!({
                "schedules": schedules,
                "mode": what_runs.mode(),
                "configured_mode": configured,
                "disagreement": what_runs.disagreement(configured, said_by),
                "leash": switch.leash,
                "restarter": config.restarter.kind,
                "paused": switch.paused,
                "switch": switch,
                "group_pauses": group_pauses,
                "recovery_objectives": objectives,
                "instances": instances
                    .iter()
                    .map(|(instance, mode)| {
                        let mut value = serde_json::json!(instance);
                        match mode {
                            Ok(mode) => {
                                value["mode"] = serde_json::json!(leashed_name(mode.leashed));
                                value["leash"] = serde_json::json!(mode);
                            }
                            Err(error) => value["error"] = serde_json::json!(error),
                        }
                        value
                    })
                    .collect::<Vec<_>>(),
                "allow": config.safety.allow,
                "deny": config.safety.deny,
                "require_signed": config.require_signed(),
                "requesters": requesters,
                "limits": limits,
                "inventory": inventory,
                "calendar": calendar.as_ref().map(|(rules, now)| {
                    serde_json::json!({ "rules": rules, "now": now })
                }),
                "groups": usage
                    .iter()
                    .map(|(group, use_)| {
                        (group.clone(), serde_json::json!({
                            "restarts_in_window": use_.restarts,
                            "disrupted": use_.disrupted,
                            "budget": budget(group),
                        }))
                    })
                    .collect::<serde_json::Map<_, _>>(),
            });
            writeln!(out, "{status}")?;
            return Ok(());
        }
        match what_runs.mode() {
            Some(mode) => writeln!(
                out,
                "mode:      {mode}, as the running instances say ({:?} backend; {said_by} \
                 says {configured})",
                config.restarter.kind
            )?,
            None => writeln!(
                out,
                "mode:      unknown: no running instance answered ({:?} backend; {said_by} \
                 says {configured})",
                config.restarter.kind
            )?,
        }
        match &switch.leash {
            Some(record) => writeln!(
                out,
                "leash:     {} by {} ({}) since {}, recorded in the store: every instance \
                 using it obeys",
                if record.leashed {
                    "LEASHED"
                } else {
                    "UNLEASHED"
                },
                record.by,
                record.reason,
                record.since
            )?,
            None => writeln!(
                out,
                "leash:     none recorded in the store: each instance follows its own \
                 safety.dry_run (`mandrill leash`, `mandrill unleash --reason …` turn it for \
                 every instance)"
            )?,
        }
        if let Some(disagreement) = what_runs.disagreement(configured, said_by) {
            writeln!(out, "WARNING:   {disagreement}")?;
        }
        if switch.paused {
            writeln!(out, "restarts:  PAUSED, {}", switch.paused_reason())?;
        } else {
            writeln!(out, "restarts:  running")?;
        }
        for pause in &group_pauses {
            writeln!(
                out,
                "group {}: PAUSED, {}",
                pause.group,
                pause.deferred_reason()
            )?;
        }
        for judged in &objectives {
            let p50 = judged.p50.map_or_else(|| "-".to_owned(), |p| p.to_string());
            writeln!(
                out,
                "recovery {}: p50 {p50}, {}{}",
                judged.group,
                judged.describe(),
                if judged.breached() { ": BREACHED" } else { "" }
            )?;
        }
        match (&instances_dir, instances.as_slice()) {
            (None, _) => {}
            (Some(dir), []) => writeln!(
                out,
                "admin:     no running instance found in {}",
                dir.display()
            )?,
            (Some(_), running) => {
                for (instance, mode) in running {
                    let mode = match mode {
                        Ok(mode) => mode.describe(),
                        Err(error) => format!("mode unknown: {error}"),
                    };
                    writeln!(
                        out,
                        "admin:     {} (pid {}): {mode}",
                        instance.url, instance.pid
                    )?;
                }
            }
        }
        writeln!(out, "allow:     {:?}", config.safety.allow)?;
        writeln!(out, "deny:      {:?}", config.safety.deny)?;
        writeln!(out, "signed:    {signed}")?;
        if !requesters.is_empty() {
            writeln!(out, "requesters: {}", requesters.join("; "))?;
        }
        match &calendar {
            Some((rules, now)) => writeln!(out, "calendar:  {rules}: {now}")?,
            None => writeln!(out, "calendar:  none (restarts at any time)")?,
        }
        writeln!(out, "limits:    {limits}")?;
        match &inventory {
            None => writeln!(out, "inventory: none (groups from safety.groups and names)")?,
            Some(state) if state["error"].is_null() => writeln!(
                out,
                "inventory: {}: {} hosts in {} groups (read now; a running service \
                 refreshes its own copy: see mandrill_inventory_* on /metrics)",
                state["source"].as_str().unwrap_or_default(),
                state["hosts"],
                state["groups"]
            )?,
            Some(state) => writeln!(
                out,
                "inventory: CANNOT BE READ NOW: {} (a running service keeps its last good \
                 copy until inventory.max_age, then defers every request)",
                state["error"].as_str().unwrap_or_default()
            )?,
        }
        for schedule in &schedules {
            if let Some(error) = schedule["error"].as_str() {
                writeln!(out, "schedules: cannot be planned: {error}")?;
                continue;
            }
            let next: Vec<String> = schedule["next"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|slot| {
                    format!(
                        "{} {}",
                        slot["local"].as_str().unwrap_or_default(),
                        slot["victim"].as_str().unwrap_or("(no eligible host)")
                    )
                })
                .collect();
            writeln!(
                out,
                "schedule {} (group {}): next {}",
                schedule["name"].as_str().unwrap_or_default(),
                schedule["group"].as_str().unwrap_or_default(),
                if next.is_empty() {
                    "none within a year".to_owned()
                } else {
                    next.join("; ")
                }
            )?;
        }
        let window = crate::settings::duration::per(config.safety.rate.window);
        for (group, use_) in &usage {
            let budget = budget(group).map_or_else(String::new, |b| format!(" of {b}"));
            writeln!(
                out,
                "group {group}: {} in the last {window}, {}{budget} hosts disrupted",
                crate::settings::duration::count(use_.restarts, "restart"),
                use_.disrupted
            )?;
        }
        Ok(())
    })
}

/// Each `[[schedule]]`'s next planned restarts with their provisional
/// victims (as `schedule preview` computes them), or why they cannot be
/// planned here (a key file this user cannot read, say).
fn next_planned(config: &Config, policy: &crate::safety::Policy) -> Vec<serde_json::Value> {
    let schedules = match config.schedules() {
        Ok(schedules) => schedules,
        Err(error) => return vec![serde_json::json!({ "error": error.to_string() })],
    };
    crate::schedule::Outlook::new(schedules, config.parse_rules().domain)
        .next(policy, jiff::Timestamp::now())
        .iter()
        .map(|planned| serde_json::json!(planned))
        .collect()
}

pub(super) async fn open(
    config: &Config,
) -> anyhow::Result<std::sync::Arc<dyn crate::store::Store>> {
    if config.store.url == "memory" {
        bail!(
            "store.url is memory: the kill switch lives in a shared store (sqlite:PATH or postgres://…)"
        );
    }
    service::open_store(&config.store).await
}
