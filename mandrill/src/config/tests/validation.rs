//! Bounds and cross-checks: every refusal names its key.

use super::*;

#[test]
fn bad_values_name_their_key() {
    let cases = [
        (
            "[worker]\nmax_in_flight = \"many\"\n",
            "worker.max_in_flight",
        ),
        ("[worker]\nmax_in_flight = 0\n", "worker.max_in_flight"),
        ("[broker]\nack_deadline = \"soon\"\n", "broker.ack_deadline"),
        (
            "[restarter]\nfailure_rate = 2.0\n",
            "restarter.failure_rate",
        ),
        ("[message]\ndomain = \"bad_domain\"\n", "message.domain"),
        ("[restarter]\nkind = \"teleport\"\n", "restarter.kind"),
        ("[restarter]\nkind = \"ssh\"\n", "restarter.ssh."),
        (
            "[restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"x\", \"{hostname}\"]\n",
            "restarter.command.argv",
        ),
        (
            "[restarter]\nkind = \"http\"\n[restarter.http]\nurl = \"ftp://x/{host}\"\n",
            "restarter.http.url",
        ),
        // Verification must fit inside the worker's wait for a restart.
        (
            "[verify]\nprobe = \"tcp\"\nport = 22\ntimeout = \"60s\"\n",
            "worker.restart_timeout",
        ),
        ("[verify]\nprobe = \"tcp\"\n", "verify.port"),
        ("[[hosts]]\npattern = \"\"\n", "hosts"),
        ("[log]\nformat = \"xml\"\n", "log.format"),
        ("[broker]\nmax_deliveries = 2\n", "broker.max_deliveries"),
        ("[broker]\npoll_interval = \"0s\"\n", "broker.poll_interval"),
        ("[broker]\nurl = \"kafka://x\"\n", "broker.url"),
        ("[store]\nurl = \"mysql://x\"\n", "store.url"),
    ];
    for (file, key) in cases {
        let error = load(Some(file), &[], &[]).unwrap_err().to_string();
        assert!(error.contains(key), "{file:?}: {error}");
    }
    let syntax = load(Some("[worker\n"), &[], &[]).unwrap_err().to_string();
    assert!(syntax.contains("not valid toml"), "{syntax}");
}

/// Plain http to a webhook that is not on loopback needs its own setting;
/// the refusal names the URL's key and that setting.
#[test]
fn plain_http_to_a_remote_webhook_is_refused_unless_allowed() {
    let http = |extra: &str| {
        format!(
            "[restarter]\nkind = \"http\"\n[restarter.http]\n\
             url = \"http://chaos.internal/restart/{{instance_name}}\"\n{extra}"
        )
    };
    let error = load(Some(&http("")), &[], &[]).unwrap_err().to_string();
    assert!(error.contains("restarter.http.url"), "{error}");
    assert!(
        error.contains("restarter.http.allow_plain_http = true"),
        "{error}"
    );
    load(Some(&http("allow_plain_http = true\n")), &[], &[]).unwrap();
    let loopback = "[restarter]\nkind = \"http\"\n[restarter.http]\n\
                    url = \"http://127.0.0.1:8080/restart/{instance_name}\"\n";
    load(Some(loopback), &[], &[]).unwrap();
}

/// The ssh backend's restart takes a connection (2 × connect_timeout,
/// retries included), the command, and the kill of a command that timed
/// out: the worker must wait longer than all three.
#[test]
fn the_restart_timeout_covers_the_ssh_connection_the_command_and_its_kill() {
    let ssh = |restart_timeout: &str| {
        format!(
            "[worker]\nrestart_timeout = \"{restart_timeout}\"\n\
             [restarter]\nkind = \"ssh\"\n[restarter.ssh]\nargv = [\"true\"]\n\
             user = \"chaos\"\nknown_hosts_file = \"/etc/mandrill/known_hosts\"\n\
             connect_timeout = \"5s\"\ntimeout = \"15s\"\n"
        )
    };
    // 2 × 5s + 15s = 25s, + 4s for the kill.
    let error = load(Some(&ssh("27s")), &[], &[]).unwrap_err().to_string();
    assert!(error.contains("worker.restart_timeout"), "{error}");
    assert!(error.contains("kill"), "{error}");
    load(Some(&ssh("30s")), &[], &[]).unwrap();
}

/// Extremes of every bounded setting: each is refused naming its key, or
/// accepted; none panics.
#[test]
fn extremes_are_refused_naming_their_key() {
    let huge = "18446744073709551615";
    let refused = [
        ("worker.max_in_flight", huge),
        ("worker.max_in_flight", "9223372036854775807"),
        ("worker.max_in_flight", "1000001"),
        ("worker.max_in_flight", "-1"),
        ("worker.pull_batch", "10001"),
        ("restarter.blocking_threads", "9223372036854775807"),
        ("restarter.blocking_threads", "513"),
        ("store.max_connections", "4000000000"),
        ("store.max_connections", "1001"),
        ("store.writers", "0"),
        ("store.writers", "65"),
        ("store.timeout", "999ms"),
        ("store.timeout", "0s"),
        ("store.timeout", "2h"),
        ("message.max_payload_bytes", "9223372036854775807"),
        ("worker.shutdown_grace", "1000000000years"),
        ("worker.shutdown_grace", "366days"),
        // Used as a nack's delay and in the guards' look-back arithmetic:
        // unbounded, they could overflow an `Instant` (a panic).
        ("safety.budget.retry", "300000000000y"),
        // Names are matched in lower case: this would deny nothing.
        ("safety.deny", "[\"DB-*\"]"),
        ("safety.allow", "[\"Web-*\"]"),
        // Keys no validation lists: the parse itself bounds every duration.
        ("inventory.timeout", "300000000000y"),
        ("inventory.refresh", "366days"),
        ("restarter.ec2.stopped_for", "366days"),
        ("store.retention", "101years"),
        ("safety.max_defer", "366days"),
        ("safety.rate.window", "1000000000years"),
        ("safety.rate.host_cooldown", "366days"),
        ("safety.budget.forget_after", "366days"),
        ("worker.restart_timeout", "1000000000years"),
        ("worker.retry_max", "99999999999999999999years"),
        ("broker.ack_deadline", "5ms"),
        ("broker.ack_deadline", "999ms"),
        ("broker.ack_deadline", "1000000000years"),
        ("broker.poll_wait", "1000000000years"),
        ("worker.lease_extension_interval", "6s"),
        ("worker.lease_extension_interval", "0s"),
        ("debug.stall_threshold", "0s"),
        ("debug.status_interval", "1000000000years"),
        ("simulate.rate", "1e300"),
        ("simulate.rate", "nan"),
        ("simulate.rate", "inf"),
        ("restarter.failure_rate", "nan"),
        ("restarter.failure_rate", "-0.1"),
        ("broker.nats.max_ack_pending", "-5"),
        ("broker.sqlite.poll_interval", "0s"),
        ("broker.pubsub.poll_interval", "0s"),
        ("broker.url", "kafka://x"),
        ("broker.url", "nats://"),
        ("broker.url", "nats://u:p@h:4222,nats://h:notaport"),
        // A queue nobody else can reach, lost at exit.
        ("broker.url", "sqlite::memory:"),
        ("store.url", "mysql://u:p@h/db"),
        ("store.url", "postgres://u:p@[::1"),
        ("log.level", "[[["),
    ];
    for (key, value) in refused {
        let flag = format!("{key}={value}");
        let error = load(None, &[], &[&flag]).unwrap_err().to_string();
        assert!(error.contains(key), "{flag}: {error}");
    }
    let accepted = [
        ("worker.max_in_flight", "1000000"),
        ("worker.pull_batch", "10000"),
        ("restarter.blocking_threads", "512"),
        ("store.max_connections", "1000"),
        ("store.writers", "64"),
        ("message.max_payload_bytes", "67108864"),
        ("worker.shutdown_grace", "365days"),
        ("store.retention", "36500days"),
        ("broker.ack_deadline", "1s"),
        ("worker.lease_extension_interval", "5s"),
        ("simulate.rate", "1000000"),
        ("broker.url", "nats://u:p@h:4222,nats://h:4223"),
        ("broker.url", "tls://h"),
        ("store.url", "postgresql://u@h/db?sslmode=require"),
    ];
    for (key, value) in accepted {
        let flag = format!("{key}={value}");
        let config = load(None, &[], &[&flag]).unwrap_or_else(|e| panic!("{flag}: {e}"));
        let _ = config.worker_config();
    }
}

/// With 0s the switch was read only by claims: the first pause stopped
/// pulling, and nothing read the switch again to see `resume`.
#[test]
fn a_zero_safety_poll_interval_is_refused_naming_the_key() {
    for layer in ["safety.poll_interval=0s", "safety.poll_interval=0ms"] {
        let error = load(None, &[], &[layer]).unwrap_err().to_string();
        assert!(error.contains("safety.poll_interval"), "{layer}: {error}");
        assert!(error.contains("longer than 0s"), "{layer}: {error}");
        assert!(
            error.contains("to see `mandrill resume`") && !error.contains("  "),
            "one sentence, no run of spaces: {error}"
        );
    }
    let config = load(None, &[], &["safety.poll_interval=100ms"]).unwrap();
    assert_eq!(
        config.worker_config().switch_poll_interval,
        Duration::from_millis(100)
    );
}

#[test]
fn lease_extension_must_land_well_inside_the_lease() {
    let error = load(
        None,
        &[],
        &[
            "broker.ack_deadline=2s",
            "worker.lease_extension_interval=1500ms",
        ],
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("worker.lease_extension_interval"),
        "{error}"
    );
}

#[test]
fn admin_off_loopback_needs_a_token_and_the_token_is_masked() {
    let default = load(None, &[], &[]).unwrap();
    let range = |ip: &str, first_port, last_port| crate::config::AdminListen {
        ip: ip.parse().unwrap(),
        first_port,
        last_port,
    };
    assert_eq!(
        default.admin.address().unwrap(),
        Some(range("127.0.0.1", 9730, 9739))
    );
    let one = load(None, &[], &["admin.listen=127.0.0.1:9730"]).unwrap();
    assert_eq!(
        one.admin.address().unwrap(),
        Some(range("127.0.0.1", 9730, 9730))
    );
    let v6 = load(None, &[], &["admin.listen=[::1]:9000-9001"]).unwrap();
    assert_eq!(v6.admin.address().unwrap(), Some(range("::1", 9000, 9001)));
    assert_eq!(
        v6.admin.address().unwrap().unwrap().to_string(),
        "[::1]:9000-9001"
    );
    for nonsense in [
        "127.0.0.1:9739-9730",
        "127.0.0.1:0-9",
        "127.0.0.1:1-70000",
        "[::1:1-2",
    ] {
        let error = load(None, &[], &[&format!("admin.listen={nonsense}")]).unwrap_err();
        assert!(
            error.to_string().contains("admin.listen"),
            "{nonsense}: {error}"
        );
    }
    let disabled = load(None, &[], &["admin.listen="]).unwrap();
    assert_eq!(disabled.admin.address().unwrap(), None);
    let open = load(None, &[], &["admin.listen=0.0.0.0:9730"]).unwrap_err();
    assert!(open.to_string().contains("admin.token"), "{open}");
    let empty = load(None, &[], &["admin.listen=[::]:1", "admin.token="]).unwrap_err();
    assert!(empty.to_string().contains("admin.token"), "{empty}");
    // No client could send these: the API would refuse every action.
    for unsendable in ["s3cret\n", " s3cret", "tökén", "tab\there"] {
        let error = load(None, &[("MANDRILL_ADMIN__TOKEN", unsendable)], &[]).unwrap_err();
        assert!(
            error.to_string().contains("admin.token"),
            "{unsendable:?}: {error}"
        );
    }
    let spaced = load(None, &[("MANDRILL_ADMIN__TOKEN", "two words")], &[]).unwrap();
    assert!(spaced.admin.token.is_some());
    let bad = load(None, &[], &["admin.listen=localhost"]).unwrap_err();
    assert!(bad.to_string().contains("admin.listen"), "{bad}");
    let numeric = load(None, &[("MANDRILL_ADMIN__TOKEN", "12345")], &[]).unwrap();
    assert_eq!(numeric.admin.token, Some(Secret("12345".into())));
    let config = load(
        None,
        &[("MANDRILL_ADMIN__TOKEN", "s3cret-admin")],
        &["admin.listen=0.0.0.0:0"],
    )
    .unwrap();
    assert!(!format!("{config:?}").contains("s3cret-admin"));
    assert!(
        !config
            .redactor()
            .scrub("token s3cret-admin")
            .contains("s3cret-admin")
    );
}

#[test]
fn notify_entries_are_checked_by_index_and_their_urls_masked() {
    let webhook = "https://hooks.example/services/T0/B0/s3cret-hook";
    let config = load(
        Some(&format!(
            "[[notify]]\nurl = \"{webhook}\"\nformat = \"slack\"\n\
             events = [\"paused\", \"unrecovered\"]\n\
             [[notify]]\nurl = \"http://127.0.0.1:9/hook\"\nevents = [\"restarted\"]\n\
             timeout = \"2s\"\n[notifier]\nflush_timeout = \"1s\"\n"
        )),
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(config.notify.len(), 2);
    assert_eq!(config.notify[0].format, crate::notify::Format::Slack);
    assert_eq!(config.notify[1].timeout, Duration::from_secs(2));
    assert_eq!(config.notifier.flush_timeout, Duration::from_secs(1));
    assert!(!format!("{config:?}").contains("s3cret-hook"));
    let redactor = config.redactor();
    for text in [webhook, "POST /services/T0/B0/s3cret-hook failed"] {
        assert!(!redactor.scrub(text).contains("s3cret-hook"), "{text}");
    }
    let cases = [
        (
            "[[notify]]\nurl = \"https://h/s3cret-hook\"\nevents = [\"restarted\", \"exploded\"]\n",
            "notify[0].events[1]",
        ),
        (
            "[[notify]]\nurl = \"https://h/x\"\nevents = [\"paused\"]\n\
             [[notify]]\nurl = \"ftp://h/s3cret-hook\"\nevents = [\"paused\"]\n",
            "notify[1].url",
        ),
        (
            "[[notify]]\nurl = \"https://h/s3cret-hook\"\nevents = []\n",
            "notify[0].events",
        ),
        ("[[notify]]\nevents = [\"paused\"]\n", "notify[0]"),
        (
            "[notifier]\nqueue_capacity = 0\n",
            "notifier.queue_capacity",
        ),
    ];
    for (file, key) in cases {
        let error = load(Some(file), &[], &[]).unwrap_err().to_string();
        assert!(error.contains(key), "{file:?}: {error}");
        assert!(!error.contains("s3cret-hook"), "{error}");
    }
}

#[test]
fn pubsub_settings_come_from_every_layer_and_are_bounded() {
    let config = load(
        Some(
            "[broker]\nurl = \"pubsub://proj/requests\"\n\
             [broker.pubsub]\ntopic = \"from-file\"\npull = \"streaming\"\n",
        ),
        &[("MANDRILL_BROKER__PUBSUB__DEAD_LETTER_TOPIC", "from-env")],
        &["broker.pubsub.dead_letter_subscription=dead-from-flag"],
    )
    .unwrap();
    let pubsub = &config.broker.pubsub;
    assert_eq!(pubsub.topic, "from-file");
    assert_eq!(pubsub.dead_letter_topic, "from-env");
    assert_eq!(pubsub.pull, crate::broker::pubsub::PullMode::Streaming);
    // Taken as a string even though it starts like a number (and then
    // refused by Pub/Sub's naming rule, naming the key).
    let error = load(
        None,
        &[],
        &[
            "broker.url=pubsub://proj/requests",
            "broker.pubsub.topic=123",
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("broker.pubsub.topic"), "{error}");
    let cases = [
        ("broker.url=pubsub://proj", "broker.url"),
        ("broker.ack_deadline=5s", "broker.ack_deadline"),
        ("broker.ack_deadline=11m", "broker.ack_deadline"),
        (
            "broker.pubsub.endpoint=http://nohost",
            "broker.pubsub.endpoint",
        ),
        (
            "broker.pubsub.dead_letter_topic=mandrill-requests",
            "broker.pubsub.dead_letter_topic",
        ),
    ];
    for (flag, key) in cases {
        let flags = ["broker.url=pubsub://proj/requests", flag];
        let error = load(None, &[], &flags).unwrap_err().to_string();
        assert!(error.contains(key), "{flag}: {error}");
    }
    // Not checked unless Pub/Sub is the broker.
    load(None, &[], &["broker.pubsub.topic=x"]).unwrap();
}

#[test]
fn postgres_needs_two_connections_naming_the_key() {
    let error = load(
        None,
        &[],
        &["store.url=postgres://u@h/db", "store.max_connections=1"],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("store.max_connections"), "{error}");
    assert!(error.contains("at least 2 with PostgreSQL"), "{error}");
    load(
        None,
        &[],
        &["store.url=postgres://u@h/db", "store.max_connections=2"],
    )
    .unwrap();
    load(None, &[], &["store.max_connections=1"]).unwrap();
}

#[test]
fn the_generated_admin_token_is_kept_beside_the_sqlite_store_unless_configured() {
    let with = |store: &str, set: &[(&str, &str)]| {
        let mut config = Config::default();
        config.store.url = store.into();
        for (key, value) in set {
            match *key {
                "admin.token" => {
                    config.admin.token = Some(crate::settings::Secret((*value).into()))
                }
                "admin.token_file" => config.admin.token_file = Some((*value).into()),
                "admin.listen" => config.admin.listen = (*value).into(),
                _ => unreachable!("{key}"),
            }
        }
        config.admin_token_file()
    };
    let path = |p: &str| Some(std::path::PathBuf::from(p));
    assert_eq!(
        with("sqlite:/var/lib/mandrill/m.db", &[]),
        path("/var/lib/mandrill/m.db.admin-token")
    );
    assert_eq!(
        with("sqlite://state/m.db?mode=rwc", &[]),
        path("state/m.db.admin-token")
    );
    assert_eq!(with("sqlite::memory:", &[]), path("mandrill-admin.token"));
    assert_eq!(with("postgres://h/db", &[]), path("mandrill-admin.token"));
    assert_eq!(
        with("memory", &[("admin.token_file", "/run/m/t")]),
        path("/run/m/t")
    );
    // None generated with a configured token, or without the server.
    assert_eq!(with("sqlite:m.db", &[("admin.token", "t")]), None);
    assert_eq!(with("sqlite:m.db", &[("admin.listen", "")]), None);
}

#[test]
fn an_inventory_has_exactly_one_source_and_its_url_is_masked() {
    let config = load(
        Some(
            "[inventory]\nurl = \"https://ops:s3cret-pw@cmdb.example/hosts\"\nrefresh = \"1m\"\n\
             max_age = \"10m\"\n",
        ),
        &[],
        &[],
    )
    .unwrap();
    assert!(config.inventory.is_configured());
    assert!(
        !config
            .redactor()
            .scrub("GET https://ops:s3cret-pw@cmdb.example/hosts")
            .contains("s3cret-pw")
    );
    let cases = [
        (
            "[inventory]\nfile = \"hosts.toml\"\ncommand = [\"ansible-inventory\", \"--list\"]\n",
            "inventory.file and inventory.command",
        ),
        (
            "[inventory]\nfile = \"hosts.toml\"\nurl = \"https://h/s3cret-pw\"\n",
            "inventory.url",
        ),
        ("[inventory]\ncommand = [\"\"]\n", "inventory.command"),
        (
            "[inventory]\nurl = \"ftp://ops:s3cret-pw@h/x\"\n",
            "inventory.url",
        ),
        (
            "[inventory]\nfile = \"h.toml\"\nrefresh = \"1h\"\nmax_age = \"10m\"\n",
            "inventory.max_age",
        ),
        ("[inventory]\nrefresh = \"0s\"\n", "inventory.refresh"),
        ("[inventory]\nfiles = \"h.toml\"\n", "inventory.files"),
    ];
    for (file, key) in cases {
        let error = load(Some(file), &[], &[]).unwrap_err().to_string();
        assert!(error.contains(key), "{file:?}: {error}");
        assert!(!error.contains("s3cret-pw"), "{error}");
    }
}
