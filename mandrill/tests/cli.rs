//! The real binary, real signals, real SQLite: draining at SIGTERM, reloads,
//! malformed messages, configuration refused at start, plain output to pipes.

mod services;
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mandrill::Status;
use serde_json::Value;
use services::free_port;
use support::{
    DEADLINE, Mandrill, binary, count, fields_of, history, mandrill, sqlite_url, temp_dir,
};

#[test]
fn sigterm_drains_and_every_message_is_recorded_and_acked_or_nacked() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let service = Mandrill::run(
        &dir,
        &[
            "--broker",
            "memory",
            "--db",
            &db,
            "--simulate=200",
            "--set",
            "restarter.max_latency=50ms",
            "--set",
            "restarter.failure_rate=0.2",
            "--set",
            "worker.retry_initial=10ms",
            "--set",
            "worker.shutdown_grace=5s",
        ],
    );
    service.wait_for("mandrill started", 1);
    service.wait_for("acked", 50);
    service.wait_for("nacked", 1);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");

    let stats = fields_of(&lines, "final stats");
    let pulled = count(&stats, "pulled");
    let acked = count(&stats, "acked");
    let nacked = count(&stats, "nacked");
    let dead = count(&stats, "dead_lettered");
    assert_eq!(
        pulled,
        acked + nacked + dead,
        "a delivery was left unsettled: {stats}"
    );

    // The order of shutdown, as logged.
    let order: Vec<&str> = [
        "shutting down: stop pulling, let in-flight work finish",
        "stopped pulling; waiting for in-flight messages",
        "all in-flight messages settled",
        "store closed",
        "final stats",
        "mandrill stopped",
    ]
    .into();
    let positions: Vec<usize> = order
        .iter()
        .map(|m| {
            lines
                .iter()
                .position(|l| l["fields"]["message"] == *m)
                .unwrap_or_else(|| panic!("no {m:?} line"))
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");

    // Nothing half-done in the database: every acked message is recorded as
    // restarted, and no request is left mid-restart.
    let entries = history(&db);
    let with = |status: Status| entries.iter().filter(|e| e.status == status).count() as u64;
    assert_eq!(
        with(Status::Received),
        0,
        "a restart was issued but its outcome not recorded"
    );
    assert_eq!(with(Status::Restarted), acked);
    assert!(with(Status::Retrying) <= nacked);
}

#[test]
fn second_sigint_skips_the_grace_period() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    // One blocking thread and slow restarts: most messages wait for capacity.
    let service = Mandrill::run(
        &dir,
        &[
            "--db",
            &db,
            "--simulate=100",
            "--max-in-flight",
            "50",
            "--set",
            "restarter.kind=simulate-blocking",
            "--set",
            "restarter.blocking_threads=1",
            "--set",
            "restarter.min_latency=500ms",
            "--set",
            "restarter.max_latency=500ms",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "worker.shutdown_grace=1h",
        ],
    );
    service.wait_for("saved", 1);
    service.wait_for("published", 10);
    service.signal("INT");
    service.wait_for("stopped pulling; waiting for in-flight messages", 1);
    service.signal("INT");
    // Exits long before the hour of grace: the waiting messages are nacked,
    // the one restart already issued is still recorded.
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    fields_of(
        &lines,
        "second signal: skipping the rest of the grace period",
    );
    let stats = fields_of(&lines, "final stats");
    assert!(count(&stats, "nacked") >= 1, "{stats}");
    assert_eq!(
        count(&stats, "pulled"),
        count(&stats, "acked") + count(&stats, "nacked") + count(&stats, "dead_lettered")
    );
    assert!(history(&db).iter().all(|e| e.status != Status::Received));
}

/// The simulated quick start says nothing about settings its user never
/// set (no probe to warn about with a simulated backend), and a restart's
/// log line carries no `recovered_after` when nothing measured it (it read
/// `None` before; with a probe it reads as people read durations).
#[test]
fn the_quick_start_warns_only_about_what_its_user_set() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(&dir, &["--db", "memory", "--simulate=20"]);
    service.wait_for("restarted", 3);
    for line in service.messages("restarted") {
        assert!(line["fields"].get("recovered_after").is_none(), "{line}");
    }
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let warned: Vec<&Value> = lines
        .iter()
        .filter(|line| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("verification probe"))
        })
        .collect();
    assert!(warned.is_empty(), "{warned:?}");
}

#[test]
fn sighup_reloads_the_configuration_file() {
    let (_guard, dir) = temp_dir();
    let config = dir.join("mandrill.toml");
    std::fs::write(&config, "[worker]\nmax_in_flight = 10\n").unwrap();
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--db",
            "memory",
            "--simulate=5",
        ],
    );
    service.wait_for("mandrill started", 1);

    std::fs::write(
        &config,
        "[worker]\nmax_in_flight = 25\n[broker]\nack_deadline = \"30s\"\n",
    )
    .unwrap();
    service.signal("HUP");
    service.wait_for("configuration reloaded", 1);
    let limit = &service.wait_for("flow control limit changed", 1)[0]["fields"];
    assert_eq!(limit["max_in_flight"], 25);
    let reloaded: Vec<Value> = service
        .messages("setting reloaded")
        .into_iter()
        .map(|l| l["fields"]["key"].clone())
        .collect();
    assert_eq!(reloaded, ["worker.max_in_flight"]);
    let needs_restart: Vec<Value> = service
        .messages("setting changed, but takes effect only after a restart")
        .into_iter()
        .map(|l| l["fields"]["key"].clone())
        .collect();
    assert_eq!(needs_restart, ["broker.ack_deadline"]);

    // A broken file is refused and the service keeps running as it was.
    std::fs::write(&config, "[worker\n").unwrap();
    service.signal("HUP");
    service.wait_for("reload failed; keeping the running configuration", 1);
    service.wait_for("acked", 2);

    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success());
}

#[test]
fn malformed_messages_are_dead_lettered_while_valid_ones_flow() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let service = Mandrill::run(
        &dir,
        &[
            "--db",
            &db,
            "--simulate=300",
            "--set",
            "simulate.malformed_rate=0.3",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.max_latency=10ms",
        ],
    );
    service.wait_for("dead-lettered", 10);
    service.wait_for("acked", 10);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let stats = fields_of(&lines, "final stats");
    assert_eq!(count(&stats, "rejected"), count(&stats, "dead_lettered"));

    let (status, stdout, stderr) = mandrill(
        &dir,
        &["history", "--db", &db, "--json", "--limit", "100000"],
        &[],
    );
    assert!(status.success(), "{stderr}");
    let entries: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rejected: Vec<&Value> = entries
        .iter()
        .filter(|e| e["status"] == "rejected")
        .collect();
    assert_eq!(rejected.len() as u64, count(&stats, "rejected"));
    let reasons: Vec<&str> = rejected
        .iter()
        .map(|e| e["last_error"].as_str().unwrap())
        .collect();
    assert!(reasons.iter().all(|r| !r.is_empty()));
    assert!(entries.iter().any(|e| e["status"] == "restarted"));

    let (status, table, _) = mandrill(&dir, &["history", "--db", &db, "--limit", "5"], &[]);
    assert!(status.success());
    assert!(table.starts_with("RECEIVED"), "{table}");
    assert_eq!(table.lines().count(), 6);

    // A reader that has what it wanted (`history --json | head -1`) ends
    // the listing quietly, with more than a pipe's buffer left to write.
    let insert = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
         INSERT INTO requests (message_id, instance_name, hostname, status, attempts,
                               received_at, updated_at)
         SELECT lower(hex(randomblob(16))), 'cattle-' || i, 'cattle-' || i || '.example.net',
                'received', 0, i, i FROM n";
    let filled = std::process::Command::new("python3")
        .args(["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()"])
        .arg(dir.join("mandrill.db"))
        .arg(insert)
        .status()
        .unwrap();
    assert!(filled.success());
    let mut reading = std::process::Command::new(binary())
        .args(["history", "--db", &db, "--json", "--limit", "100000"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(reading.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.starts_with('{'), "{first}");
    let output = reading.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn bad_configuration_fails_at_start_naming_the_key() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["run", "--set", "worker.max_in_flght=3"], &[]);
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains("worker.max_in_flght"), "{stderr}");

    let (status, _, stderr) = mandrill(
        &dir,
        &["run", "--db", "memory"],
        &[("MANDRILL_WORKER__SHUTDOWN_GRACE", "soon")],
    );
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains("worker.shutdown_grace"), "{stderr}");

    let (status, _, stderr) = mandrill(
        &dir,
        &["run", "--broker", "kafka://x", "--db", "memory"],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("broker.url"), "{stderr}");

    // Would leave pulling stopped for good after the first pause.
    let (status, _, stderr) = mandrill(
        &dir,
        &["run", "--db", "memory", "--set", "safety.poll_interval=0s"],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("safety.poll_interval"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // A file that cannot be read: named once, and why once.
    let (status, _, stderr) = mandrill(&dir, &["run", "--config", "absent.toml"], &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("absent.toml").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    // Nothing was created by a run that could not start.
    assert!(!dir.join("mandrill.db").exists());
}

/// The demo publisher makes up instance names; with a real backend they
/// would be acted on, and published into a broker real publishers share.
#[test]
fn simulate_with_a_real_backend_is_refused_at_start_naming_both() {
    let (_guard, dir) = temp_dir();
    let broker = sqlite_url(&dir);
    std::fs::write(
        dir.join("real.toml"),
        "[restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"true\", \"{host}\"]\n\
         [safety]\nallow = [\"*\"]\n",
    )
    .unwrap();
    // Spawned, not run to completion: a binary that accepted this would
    // run until stopped (and fail the test at the deadline).
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            "real.toml",
            "--broker",
            &broker,
            "--db",
            &broker,
            "--simulate=50",
        ],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !service.raw().contains("simulate") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stderr = service.raw();
    let (status, _) = service.wait_exit_within(std::time::Duration::from_secs(10));
    assert_eq!(status.code(), Some(2), "{stderr}");
    for named in ["--simulate", "simulate.enabled", "restarter.kind = command"] {
        assert!(stderr.contains(named), "{named} not in {stderr}");
    }
    // Refused before anything was opened: nothing was published.
    assert!(!dir.join("mandrill.db").exists());
}

#[test]
fn unknown_url_schemes_exit_2_naming_the_key() {
    let (_guard, dir) = temp_dir();
    let cases: [(&[&str], &str); 4] = [
        (
            &["run", "--broker", "kafka://x", "--db", "memory"],
            "broker.url",
        ),
        (
            &["run", "--broker", "memory", "--db", "mysql://h/db"],
            "store.url",
        ),
        (
            &["publish", "--broker", "amqp://h", "cattle-1"],
            "broker.url",
        ),
        (&["history", "--db", "redis://h"], "store.url"),
    ];
    for (args, key) in cases {
        let (status, _, stderr) = mandrill(&dir, args, &[]);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(key), "{args:?}: {stderr}");
    }
    assert!(!dir.join("mandrill.db").exists());
}

#[test]
fn test_only_variables_are_not_configuration() {
    let (_guard, dir) = temp_dir();
    let broker = sqlite_url(&dir);
    let env = [
        (
            "MANDRILL_TEST_POSTGRES",
            "postgres://root@127.0.0.1:5432/postgres",
        ),
        ("MANDRILL_TEST_NATS", "nats://127.0.0.1:4222"),
        ("MANDRILL_TEST_ANYTHING", "x"),
        ("MANDRILL_WORKER__MAX_ATTEMPTS", "3"),
    ];
    let (status, stdout, stderr) =
        mandrill(&dir, &["publish", "--broker", &broker, "cattle-test"], &env);
    assert!(status.success(), "{stderr}");
    // One spelling, one plural: the count on stderr, the id on stdout.
    assert!(stderr.contains("published 1 request\n"), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.ends_with(" cattle-test.example.net\n"), "{stdout}");
    let (status, _, stderr) = mandrill(&dir, &["history", "--db", &broker], &env);
    assert!(status.success(), "{stderr}");

    // A setting written with single underscores is a mistake, not ignored.
    let (status, _, stderr) = mandrill(
        &dir,
        &["history", "--db", &broker],
        &[("MANDRILL_WORKER_MAX_ATTEMPTS", "3")],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MANDRILL_WORKER__MAX_ATTEMPTS"), "{stderr}");
}

#[test]
fn no_colour_codes_when_output_is_a_pipe() {
    let (_guard, dir) = temp_dir();
    let queue = sqlite_url(&dir);
    let closed = format!("nats://127.0.0.1:{}", free_port());
    let runs: [&[&str]; 5] = [
        &["publish", "--broker", &queue, "cattle-1", "cattle-2"],
        &["run", "--broker", &queue, "--db", "memory", "--until-idle"],
        &["run", "--broker", &closed, "--db", "memory"],
        &["run", "--set", "worker.max_in_flght=1"],
        &["run", "--help"],
    ];
    for args in runs {
        let (_, stdout, stderr) = mandrill(&dir, args, &[]);
        assert!(!stdout.contains("\x1b["), "{args:?} stdout: {stdout:?}");
        assert!(!stderr.contains("\x1b["), "{args:?} stderr: {stderr:?}");
    }
}

/// Rows in the SQLite queue at `url`, counted.
fn queued(url: &str) -> i64 {
    use sqlx::Connection as _;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let Ok(mut connection) = sqlx::SqliteConnection::connect(url).await else {
                return 0;
            };
            let rows = sqlx::query_scalar("SELECT count(*) FROM queue")
                .fetch_one(&mut connection)
                .await
                .unwrap_or(0);
            let _ = connection.close().await;
            rows
        })
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn publish_random_streams_a_billion_instead_of_allocating_them() {
    let (_guard, dir) = temp_dir();
    let queue = sqlite_url(&dir);
    let publisher = Killed(
        Command::new(binary())
            .args(["publish", "--broker", &queue, "--random", "1000000000"])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Requests reach the queue while the rest are still to be made.
    let deadline = Instant::now() + DEADLINE;
    while queued(&queue) < 10_000 {
        assert!(Instant::now() < deadline, "nothing was published");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(publisher);
}
