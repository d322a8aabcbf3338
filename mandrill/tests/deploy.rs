//! `deploy/` works as shipped: every path the example configuration names
//! exists for the service under the example systemd unit's sandbox, and the
//! configuration passes validation and `mandrill policy check`.

mod support;

use std::path::{Path, PathBuf};

#[path = "services/shipped.rs"]
mod shipped;

use shipped::{SECRETS, deploy_configuration, readme_configuration, runnable};
use support::{mandrill, temp_dir};

fn deploy(file: &str) -> PathBuf {
    shipped::repo_file("deploy").join(file)
}

/// Settings whose file the service writes, or whose directory must exist
/// for it (the pause file's directory is watched; an operator creates the
/// file there). Every other path it only reads.
const WRITTEN: &[&str] = &["safety.pause_file", "restarter.journal", "admin.token_file"];

/// What the unit's `[Service]` section says about the file system.
#[derive(Debug, Default)]
struct Sandbox {
    /// Writable for the service: the directories systemd creates for it
    /// (`RuntimeDirectory=` and the like), `ReadWritePaths=`, and a private
    /// /tmp.
    writable: Vec<PathBuf>,
    /// Not there at all for the service (`ProtectHome=`), or a private copy
    /// nobody else writes to (`PrivateTmp=`): nothing the operator puts
    /// there is seen.
    hidden: Vec<PathBuf>,
    /// `ProtectSystem=strict`: everything else is read-only.
    read_only_elsewhere: bool,
    /// The `--config` file `ExecStart=` names.
    config: Option<PathBuf>,
    /// `WorkingDirectory=`: where relative paths land.
    working_directory: Option<PathBuf>,
}

fn sandbox(unit: &str) -> Sandbox {
    let mut sandbox = Sandbox::default();
    let mut in_service = false;
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !in_service || line.starts_with('#') {
            continue;
        }
        let each: Vec<&str> = value
            .split_whitespace()
            .map(|v| v.trim_start_matches('-'))
            .collect();
        let under = |root: &str| -> Vec<PathBuf> {
            each.iter().map(|name| Path::new(root).join(name)).collect()
        };
        match key {
            "RuntimeDirectory" => sandbox.writable.extend(under("/run")),
            "StateDirectory" => sandbox.writable.extend(under("/var/lib")),
            "CacheDirectory" => sandbox.writable.extend(under("/var/cache")),
            "LogsDirectory" => sandbox.writable.extend(under("/var/log")),
            "ReadWritePaths" => sandbox.writable.extend(each.iter().map(PathBuf::from)),
            "PrivateTmp" if value == "yes" => {
                sandbox.writable.extend(["/tmp".into(), "/var/tmp".into()]);
                sandbox.hidden.extend(["/tmp".into(), "/var/tmp".into()]);
            }
            "ProtectHome" if value == "yes" => {
                sandbox
                    .hidden
                    .extend(["/home".into(), "/root".into(), "/run/user".into()])
            }
            "ProtectSystem" => sandbox.read_only_elsewhere = value == "strict",
            "WorkingDirectory" => sandbox.working_directory = Some(value.into()),
            "ExecStart" => {
                let words: Vec<&str> = value.split_whitespace().collect();
                sandbox.config = words
                    .windows(2)
                    .find(|pair| pair[0] == "--config")
                    .map(|pair| PathBuf::from(pair[1]));
            }
            _ => {}
        }
    }
    sandbox
}

/// Every absolute path among the configuration's values, with its key
/// (array indices dropped): `sqlite:` URLs' files too.
fn paths(value: &toml::Value, key: &str, found: &mut Vec<(String, PathBuf)>) {
    match value {
        toml::Value::String(text) => {
            let path = text
                .strip_prefix("sqlite:")
                .map(|rest| rest.trim_start_matches("//"))
                .unwrap_or(text);
            if path.starts_with('/') {
                found.push((
                    key.to_owned(),
                    PathBuf::from(path.split('?').next().unwrap()),
                ));
            }
        }
        toml::Value::Array(items) => items.iter().for_each(|item| paths(item, key, found)),
        toml::Value::Table(table) => {
            for (name, item) in table {
                let key = if key.is_empty() {
                    name.clone()
                } else {
                    format!("{key}.{name}")
                };
                paths(item, &key, found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_path_the_example_configuration_names_is_there_under_the_example_unit() {
    let unit = std::fs::read_to_string(deploy("mandrill.service")).unwrap();
    let sandbox = sandbox(&unit);
    assert!(
        sandbox.read_only_elsewhere,
        "the unit sets ProtectSystem=strict"
    );
    let config_file = sandbox.config.clone().expect("ExecStart names --config");
    // Relative paths (default settings among them) land there.
    let working_directory = sandbox.working_directory.clone().unwrap_or("/".into());
    assert!(
        sandbox.writable.contains(&working_directory),
        "WorkingDirectory={} is not writable: {sandbox:?}",
        working_directory.display()
    );
    let text = std::fs::read_to_string(deploy("mandrill.toml")).unwrap();
    let config: toml::Value = toml::from_str(&text).unwrap();
    let mut found = Vec::new();
    paths(&config, "", &mut found);
    assert!(
        found.iter().any(|(key, _)| key == "safety.pause_file"),
        "the example has a pause file: {found:?}"
    );
    let within = |path: &Path, dirs: &[PathBuf]| dirs.iter().any(|dir| path.starts_with(dir));
    let config_dir = config_file.parent().unwrap().to_owned();
    for (key, path) in &found {
        assert!(
            !within(path, &sandbox.hidden),
            "{key} = {}: the unit hides that directory from the service",
            path.display()
        );
        if WRITTEN.contains(&key.as_str()) || key.ends_with("url") {
            let directory = path.parent().unwrap();
            assert!(
                within(directory, &sandbox.writable),
                "{key} = {}: its directory is neither made nor writable by the unit \
                 (RuntimeDirectory=, StateDirectory=, ReadWritePaths=, …): {sandbox:?}",
                path.display()
            );
        } else {
            // Read only: beside the configuration, which the unit reads.
            assert!(
                path.starts_with(&config_dir) || path.starts_with("/usr"),
                "{key} = {}: not beside {}",
                path.display(),
                config_file.display()
            );
        }
    }
}

/// `mandrill policy check` decides with the shipped production
/// configurations' inventory (`deploy/mandrill.toml` and README's): a listed
/// host is eligible, one the inventory does not list is not. How they load
/// is the configuration's unit tests' (`config/tests/shipped.rs`).
#[test]
fn the_shipped_production_configurations_pass_policy_check_with_their_inventory() {
    for (name, text) in [
        ("deploy", deploy_configuration()),
        ("README", readme_configuration()),
    ] {
        let (_guard, dir) = temp_dir();
        let (status, _, stderr) = mandrill(&dir, &["keygen", "oncall-bot"], &[]);
        assert!(status.success(), "{stderr}");
        let config = runnable(&text, &dir);
        let (status, stdout, stderr) = mandrill(
            &dir,
            &[
                "policy",
                "check",
                "--config",
                config.to_str().unwrap(),
                "--at",
                "2026-11-24T10:00:00Z",
                "cattle-web-01",
                "cattle-db1",
                "cattle-web-99",
            ],
            &SECRETS,
        );
        assert!(status.success(), "{name}: {stderr}");
        let line = |host: &str| {
            stdout
                .lines()
                .find(|line| line.contains(host))
                .unwrap_or_else(|| panic!("{name}: {host} not in {stdout}"))
                .to_owned()
        };
        assert!(line("cattle-web-01").contains("web"), "{name}: {stdout}");
        assert!(
            stdout.contains("not in the inventory"),
            "{name}: cattle-web-99 is not listed: {stdout}"
        );
    }
}
