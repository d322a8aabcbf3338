//! Old spellings of settings, still read for now so that a refactor does not
//! break every deployment's configuration: `[nats]` (now `[broker.nats]`,
//! owned by the NATS adapter) and `broker.poll_interval` (now each polling
//! adapter's own, `broker.sqlite.poll_interval` and
//! `broker.pubsub.poll_interval`). Each layer's old keys are renamed before
//! it is merged, so layering works as for the new keys; the service warns
//! once at start-up, naming the old and the new spelling.

use super::ConfigError;

/// A setting read under its old name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renamed {
    /// As written: `[nats]`, `MANDRILL_NATS__PASSWORD`, `--set nats.token`.
    pub old: String,
    /// What to write instead, in the same place.
    pub new: String,
    /// The old dotted key (or section) it covers, to name in errors.
    from: String,
}

/// Where a setting was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layer {
    /// A `MANDRILL_SECTION__KEY` variable.
    Environment,
    /// A `--set` flag.
    Flag,
}

/// The new keys an old dotted key stands for; `None` if it is not old.
fn new_keys(key: &str) -> Option<Vec<String>> {
    if let Some(field) = key.strip_prefix("nats.") {
        return Some(vec![format!("broker.nats.{field}")]);
    }
    if key == "broker.poll_interval" {
        return Some(vec![
            "broker.sqlite.poll_interval".into(),
            "broker.pubsub.poll_interval".into(),
        ]);
    }
    None
}

/// The key an old spelling stands for (the first, if several), or `key`.
pub(super) fn new_key(key: &str) -> String {
    new_keys(key)
        .and_then(|keys| keys.into_iter().next())
        .unwrap_or_else(|| key.to_owned())
}

/// The keys to set for `key` as written in `layer`, noting an old spelling.
pub(super) fn rename(layer: Layer, key: &str, renamed: &mut Vec<Renamed>) -> Vec<String> {
    let Some(keys) = new_keys(key) else {
        return vec![key.to_owned()];
    };
    let spell = |key: &str| match layer {
        Layer::Environment => format!("MANDRILL_{}", key.replace('.', "__").to_ascii_uppercase()),
        Layer::Flag => format!("--set {key}"),
    };
    note(
        renamed,
        Renamed {
            old: spell(key),
            new: keys
                .iter()
                .map(|k| spell(k))
                .collect::<Vec<_>>()
                .join(" and "),
            from: key.to_owned(),
        },
    );
    keys
}

/// Renames the old keys of a configuration file's table in place. A key
/// written under both its old and its new name is refused: which one was
/// meant is not for the loader to guess.
pub(super) fn rename_file_keys(
    table: &mut toml::Table,
    renamed: &mut Vec<Renamed>,
) -> Result<(), ConfigError> {
    // Anything but a table under `nats` stays, for serde to refuse by name.
    if let Some(toml::Value::Table(nats)) = table
        .get("nats")
        .is_some_and(toml::Value::is_table)
        .then(|| table.remove("nats"))
        .flatten()
    {
        let broker = section(table, "broker", "broker")?;
        let target = section(broker, "nats", "broker.nats")?;
        for (field, value) in nats {
            if target.contains_key(&field) {
                return Err(twice(&format!("broker.nats.{field}"), "[nats]"));
            }
            target.insert(field, value);
        }
        note(
            renamed,
            Renamed {
                old: "[nats]".into(),
                new: "[broker.nats]".into(),
                from: "nats".into(),
            },
        );
    }
    let broker = match table.get_mut("broker") {
        Some(toml::Value::Table(broker)) => broker,
        _ => return Ok(()),
    };
    if let Some(value) = broker.remove("poll_interval") {
        for adapter in ["sqlite", "pubsub"] {
            let key = format!("broker.{adapter}");
            let target = section(broker, adapter, &key)?;
            if target.contains_key("poll_interval") {
                return Err(twice(
                    &format!("{key}.poll_interval"),
                    "[broker] poll_interval",
                ));
            }
            target.insert("poll_interval".into(), value.clone());
        }
        note(
            renamed,
            Renamed {
                old: "broker.poll_interval".into(),
                new: "broker.sqlite.poll_interval and broker.pubsub.poll_interval".into(),
                from: "broker.poll_interval".into(),
            },
        );
    }
    Ok(())
}

/// The table `name` of `table`, created if missing.
fn section<'t>(
    table: &'t mut toml::Table,
    name: &str,
    key: &str,
) -> Result<&'t mut toml::Table, ConfigError> {
    let entry = table
        .entry(name.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match entry {
        toml::Value::Table(inner) => Ok(inner),
        _ => Err(ConfigError::invalid(key, "is not a section")),
    }
}

fn twice(key: &str, old: &str) -> ConfigError {
    ConfigError::invalid(
        key,
        format!("is set twice, also under its old name ({old}): keep only {key}"),
    )
}

fn note(renamed: &mut Vec<Renamed>, new: Renamed) {
    if !renamed.contains(&new) {
        renamed.push(new);
    }
}

/// `error`, saying under which old name its key was set, if it was.
pub(super) fn annotate(error: ConfigError, renamed: &[Renamed]) -> ConfigError {
    match error {
        ConfigError::Invalid { key, message } => {
            let written_as = written_as(renamed, &key);
            ConfigError::Invalid {
                message: format!("{message}{written_as}"),
                key,
            }
        }
        other => other,
    }
}

/// ` (written as …)` when `key` was set under an old name, for errors.
pub(super) fn written_as(renamed: &[Renamed], key: &str) -> String {
    let old = match key.strip_prefix("broker.") {
        Some(field) if field == "nats" || field.starts_with("nats.") => field.to_owned(),
        Some("sqlite.poll_interval" | "pubsub.poll_interval") => "broker.poll_interval".into(),
        _ => return String::new(),
    };
    let covered = |from: &str| old == from || old.starts_with(&format!("{from}."));
    match renamed.iter().find(|r| covered(&r.from)) {
        Some(r) => format!(" (written as {})", r.old),
        None => String::new(),
    }
}

/// The start-up warning about old spellings, if any were read.
pub fn renamed_warning(renamed: &[Renamed]) -> Option<String> {
    if renamed.is_empty() {
        return None;
    }
    let pairs: Vec<String> = renamed
        .iter()
        .map(|r| format!("{} → {}", r.old, r.new))
        .collect();
    Some(format!(
        "settings read under old names that will stop working; rename them: {}",
        pairs.join(", ")
    ))
}
