//! Runs one program without a shell, bounded in time and in what it keeps:
//! the `command` backend and the `command` probe both use it.
//!
//! The program starts in a process group of its own (`process_group(0)`), so
//! that a timeout kills everything it started, grandchildren included, with
//! one `killpg(SIGKILL)`. The group is killed only while its leader is not
//! yet reaped: until then the leader's PID, and so the group's id, cannot be
//! reused by an unrelated process. The same holds when the run is cancelled
//! (its future dropped, e.g. by the worker's `restart_timeout`).
//!
//! Nothing here blocks a runtime thread: `tokio::process` waits for the
//! child through the runtime's SIGCHLD handling and reads its pipes as
//! async I/O, so no blocking pool is involved.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::time::Instant;

/// How long output is still read after the program exited, for a pipe that
/// a background process it started keeps open. Past this the runner stops
/// reading (that process may then get `SIGPIPE`): a script that leaves a
/// process behind should redirect its output.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// How long to wait for a killed program to be reaped before leaving it to
/// tokio's orphan reaper (a process in uninterruptible sleep may take long).
pub(crate) const REAP_AFTER_KILL: Duration = Duration::from_secs(5);

/// Where and how programs run. Built once; cheap to share.
#[derive(Debug, Clone)]
pub(crate) struct ProcessRunner {
    working_dir: Option<PathBuf>,
    /// The whole environment the program gets: the allow-listed inherited
    /// variables, read once when the runner is built, then the fixed ones.
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
    max_output: usize,
}

/// What one stream of the program printed: the first bytes, up to the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Captured {
    /// The bytes kept.
    pub kept: Vec<u8>,
    /// How many bytes the program wrote in all.
    pub total: u64,
}

/// What the program printed on stdout and stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Output {
    /// Standard output.
    pub stdout: Captured,
    /// Standard error.
    pub stderr: Captured,
}

/// A program that ran to its end.
#[derive(Debug)]
pub(crate) struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// What it printed.
    pub output: Output,
}

/// Why a program did not run to its end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// It could not be started (not found, not executable, bad directory).
    #[error("cannot start {program:?}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It ran past the timeout, and its process group was killed.
    #[error("{program:?} ran longer than {after:?}; its process group was killed")]
    TimedOut {
        /// The program.
        program: String,
        /// The timeout.
        after: Duration,
        /// What it printed until then.
        output: Output,
    },
    /// Waiting for it failed (should not happen).
    #[error("cannot wait for {program:?}")]
    Wait {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl RunError {
    /// Whether the program cannot be started however often it is tried: it
    /// does not exist, may not be executed, or the working directory is
    /// missing. A configuration error, not a passing one.
    pub(crate) fn is_permanent(&self) -> bool {
        use std::io::ErrorKind::{NotFound, PermissionDenied};
        matches!(self, Self::Spawn { source, .. } if matches!(source.kind(), NotFound | PermissionDenied))
    }
}

impl ProcessRunner {
    /// A runner whose programs inherit only the `env_allow`ed variables of
    /// this process's environment, plus `env`.
    pub(crate) fn new(
        working_dir: Option<PathBuf>,
        env_allow: &[String],
        env: &[(String, String)],
        timeout: Duration,
        max_output: usize,
    ) -> Self {
        Self::with_inherited(
            working_dir,
            env_allow,
            env,
            timeout,
            max_output,
            std::env::vars_os(),
        )
    }

    /// As [`ProcessRunner::new`], with `inherited` standing for this
    /// process's environment.
    pub(crate) fn with_inherited(
        working_dir: Option<PathBuf>,
        env_allow: &[String],
        env: &[(String, String)],
        timeout: Duration,
        max_output: usize,
        inherited: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Self {
        let mut kept: Vec<(OsString, OsString)> = inherited
            .into_iter()
            .filter(|(name, _)| env_allow.iter().any(|allowed| name == allowed.as_str()))
            .filter(|(name, _)| !env.iter().any(|(fixed, _)| name == fixed.as_str()))
            .collect();
        kept.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
        Self {
            working_dir,
            env: kept,
            timeout,
            max_output,
        }
    }

    /// Runs `argv` (the program first, never through a shell) to its end or
    /// its timeout. Cancel-safe: dropping the future kills the process group.
    pub(crate) async fn run(&self, argv: &[String]) -> Result<Finished, RunError> {
        let (program, args) = argv.split_first().ok_or_else(|| RunError::Spawn {
            program: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"),
        })?;
        let mut command = Command::new(program);
        command
            .args(args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, led by the child: see the module docs.
            .process_group(0);
        if let Some(dir) = &self.working_dir {
            command.current_dir(dir);
        }
        let mut child = command.spawn().map_err(|source| RunError::Spawn {
            program: program.clone(),
            source,
        })?;
        // `id` is `None` only once the child has been reaped, which has not
        // happened yet.
        let pid = child.id().expect("a child not yet waited for has an id");
        let mut group = GroupKill::new(pid);
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let deadline = Instant::now() + self.timeout;

        let mut output = Output::default();
        let exited = {
            let limit = self.max_output;
            let reading = async {
                tokio::join!(
                    capture(stdout, &mut output.stdout, limit),
                    capture(stderr, &mut output.stderr, limit),
                )
            };
            let mut reading = std::pin::pin!(reading);
            let mut read_all = false;
            // Read while waiting, so that the child never blocks on a full pipe.
            let exited = loop {
                tokio::select! {
                    status = child.wait() => break Some(status),
                    _ = &mut reading, if !read_all => read_all = true,
                    () = tokio::time::sleep_until(deadline) => break None,
                }
            };
            if let Some(Ok(_)) = exited {
                // Reaped: disarm before anything else can be cancelled.
                group.disarm();
            }
            if exited.is_some() && !read_all {
                let drained_by = deadline.min(Instant::now() + DRAIN_AFTER_EXIT);
                let _ = tokio::time::timeout_at(drained_by, reading).await;
            }
            exited
        };
        match exited {
            Some(Ok(status)) => Ok(Finished { status, output }),
            Some(Err(source)) => {
                group.kill();
                Err(RunError::Wait {
                    program: program.clone(),
                    source,
                })
            }
            None => {
                group.kill();
                // Reap it, so that no zombie is left; bounded, see the const.
                // Unreaped, the guard kills again on drop, harmlessly.
                if let Ok(Ok(_)) = tokio::time::timeout(REAP_AFTER_KILL, child.wait()).await {
                    group.disarm();
                }
                Err(RunError::TimedOut {
                    program: program.clone(),
                    after: self.timeout,
                    output,
                })
            }
        }
    }
}

/// Reads `stream` to its end, keeping the first `limit` bytes and counting
/// the rest, which is read and discarded so that the writer never blocks.
/// A read error ends the stream.
async fn capture(stream: Option<impl AsyncRead + Unpin>, into: &mut Captured, limit: usize) {
    let Some(mut stream) = stream else { return };
    let mut buffer = vec![0; 8192];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        into.total += read as u64;
        let room = limit.saturating_sub(into.kept.len());
        into.kept.extend_from_slice(&buffer[..read.min(room)]);
    }
}

/// Kills the process group on drop unless disarmed; see the module docs for
/// why it must be disarmed once the leader is reaped.
struct GroupKill {
    pgid: Option<libc::pid_t>,
}

impl GroupKill {
    fn new(pid: u32) -> Self {
        Self {
            pgid: libc::pid_t::try_from(pid).ok(),
        }
    }

    /// The leader was reaped: its id may be reused, so never kill by it again.
    fn disarm(&mut self) {
        self.pgid = None;
    }

    /// Kills the group now (and again on drop, harmlessly, while unreaped).
    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg takes two integers and touches no memory of
            // ours. `libc` rather than `nix`: tokio already builds it, and
            // this is the one call we need. A group already gone is ESRCH,
            // which is fine.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Captured {
    /// The kept bytes as text (invalid UTF-8 and NUL bytes replaced, as a
    /// store may refuse them), saying how much was not kept.
    pub(crate) fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).replace('\0', "\u{FFFD}");
        let dropped = self.total.saturating_sub(self.kept.len() as u64);
        if dropped > 0 {
            text.push_str(&format!("[… {dropped} more bytes not kept]"));
        }
        text
    }
}

impl Output {
    /// Both streams as one text, stderr after stdout under a `[stderr]`
    /// line; `None` when the program printed nothing.
    pub(crate) fn text(&self) -> Option<String> {
        match (self.stdout.total, self.stderr.total) {
            (0, 0) => None,
            (_, 0) => Some(self.stdout.text()),
            (0, _) => Some(format!("[stderr]\n{}", self.stderr.text())),
            (_, _) => {
                let stdout = self.stdout.text();
                let newline = if stdout.ends_with('\n') { "" } else { "\n" };
                Some(format!("{stdout}{newline}[stderr]\n{}", self.stderr.text()))
            }
        }
    }
}

/// At most `max_chars` of `text`, for a log line or an error: escaped
/// ([`printable`](crate::domain::printable)), since what a host or a server
/// wrote must not start a line of its own nor reach a terminal as a control.
pub(crate) fn for_log(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    let cut: std::borrow::Cow<'_, str> = match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]).into(),
        None => text.into(),
    };
    if let std::borrow::Cow::Owned(shown) = crate::domain::printable(&cut) {
        return shown.into();
    }
    cut
}

/// Helpers for the tests of the backends that run processes.
#[cfg(test)]
pub(crate) mod testing;
