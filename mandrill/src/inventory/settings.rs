//! `[inventory]`, owned here; the configuration embeds it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Keys;
use crate::settings::settings;

/// Largest inventory read, from any source: bigger is refused (the last
/// good copy is kept).
pub(crate) const MAX_INVENTORY_BYTES: usize = 64 * 1024 * 1024;

settings! {
    /// `[inventory]`: the operator's hosts, groups and zones. At most one
    /// source: `file`, `command`, `url` or `[inventory.ec2]`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct InventorySettings {
        /// A file: mandrill's TOML `[[hosts]]` (a `.toml` file), or JSON:
        /// mandrill's `{"hosts": [...]}`, `ansible-inventory --list`'s, or
        /// Prometheus `file_sd`, told apart by their shape.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub file: Option<PathBuf> = None,
        /// A program and its arguments, run without a shell, whose standard
        /// output is the inventory, e.g. `["ansible-inventory", "-i",
        /// "hosts.ini", "--list"]`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub command: Vec<String> = Vec::new(),
        /// An http(s) URL answering the inventory as JSON; credentials in it
        /// are never printed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub url: Option<String> = None,
        /// `[inventory.ec2]`: the instances of EC2 (docs/inventory.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ec2: Option<Ec2InventorySettings> = None,
        /// How often the inventory is read again; a failed read keeps the
        /// last good copy.
        #[serde(with = "crate::settings::duration")]
        pub refresh: Duration = Duration::from_secs(300),
        /// Oldest copy decided with: past it every request is deferred until
        /// a read succeeds (fail closed).
        #[serde(with = "crate::settings::duration")]
        pub max_age: Duration = Duration::from_secs(3600),
        /// Longest one read may take (the command's run, the HTTP request).
        #[serde(with = "crate::settings::duration")]
        pub timeout: Duration = Duration::from_secs(30),
        /// The `file_sd` label holding a target's group.
        pub group_label: String = "group".to_owned(),
        /// The `file_sd` label holding a target's zone.
        pub zone_label: String = "zone".to_owned(),
        /// The ansible host variable holding a host's zone.
        pub zone_var: String = "zone".to_owned(),
        /// Largest share of the hosts, in percent, one refresh may drop; a
        /// read that drops more is refused and the last good copy kept.
        ///
        /// A source that suddenly lists far fewer hosts is more likely
        /// broken than the fleet gone. To take such a read, raise it (100
        /// takes any) and reload, or restart: the first read of a
        /// running service compares with nothing.
        pub max_drop: u32 = 50,
    }
}

impl InventorySettings {
    /// Whether an inventory is configured.
    pub(crate) fn is_configured(&self) -> bool {
        self.file.is_some() || !self.command.is_empty() || self.url.is_some() || self.ec2.is_some()
    }

    /// What the parsers need beyond the text.
    pub(crate) fn keys(&self) -> Keys {
        Keys {
            group_label: self.group_label.clone(),
            zone_label: self.zone_label.clone(),
            zone_var: self.zone_var.clone(),
        }
    }

    /// Checks what types cannot: `(key, why)`. The URL is never quoted.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let sources: Vec<&str> = [
            ("inventory.file", self.file.is_some()),
            ("inventory.command", !self.command.is_empty()),
            ("inventory.url", self.url.is_some()),
            ("inventory.ec2", self.ec2.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        if sources.len() > 1 {
            return Err((
                "inventory",
                format!(
                    "{} are all set; an inventory has exactly one source",
                    sources.join(" and ")
                ),
            ));
        }
        if self.command.first().is_some_and(String::is_empty) {
            return Err(("inventory.command", "its program is empty".into()));
        }
        if let Some(url) = &self.url {
            let parsed = url::Url::parse(url).map_err(|_| {
                (
                    "inventory.url",
                    "is not a valid URL (not shown: it may hold credentials)".to_owned(),
                )
            })?;
            if !matches!(parsed.scheme(), "http" | "https")
                || parsed.host_str().is_none_or(str::is_empty)
            {
                return Err((
                    "inventory.url",
                    format!(
                        "must be an http:// or https:// URL with a host, not {}",
                        crate::settings::redact_url(url)
                    ),
                ));
            }
        }
        if let Some(ec2) = &self.ec2 {
            ec2.validate()?;
        }
        for (key, value) in [
            ("inventory.refresh", self.refresh),
            ("inventory.max_age", self.max_age),
            ("inventory.timeout", self.timeout),
        ] {
            if value.is_zero() {
                return Err((key, "must be longer than 0s".into()));
            }
        }
        if self.max_drop > 100 {
            return Err((
                "inventory.max_drop",
                format!("{} is over 100 (percent of the hosts)", self.max_drop),
            ));
        }
        if self.is_configured() && self.max_age < self.refresh {
            return Err((
                "inventory.max_age",
                format!(
                    "{} is shorter than inventory.refresh ({}): every copy would be too old \
                     before the next read",
                    humantime::format_duration(self.max_age),
                    humantime::format_duration(self.refresh)
                ),
            ));
        }
        for (key, value) in [
            ("inventory.group_label", &self.group_label),
            ("inventory.zone_label", &self.zone_label),
            ("inventory.zone_var", &self.zone_var),
        ] {
            if value.is_empty() {
                return Err((key, "is empty".into()));
            }
        }
        Ok(())
    }
}

settings! {
    /// `[inventory.ec2]`: running and stopped EC2 instances matching
    /// `filters`, named by their ids.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct Ec2InventorySettings {
        /// The AWS region, e.g. `us-east-1`; default `AWS_REGION`, else
        /// `AWS_DEFAULT_REGION`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub region: Option<String> = None,
        /// Another endpoint than AWS's public one: a VPC endpoint, an
        /// emulator (plain http only on loopback).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub endpoint_url: Option<String> = None,
        /// `DescribeInstances` filters: a name and the values any of which
        /// matches, e.g. `{ "tag:chaos" = ["yes"] }`; all must match.
        ///
        /// Without an `instance-state-name` filter, instances pending,
        /// running, stopping or stopped are listed (not those shutting down
        /// or terminated).
        pub filters: BTreeMap<String, Vec<String>> = BTreeMap::new(),
        /// The tag holding an instance's group; without it, an Auto
        /// Scaling group's member is in the group named like it.
        pub group_tag: String = "chaos-group".to_owned(),
        /// Tags shown as labels in `mandrill inventory`; none by default
        /// (tags hold secrets too).
        pub label_tags: Vec<String> = Vec::new(),
    }
}

impl Ec2InventorySettings {
    /// Checks what types cannot: `(key, why)`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let region = crate::restarter::http::aws::region(self.region.as_deref()).ok_or((
            "inventory.ec2.region",
            "is required (or AWS_REGION in the environment)".to_owned(),
        ))?;
        crate::restarter::http::aws::check_region(&region)
            .map_err(|why| ("inventory.ec2.region", why))?;
        if let Some(endpoint) = &self.endpoint_url {
            crate::restarter::http::aws::check_endpoint(endpoint)
                .map_err(|why| ("inventory.ec2.endpoint_url", why))?;
        }
        for (name, values) in &self.filters {
            if name.is_empty() || values.is_empty() || values.iter().any(String::is_empty) {
                return Err((
                    "inventory.ec2.filters",
                    format!("filter {name:?} needs a name and at least one value, none empty"),
                ));
            }
        }
        if self.group_tag.is_empty() {
            return Err(("inventory.ec2.group_tag", "is empty".into()));
        }
        Ok(())
    }
}
