//! Signals are honoured at every phase, with the real binary: a hung
//! server at start-up, a publisher behind its rate, a third signal, and a
//! reload whose values are out of range.

mod services;
mod support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{CANARY, DEADLINE, Mandrill, assert_no_canary, fields_of, sqlite_url, temp_dir};

/// A TCP listener that accepts connections (the kernel does) but never
/// says a word: a server that hangs.
fn silent_server() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

const STARTING: &str = "starting: connecting to the broker and the store";
const NOT_STARTING: &str = "shutdown requested during start-up: not starting";

#[test]
fn sigterm_while_nats_hangs_at_start_up_stops_at_once() {
    let (_guard, dir) = temp_dir();
    let (_listener, port) = silent_server();
    let nats = format!("nats://127.0.0.1:{port}");
    let service = Mandrill::run(&dir, &["--broker", &nats, "--db", "memory"]);
    service.wait_for(STARTING, 1);
    service.signal("TERM");
    // Well before the 5 s connect timeout; the log proves the start-up was
    // abandoned rather than failed.
    let (status, lines) = service.wait_exit_within(Duration::from_secs(4));
    assert!(status.success(), "exit status {status}");
    fields_of(&lines, NOT_STARTING);
    assert!(
        !lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot")),
        "{lines:?}"
    );
}

#[test]
fn sigterm_while_postgres_hangs_at_start_up_stops_at_once() {
    let (_guard, dir) = temp_dir();
    let (_listener, port) = silent_server();
    let postgres = format!("postgres://mandrill:{CANARY}@127.0.0.1:{port}/db");
    let service = Mandrill::run(&dir, &["--broker", "memory", "--db", &postgres]);
    service.wait_for(STARTING, 1);
    service.signal("TERM");
    // The pool would wait 10 s for a connection.
    let raw_before = service.raw();
    let (status, lines) = service.wait_exit_within(Duration::from_secs(5));
    assert!(status.success(), "exit status {status}");
    fields_of(&lines, NOT_STARTING);
    assert_no_canary("run", &raw_before);
    let all: Vec<String> = lines.iter().map(Value::to_string).collect();
    assert_no_canary("run", &all.join("\n"));
}

#[test]
fn demo_publisher_behind_its_rate_stops_at_sigterm() {
    let (_guard, dir) = temp_dir();
    let queue = sqlite_url(&dir);
    // Far more than a SQLite queue can take: the publisher is always behind.
    let service = Mandrill::run(
        &dir,
        &[
            "--broker",
            &queue,
            "--db",
            "memory",
            "--simulate=1000000",
            "--set",
            "restarter.max_latency=1ms",
        ],
    );
    service.wait_for("published", 200);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    let messages: Vec<&str> = lines
        .iter()
        .map(|l| l["fields"]["message"].as_str().unwrap_or(""))
        .collect();
    let stop = messages
        .iter()
        .position(|m| *m == "shutting down: stop pulling, let in-flight work finish")
        .expect("shutdown logged");
    let after = messages[stop..]
        .iter()
        .filter(|m| **m == "published")
        .count();
    // The one in progress when the signal came, give or take a scheduling
    // race; not every request owed since the publisher fell behind.
    assert!(after <= 5, "{after} published after SIGTERM");
}

#[test]
fn third_signal_exits_at_once() {
    let (_guard, dir) = temp_dir();
    // Restarts that take an hour: the second signal still waits for the ones
    // already issued, as it must.
    let journal = dir.join("restarts.log");
    let service = Mandrill::run(
        &dir,
        &[
            "--broker",
            "memory",
            "--db",
            "memory",
            "--simulate=20",
            "--set",
            "restarter.min_latency=1h",
            "--set",
            "restarter.max_latency=1h",
            "--set",
            "worker.restart_timeout=2h",
            "--set",
            "worker.shutdown_grace=1h",
            "--set",
            &format!("restarter.journal={}", journal.display()),
        ],
    );
    // The journal has a line once a restart is issued.
    let deadline = Instant::now() + DEADLINE;
    while std::fs::read_to_string(&journal)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "no restart was issued");
        std::thread::sleep(Duration::from_millis(50));
    }
    service.signal("TERM");
    service.wait_for("shutting down: stop pulling, let in-flight work finish", 1);
    service.signal("TERM");
    service.wait_for("second signal: skipping the rest of the grace period", 1);
    service.signal("INT");
    let (status, lines) = service.wait_exit();
    assert_eq!(status.code(), Some(130), "exit status {status}");
    fields_of(
        &lines,
        "third signal: exiting at once; unsettled deliveries will be redelivered",
    );
}

#[test]
fn reload_with_an_out_of_range_value_is_refused_and_the_old_config_kept() {
    let (_guard, dir) = temp_dir();
    let config = dir.join("mandrill.toml");
    std::fs::write(&config, "[worker]\nmax_in_flight = 10\n").unwrap();
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--broker",
            "memory",
            "--db",
            "memory",
            "--simulate=20",
            "--set",
            "restarter.max_latency=10ms",
        ],
    );
    service.wait_for("mandrill started", 1);
    for (round, text) in [
        "[worker]\nmax_in_flight = 1000000000000\n",
        "[restarter]\nblocking_threads = 1000000000000\n",
        "[worker]\nshutdown_grace = \"1000000000years\"\n",
        "[broker]\nack_deadline = \"5ms\"\n",
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&config, text).unwrap();
        service.signal("HUP");
        service.wait_for(
            "reload failed; keeping the running configuration",
            round + 1,
        );
    }
    let acked = service.messages("acked").len();
    service.wait_for("acked", acked + 3);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    assert!(service_never_changed_the_limit(&lines));
}

fn service_never_changed_the_limit(lines: &[Value]) -> bool {
    !lines
        .iter()
        .any(|l| l["fields"]["message"] == "flow control limit changed")
}

/// A SIGHUP while the configuration is still being read (a `systemctl
/// reload` right after `start`) is a reload once started, not the
/// signal's default action, which killed the process: the configuration
/// file is a FIFO, so the test knows the service is reading it.
#[test]
fn sighup_while_the_configuration_is_read_is_a_reload_once_started() {
    use std::io::Write as _;
    let (_guard, dir) = temp_dir();
    let fifo = config_fifo(&dir);
    let db = sqlite_url(&dir);
    let config = format!("[broker]\nurl = {db:?}\n[store]\nurl = {db:?}\n");
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    let mut reading = open_for_writing(&fifo);
    // The service is reading its configuration now.
    service.signal("HUP");
    std::thread::sleep(Duration::from_millis(200));
    // Every later read of the file (what it says of the leash, the
    // reload) finds a plain file with the same text.
    std::fs::write(dir.join("plain.toml"), &config).unwrap();
    std::fs::rename(dir.join("plain.toml"), &fifo).unwrap();
    reading
        .write_all(config.as_bytes())
        .expect("the service was killed by the SIGHUP while reading its configuration");
    drop(reading);
    service.wait_for("SIGHUP during start-up: reloading once started", 1);
    service.wait_for("configuration reloaded", 1);
    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
}

/// SIGTERM while the configuration is still being read (it hangs: a FIFO
/// nobody writes, a stale network mount) stops the process, as its default
/// action does: only SIGHUP is caught that early.
#[test]
fn sigterm_while_the_configuration_is_read_stops_the_process() {
    use std::os::unix::process::ExitStatusExt as _;
    let (_guard, dir) = temp_dir();
    let fifo = config_fifo(&dir);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    let reading = open_for_writing(&fifo);
    // The service is reading its configuration now.
    service.signal("TERM");
    let (status, _) = service.wait_exit_within(Duration::from_secs(10));
    drop(reading);
    assert_eq!(status.signal(), Some(15), "exit status {status}");
}

/// `mandrill.toml` in `dir`, made a FIFO: reading it waits for a writer.
fn config_fifo(dir: &std::path::Path) -> std::path::PathBuf {
    let fifo = dir.join("mandrill.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    fifo
}

/// Opens `fifo` for writing once the service opens it for reading (a
/// non-blocking open fails until then), within the deadline.
fn open_for_writing(fifo: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt as _;
    let deadline = Instant::now() + DEADLINE;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc_o_nonblock())
            .open(fifo)
        {
            Ok(file) => return file,
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => panic!("the service never read its configuration: {error}"),
        }
    }
}

/// `O_NONBLOCK` on Linux (the tests run there; no libc crate for one flag).
fn libc_o_nonblock() -> i32 {
    0o4000
}

/// A reload whose policy cannot be put in force (here: reply destinations
/// on a broker the service did not start with, which can carry none)
/// applies nothing of the file, its `max_in_flight` included: valid or
/// nothing.
#[test]
fn a_reload_whose_policy_is_refused_applies_nothing() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let config = dir.join("mandrill.toml");
    let first = format!("[broker]\nurl = {db:?}\n[store]\nurl = {db:?}\n");
    std::fs::write(&config, &first).unwrap();
    let service = Mandrill::run(&dir, &["--config", config.to_str().unwrap()]);
    service.wait_for("mandrill started", 1);
    std::fs::write(
        &config,
        format!(
            "[broker]\nurl = \"nats://127.0.0.1:4222\"\nreply_to_allowed = [\"verdicts.*\"]\n\
             [store]\nurl = {db:?}\n[worker]\nmax_in_flight = 7\n"
        ),
    )
    .unwrap();
    service.signal("HUP");
    service.wait_for("safety policy not reloaded; keeping the one in force", 1);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    assert!(service_never_changed_the_limit(&lines));
}
