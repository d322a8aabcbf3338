//! Prometheus `file_sd` JSON: `[{"targets": ["host:port"], "labels": {...}}]`.
//! A target's host is the instance name and the address; its group is the
//! label named by `inventory.group_label`, its zone the one named by
//! `inventory.zone_label`; the other labels are kept as labels. The
//! target's port is the scrape port, not the host's: it is not used as the
//! port backends and probes connect to.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::{Format, Inventory, Keys, Shared, host};
use crate::domain::Reach;

#[derive(Deserialize)]
struct TargetGroup {
    targets: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

pub(super) fn parse(groups: Vec<Value>, keys: &Keys) -> Result<Inventory, String> {
    let mut hosts = Vec::new();
    let mut skipped = Vec::new();
    let mut shared = Shared::default();
    for (index, group) in groups.into_iter().enumerate() {
        let group: TargetGroup =
            serde_json::from_value(group).map_err(|e| format!("[{index}]: {e}"))?;
        let mut labels = group.labels;
        let group_name = labels.remove(&keys.group_label);
        let zone = labels.remove(&keys.zone_label);
        for target in group.targets {
            let name = host_of(&target);
            let reach = Reach {
                address: Some(name.to_owned()),
                port: None,
                user: None,
            };
            match host(
                name,
                group_name.as_deref(),
                reach,
                zone.as_deref(),
                labels.clone(),
                &mut shared,
            )
            .map_err(|bad| {
                let field = match bad.field {
                    "group" => keys.group_label.as_str(),
                    "zone" => keys.zone_label.as_str(),
                    other => other,
                };
                format!("[{index}]: target {target:?}: {field} {}", bad.why)
            })? {
                Some(parsed) => hosts.push(Arc::new(parsed)),
                None => skipped.push(target),
            }
        }
    }
    Inventory::from_hosts(hosts, skipped, Format::FileSd)
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
fn host_of(target: &str) -> &str {
    if let Some(rest) = target.strip_prefix('[') {
        return rest.split_once(']').map_or(target, |(host, _)| host);
    }
    match target.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => target,
    }
}
