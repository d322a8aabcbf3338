//! mandrill's own format: TOML `[[hosts]]` or JSON `{"hosts": [...]}`, each
//! host with `name`, `group`, and optional `address`, `port`, `user`,
//! `zone`, `labels`. Every name must be an instance name and have a group.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::{Format, Host, Inventory, Shared, host};
use crate::domain::Reach;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    hosts: Hosts,
}

/// The hosts, each checked and built as it is read, so that no list of the
/// raw entries is held beside them (100,000 hosts: 15 MB less to allocate
/// and free per refresh); the first entry that fails its check is the
/// error, once the file has been read (a syntax error anywhere comes first).
struct Hosts {
    built: Vec<Arc<Host>>,
    first_error: Option<String>,
}

impl<'de> Deserialize<'de> for Hosts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Each;
        impl<'de> serde::de::Visitor<'de> for Each {
            type Value = Hosts;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of hosts")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Hosts, A::Error> {
                let mut hosts = Hosts {
                    built: Vec::with_capacity(seq.size_hint().unwrap_or(0)),
                    first_error: None,
                };
                let mut index = 0;
                let mut shared = Shared::default();
                while let Some(entry) = seq.next_element::<Entry<'de>>()? {
                    if hosts.first_error.is_none() {
                        match build_one(index, entry, &mut shared) {
                            Ok(host) => hosts.built.push(Arc::new(host)),
                            Err(why) => hosts.first_error = Some(why),
                        }
                    }
                    index += 1;
                }
                Ok(hosts)
            }
        }
        deserializer.deserialize_seq(Each)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry<'a> {
    name: String,
    // Borrowed where the text has no escapes: one shared copy is kept.
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(default)]
    address: Option<String>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default, borrow)]
    zone: Option<Cow<'a, str>>,
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
    if let Some(why) = file.hosts.first_error {
        return Err(why);
    }
    Inventory::from_hosts(file.hosts.built, Vec::new(), Format::Mandrill)
}

/// The host of entry `index`, checked.
fn build_one(index: usize, entry: Entry<'_>, shared: &mut Shared) -> Result<Host, String> {
    let reach = Reach {
        address: entry.address,
        port: entry.port,
        user: entry.user,
    };
    let name = entry.name;
    let parsed = host(
        &name,
        Some(&entry.group),
        reach,
        entry.zone.as_deref(),
        entry.labels,
        shared,
    )
    .map_err(|bad| format!("hosts[{index}].{} {}", bad.field, bad.why))?;
    // Mandrill's own file names instances: a name that cannot be one
    // is a mistake, not a host to skip.
    parsed.ok_or_else(|| {
        format!("hosts[{index}]: name {name:?} is not an instance name (a DNS label)")
    })
}
