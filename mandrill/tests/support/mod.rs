//! Drives the real `mandrill` binary: spawn it, read its JSON log lines as
//! they come, send it real signals, wait for it to exit. Every wait is on a
//! condition with a generous deadline, never a bare sleep.

#![allow(dead_code)]

pub mod tmpfs;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Long enough for a slow CI machine; only reached when something hangs.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_mandrill")
}

#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<Value>>,
    raw: Mutex<Vec<String>>,
    changed: Condvar,
}

pub struct Mandrill {
    child: Child,
    log: Arc<Lines>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Mandrill {
    /// Starts `mandrill run ARGS --log-format json` in `dir`.
    pub fn run(dir: &Path, args: &[&str]) -> Self {
        Self::run_with_env(dir, args, &[])
    }

    pub fn run_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        // Port 0: tests run side by side; `admin listening` says where.
        let mut env = env.to_vec();
        env.insert(0, ("MANDRILL_ADMIN__LISTEN", "127.0.0.1:0"));
        Self::spawn(dir, args, &env)
    }

    /// As [`Mandrill::run`], with the admin server where the default
    /// configuration puts it (for tests of several instances on one machine
    /// as a user starts them).
    pub fn run_with_default_admin(dir: &Path, args: &[&str]) -> Self {
        Self::spawn(dir, args, &[])
    }

    fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(binary())
            .arg("run")
            .args(args)
            .args(["--log-format", "json"])
            .current_dir(dir)
            .env_remove("MANDRILL_ADMIN__LISTEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mandrill binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Lines::default());
        let reader = std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(value) = serde_json::from_str::<Value>(&line) {
                        log.lines.lock().unwrap().push(value);
                    }
                    log.raw.lock().unwrap().push(line);
                    log.changed.notify_all();
                }
            }
        });
        Self {
            child,
            log,
            reader: Some(reader),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has exited; never waits.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child
            .try_wait()
            .expect("the child's status can be read")
    }

    /// Sends a signal by name (`TERM`, `INT`, `HUP`, `QUIT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -s {name} failed");
    }

    /// Log lines so far whose message is `message`.
    pub fn messages(&self, message: &str) -> Vec<Value> {
        self.log
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line["fields"]["message"] == message)
            .cloned()
            .collect()
    }

    /// Waits until `count` lines with message `message` were logged.
    pub fn wait_for(&self, message: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + DEADLINE;
        let mut lines = self.log.lines.lock().unwrap();
        loop {
            let found: Vec<Value> = lines
                .iter()
                .filter(|line| line["fields"]["message"] == message)
                .cloned()
                .collect();
            if found.len() >= count {
                return found;
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "timed out waiting for {count} x {message:?}; log so far:\n{}",
                self.log.raw.lock().unwrap().join("\n")
            );
            lines = self
                .log
                .changed
                .wait_timeout(lines, deadline - now)
                .unwrap()
                .0;
        }
    }

    /// Every line written to standard error so far, JSON or not.
    pub fn raw(&self) -> String {
        self.log.raw.lock().unwrap().join("\n")
    }

    /// Waits for the process to exit; returns its status and whole log.
    pub fn wait_exit(self) -> (ExitStatus, Vec<Value>) {
        self.wait_exit_within(DEADLINE)
    }

    /// Waits at most `within` for the process to exit (panics, killing it,
    /// if it does not); returns its status and whole log.
    pub fn wait_exit_within(mut self, within: Duration) -> (ExitStatus, Vec<Value>) {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "mandrill did not exit within {within:?}; log:\n{}",
                    self.log.raw.lock().unwrap().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let lines = self.log.lines.lock().unwrap().clone();
        (status, lines)
    }
}

impl Drop for Mandrill {
    fn drop(&mut self) {
        // A failed test must not leave a service running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `fields` of the single log line with this message.
/// Waits until `instances` together logged `count` deferrals, within
/// twice [`DEADLINE`].
pub fn wait_for_deferrals(instances: &[&Mandrill], count: usize) {
    let deadline = Instant::now() + DEADLINE * 2;
    loop {
        let deferred: usize = instances.iter().map(|i| i.messages("deferred").len()).sum();
        if deferred >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {deferred} of {count} deferrals; the instances' logs:\n{}",
            instances
                .iter()
                .map(|instance| instance.raw())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// For two instances sharing one SQLite file, `published` requests of
/// which all but `allowed` are deferred: waits for those deferrals and,
/// while one instance has deferred none (SQLite's lock is not fair, and on
/// a loaded machine one can take a whole round), has `publish` send
/// `round` more, up to `most`; else a test of what both do together would
/// prove nothing. Returns how many were published in all.
pub fn until_both_deferred(
    (a, b): (&Mandrill, &Mandrill),
    mut published: usize,
    allowed: usize,
    (round, most): (usize, usize),
    mut publish: impl FnMut(usize),
) -> usize {
    loop {
        wait_for_deferrals(&[a, b], published - allowed);
        if !a.messages("deferred").is_empty() && !b.messages("deferred").is_empty() {
            return published;
        }
        assert!(published < most, "both instances took part");
        publish(round);
        published += round;
    }
}

pub fn fields_of(lines: &[Value], message: &str) -> Value {
    let found: Vec<&Value> = lines
        .iter()
        .filter(|line| line["fields"]["message"] == message)
        .collect();
    assert_eq!(found.len(), 1, "expected one {message:?} line");
    found[0]["fields"].clone()
}

pub fn count(fields: &Value, key: &str) -> u64 {
    fields[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {fields}"))
}

pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("mandrill.db").display())
}

/// Runs `mandrill ARGS` to completion; returns status, stdout, stderr.
pub fn mandrill(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String, String) {
    let output = Command::new(binary())
        .args(args)
        .current_dir(dir)
        .env("MANDRILL_ADMIN__LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .output()
        .expect("mandrill binary runs");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

pub fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    (dir, path)
}

/// Every recorded request in the store at `url` (SQLite or PostgreSQL).
pub fn history(url: &str) -> Vec<mandrill::HistoryEntry> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let records = mandrill::Records::open(url).await.unwrap();
        let entries = records.history(1_000_000).await.unwrap();
        records.close().await;
        entries
    })
}

/// A row of the SQLite broker's queue table, read directly.
#[derive(Debug, Clone)]
pub struct QueueRow {
    pub id: i64,
    pub payload: Vec<u8>,
    pub deliveries: i64,
    /// Whether a consumer held the lease when the row was read.
    pub leased: bool,
}

/// The queue table at `url`, as it is on disk now.
pub fn queue_rows(url: &str) -> Vec<QueueRow> {
    use sqlx::{Connection as _, Row as _};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        let rows = sqlx::query("SELECT id, payload, deliveries, lease FROM queue ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        rows.iter()
            .map(|row| QueueRow {
                id: row.get("id"),
                payload: row.get("payload"),
                deliveries: row.get("deliveries"),
                leased: row.get::<Option<i64>, _>("lease").is_some(),
            })
            .collect()
    })
}

/// How many messages the SQLite queue at `url` holds: none when its file
/// does not exist (a command that refused before opening it).
pub fn queue_len(url: &str) -> usize {
    let path = url.trim_start_matches("sqlite:");
    if Path::new(path).exists() {
        queue_rows(url).len()
    } else {
        0
    }
}

/// A secret that must appear in no output.
pub const CANARY: &str = "CANARY-s3cr3t-7f3a";
/// A secret that reads as a number.
pub const NUMERIC_CANARY: &str = "987654321123";

pub fn assert_no_canary(what: &str, text: &str) {
    assert!(
        !text.contains(CANARY) && !text.contains(NUMERIC_CANARY),
        "{what} printed a secret:\n{text}"
    );
}
