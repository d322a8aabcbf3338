//! Reading and layering the sources: the file, then `MANDRILL_*`
//! environment variables, then `--set` flags, merged as one TOML table and
//! deserialised once, so that an error names its dotted key whatever layer
//! it came from.

use std::path::{Path, PathBuf};

use super::docs::{documented_keys, is_subsection};
use super::{Config, ConfigError};
use crate::safety::requesters::RequesterSettings;

/// Keys whose values are always strings: taken as written from the
/// environment and `--set`, so that `broker.nats.password=12345` is a password and
/// not a number.
const STRING_KEYS: &[&str] = &[
    "broker.url",
    "broker.pubsub.topic",
    "broker.pubsub.dead_letter_topic",
    "broker.pubsub.dead_letter_subscription",
    "broker.pubsub.endpoint",
    "broker.pubsub.credentials_file",
    "store.url",
    "broker.nats.user",
    "broker.nats.password",
    "broker.nats.token",
    "message.domain",
    "log.level",
    "admin.listen",
    "admin.token",
];

/// Keys holding secrets: an error about one never shows its value.
pub(crate) const SECRET_KEYS: &[&str] =
    &["broker.nats.password", "broker.nats.token", "admin.token"];

/// A raw value from the environment or `--set`, typed for its key.
fn value_for(key: &str, raw: &str) -> toml::Value {
    if STRING_KEYS.contains(&key) {
        toml::Value::String(raw.to_owned())
    } else {
        parse_scalar(raw)
    }
}

/// Where configuration comes from, so that a reload can read it all again.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sources {
    /// A TOML file, if any.
    pub file: Option<PathBuf>,
    /// `MANDRILL_SECTION__KEY` variables.
    pub environment: Vec<(String, String)>,
    /// From flags, as dotted key and value; applied last.
    pub overrides: Vec<(String, toml::Value)>,
}

impl Sources {
    /// The configuration variables of this process: `MANDRILL_SECTION__KEY`,
    /// and names that look like a setting misspelt (`MANDRILL_WORKER_MAX_IN_FLIGHT`),
    /// which [`Sources::load`] reports. Other `MANDRILL_*` names, such as the
    /// tests' `MANDRILL_TEST_POSTGRES`, are not configuration.
    pub(crate) fn process_environment() -> Result<Vec<(String, String)>, ConfigError> {
        let mut variables = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|name| is_config_variable(name)) else {
                continue;
            };
            let value = value.into_string().map_err(|_| ConfigError::Environment {
                name: name.to_owned(),
                why: "value is not valid UTF-8".into(),
            })?;
            variables.push((name.to_owned(), value));
        }
        Ok(variables)
    }

    /// Reads every layer and builds the configuration.
    pub(crate) fn load(&self) -> Result<Config, ConfigError> {
        self.layered(false).map(|(config, ..)| config)
    }

    /// As [`load`](Self::load), for a reload: a safety setting that a flag
    /// (`--set`) made looser than the file (or the environment) now says
    /// takes the file's stricter value (`safety.dry_run` aside: see
    /// [`Reloaded::file_dry_run`]).
    ///
    /// Flags win at start-up, where the operator gives them with the file
    /// in view; a file edited and reloaded later says what the operator
    /// wants now, and a flag from then must not widen it.
    pub(crate) fn reload(&self) -> Result<Reloaded, ConfigError> {
        let (config, tightened, file_dry_run) = self.layered(true)?;
        Ok(Reloaded {
            config,
            tightened,
            file_dry_run,
        })
    }

    /// `safety.dry_run` as the file and the environment say it now, no
    /// flag over them: what the next reload compares with
    /// ([`Reloaded::file_dry_run`]).
    pub(crate) fn file_dry_run(&self) -> Result<Option<bool>, ConfigError> {
        Ok(file_dry_run(&self.file_and_environment()?))
    }

    /// Just the `[[requesters]]` entries the sources say now, for a reload
    /// refused for another key: the entries it removes or changes are
    /// revoked all the same. An error where even they cannot be read (a
    /// file that is not TOML, say): then no key is trusted.
    pub(crate) fn requester_entries(&self) -> Result<Vec<RequesterSettings>, ConfigError> {
        let mut table = self.file_and_environment()?;
        self.apply_flags(&mut table)?;
        let Some(entries) = table.remove("requesters") else {
            return Ok(Vec::new());
        };
        serde_path_to_error::deserialize(entries).map_err(|error| {
            let key = format!("requesters{}", error.path());
            let message = error.into_inner().to_string();
            ConfigError::invalid(&key, message.lines().next().unwrap_or_default())
        })
    }

    /// What set `safety.dry_run` in `config` (loaded from these
    /// sources), for the record of the leash: the last layer that sets it,
    /// else the backend's default. A flag cannot say which flag it was
    /// (`--unleash` is `--set safety.dry_run=false`), so both are named.
    pub(crate) fn dry_run_set_by(&self, config: &Config) -> String {
        const KEY: &str = "safety.dry_run";
        if let Some((_, value)) = self.overrides.iter().rev().find(|(key, _)| key == KEY) {
            return match value.as_bool() {
                Some(false) => "a start-up flag (--unleash, or --set safety.dry_run=false)".into(),
                _ => format!("a start-up flag (--set safety.dry_run={value})"),
            };
        }
        if let Some((name, _)) = self
            .environment
            .iter()
            .rev()
            .find(|(name, _)| env_key(name).is_ok_and(|key| key == KEY))
        {
            return format!("the environment ({name})");
        }
        // The file's path is not named: `/api/status`, which serves this,
        // needs no token.
        match (config.safety.dry_run, &self.file) {
            (Some(_), Some(_)) => "the configuration file".into(),
            _ => format!(
                "the default for the {:?} backend (safety.dry_run unset)",
                config.restarter.kind
            ),
        }
    }

    /// The file's table with the environment's variables over it.
    fn file_and_environment(&self) -> Result<toml::Table, ConfigError> {
        let mut table = match &self.file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        for (name, raw) in &self.environment {
            let key = env_key(name)?;
            set_dotted(&mut table, &key, value_for(&key, raw)).map_err(|why| {
                ConfigError::Environment {
                    name: name.clone(),
                    why,
                }
            })?;
        }
        Ok(table)
    }

    /// `--set` flags over `table`.
    fn apply_flags(&self, table: &mut toml::Table) -> Result<(), ConfigError> {
        for (key, value) in &self.overrides {
            set_dotted(table, key, value.clone()).map_err(|why| ConfigError::invalid(key, why))?;
        }
        Ok(())
    }

    fn layered(
        &self,
        stricter_below_flags_wins: bool,
    ) -> Result<(Config, Vec<&'static str>, Option<bool>), ConfigError> {
        let mut table = self.file_and_environment()?;
        let file_dry_run = file_dry_run(&table);
        let below_flags = stricter_below_flags_wins.then(|| table.clone());
        self.apply_flags(&mut table)?;
        let tightened = match &below_flags {
            Some(below_flags) => stricter_wins(below_flags, &mut table),
            None => Vec::new(),
        };
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|error| {
                let key = error.path().to_string();
                // The toml error may add a second line of context ("in `worker`")
                // that the key already says.
                let message = error.into_inner().to_string();
                let first_line = message.lines().next().unwrap_or_default();
                if SECRET_KEYS.contains(&key.as_str()) {
                    // Serde quotes the value it could not use.
                    return ConfigError::invalid(
                        &key,
                        "expected a string (the value is a secret and not shown)",
                    );
                }
                ConfigError::invalid(&key, first_line)
            })?;
        if stricter_below_flags_wins {
            config.validate_for_reload()
        } else {
            config.validate()
        }?;
        Ok((config, tightened, file_dry_run))
    }
}

/// What a reload read.
#[derive(Debug)]
pub(crate) struct Reloaded {
    /// The configuration, flags over the file as at start-up, but for
    /// `tightened`.
    pub config: Config,
    /// The safety keys a flag made looser than the file, given the file's
    /// stricter value: to be logged.
    pub tightened: Vec<&'static str>,
    /// `safety.dry_run` as the file and the environment say it (no flag):
    /// the reload turns the leash only when this changed since the
    /// configuration in force was read (`safety::leash::reloaded_dry_run`).
    pub file_dry_run: Option<bool>,
}

/// `safety.dry_run` in a table of the layers below the flags.
fn file_dry_run(below_flags: &toml::Table) -> Option<bool> {
    get_dotted(below_flags, "safety.dry_run").and_then(toml::Value::as_bool)
}

/// The safety settings whose `true` is the stricter value: pausing
/// everything when a host does not come back, and refusing unsigned
/// requests. (The others have no order to take the stricter by: which of
/// two allow lists is narrower? And `safety.dry_run` is turned by a reload
/// only when the file's own value changed, so that a file that keeps
/// `dry_run = true` under `--unleash` is not a trap a routine reload
/// springs: `safety::leash::reloaded_dry_run`.)
const STRICTER_WHEN_TRUE: &[&str] = &["safety.pause_on_unrecovered", "safety.require_signed"];

/// Gives each of [`STRICTER_WHEN_TRUE`] that the flags in `table` set to
/// `false` the `true` that `below_flags` (the file and the environment)
/// says; returns those keys.
fn stricter_wins(below_flags: &toml::Table, table: &mut toml::Table) -> Vec<&'static str> {
    let mut tightened = Vec::new();
    for &key in STRICTER_WHEN_TRUE {
        let below = get_dotted(below_flags, key).and_then(toml::Value::as_bool);
        let flagged = get_dotted(table, key).and_then(toml::Value::as_bool);
        if below == Some(true)
            && flagged == Some(false)
            && set_dotted(table, key, toml::Value::Boolean(true)).is_ok()
        {
            tightened.push(key);
        }
    }
    tightened
}

/// The value at `section.key` (or `section.subsection.key`), if set.
fn get_dotted<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let (sections, field) = key.rsplit_once('.')?;
    let mut table = table;
    for section in sections.split('.') {
        table = table.get(section)?.as_table()?;
    }
    table.get(field)
}

/// Parses a `--set SECTION.KEY=VALUE` flag.
pub(crate) fn parse_override(raw: &str) -> Result<(String, toml::Value), ConfigError> {
    let (key, value) = raw
        .split_once('=')
        .ok_or_else(|| ConfigError::Override(raw.to_owned()))?;
    if !is_setting_path(key) {
        return Err(ConfigError::Override(format!("{key}=…")));
    }
    let key = key.trim();
    Ok((key.to_owned(), value_for(key, value.trim())))
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|error| ConfigError::Syntax {
            path: path.to_owned(),
            // Not the error's Display: it quotes the offending line, which
            // may hold a password.
            message: match error.span() {
                Some(span) => {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                    format!("line {line}, column {column}: {}", error.message())
                }
                None => error.message().to_owned(),
            },
        })
}

/// Whether an environment variable belongs to the configuration layer (see
/// [`Sources::process_environment`]).
pub(super) fn is_config_variable(name: &str) -> bool {
    match name.strip_prefix("MANDRILL_") {
        Some(rest) => rest.contains("__") || misspelt_setting(rest).is_some(),
        None => false,
    }
}

/// The setting `rest` (a variable name less `MANDRILL_`) seems to mean when
/// written with single underscores: `WORKER_MAX_IN_FLIGHT` or `MAX_IN_FLIGHT`.
fn misspelt_setting(rest: &str) -> Option<String> {
    let rest = rest.to_ascii_lowercase();
    documented_keys().find(|key| {
        let (section, field) = key.split_once('.').unwrap_or_default();
        rest == field || rest == format!("{section}_{field}")
    })
}

/// `MANDRILL_WORKER__MAX_IN_FLIGHT` → `worker.max_in_flight`.
fn env_key(name: &str) -> Result<String, ConfigError> {
    let rest = name.strip_prefix("MANDRILL_").unwrap_or(name);
    let parts: Vec<&str> = rest.split("__").collect();
    let key = parts.join(".").to_lowercase();
    if parts.iter().any(|p| p.is_empty()) || !is_setting_path(&key) {
        let why = match misspelt_setting(rest) {
            Some(key) => format!(
                "expected MANDRILL_SECTION__KEY; did you mean MANDRILL_{}?",
                key.replace('.', "__").to_ascii_uppercase()
            ),
            None => "expected MANDRILL_SECTION__KEY, e.g. MANDRILL_WORKER__MAX_IN_FLIGHT".into(),
        };
        return Err(ConfigError::Environment {
            name: name.to_owned(),
            why,
        });
    }
    Ok(key)
}

/// `section.key`, or `section.subsection.key` for a known subsection.
fn is_setting_path(key: &str) -> bool {
    match key.rsplit_once('.') {
        Some((section, _)) if !section.contains('.') => true,
        Some((section, _)) => is_subsection(section.trim()),
        None => false,
    }
}

/// A value as TOML if it reads as a TOML scalar (number, bool), else a string.
fn parse_scalar(raw: &str) -> toml::Value {
    format!("value = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut table| table.remove("value"))
        .filter(|value| !value.is_table())
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Sets `section.key` or `section.subsection.key` (`broker.pubsub.topic`).
fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').collect();
    let Some((field, sections)) = parts.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(format!("{key:?} is not SECTION.KEY"));
    };
    let mut table = table;
    for (depth, section) in sections.iter().enumerate() {
        let entry = table
            .entry((*section).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = entry else {
            return Err(format!(
                "`{}` is not a section",
                sections[..=depth].join(".")
            ));
        };
        table = inner;
    }
    table.insert((*field).to_owned(), value);
    Ok(())
}
