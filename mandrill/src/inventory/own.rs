//! mandrill's own format: TOML `[[hosts]]` or JSON `{"hosts": [...]}`, each
//! host with `name`, `group`, and optional `address`, `port`, `user`,
//! `zone`, `labels`. Every name must be an instance name and have a group.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Format, Inventory, host};
use crate::domain::Reach;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    hosts: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    group: String,
    #[serde(default)]
    address: Option<String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

pub(super) fn parse_toml(text: &str) -> Result<Inventory, String> {
    let file: File = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    build(file)
}

/// `text` read straight into mandrill's JSON format, when it is one:
/// `None` when it is not (the caller then reads it as a tree, which names
/// what is wrong). The same result as [`parse_json`] where both read it,
/// without a tree of the whole file (about half of the memory and time of
/// reading 100,000 hosts).
pub(super) fn parse_json_str(text: &str) -> Option<Result<Inventory, String>> {
    let file: File = serde_json::from_str(text).ok()?;
    Some(build(file))
}

pub(super) fn parse_json(value: serde_json::Value) -> Result<Inventory, String> {
    let file: File = serde_json::from_value(value).map_err(|e| e.to_string())?;
    build(file)
}

fn build(file: File) -> Result<Inventory, String> {
    let mut hosts = Vec::with_capacity(file.hosts.len());
    for (index, entry) in file.hosts.into_iter().enumerate() {
        let reach = Reach {
            address: entry.address,
            port: entry.port,
            user: entry.user,
        };
        let name = entry.name;
        let parsed = host(&name, Some(entry.group), reach, entry.zone, entry.labels)
            .map_err(|bad| format!("hosts[{index}].{} {}", bad.field, bad.why))?;
        // Mandrill's own file names instances: a name that cannot be one
        // is a mistake, not a host to skip.
        let parsed = parsed.ok_or_else(|| {
            format!("hosts[{index}]: name {name:?} is not an instance name (a DNS label)")
        })?;
        hosts.push(parsed);
    }
    Inventory::from_hosts(hosts, Vec::new(), Format::Mandrill)
}
