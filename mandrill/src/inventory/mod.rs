//! The operator's inventory (`[inventory]`): which hosts exist, the group
//! and zone each is in, and where each is reached. With an inventory a
//! request for a name it does not list is denied, its group and zone come
//! from it alone, and the group sizes of `safety.budget.max_disrupted_percent`
//! are counted from it.
//!
//! `mod.rs` the model and the format detection (pure); `own.rs`,
//! `ansible.rs`, `file_sd.rs`, `ec2.rs` the parsers, one per format (pure);
//! `settings.rs` the section; `source.rs` the I/O at the edge (a file, a
//! command through `restarter/process.rs`, an HTTP URL, EC2's API through
//! `restarter/http/aws.rs`); `handle.rs` the
//! copy the worker reads (swapped whole on refresh) and the refresh task.
//! `restarter/hosts.rs` stays beside it: `[[hosts]]` maps name patterns to
//! addresses for hosts no inventory lists; an inventory's address, port and
//! user take that role for the hosts it lists (`domain::Reach`).
//!
//! The model and every question asked of it (hosts, groups, aliases,
//! parent groups), so one file past 400 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

// foldhash: the names are the operator's, and a refresh of a large fleet
// hashes each several times.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde::Serialize;

use crate::domain::{InstanceName, Reach};

mod ansible;
mod ec2;
mod file_sd;
mod handle;
mod own;
mod settings;
mod source;

#[cfg(test)]
pub(crate) use handle::web_hosts_file;
pub(crate) use handle::{InventoryHandle, refresh_task};
pub(crate) use settings::{Ec2InventorySettings, InventorySettings, MAX_INVENTORY_BYTES};
use source::{Loaded, load_changed};
pub(crate) use source::{Source, load};

/// One host as the inventory lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Host {
    /// The instance name requests use.
    pub name: String,
    /// The operator's group; `None` when the source gives none (or, for
    /// ansible, two groups not one inside the other): requests for it are
    /// denied.
    pub group: Option<Arc<str>>,
    /// Why the host has no group, when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_group: Option<String>,
    /// Where it is reached: address, port, user.
    #[serde(flatten)]
    pub reach: Arc<Reach>,
    /// The zone, for the budget per zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<Arc<str>>,
    /// Free labels, shown only.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A parsed inventory: hosts by name, and each group's size.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inventory {
    hosts: HashSet<ByName>,
    /// Machines per group: entries that share an address count once, so
    /// padding a group with aliases never raises its percentage budget.
    group_sizes: BTreeMap<String, u32>,
    /// Each entry that shares its address with others, with their names
    /// (sorted): one machine under several names (ansible aliases).
    aliases: HashMap<String, Vec<String>>,
    /// Ansible only: each group with `children`, and every group below it.
    /// Its hosts take their deepest group, so the parent's name alone
    /// counts none of them.
    beneath: BTreeMap<String, BTreeSet<String>>,
    /// Entries left out because their name cannot be an instance name
    /// (an IP address, a dotted name): no request can name them.
    pub skipped: Vec<String>,
    /// The format it was read in.
    pub format: Format,
    /// SHA-256 of what it was parsed from (the bytes and the keys that
    /// read them), when read from a file, a command or a URL: a refresh
    /// that reads the same is not parsed again.
    pub digest: Option<[u8; 32]>,
}

/// The formats an inventory is read in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Format {
    /// mandrill's own: TOML `[[hosts]]` or JSON `{"hosts": [...]}`.
    #[default]
    Mandrill,
    /// The JSON of `ansible-inventory --list`.
    Ansible,
    /// Prometheus `file_sd` JSON.
    FileSd,
    /// EC2's `DescribeInstances` (`[inventory.ec2]`).
    Ec2,
}

impl Format {
    /// The name shown.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Mandrill => "mandrill",
            Self::Ansible => "ansible",
            Self::FileSd => "file_sd",
            Self::Ec2 => "ec2",
        }
    }
}

/// What the parsers need to know beyond the text.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// The `file_sd` label holding a target's group.
    pub group_label: String,
    /// The `file_sd` label holding a target's zone.
    pub zone_label: String,
    /// The ansible host variable holding a host's zone.
    pub zone_var: String,
}

impl Default for Keys {
    fn default() -> Self {
        Self {
            group_label: "group".into(),
            zone_label: "zone".into(),
            zone_var: "zone".into(),
        }
    }
}

impl Inventory {
    /// Parses `text`: TOML when `toml_hint` says so (a `.toml` file),
    /// else JSON whose shape says the format (an array: `file_sd`; an
    /// object with `hosts` as an array: mandrill's; an object with `_meta`
    /// or `all`: ansible's), else TOML. The error says what is wrong and
    /// where.
    pub(crate) fn parse(text: &str, toml_hint: bool, keys: &Keys) -> Result<Self, String> {
        if toml_hint {
            return own::parse_toml(text);
        }
        if let Some(own) = own::parse_json_str(text) {
            return own;
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Array(targets)) => file_sd::parse(targets, keys),
            Ok(serde_json::Value::Object(object)) => {
                if object.get("hosts").is_some_and(serde_json::Value::is_array) {
                    own::parse_json(serde_json::Value::Object(object))
                } else if object.contains_key("_meta") || object.contains_key("all") {
                    ansible::parse(&object, keys)
                } else {
                    Err(
                        "a JSON object that is neither mandrill's ({\"hosts\": [...]}) nor \
                         ansible-inventory --list's (with _meta or all)"
                            .into(),
                    )
                }
            }
            Ok(_) => Err("JSON that is neither an object nor an array".into()),
            Err(json) => own::parse_toml(text)
                .map_err(|toml| format!("neither JSON ({json}) nor mandrill's TOML ({toml})")),
        }
    }

    /// Builds an inventory from hosts, refusing a name listed twice. A
    /// machine whose names are in two groups is left in neither (see
    /// [`two_groups`]).
    fn from_hosts(
        mut hosts: Vec<Arc<Host>>,
        skipped: Vec<String>,
        format: Format,
    ) -> Result<Self, String> {
        // One pass in the hosts' order (the order they were allocated in,
        // which keeps each host's fields in cache): each machine's first
        // host by index, and the indices of the few that have aliases.
        let mut shared: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut ungrouped = Vec::new();
        {
            let mut machines: HashMap<Machine<'_>, u32> = HashMap::with_capacity(hosts.len());
            for (index, host) in (0..).zip(hosts.iter().map(|host| &**host)) {
                match machines.entry(machine_of(host)) {
                    std::collections::hash_map::Entry::Vacant(vacant) => {
                        vacant.insert(index);
                    }
                    std::collections::hash_map::Entry::Occupied(first) => {
                        let first = *first.get();
                        shared
                            .entry(first)
                            .or_insert_with(|| vec![first])
                            .push(index);
                    }
                }
            }
            for names in shared.values() {
                ungrouped.extend(two_groups(&hosts, names));
            }
        }
        for (index, why) in ungrouped {
            without_group(Arc::make_mut(&mut hosts[index as usize]), why);
        }
        // A machine counts once in the group its names are in (one at most,
        // now): padding a group with aliases never raises its budget.
        let mut sizes: HashMap<&str, u32> = HashMap::new();
        for group in hosts.iter().filter_map(|host| host.group.as_deref()) {
            *sizes.entry(group).or_default() += 1;
        }
        for names in shared.values() {
            let mut grouped = names
                .iter()
                .filter_map(|&i| hosts[i as usize].group.as_deref());
            if let Some(group) = grouped.next() {
                let more = u32::try_from(grouped.count()).unwrap_or(u32::MAX);
                sizes.entry(group).and_modify(|size| *size -= more);
            }
        }
        let group_sizes: BTreeMap<String, u32> = sizes
            .into_iter()
            .map(|(group, size)| (group.to_owned(), size))
            .collect();
        let shared = shared.into_values().map(|names| {
            names
                .into_iter()
                .map(|i| &*hosts[i as usize])
                .collect::<Vec<_>>()
        });
        let mut aliases = HashMap::new();
        for names in shared {
            let mut names: Vec<&str> = names.iter().map(|host| host.name.as_str()).collect();
            names.sort_unstable();
            for name in &names {
                let others = names.iter().filter(|other| *other != name);
                aliases.insert(
                    (*name).to_owned(),
                    others.map(|o| (*o).to_owned()).collect(),
                );
            }
        }
        let mut by_name = HashSet::with_capacity(hosts.len());
        for host in hosts {
            if let Some(listed) = by_name.replace(ByName(host)) {
                return Err(format!("host {} is listed twice", listed.0.name));
            }
        }
        Ok(Self {
            hosts: by_name,
            group_sizes,
            aliases,
            beneath: BTreeMap::new(),
            skipped,
            format,
            digest: None,
        })
    }

    /// The other names of the machine `name` is (entries sharing its
    /// address), sorted; empty when it has none.
    pub(crate) fn aliases(&self, name: &str) -> &[String] {
        self.aliases.get(name).map_or(&[], Vec::as_slice)
    }

    /// The groups hosts are counted in that `group` stands for: itself if
    /// hosts are counted in it, and, for an ansible parent group, every
    /// such group beneath it. Empty when the inventory knows no such group
    /// or none of its hosts is counted in it.
    pub(crate) fn groups_within(&self, group: &str) -> BTreeSet<String> {
        let mut within: BTreeSet<String> = self
            .beneath
            .get(group)
            .into_iter()
            .flatten()
            .filter(|below| self.group_sizes.contains_key(*below))
            .cloned()
            .collect();
        if self.group_sizes.contains_key(group) {
            within.insert(group.to_owned());
        }
        within
    }

    /// The ansible groups with `children` (see [`Self::groups_within`]).
    pub(crate) fn parent_groups(&self) -> impl Iterator<Item = &str> {
        self.beneath.keys().map(String::as_str)
    }

    /// The host named `name`, if listed.
    pub(crate) fn host(&self, name: &str) -> Option<&Arc<Host>> {
        self.hosts.get(name).map(|host| &host.0)
    }

    /// The name the counting guards know `name`'s machine by when it has
    /// aliases: the first of its names (sorted), so that every alias
    /// counts as that one machine; `None` without aliases.
    pub(crate) fn machine<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        let first = self.aliases(name).first()?.as_str();
        Some(first.min(name))
    }

    /// How many machines of `group` it lists (entries sharing an address
    /// count once).
    pub(crate) fn group_size(&self, group: &str) -> Option<u32> {
        self.group_sizes.get(group).copied()
    }

    /// Every group with its size, by name.
    pub(crate) fn groups(&self) -> &BTreeMap<String, u32> {
        &self.group_sizes
    }

    /// Every zone with its number of hosts, by name.
    pub(crate) fn zones(&self) -> BTreeMap<String, u32> {
        let mut zones = BTreeMap::new();
        for ByName(host) in &self.hosts {
            if let Some(zone) = &host.zone {
                *zones.entry(zone.to_string()).or_insert(0) += 1;
            }
        }
        zones
    }

    /// Every host, by name.
    pub(crate) fn hosts(&self) -> Vec<&Arc<Host>> {
        let mut hosts: Vec<_> = self.hosts.iter().map(|host| &host.0).collect();
        hosts.sort_by(|a, b| a.name.cmp(&b.name));
        hosts
    }

    /// The hosts whose group is `group`, in no order (no sort: a
    /// schedule's draw orders them itself).
    pub(crate) fn in_group<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a Arc<Host>> {
        self.hosts
            .iter()
            .map(|host| &host.0)
            .filter(move |host| host.group.as_deref() == Some(group))
    }

    /// How many hosts it lists.
    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }
}

/// A listed host, found in the set by its name.
#[derive(Debug, Clone)]
struct ByName(Arc<Host>);

impl std::borrow::Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.name
    }
}

// As its name hashes and compares, which `Borrow` requires.
impl std::hash::Hash for ByName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

/// Which machine a host is: its address, as one machine is written
/// however it is spelled (an IP address parsed, a DNS name in lower case),
/// else its name (reached by its hostname). Borrowed from the host unless
/// a name must be lowered.
#[derive(PartialEq, Eq, Hash)]
enum Machine<'a> {
    Ip(std::net::IpAddr),
    Name(std::borrow::Cow<'a, str>),
}

fn machine_of(host: &Host) -> Machine<'_> {
    fn lower(name: &str) -> std::borrow::Cow<'_, str> {
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(name.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(name)
        }
    }
    match &host.reach.address {
        Some(address) => match address.parse::<std::net::IpAddr>() {
            Ok(ip) => Machine::Ip(ip),
            Err(_) => Machine::Name(lower(address)),
        },
        None => Machine::Name(lower(&host.name)),
    }
}

/// A field of a host that failed its check: the field in mandrill's own
/// terms (`address`, `user`, `group`, `zone`) and why. Each parser names it
/// in its format's terms (`hosts[3].address`, `ansible_host`).
#[derive(Debug)]
struct BadField {
    field: &'static str,
    why: String,
}

/// A host from its parts, validated: `Ok(None)` when `name` cannot be an
/// instance name (the caller skips it), an error for a bad address, user,
/// group or zone (which would otherwise reach a backend or a store).
fn host(
    name: &str,
    group: Option<&str>,
    reach: Reach,
    zone: Option<&str>,
    labels: BTreeMap<String, String>,
    shared: &mut Shared,
) -> Result<Option<Host>, BadField> {
    if InstanceName::parse(name).is_err() {
        return Ok(None);
    }
    if let Some(address) = &reach.address {
        check_address(address).map_err(|why| BadField {
            field: "address",
            why,
        })?;
    }
    if let Some(user) = &reach.user {
        check_user(user).map_err(|why| BadField { field: "user", why })?;
    }
    for (field, value) in [("group", group), ("zone", zone)] {
        if let Some(value) = value
            && (value.is_empty()
                || value.len() > 63
                || !value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(BadField {
                field,
                why: format!("{value:?} is not 1 to 63 letters, digits, '-', '_' or '.'"),
            });
        }
    }
    Ok(Some(Host {
        name: name.to_owned(),
        no_group: group
            .is_none()
            .then(|| "the inventory gives it no group".to_owned()),
        group: group.map(|group| shared.name(group)),
        reach: Arc::new(reach),
        zone: zone.map(|zone| shared.name(zone)),
        labels,
    }))
}

/// One copy of each group and zone name that an inventory's hosts share:
/// 100,000 hosts name a few groups and zones.
#[derive(Default)]
struct Shared(HashSet<Arc<str>>);

impl Shared {
    fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.0.get(name) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = Arc::from(name);
        self.0.insert(Arc::clone(&shared));
        shared
    }
}

/// Whether `address` is a DNS name (dot-separated labels of letters, digits
/// and `-`, none starting or ending with `-`) or an IP address: IPv4 dotted,
/// IPv6 bare (`fd00::1`, no brackets, no `%zone`; URL templates add the
/// brackets). An address reaches URLs, ssh's command line and connects, so
/// nothing else that could change where a request goes gets in (`/`, `@`,
/// `#`, `:` outside an IPv6 address, a leading `-`).
fn check_address(address: &str) -> Result<(), String> {
    if address.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let refuse = |why: &str| {
        Err(format!(
            "{address:?} is not a DNS name or an IP address: {why}"
        ))
    };
    if address.starts_with('[') {
        return refuse("write an IPv6 address without brackets");
    }
    if address.is_empty() || address.len() > 253 {
        return refuse("a name has 1 to 253 characters");
    }
    for label in address.split('.') {
        if label.is_empty() || label.len() > 63 {
            return refuse("each dot-separated label has 1 to 63 characters");
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return refuse("a name has only letters, digits, '-' and '.'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return refuse("a label neither starts nor ends with '-'");
        }
    }
    // URLs read a name ending in a numeric label as an IPv4 address.
    if address
        .rsplit('.')
        .next()
        .is_some_and(|last| last.chars().all(|c| c.is_ascii_digit()))
    {
        return refuse("its last label is a number, but it is not an IPv4 address");
    }
    Ok(())
}

/// Whether `user` is a user name ssh reads as one: 1 to 32 letters, digits,
/// `_`, `.` and `-`, not starting with `-`. Nothing that ssh or a URL reads
/// as syntax (`@`, `/`, `:`, `%`, spaces).
fn check_user(user: &str) -> Result<(), String> {
    if user.is_empty()
        || user.len() > 32
        || user.starts_with('-')
        || !user
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(format!(
            "{user:?} is not a user name: 1 to 32 letters, digits, '_', '.' or '-', \
             not starting with '-'"
        ));
    }
    Ok(())
}

/// The hosts of one machine (`names`, indices into `hosts`) to leave
/// without a group, and why: every one of them with a group when its names
/// are in two groups. Counted in either, a request naming it there would
/// pass the other group's rate limit, budget, pause and requesters' groups,
/// as ansible's ties would ([`ansible`]).
fn two_groups(hosts: &[Arc<Host>], names: &[u32]) -> Vec<(u32, String)> {
    let host = |i: u32| &*hosts[i as usize];
    let mut grouped = names.iter().filter(|&&i| host(i).group.is_some());
    let Some(&first) = grouped.next() else {
        return Vec::new();
    };
    if grouped.all(|&i| host(i).group == host(first).group) {
        return Vec::new();
    }
    let address = host(first).reach.address.as_deref().unwrap_or("its name");
    names
        .iter()
        .filter(|&&i| host(i).group.is_some())
        .map(|&i| {
            let others: Vec<String> = names
                .iter()
                .filter(|&&other| other != i)
                .map(|&other| {
                    let other = host(other);
                    format!(
                        "{} (group {})",
                        other.name,
                        other.group.as_deref().unwrap_or("none")
                    )
                })
                .collect();
            let why = format!(
                "it is the machine at {address}, also listed as {}: a machine whose names are \
                 in two groups is counted in neither (put its names in one group)",
                others.join(", ")
            );
            (i, why)
        })
        .collect()
}

/// The groups of hosts left without one, and why; for ansible's ties.
fn without_group(host: &mut Host, why: String) {
    host.group = None;
    host.no_group = Some(why);
}

/// Names in a set, joined for a message.
fn joined(names: &BTreeSet<String>) -> String {
    names.iter().cloned().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
