//! Test support: Pub/Sub emulators on free ports.
//!
//! One emulator per test binary ([`shared`]), started on first use. A static
//! is never dropped, so it cannot be stopped by a `Drop`; instead it runs
//! under a small shell guard that reads its standard input, which is a pipe
//! from this process: when the test binary exits, however it exits (even
//! `kill -9`), the pipe closes, the guard's `read` returns and it kills the
//! emulator by the PID `$!` it started. `MANDRILL_TEST_PUBSUB=HOST:PORT`
//! reuses an emulator started elsewhere instead.
//!
//! Tests that stop and restart the service start their own with
//! [`Emulator::start`], killed by PID when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The emulator's launcher script, from the `google-cloud-cli-pubsub-emulator`
/// package; it execs the JVM, so its PID is the emulator's.
pub(crate) const LAUNCHER: &str =
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// How long an emulator may take to answer (a JVM on a loaded machine).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// `HOST:PORT` of this test binary's emulator.
pub(crate) fn shared() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        if let Ok(host) = std::env::var("MANDRILL_TEST_PUBSUB") {
            return host;
        }
        let port = free_port();
        let script = format!(
            "{LAUNCHER} --host=127.0.0.1 --port={port} >/dev/null 2>&1 & emulator=$!; \
             read -r _; kill -9 $emulator"
        );
        let guard = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the pubsub emulator's guard");
        // The guard's stdin must stay open for the life of this process:
        // leaked on purpose, it closes when the process exits.
        std::mem::forget(guard);
        let host = format!("127.0.0.1:{port}");
        wait_until_ready(&host);
        host
    })
}

/// A private emulator, killed by PID on drop.
pub(crate) struct Emulator {
    pub(crate) host: String,
    port: u16,
    child: Option<Child>,
}

impl Emulator {
    /// Starts an emulator on a free port and waits until it answers.
    pub(crate) fn start() -> Self {
        let port = free_port();
        let mut emulator = Self {
            host: format!("127.0.0.1:{port}"),
            port,
            child: None,
        };
        emulator.restart();
        emulator
    }

    /// Kills the emulator (its topics and subscriptions are lost: it keeps
    /// them in memory).
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub(crate) fn restart(&mut self) {
        self.stop();
        let child = Command::new(LAUNCHER)
            .args(["--host=127.0.0.1", &format!("--port={}", self.port)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the pubsub emulator");
        self.child = Some(child);
        wait_until_ready(&self.host);
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// Waits until `GET /` answers `Ok`.
fn wait_until_ready(host: &str) {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if answers_ok(host) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the pubsub emulator at {host} did not answer within {START_TIMEOUT:?}");
}

fn answers_ok(host: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(host) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200") && response.trim_end().ends_with("Ok")
}
