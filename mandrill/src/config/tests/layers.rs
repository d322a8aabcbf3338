//! Layering (file, environment, flags), what counts as a setting, the
//! help, and what a reload compares.

use super::*;

#[test]
fn flags_beat_environment_beat_file_beat_defaults() {
    let config = load(
        Some("[worker]\nmax_in_flight = 5\nmax_attempts = 7\nshutdown_grace = \"3s\"\n"),
        &[
            ("MANDRILL_WORKER__MAX_ATTEMPTS", "8"),
            ("MANDRILL_LOG__LEVEL", "debug"),
        ],
        &["worker.max_attempts=9"],
    )
    .unwrap();
    assert_eq!(config.worker.max_in_flight, 5);
    assert_eq!(config.worker.max_attempts, 9);
    assert_eq!(config.worker.shutdown_grace, Duration::from_secs(3));
    assert_eq!(config.log.level, "debug");
    assert_eq!(
        config.worker.pull_batch,
        WorkerSettings::default().pull_batch
    );
}

#[test]
fn unknown_key_is_named_whatever_layer_it_came_from() {
    let from_file = load(Some("[worker]\nmax_in_flght = 5\n"), &[], &[]).unwrap_err();
    assert!(
        from_file.to_string().contains("max_in_flght"),
        "{from_file}"
    );
    let from_env = load(None, &[("MANDRILL_WORKER__MAX_IN_FLGHT", "5")], &[]).unwrap_err();
    assert!(from_env.to_string().contains("max_in_flght"), "{from_env}");
    let section = load(Some("[wroker]\nx = 1\n"), &[], &[]).unwrap_err();
    assert!(section.to_string().contains("wroker"), "{section}");
    let shape = load(None, &[("MANDRILL_MAX_IN_FLIGHT", "5")], &[]).unwrap_err();
    assert!(
        shape.to_string().contains("MANDRILL_MAX_IN_FLIGHT"),
        "{shape}"
    );
}

#[test]
fn only_section_key_variables_are_configuration() {
    for name in [
        "MANDRILL_TEST_POSTGRES",
        "MANDRILL_TEST_NATS",
        "MANDRILL_CONFIG",
        "MANDRILL_TESTING",
        "PATH",
    ] {
        assert!(!is_config_variable(name), "{name}");
    }
    for name in [
        "MANDRILL_WORKER__MAX_IN_FLIGHT",
        "MANDRILL_WORKER_MAX_IN_FLIGHT",
        "MANDRILL_MAX_IN_FLIGHT",
        "MANDRILL_NOPE__X",
    ] {
        assert!(is_config_variable(name), "{name}");
    }
    let error = load(None, &[("MANDRILL_WORKER_MAX_IN_FLIGHT", "5")], &[]).unwrap_err();
    assert!(
        error.to_string().contains("MANDRILL_WORKER__MAX_IN_FLIGHT"),
        "{error}"
    );
}

#[test]
fn every_setting_is_documented_in_help() {
    let documented: Vec<String> = docs::documented_keys().collect();
    let mut config = Config::default();
    config.worker.lease_extension_interval = Some(Duration::from_secs(1));
    config.restarter.journal = Some(PathBuf::from("restarts.log"));
    config.broker.nats.user = Some("u".into());
    config.broker.nats.password = Some(Secret("p".into()));
    config.broker.nats.token = Some(Secret("t".into()));
    config.broker.nats.creds_file = Some(PathBuf::from("x.creds"));
    config.broker.nats.tls_ca_file = Some(PathBuf::from("ca.pem"));
    config.restarter.command.working_dir = Some(PathBuf::from("/"));
    config.restarter.ssh.user = Some("chaos".into());
    config.restarter.ssh.key_file = Some(PathBuf::from("id"));
    config.restarter.ssh.agent_socket = Some(PathBuf::from("agent"));
    config.restarter.ssh.known_hosts_file = Some(PathBuf::from("known_hosts"));
    config.restarter.http.hmac_secret_file = Some(PathBuf::from("key"));
    config.restarter.http.hmac_secret_env = Some("KEY".into());
    config.restarter.http.ca_file = Some(PathBuf::from("ca.pem"));
    config.verify.port = Some(22);
    config.safety.dry_run = Some(true);
    config.safety.rate.group_max = Some(1);
    config.safety.rate.global_max = Some(10);
    config.safety.budget.max_disrupted = Some(1);
    config.safety.budget.max_disrupted_percent = Some(20);
    config.safety.budget.max_disrupted_per_zone = Some(1);
    config.safety.pause_file = Some(PathBuf::from("/run/mandrill/PAUSE"));
    config.safety.calendar = Some(CalendarSettings {
        weekdays: Some(vec!["mon".into()]),
        hours: Some(vec!["09:00-15:00".into()]),
        timezone: Some("UTC".into()),
        ..CalendarSettings::default()
    });
    config.admin.token = Some(Secret("t".into()));
    config.admin.token_file = Some(PathBuf::from("admin-token"));
    config.admin.instances_dir = Some(PathBuf::from("instances"));
    config.verify.url = Some("http://{host}/".into());
    config.hosts = vec![HostEntry {
        pattern: "cattle-*".into(),
        address: None,
        port: None,
        user: None,
    }];
    config.notify = vec![crate::notify::NotifyEntry {
        url: Secret("https://hooks.example/x".into()),
        format: crate::notify::Format::Json,
        events: vec![crate::notify::EventKind::Paused],
        timeout: Duration::from_secs(5),
    }];
    config.safety.require_signed = Some(true);
    config.safety.audience = Some("prod".into());
    config.requesters = vec![crate::safety::RequesterSettings {
        name: "alice".into(),
        public_key: None,
        public_key_file: Some(PathBuf::from("alice.pub")),
        allow: vec!["cattle-*".into()],
        groups: Vec::new(),
        quota: None,
    }];
    config.schedule = vec![crate::schedule::ScheduleSettings {
        name: "drip".into(),
        group: "cattle".into(),
        mean_time_between: Duration::from_secs(3600),
        requester: None,
        key_file: None,
        max_lateness: crate::schedule::DEFAULT_MAX_LATENESS,
    }];
    config.recovery_objective = vec![crate::safety::objectives::RecoveryObjective {
        group: "cattle".into(),
        max: Duration::from_secs(120),
        ..Default::default()
    }];
    config.broker.pubsub.endpoint = Some("http://127.0.0.1:8085".into());
    config.broker.pubsub.credentials_file = Some(PathBuf::from("key.json"));
    // One source is valid; all three are set here only to be flattened.
    config.inventory.file = Some(PathBuf::from("hosts.toml"));
    config.inventory.command = vec!["ansible-inventory".into()];
    config.inventory.url = Some("https://cmdb.example/hosts".into());
    config.inventory.ec2 = Some(crate::inventory::Ec2InventorySettings {
        region: Some("us-east-1".into()),
        endpoint_url: Some("https://ec2.example".into()),
        filters: [("tag:chaos".to_owned(), vec!["yes".to_owned()])].into(),
        ..Default::default()
    });
    config.restarter.ec2.region = Some("us-east-1".into());
    config.restarter.ec2.endpoint_url = Some("https://ec2.example".into());
    config.restarter.ec2.autoscaling_endpoint_url = Some("https://autoscaling.example".into());
    for key in config.flatten().keys() {
        assert!(
            documented.contains(key),
            "{key} has no doc: a field doc in its section"
        );
    }
    let flat = config.flatten();
    let undocumented: Vec<&String> = documented
        .iter()
        .filter(|key| !flat.contains_key(*key))
        .collect();
    assert!(
        undocumented.is_empty(),
        "documented but no setting: {undocumented:?}"
    );
    assert_eq!(documented.len(), flat.len());
    // And each says something in the help.
    for (key, doc) in docs::documented() {
        assert!(!crate::settings::summary(doc).is_empty(), "{key}");
    }
    let help = settings_help();
    assert!(help.contains("broker.nats.password"), "{help}");
    assert!(help.contains("broker.sqlite.poll_interval"), "{help}");
}

#[test]
fn a_reload_applies_safety_but_its_poll_and_pause_file() {
    for key in [
        "log.level",
        "safety.deny",
        "safety.calendar.hours",
        "safety.stop_conditions",
    ] {
        assert!(reloads(key), "{key}");
    }
    for key in [
        "broker.ack_deadline",
        "safety.poll_interval",
        "safety.pause_file",
    ] {
        assert!(!reloads(key), "{key}");
    }
}

#[test]
fn changed_keys_lists_what_a_reload_changes() {
    let old = Config::default();
    let mut new = old.clone();
    new.worker.max_in_flight = 7;
    new.broker.ack_deadline = Duration::from_secs(30);
    assert_eq!(
        old.changed_keys(&new),
        ["broker.ack_deadline", "worker.max_in_flight"]
    );
}

/// Configuration depends on the modules whose settings it embeds or builds,
/// never the reverse: no broker, store, restarter, worker, safety or notify
/// file names `crate::config`, so the adapters own their sections and no
/// dependency cycles back.
#[test]
fn what_config_embeds_never_imports_config() {
    fn sources(dir: &std::path::Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for dir in [
        "broker",
        "store",
        "restarter",
        "worker",
        "safety",
        "notify",
        "inventory",
        "schedule",
    ] {
        sources(&src.join(dir), &mut files);
    }
    assert!(files.len() > 20, "{files:?}");
    let offenders: Vec<_> = files
        .iter()
        .filter(|path| {
            std::fs::read_to_string(path)
                .unwrap()
                .contains("crate::config")
        })
        .collect();
    assert!(offenders.is_empty(), "{offenders:?}");
}

/// What `/api/status` and `mandrill status` say set the leash at start-up:
/// the last layer that sets `safety.dry_run`, else the backend's default.
#[test]
fn the_leash_is_said_to_be_set_by_the_last_layer_that_sets_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mandrill.toml");
    std::fs::write(&path, "[safety]\ndry_run = true\n").unwrap();
    let sources = |file: bool, env: &[(&str, &str)], flags: &[&str]| Sources {
        file: file.then(|| path.clone()),
        environment: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        overrides: flags.iter().map(|f| parse_override(f).unwrap()).collect(),
    };
    let by = |sources: Sources| sources.dry_run_set_by(&sources.load().unwrap());
    let unleashed = by(sources(
        true,
        &[("MANDRILL_SAFETY__DRY_RUN", "true")],
        &["safety.dry_run=false"],
    ));
    assert!(unleashed.contains("--unleash"), "{unleashed}");
    let environment = by(sources(true, &[("MANDRILL_SAFETY__DRY_RUN", "true")], &[]));
    assert_eq!(environment, "the environment (MANDRILL_SAFETY__DRY_RUN)");
    assert_eq!(by(sources(true, &[], &[])), "the configuration file");
    let default = by(sources(false, &[], &[]));
    assert!(default.starts_with("the default for the"), "{default}");
}
