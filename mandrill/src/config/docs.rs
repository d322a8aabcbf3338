//! The help: every setting with its doc and default, generated from the
//! sections' field docs (see [`settings!`](crate::settings)), so that a key
//! is documented once.

use super::{
    AdminSettings, BrokerSettings, Config, DebugSettings, LogSettings, MessageSettings, RELOADABLE,
    RestarterSettings, SAFETY_NEEDS_RESTART, SafetySettings, SimulateSettings, StoreSettings,
    WorkerSettings, owned_elsewhere as elsewhere,
};
use crate::broker::nats::NatsSettings;
use crate::broker::pubsub::PubSubSettings;
use crate::broker::sqlite::SqliteSettings;
use crate::inventory::InventorySettings;
use crate::notify::NotifierSettings;
use crate::safety::{BudgetSettings, CalendarSettings, RateSettings};
use crate::settings::{Documented, summary};

type Docs = &'static [(&'static str, &'static str)];

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
    ("restarter.command", elsewhere::RESTARTER_COMMAND),
    ("restarter.ssh", elsewhere::RESTARTER_SSH),
    ("restarter.http", elsewhere::RESTARTER_HTTP),
    ("verify", elsewhere::VERIFY),
    ("safety", SafetySettings::DOCS),
    ("safety.calendar", CalendarSettings::DOCS),
    ("safety.rate", RateSettings::DOCS),
    ("safety.budget", BudgetSettings::DOCS),
    ("inventory", InventorySettings::DOCS),
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

/// Every documented setting, as its dotted key and whole doc.
pub(super) fn documented() -> impl Iterator<Item = (String, &'static str)> {
    SECTIONS.iter().flat_map(|(section, docs)| {
        docs.iter().filter_map(move |(field, doc)| {
            let key = match *section {
                "" => (*field).to_owned(),
                section => format!("{section}.{field}"),
            };
            (!is_section(&key)).then_some((key, *doc))
        })
    })
}

/// Every documented setting's dotted key.
pub(super) fn documented_keys() -> impl Iterator<Item = String> {
    documented().map(|(key, _)| key)
}

/// Every setting with its default and meaning, for `mandrill run --help`.
pub fn settings_help() -> String {
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
    text.push_str(&format!(
        "Reloaded on SIGHUP without a restart: {}, and [safety] but for {}.\n",
        RELOADABLE.join(", "),
        SAFETY_NEEDS_RESTART.join(", ")
    ));
    text
}
