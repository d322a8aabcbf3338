//! The help and docs/settings.md: every setting with its doc and default,
//! generated from the sections' field docs (see
//! [`settings!`](crate::settings)), so that a key is documented once.

use super::{
    AdminSettings, BrokerSettings, Config, DebugSettings, LogSettings, MessageSettings, RELOADABLE,
    RestarterSettings, SAFETY_NEEDS_RESTART, SafetySettings, SimulateSettings, StoreSettings,
    WorkerSettings,
};
use crate::broker::nats::NatsSettings;
use crate::broker::pubsub::PubSubSettings;
use crate::inventory::{Ec2InventorySettings, InventorySettings};
use crate::notify::NotifierSettings;
use crate::restarter::{CommandSettings, Ec2Settings, HttpSettings, SshSettings, VerifySettings};
use crate::safety::{BudgetSettings, CalendarSettings, RateSettings};
use crate::settings::{Documented, Field, summary};
use crate::sqlite::SqliteSettings;

type Docs = &'static [Field];

/// Every section with its fields' docs, in the order of the help (`""` is
/// the file's top level). A field that is a section here is not a setting
/// itself: its section's fields are.
const SECTIONS: &[(&str, Docs)] = &[
    ("broker", BrokerSettings::DOCS),
    ("broker.sqlite", SqliteSettings::DOCS),
    ("broker.nats", NatsSettings::DOCS),
    ("broker.pubsub", PubSubSettings::DOCS),
    ("store", StoreSettings::DOCS),
    ("worker", WorkerSettings::DOCS),
    ("message", MessageSettings::DOCS),
    ("restarter", RestarterSettings::DOCS),
    ("restarter.command", CommandSettings::DOCS),
    ("restarter.ssh", SshSettings::DOCS),
    ("restarter.http", HttpSettings::DOCS),
    ("restarter.ec2", Ec2Settings::DOCS),
    ("verify", VerifySettings::DOCS),
    ("safety", SafetySettings::DOCS),
    ("safety.calendar", CalendarSettings::DOCS),
    ("safety.rate", RateSettings::DOCS),
    ("safety.budget", BudgetSettings::DOCS),
    ("inventory", InventorySettings::DOCS),
    ("inventory.ec2", Ec2InventorySettings::DOCS),
    ("", Config::DOCS),
    ("notifier", NotifierSettings::DOCS),
    ("simulate", SimulateSettings::DOCS),
    ("log", LogSettings::DOCS),
    ("debug", DebugSettings::DOCS),
    ("admin", AdminSettings::DOCS),
];

fn is_section(key: &str) -> bool {
    SECTIONS.iter().any(|(section, _)| *section == key)
}

/// Whether `section` (`broker.nats`) is a section inside a section, which
/// the environment and `--set` can reach (`broker.nats.user`).
pub(super) fn is_subsection(section: &str) -> bool {
    section.contains('.') && is_section(section)
}

/// Every documented setting, as its section, dotted key and field.
fn fields() -> impl Iterator<Item = (&'static str, String, &'static Field)> {
    SECTIONS.iter().flat_map(|(section, docs)| {
        docs.iter().filter_map(move |field| {
            let key = match *section {
                "" => field.name.to_owned(),
                section => format!("{section}.{}", field.name),
            };
            (!is_section(&key)).then_some((*section, key, field))
        })
    })
}

/// Every documented setting, as its dotted key and whole doc.
pub(super) fn documented() -> impl Iterator<Item = (String, &'static str)> {
    fields().map(|(_, key, field)| (key, field.doc))
}

/// Every documented setting's dotted key.
pub(super) fn documented_keys() -> impl Iterator<Item = String> {
    documented().map(|(key, _)| key)
}

/// Every setting with its default and meaning, for `mandrill run --help`.
pub(crate) fn settings_help() -> String {
    let defaults = Config::default().flatten();
    let mut text = String::from(
        "Settings (config file `[section] key = value`, environment MANDRILL_SECTION__KEY, \
         or --set section.key=value; later layers win; durations like 500ms, 10s, 2m, \
         at most 365 days; passwords and tokens, also in URLs, are never printed):\n",
    );
    for (key, doc) in documented() {
        let default = defaults
            .get(&key)
            .cloned()
            .unwrap_or_else(|| "(unset)".into());
        text.push_str(&format!(
            "  {key:<34} {} [default: {default}]\n",
            summary(doc)
        ));
    }
    text.push_str(&reloaded());
    text
}

fn reloaded() -> String {
    format!(
        "Reloaded on SIGHUP without a restart: {}, and [safety] but for {}.\n",
        RELOADABLE.join(", "),
        SAFETY_NEEDS_RESTART.join(", ")
    )
}

/// docs/settings.md's reference: a table per section of every setting's
/// key, type, default and whole doc.
pub fn settings_reference() -> String {
    let defaults = Config::default().flatten();
    let mut text = String::new();
    let mut current = None;
    for (section, key, field) in fields() {
        if current != Some(section) {
            current = Some(section);
            let heading = match section {
                "" => "Top level".to_owned(),
                section => format!("`[{section}]`"),
            };
            text.push_str(&format!(
                "\n## {heading}\n\n| key | type | default | meaning |\n|---|---|---|---|\n"
            ));
        }
        let default = match defaults.get(&key) {
            Some(value) => format!("`{}`", value.replace('|', "\\|")),
            None => "(unset)".to_owned(),
        };
        text.push_str(&format!(
            "| `{key}` | {} | {default} | {} |\n",
            type_name(field.ty),
            crate::reference::paragraphs(field.doc)
        ));
    }
    text.push('\n');
    text.push_str(&reloaded());
    text
}

/// A setting's type in an operator's words: `Option<Duration>` is a
/// duration, `Vec<PathBuf>` a list of paths.
fn type_name(rust: &str) -> String {
    let rust: String = rust.chars().filter(|c| !c.is_whitespace()).collect();
    let rust = rust.rsplit("::").next().unwrap_or(&rust);
    if let Some(inner) = rust
        .strip_prefix("Option<")
        .and_then(|r| r.strip_suffix('>'))
    {
        return type_name(inner);
    }
    if let Some(inner) = rust.strip_prefix("Vec<").and_then(|r| r.strip_suffix('>')) {
        return match type_name(inner).as_str() {
            // `[[hosts]]` and the like: a struct per entry.
            "table" => "array of tables".to_owned(),
            item => format!("list of {item}s"),
        };
    }
    match rust {
        "bool" => "bool",
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => "integer",
        "f64" => "number",
        "String" => "string",
        "Secret" => "string (secret)",
        "PathBuf" => "path",
        "Duration" => "duration",
        map if map.starts_with("BTreeMap<") => "table",
        _ if rust.ends_with("Settings") || rust.ends_with("Entry") => "table",
        // An enum: its doc lists the values.
        _ => "choice",
    }
    .to_owned()
}
