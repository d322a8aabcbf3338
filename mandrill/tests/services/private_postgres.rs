//! A PostgreSQL server of the test's own (`initdb` into a temporary
//! directory, `postgres` on a free port), which the test may stop with
//! SIGSTOP and resume with SIGCONT: never the machine's shared server,
//! which other tests use. Killed, with its directory removed, when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt as _;

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

use super::free_port;

pub struct PrivatePostgres {
    pub port: u16,
    /// The postmaster.
    child: Child,
    dir: tempfile::TempDir,
}

/// The `postgres` account's uid and gid, to run the server as when the
/// tests run as root (the server refuses to run as root).
fn postgres_account() -> Option<(u32, u32)> {
    // SAFETY: geteuid reads no memory.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"postgres") && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

/// The directory of PostgreSQL's programs (`initdb`, `postgres`).
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .map(|version| version.join("bin"))
        .filter(|bin| bin.join("postgres").exists())
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin"))
}

fn as_account(command: &mut Command, account: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = account {
        command.uid(uid).gid(gid);
    }
    command
}

fn chown_all(path: &Path, account: Option<(u32, u32)>) {
    if let Some((uid, gid)) = account {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown for postgres");
    }
}

impl PrivatePostgres {
    pub fn start() -> Self {
        let account = postgres_account();
        let dir = tempfile::tempdir().expect("temp dir");
        chown_all(dir.path(), account);
        let data = dir.path().join("data");
        let bin = bin_dir();
        let output = as_account(&mut Command::new(bin.join("initdb")), account)
            .args(["-U", "postgres", "-A", "trust", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .expect("initdb runs");
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let port = free_port();
        let child = as_account(&mut Command::new(bin.join("postgres")), account)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts");
        let server = Self { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = server.url("postgres");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        while runtime.block_on(PgConnection::connect(&url)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the private postgres did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// A URL for `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates `database` and returns its URL.
    pub fn create_database(&self, database: &str) -> String {
        let admin = self.url("postgres");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let mut connection = PgConnection::connect(&admin).await.expect("postgres");
                sqlx::query(&format!("CREATE DATABASE {database}"))
                    .execute(&mut connection)
                    .await
                    .expect("create database");
            });
        self.url(database)
    }

    /// Sends `signal` to the postmaster, then to each of its children
    /// (backends and helpers each lead a session of their own, so no
    /// process group holds them all). Once the postmaster is stopped it
    /// starts no new child, so a SIGSTOP reaches every process.
    fn signal_all(&self, signal: libc::c_int) {
        let postmaster = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill takes two integers and touches no memory; the pids
        // are the server's own processes (the postmaster is not reaped yet).
        unsafe {
            libc::kill(postmaster, signal);
        }
        for child in children_of(self.child.id()) {
            // SAFETY: as above.
            unsafe {
                libc::kill(child, signal);
            }
        }
    }

    /// Stops every process of the server (SIGSTOP): connections stay open
    /// and nothing answers, as a hung host.
    pub fn pause(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// Ends every other connection to the server's databases
    /// (`pg_terminate_backend`): clients see their connection cut, maybe
    /// after a COMMIT whose reply never reached them.
    pub fn cut_connections(&self) {
        let admin = self.url("postgres");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let mut connection = PgConnection::connect(&admin).await.expect("postgres");
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE pid <> pg_backend_pid() AND datname IS NOT NULL",
                )
                .execute(&mut connection)
                .await
                .expect("terminate the other backends");
            });
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.signal_all(libc::SIGCONT);
        // SIGQUIT: an immediate shutdown that still releases shared memory.
        let _ = Command::new("kill")
            .args(["-s", "QUIT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal_all(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: u32) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: libc::pid_t = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces, not ')'.
            let (_, rest) = stat.rsplit_once(')')?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}
