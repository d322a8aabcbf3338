//! What a group pause names: the groups requests are counted in, which a
//! claim compares with the paused groups exactly. A name that counts no
//! request would pause nothing while the operator is told it paused.

use super::Policy;

/// The groups `pause --group NAME` (or `resume`) turns under `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupPause {
    /// The groups whose pause is turned: `NAME` itself, or every group
    /// beneath an ansible parent group.
    pub groups: Vec<String>,
    /// Whether `NAME` is an ansible parent group standing for `groups`.
    pub parent: bool,
}

impl Policy {
    /// The groups a pause of `group` turns: the inventory's group of that
    /// name, or for an ansible parent group every group beneath it (its
    /// hosts are counted in their deepest group, never in the parent).
    /// Without an inventory, a group of `safety.groups` or one a name's
    /// default can give (a-z, 0-9, '-': `cattle` for `cattle-a1`). `Err`,
    /// naming the known groups, for anything else: `Web` when the group is
    /// `web` paused nothing. An inventory not read yet refuses nothing (a
    /// pause is the safe side).
    pub(crate) fn group_pause(&self, group: &str) -> Result<GroupPause, String> {
        let snapshot = self.inventory.as_ref().and_then(|handle| handle.current());
        if let Some(snapshot) = snapshot {
            let inventory = &snapshot.inventory;
            let within = inventory.groups_within(group);
            if within.is_empty() {
                let mut known = inventory
                    .groups()
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>();
                known.extend(
                    inventory
                        .parent_groups()
                        .filter(|parent| !inventory.groups_within(parent).is_empty()),
                );
                known.sort_unstable();
                known.dedup();
                return Err(format!(
                    "no host of the inventory is counted in group {group:?}; its groups are {}",
                    listed(&known)
                ));
            }
            return Ok(GroupPause {
                parent: within.iter().any(|below| below != group),
                groups: within.into_iter().collect(),
            });
        }
        if self.inventory.is_none() {
            let configured = self.guards.counting.group_names().collect::<Vec<_>>();
            let by_name = crate::domain::InstanceName::parse(group).is_ok();
            if !configured.contains(&group) && !by_name {
                return Err(format!(
                    "no group {group:?}: the groups of safety.groups are {}, and any other is \
                     its hosts' name without the last -suffix (a-z, 0-9 and '-' only)",
                    listed(&configured)
                ));
            }
        }
        Ok(GroupPause {
            groups: vec![group.to_owned()],
            parent: false,
        })
    }
}

fn listed(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::inventory::{Inventory, InventoryHandle, InventorySettings, Keys, Source};
    use crate::safety::{BudgetSettings, Counting, RateSettings};

    fn with_groups(groups: &[(&str, &str)]) -> Policy {
        let groups: BTreeMap<String, Vec<String>> = groups
            .iter()
            .map(|(name, pattern)| ((*name).to_owned(), vec![(*pattern).to_owned()]))
            .collect();
        let mut policy = Policy::default();
        policy.guards.counting = Counting::new(
            &groups,
            &RateSettings::default(),
            &BudgetSettings::default(),
            false,
        )
        .unwrap();
        policy
    }

    fn with_ansible(json: &str) -> Policy {
        let inventory = Inventory::parse(json, false, &Keys::default()).unwrap();
        let handle = InventoryHandle::new(
            inventory,
            &Source::File("hosts.json".into()),
            &InventorySettings::default(),
        );
        Policy {
            inventory: Some(handle),
            ..Policy::default()
        }
    }

    fn one(group: &str) -> GroupPause {
        GroupPause {
            groups: vec![group.to_owned()],
            parent: false,
        }
    }

    #[test]
    fn without_an_inventory_a_group_is_configured_or_a_names_default() {
        let policy = with_groups(&[("databases", "db-*")]);
        assert_eq!(policy.group_pause("databases"), Ok(one("databases")));
        assert_eq!(policy.group_pause("cattle"), Ok(one("cattle")));
        let error = policy.group_pause("Web").unwrap_err();
        assert!(
            error.contains("\"Web\"") && error.contains("safety.groups are databases"),
            "{error}"
        );
        assert!(policy.group_pause("web_eu").is_err());
    }

    #[test]
    fn with_an_inventory_a_group_is_one_its_hosts_are_counted_in_or_a_parent_of_them() {
        let policy = with_ansible(
            r#"{
                "_meta": {"hostvars": {}},
                "all": {"children": ["ungrouped", "web", "db"]},
                "web": {"children": ["web_eu", "web_us"]},
                "web_eu": {"hosts": ["web-1"], "children": ["web_eu_edge"]},
                "web_eu_edge": {"hosts": ["web-9"]},
                "web_us": {"hosts": ["web-2"]},
                "empty": {"children": ["nothing"]},
                "db": {"hosts": ["db-1"]}
            }"#,
        );
        assert_eq!(policy.group_pause("db"), Ok(one("db")));
        assert_eq!(
            policy.group_pause("web"),
            Ok(GroupPause {
                groups: vec!["web_eu".into(), "web_eu_edge".into(), "web_us".into()],
                parent: true,
            })
        );
        // A parent that lists hosts of its own pauses itself too.
        assert_eq!(
            policy.group_pause("web_eu").unwrap().groups,
            ["web_eu", "web_eu_edge"]
        );
        for unknown in ["Web", "cattle", "all", "empty"] {
            let error = policy.group_pause(unknown).unwrap_err();
            assert!(
                error.contains(&format!("{unknown:?}"))
                    && error.contains("are db, web, web_eu, web_eu_edge, web_us"),
                "{error}"
            );
        }
    }
}
