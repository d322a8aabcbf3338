//! The JSON of `ansible-inventory --list`: groups with `hosts` and
//! `children`, and `_meta.hostvars`. `ansible_host` is the address,
//! `ansible_port` the port, `ansible_user` the user, the variable named by
//! `inventory.zone_var` the zone. No other variable is kept, not even as a
//! label: host variables hold things like `api_token` and
//! `ansible_password`, and labels are printed (`mandrill inventory`).
//!
//! A host's group is the most specific group that lists it directly, not
//! counting `all` and `ungrouped`: the one deepest below `all` (a group's
//! depth is its longest chain of parents), and only when every other group
//! listing it directly is an ancestor of that one (they lie on one chain).
//! A host listed directly by two groups neither of which is inside the
//! other, at any depths, has no group (requests for it are denied, naming
//! them): counting it in one would let the other's limits and budget miss
//! it. A host in no group but `all`/`ungrouped` has none either.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Format, Inventory, Keys, Shared, host, joined, without_group};
use crate::domain::Reach;

const IMPLICIT: [&str; 3] = ["all", "ungrouped", "_meta"];

pub(super) fn parse(object: &Map<String, Value>, keys: &Keys) -> Result<Inventory, String> {
    let groups: BTreeMap<&str, &Map<String, Value>> = object
        .iter()
        .filter(|(name, _)| name.as_str() != "_meta")
        .map(|(name, group)| {
            group
                .as_object()
                .map(|group| (name.as_str(), group))
                .ok_or_else(|| format!("group {name} is not an object"))
        })
        .collect::<Result<_, _>>()?;
    let list = |group: &Map<String, Value>, key: &str| -> Result<Vec<String>, String> {
        match group.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("{key} holds {item}, not a name"))
                })
                .collect(),
            Some(other) => Err(format!("{key} is {other}, not a list")),
        }
    };
    // Depth below `all`: the longest chain of parents, found by relaxing
    // the edges at most once per group (a cycle stops there).
    let mut depth: HashMap<&str, usize> = groups.keys().map(|name| (*name, 1)).collect();
    depth.insert("all", 0);
    let mut edges = Vec::new();
    for (name, group) in &groups {
        for child in list(group, "children").map_err(|why| format!("group {name}: {why}"))? {
            edges.push((*name, child));
        }
    }
    for _ in 0..=groups.len() {
        let mut changed = false;
        for (parent, child) in &edges {
            let below = depth.get(parent).copied().unwrap_or(1) + 1;
            if let Some(d) = depth.get_mut(child.as_str())
                && *d < below
            {
                *d = below;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut parents: HashMap<&str, Vec<&str>> = HashMap::new();
    for (parent, child) in &edges {
        parents.entry(child.as_str()).or_default().push(parent);
    }
    // Every group above `group` through `children` (a cycle stops there).
    let ancestors = |group: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut next = vec![group];
        while let Some(current) = next.pop() {
            for parent in parents.get(current).into_iter().flatten() {
                if seen.insert((*parent).to_owned()) {
                    next.push(parent);
                }
            }
        }
        seen
    };
    let mut memberships: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, group) in &groups {
        for member in list(group, "hosts").map_err(|why| format!("group {name}: {why}"))? {
            let entry = memberships.entry(member).or_default();
            if !IMPLICIT.contains(name) {
                entry.insert((*name).to_owned());
            }
        }
    }
    let no_vars = Map::new();
    let hostvars = object
        .get("_meta")
        .and_then(|meta| meta.get("hostvars"))
        .and_then(Value::as_object)
        .unwrap_or(&no_vars);
    for name in hostvars.keys() {
        memberships.entry(name.clone()).or_default();
    }
    let mut hosts = Vec::new();
    let mut skipped = Vec::new();
    let mut shared = Shared::default();
    for (name, member_of) in memberships {
        let vars = hostvars
            .get(&name)
            .and_then(Value::as_object)
            .unwrap_or(&no_vars);
        let text = |key: &str| vars.get(key).and_then(scalar);
        let port = match vars.get("ansible_port") {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                scalar(value)
                    .and_then(|p| p.parse::<u16>().ok())
                    .ok_or_else(|| format!("host {name}: ansible_port {value} is not a port"))?,
            ),
        };
        let reach = Reach {
            address: text("ansible_host"),
            port,
            user: text("ansible_user"),
        };
        let deepest = member_of
            .iter()
            .max_by_key(|group| depth.get(group.as_str()).copied().unwrap_or(1));
        // The deepest group, if every other group listing the host directly
        // lies above it; two equally deep groups never do.
        let on_one_chain = deepest.filter(|deepest| {
            let above = ancestors(deepest);
            member_of
                .iter()
                .all(|group| group == *deepest || above.contains(group))
        });
        let group = on_one_chain.cloned();
        let zone = text(&keys.zone_var);
        let Some(mut parsed) = host(
            &name,
            group.as_deref(),
            reach,
            zone.as_deref(),
            BTreeMap::new(),
            &mut shared,
        )
        .map_err(|bad| {
            let field = match bad.field {
                "address" => "ansible_host",
                "user" => "ansible_user",
                "zone" => keys.zone_var.as_str(),
                other => other,
            };
            format!("host {name}: {field} {}", bad.why)
        })?
        else {
            skipped.push(name);
            continue;
        };
        if member_of.is_empty() {
            without_group(
                &mut parsed,
                "the inventory lists it in no group but all/ungrouped".into(),
            );
        } else if on_one_chain.is_none() {
            without_group(
                &mut parsed,
                format!(
                    "the inventory lists it in groups {} that are not one inside another; \
                     mandrill counts a host in one group only",
                    joined(&member_of)
                ),
            );
        }
        hosts.push(Arc::new(parsed));
    }
    let mut inventory = Inventory::from_hosts(hosts, skipped, Format::Ansible)?;
    inventory.beneath = beneath(&edges);
    Ok(inventory)
}

/// Each group with children (but `all`), and every group below it through
/// `children` (a cycle stops there).
fn beneath(edges: &[(&str, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (parent, child) in edges {
        if !IMPLICIT.contains(parent) {
            children.entry(parent).or_default().push(child);
        }
    }
    children
        .keys()
        .map(|parent| {
            let mut seen = BTreeSet::new();
            let mut next = vec![*parent];
            while let Some(current) = next.pop() {
                for child in children.get(current).into_iter().flatten() {
                    if seen.insert((*child).to_owned()) {
                        next.push(child);
                    }
                }
            }
            ((*parent).to_owned(), seen)
        })
        .collect()
}

/// A string, number or boolean as text; nothing for lists, maps, null.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
