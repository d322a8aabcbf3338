//! `mandrill inventory [--json]`: the operator's inventory, read once from
//! its configured source: hosts, groups with their sizes, zones, the source
//! and its age. Also [`load`], with which `policy check`, `policy replay`
//! and `status` decide as the worker does.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use serde_json::json;

use super::{ConfigArgs, command};
use crate::config::Config;
use crate::inventory::{InventoryHandle, Source};
use crate::safety::Policy;
use crate::settings::duration::count;

/// `mandrill inventory`
#[derive(Debug, Args)]
pub(crate) struct InventoryArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints the inventory.
pub(super) fn main(args: &InventoryArgs) -> ExitCode {
    let sources = args.config.sources(Vec::new());
    command(
        sources,
        |config| async move { print(&config, args.json).await },
    )
}

/// The configured inventory, read once, as a handle: `None` without
/// `[inventory]`; an error naming the source when it cannot be read.
pub(super) async fn load(config: &Config) -> anyhow::Result<Option<(Source, InventoryHandle)>> {
    let Some(source) = Source::of(&config.inventory) else {
        return Ok(None);
    };
    let inventory = crate::service::load_inventory(&source, &config.inventory).await?;
    let handle = InventoryHandle::new(inventory, &source, &config.inventory);
    Ok(Some((source, handle)))
}

/// `policy` deciding with the configured inventory, read once.
pub(super) async fn policy_with_inventory(config: &Config) -> anyhow::Result<Policy> {
    let mut policy = (*config.worker_config().policy.current()).clone();
    policy.inventory = load(config).await?.map(|(_, handle)| handle);
    Ok(policy)
}

/// A request for `name` as the worker would place it: nothing from a
/// message (no group named), for judging the policy alone.
pub(super) fn request_for(
    name: &crate::domain::InstanceName,
    rules: &crate::domain::ParseRules,
) -> crate::domain::RestartRequest {
    crate::domain::RestartRequest {
        message_id: uuid::Uuid::nil(),
        hostname: crate::domain::Hostname::new(name, &rules.domain),
        instance_name: name.clone(),
        requested_by: None,
        reason: None,
        published_at: None,
        group: None,
        requested_group: None,
        zone: None,
        requester: None,
        signature: None,
        reach: None,
        machine: None,
        not_before: None,
        reply_to: None,
    }
}

/// How old what the source holds is: a file's modification time; a
/// command's or a URL's answer is as old as this read.
fn source_age(source: &Source) -> Duration {
    match source {
        Source::File(path) => std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok())
            .unwrap_or_default(),
        Source::Command(_) | Source::Url(_) | Source::Ec2(_) => Duration::ZERO,
    }
}

async fn print(config: &Config, as_json: bool) -> anyhow::Result<()> {
    let Some((source, handle)) = load(config).await? else {
        return Err(super::BadInput(
            "no inventory is configured: set inventory.file, inventory.command, inventory.url or [inventory.ec2]"
                .into(),
        )
        .into());
    };
    // Just installed: there is a copy.
    let snapshot = handle.current().expect("a loaded inventory has a copy");
    let inventory = &snapshot.inventory;
    let age = source_age(&source);
    let mut out = std::io::stdout().lock();
    if as_json {
        // Each host as listed, with the other entries at its address.
        let hosts: Vec<serde_json::Value> = inventory
            .hosts()
            .into_iter()
            .map(|host| {
                let mut listed = json!(host);
                let aliases = inventory.aliases(&host.name);
                if !aliases.is_empty() {
                    listed["aliases"] = json!(aliases);
                }
                listed
            })
            .collect();
        let line = json!({
            "source": source.to_string(),
            "format": inventory.format,
            "age_seconds": age.as_secs(),
            "hosts": hosts,
            "groups": inventory.groups(),
            "zones": inventory.zones(),
            "skipped": inventory.skipped,
        });
        writeln!(out, "{line}")?;
        return Ok(());
    }
    writeln!(
        out,
        "source:  {source} ({} format), {} old",
        inventory.format.as_str(),
        humantime::format_duration(Duration::from_secs(age.as_secs()))
    )?;
    writeln!(out, "hosts:   {}", inventory.len())?;
    if !inventory.skipped.is_empty() {
        writeln!(
            out,
            "skipped: {} (not instance names): {}",
            inventory.skipped.len(),
            inventory.skipped.join(", ")
        )?;
    }
    writeln!(out, "groups:")?;
    for (group, size) in inventory.groups() {
        writeln!(out, "  {group}: {}", count(*size as u64, "host"))?;
    }
    let zones = inventory.zones();
    if !zones.is_empty() {
        writeln!(out, "zones:")?;
        for (zone, size) in &zones {
            writeln!(out, "  {zone}: {}", count(*size as u64, "host"))?;
        }
    }
    writeln!(out, "hosts:")?;
    for host in inventory.hosts() {
        let mut line = format!("  {}", host.name);
        match (&host.group, &host.no_group) {
            (Some(group), _) => line.push_str(&format!("  group {group}")),
            (None, why) => line.push_str(&format!(
                "  no group ({}; requests for it are denied)",
                why.as_deref().unwrap_or("none given")
            )),
        }
        if let Some(zone) = &host.zone {
            line.push_str(&format!("  zone {zone}"));
        }
        if let Some(address) = &host.reach.address {
            line.push_str(&format!("  address {address}"));
        }
        if let Some(port) = host.reach.port {
            line.push_str(&format!("  port {port}"));
        }
        if let Some(user) = &host.reach.user {
            line.push_str(&format!("  user {user}"));
        }
        let aliases = inventory.aliases(&host.name);
        if !aliases.is_empty() {
            line.push_str(&format!(
                "  aliases {} (the same machine)",
                aliases.join(", ")
            ));
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}
