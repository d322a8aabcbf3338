//! Secrets are never printed, with the real binary: whatever is
//! unreachable, refused or reached, a credential given in a URL, the
//! environment or a file appears in no log line, error or command output.

mod services;
mod support;

use services::{Database, NatsNames, PrivateNats, free_port};
use support::{CANARY, Mandrill, NUMERIC_CANARY, assert_no_canary, mandrill, temp_dir};

/// Environment variables for one run.
type Env<'a> = &'a [(&'a str, &'a str)];

#[test]
fn secrets_are_never_printed_when_servers_are_unreachable() {
    let (_guard, dir) = temp_dir();
    let closed = free_port();
    let nats = format!("nats://mandrill:{CANARY}@127.0.0.1:{closed}");
    let nats_token = format!("nats://{CANARY}@127.0.0.1:{closed}");
    let postgres = format!(
        "postgres://mandrill:{CANARY}@127.0.0.1:{closed}/db?password={CANARY}&sslpassword={CANARY}"
    );
    let config = dir.join("secret.toml");
    std::fs::write(
        &config,
        format!("[broker.nats]\npassword = {NUMERIC_CANARY}\n"),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    // The section's retired name is refused, its secret not echoed.
    let old_config = dir.join("old-secret.toml");
    std::fs::write(
        &old_config,
        format!("[nats]\npassword = {NUMERIC_CANARY}\n"),
    )
    .unwrap();
    let old_config = old_config.to_str().unwrap();
    let plain_nats = format!("nats://127.0.0.1:{closed}");
    let numeric_env = [
        ("MANDRILL_BROKER__NATS__USER", "mandrill"),
        ("MANDRILL_BROKER__NATS__PASSWORD", NUMERIC_CANARY),
    ];
    let old_numeric_env = [
        ("MANDRILL_NATS__USER", "mandrill"),
        ("MANDRILL_NATS__PASSWORD", NUMERIC_CANARY),
    ];
    let help_env = [
        ("MANDRILL_BROKER__URL", nats.as_str()),
        ("MANDRILL_STORE__URL", postgres.as_str()),
    ];
    let cases: Vec<(Vec<&str>, Env, Option<i32>)> = vec![
        (
            vec!["run", "--broker", &nats, "--db", "memory"],
            &[],
            Some(1),
        ),
        (
            vec![
                "run",
                "--broker",
                &nats,
                "--db",
                "memory",
                "--log-format",
                "json",
            ],
            &[],
            Some(1),
        ),
        (
            vec!["run", "--broker", &nats_token, "--db", "memory"],
            &[],
            Some(1),
        ),
        (
            vec!["run", "--broker", "memory", "--db", &postgres],
            &[],
            Some(1),
        ),
        (vec!["publish", "--broker", &nats, "cattle-1"], &[], Some(1)),
        (vec!["history", "--db", &postgres], &[], Some(1)),
        // A password that reads as a number is still a password.
        (
            vec!["run", "--broker", &plain_nats, "--db", "memory"],
            &numeric_env,
            Some(1),
        ),
        (
            vec!["run", "--broker", &plain_nats, "--db", "memory"],
            &old_numeric_env,
            Some(2),
        ),
        (
            vec!["run", "--config", config, "--db", "memory"],
            &[],
            Some(2),
        ),
        (
            vec!["run", "--config", old_config, "--db", "memory"],
            &[],
            Some(2),
        ),
        (vec!["run", "--help"], &help_env, Some(0)),
        (
            vec![
                "run",
                "--broker",
                "kafka://u:CANARY-s3cr3t-7f3a@h",
                "--db",
                "memory",
            ],
            &[],
            Some(2),
        ),
    ];
    for (args, env, code) in cases {
        let (status, stdout, stderr) = mandrill(&dir, &args, env);
        let what = format!("{args:?}");
        assert_eq!(status.code(), code, "{what}: {stderr}");
        assert_no_canary(&what, &stdout);
        assert_no_canary(&what, &stderr);
    }
}

#[test]
fn credentials_in_a_nats_url_authenticate_and_are_never_printed() {
    let (_guard, dir) = temp_dir();
    let server = PrivateNats::start_with_user("mandrill", CANARY);
    let names = NatsNames::new(&server.url());
    let flags = names.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let url = format!("nats://mandrill:{CANARY}@127.0.0.1:{}", server.port);

    let (status, stdout, stderr) = mandrill(
        &dir,
        &[&["publish", "--broker", &url, "cattle-auth"], &flags[..]].concat(),
        &[],
    );
    assert!(status.success(), "{stderr}");
    assert_no_canary("publish", &stdout);
    assert_no_canary("publish", &stderr);

    let service = Mandrill::run(
        &dir,
        &[
            &[
                "--broker",
                &url,
                "--db",
                "memory",
                "--simulate=50",
                "--set",
                "restarter.max_latency=10ms",
                "--set",
                "restarter.failure_rate=0",
            ],
            &flags[..],
        ]
        .concat(),
    );
    service.wait_for("acked", 5);
    service.signal("TERM");
    let raw = service.raw();
    let (status, _) = service.wait_exit();
    assert!(status.success(), "{raw}");
    assert_no_canary("run", &raw);

    // The same credentials as settings.
    let plain = server.url();
    let password = format!("broker.nats.password={CANARY}");
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            &["publish", "--broker", &plain, "cattle-auth"],
            &["--set", "broker.nats.user=mandrill", "--set", &password][..],
            &flags[..],
        ]
        .concat(),
        &[],
    );
    assert!(status.success(), "{stderr}");
    assert_no_canary("publish with broker.nats.password", &stdout);
    assert_no_canary("publish with broker.nats.password", &stderr);

    // A wrong password is refused, and not printed either.
    let wrong = format!("nats://mandrill:{NUMERIC_CANARY}@127.0.0.1:{}", server.port);
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[&["run", "--broker", &wrong, "--db", "memory"], &flags[..]].concat(),
        &[],
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("broker.url"), "{stderr}");
    assert_no_canary("run with a wrong password", &stdout);
    assert_no_canary("run with a wrong password", &stderr);
}

#[test]
fn secrets_are_never_printed_with_a_reachable_postgres() {
    let (_guard, dir) = temp_dir();
    let database = Database::create();
    // The driver ignores `sslpassword` here, and logs it as it does so.
    let separator = if database.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}sslpassword={CANARY}", database.url);
    let service = Mandrill::run(
        &dir,
        &[
            "--broker",
            "memory",
            "--db",
            &url,
            "--simulate=50",
            "--set",
            "restarter.max_latency=10ms",
        ],
    );
    service.wait_for("acked", 3);
    service.signal("TERM");
    let raw = service.raw();
    let (status, _) = service.wait_exit();
    assert!(status.success(), "{raw}");
    assert_no_canary("run", &raw);

    let (status, stdout, stderr) = mandrill(&dir, &["history", "--db", &url], &[]);
    assert!(status.success(), "{stderr}");
    assert_no_canary("history", &stdout);
    assert_no_canary("history", &stderr);
}
