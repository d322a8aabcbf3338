//! The configuration's tests, by topic. `load` builds a configuration from a
//! file's text, environment variables and `--set` flags, as `mandrill run`
//! does.

use std::path::PathBuf;
use std::time::Duration;

use super::load::is_config_variable;
use super::*;
use crate::restarter::hosts::HostEntry;
use crate::safety::CalendarSettings;

mod layers;
mod property;
mod safety;
mod secrets;
mod shipped;
mod validation;

fn load(file: Option<&str>, env: &[(&str, &str)], flags: &[&str]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mandrill.toml");
    if let Some(text) = file {
        std::fs::write(&path, text).unwrap();
    }
    Sources {
        file: file.map(|_| path.clone()),
        environment: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        overrides: flags.iter().map(|f| parse_override(f).unwrap()).collect(),
    }
    .load()
}
