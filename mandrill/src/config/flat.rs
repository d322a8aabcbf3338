//! The flat view of a configuration (`section.key` → value): what a reload
//! compares, and the defaults the help shows.

use std::collections::BTreeMap;

use super::Config;

/// Settings whose values are maps (name → value), not sections.
const MAP_SETTINGS: &[&str] = &[
    "restarter.command.env",
    "restarter.http.headers",
    "inventory.ec2.filters",
    "safety.groups",
    "safety.budget.group_sizes",
];

impl Config {
    /// Every setting as `section.key = value`, for diffs on reload.
    pub(crate) fn flatten(&self) -> BTreeMap<String, String> {
        let mut flat = BTreeMap::new();
        // A struct of plain fields always serialises to a table.
        let toml::Value::Table(sections) =
            toml::Value::try_from(self).expect("config serialises to toml")
        else {
            unreachable!("config serialises to a table");
        };
        fn walk(prefix: &str, table: toml::Table, flat: &mut BTreeMap<String, String>) {
            for (key, value) in table {
                let key = format!("{prefix}.{key}");
                match value {
                    // A setting whose value is a map is one setting.
                    toml::Value::Table(inner) if !MAP_SETTINGS.contains(&key.as_str()) => {
                        walk(&key, inner, flat);
                    }
                    value => {
                        flat.insert(key, value.to_string());
                    }
                }
            }
        }
        for (section, fields) in sections {
            match fields {
                toml::Value::Table(fields) => walk(&section, fields, &mut flat),
                // `[[hosts]]`: one setting, compared whole.
                value => {
                    flat.insert(section, value.to_string());
                }
            }
        }
        flat
    }

    /// The keys whose values differ between two configurations.
    pub(crate) fn changed_keys(&self, other: &Config) -> Vec<String> {
        let (old, new) = (self.flatten(), other.flatten());
        let keys: std::collections::BTreeSet<&String> = old
            .keys()
            .chain(new.keys())
            .filter(|k| old.get(*k) != new.get(*k))
            .collect();
        keys.into_iter().cloned().collect()
    }
}
