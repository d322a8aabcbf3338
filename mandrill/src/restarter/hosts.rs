//! The host map: where an instance is really reached. By default a request's
//! host is `{instance_name}.{message.domain}`; `[[hosts]]` entries point
//! instance-name patterns at an address, and optionally a port and a user
//! (for SSH). The most specific matching pattern wins; an exact name beats
//! any pattern. For a host the operator's inventory lists, the inventory's
//! address, port and user (`request.reach`) come first, each in its own
//! right: a part the inventory leaves out is the map's.

use serde::{Deserialize, Serialize};

use crate::domain::RestartRequest;
use crate::pattern::Pattern;

/// One `[[hosts]]` entry, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostEntry {
    /// Instance names this entry applies to, e.g. `cattle-*`.
    pub pattern: String,
    /// Address to reach them at (a name or an IP), instead of the hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Port, for backends and probes that connect (SSH).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// User, for SSH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Where to reach one request's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The address: the host map's, else the request's hostname.
    pub address: String,
    /// The port, if the host map gives one.
    pub port: Option<u16>,
    /// The user, if the host map gives one.
    pub user: Option<String>,
}

/// The parsed host map. See the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostMap {
    entries: Vec<(Pattern, HostEntry)>,
}

impl HostMap {
    /// Parses the configured entries, naming the first bad one by index.
    pub(crate) fn new(entries: &[HostEntry]) -> Result<Self, String> {
        let mut parsed = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let pattern = Pattern::parse(&entry.pattern)
                .map_err(|why| format!("hosts[{index}].pattern: {why}"))?;
            if let Some(address) = &entry.address
                && (address.is_empty()
                    || address.chars().any(|c| c.is_whitespace() || c.is_control()))
            {
                return Err(format!(
                    "hosts[{index}].address {address:?} is not a host name or address"
                ));
            }
            parsed.push((pattern, entry.clone()));
        }
        // Most specific first, so that the first match is the best one.
        parsed.sort_by_key(|(pattern, _)| std::cmp::Reverse(pattern.specificity()));
        Ok(Self { entries: parsed })
    }

    /// The address the map gives `instance` (the most specific matching
    /// entry's, as [`Self::target`] takes it), if that entry gives one.
    pub(crate) fn address(&self, instance: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(pattern, _)| pattern.matches(instance))
            .and_then(|(_, entry)| entry.address.as_deref())
    }

    /// Where to reach `request`'s host: the inventory's parts first, then
    /// the map's, then the hostname.
    pub(crate) fn target(&self, request: &RestartRequest) -> Target {
        let entry = self
            .entries
            .iter()
            .find(|(pattern, _)| pattern.matches(request.instance_name.as_str()))
            .map(|(_, entry)| entry);
        let listed = request.reach.as_deref();
        Target {
            address: listed
                .and_then(|r| r.address.clone())
                .or_else(|| entry.and_then(|e| e.address.clone()))
                .unwrap_or_else(|| request.hostname.to_string()),
            port: listed
                .and_then(|r| r.port)
                .or_else(|| entry.and_then(|e| e.port)),
            user: listed
                .and_then(|r| r.user.clone())
                .or_else(|| entry.and_then(|e| e.user.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::request;

    fn entry(pattern: &str, address: &str, port: Option<u16>) -> HostEntry {
        HostEntry {
            pattern: pattern.into(),
            address: Some(address.into()),
            port,
            user: None,
        }
    }

    #[test]
    fn the_inventorys_address_port_and_user_come_first_for_a_listed_host() {
        let map = HostMap::new(&[HostEntry {
            pattern: "cattle-*".into(),
            address: Some("10.0.0.1".into()),
            port: Some(22),
            user: Some("ops".into()),
        }])
        .unwrap();
        let mut listed = request("cattle-ab12");
        listed.reach = Some(std::sync::Arc::new(crate::domain::Reach {
            address: Some("192.0.2.7".into()),
            port: Some(2222),
            user: None,
        }));
        let target = map.target(&listed);
        assert_eq!(target.address, "192.0.2.7");
        assert_eq!(target.port, Some(2222));
        assert_eq!(
            target.user.as_deref(),
            Some("ops"),
            "the map's, where the inventory is silent"
        );
    }

    #[test]
    fn the_most_specific_pattern_wins_and_unmapped_names_keep_their_hostname() {
        let map = HostMap::new(&[
            entry("cattle-*", "10.0.0.1", Some(22)),
            entry("cattle-ab12", "127.0.0.1", Some(2222)),
        ])
        .unwrap();
        let exact = map.target(&request("cattle-ab12"));
        assert_eq!(
            (exact.address.as_str(), exact.port),
            ("127.0.0.1", Some(2222))
        );
        let pattern = map.target(&request("cattle-zz99"));
        assert_eq!(pattern.address, "10.0.0.1");
        let unmapped = map.target(&request("pet-01"));
        assert_eq!(
            (unmapped.address.as_str(), unmapped.port),
            ("pet-01.example.net", None)
        );
    }

    #[test]
    fn bad_entries_are_named() {
        let error = HostMap::new(&[entry("", "x", None)]).unwrap_err();
        assert!(error.starts_with("hosts[0].pattern"), "{error}");
        let error = HostMap::new(&[entry("a*", "two words", None)]).unwrap_err();
        assert!(error.contains("hosts[0].address"), "{error}");
    }
}
