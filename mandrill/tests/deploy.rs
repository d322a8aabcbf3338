//! `deploy/` works as shipped: every path the example configuration names
//! exists for the service under the example systemd unit's sandbox, and the
//! configuration passes validation and `mandrill policy check`.

mod support;

use std::path::{Path, PathBuf};

use support::{mandrill, temp_dir};

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
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

/// The secrets the unit's environment file provides.
const SECRETS: [(&str, &str); 3] = [
    (
        "MANDRILL_STORE__URL",
        "postgres://mandrill:pw@db.internal/mandrill",
    ),
    ("MANDRILL_BROKER__NATS__PASSWORD", "nats-pw"),
    ("MANDRILL_ADMIN__TOKEN", "admin-token"),
];

/// The production configuration README's "Safe by default" shows.
fn readme_configuration() -> String {
    let readme = std::fs::read_to_string(deploy("../README.md")).unwrap();
    let section = readme
        .split_once("### Safe by default")
        .expect("README has a \"Safe by default\" section")
        .1;
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split_once("```"))
        .expect("the section opens with a toml block")
        .0;
    assert!(
        block.contains("[inventory]") && block.contains("[[requesters]]"),
        "README's production configuration has an inventory and a requester:\n{block}"
    );
    block.to_owned()
}

/// `text` made runnable in `dir`: its requester's key file and its
/// inventory command point at files made here (the real ones live on the
/// production host); everything else as shipped. Each replacement must
/// find what it replaces, so that the shipped text cannot drift from it.
fn runnable(text: &str, dir: &Path) -> PathBuf {
    let (status, _, stderr) = mandrill(dir, &["keygen", "oncall-bot"], &[]);
    assert!(status.success(), "{stderr}");
    let inventory = dir.join("inventory.json");
    std::fs::write(
        &inventory,
        r#"{"hosts": [
            {"name": "cattle-web-01", "group": "web", "zone": "eu-1a"},
            {"name": "cattle-db1", "group": "db", "zone": "eu-1a"}
        ]}"#,
    )
    .unwrap();
    let mut text = text.to_owned();
    for (shipped, here) in [
        (
            "\"/etc/mandrill/requesters/oncall-bot.pub\"".to_owned(),
            format!("{:?}", dir.join("oncall-bot.pub").display().to_string()),
        ),
        (
            r#"["ansible-inventory", "-i", "/etc/mandrill/hosts.ini", "--list"]"#.to_owned(),
            format!("[\"cat\", {:?}]", inventory.display().to_string()),
        ),
    ] {
        assert!(text.contains(&shipped), "{shipped} not in:\n{text}");
        text = text.replace(&shipped, &here);
    }
    let path = dir.join("mandrill.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The production configurations shipped (`deploy/mandrill.toml` and
/// README's) load with their secrets from the environment, and `mandrill
/// policy check` decides with their inventory: a listed host is eligible,
/// a denied one and one the inventory does not list are not.
#[test]
fn the_shipped_production_configurations_pass_policy_check_with_their_inventory() {
    let shipped = std::fs::read_to_string(deploy("mandrill.toml")).unwrap();
    for (name, text) in [("deploy", shipped), ("README", readme_configuration())] {
        let (_guard, dir) = temp_dir();
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
        let loaded = mandrill::Sources {
            file: Some(config),
            environment: SECRETS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            overrides: Vec::new(),
        }
        .load()
        .unwrap();
        assert!(loaded.dry_run(), "{name}: starts leashed");
        assert!(
            loaded.require_signed() && loaded.requesters.len() == 1,
            "{name}: takes signed requests only, from its one requester"
        );
        assert!(loaded.inventory.is_configured(), "{name}: has an inventory");
        // The stop condition asks for the firing alerts, not for liveness.
        let alerts = &loaded.safety.stop_conditions[0];
        assert!(alerts.expect_empty_json_array, "{name}: {alerts:?}");
        let url = alerts.http.as_deref().unwrap();
        assert!(
            url.contains("/api/v2/alerts?active=true&silenced=false&inhibited=false"),
            "{name}: {url}"
        );
    }
}

/// The example's secrets come from the environment file the unit reads:
/// without them it refuses to start, naming the setting; with them they
/// are in force and never shown.
#[test]
fn the_example_production_configuration_loads_with_its_secrets_from_the_environment() {
    let (_guard, dir) = temp_dir();
    let shipped = std::fs::read_to_string(deploy("mandrill.toml")).unwrap();
    let path = runnable(&shipped, &dir);
    let sources = |environment: &[(&str, &str)]| mandrill::Sources {
        file: Some(path.clone()),
        environment: environment
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        overrides: Vec::new(),
    };
    let config = sources(&SECRETS).load().unwrap();
    assert_eq!(
        config.broker.nats.password,
        Some(mandrill::Secret("nats-pw".into()))
    );
    assert_eq!(config.admin.listen, "0.0.0.0:9730");
    assert_eq!(config.notify.len(), 1, "the example has a notification");
    assert!(
        !format!("{config:?}").contains("XXXXXXXX"),
        "its URL is masked"
    );
    // Without the token, the example refuses to start, naming it.
    let error = sources(&SECRETS[..2]).load().unwrap_err();
    assert!(error.to_string().contains("admin.token"), "{error}");
}
