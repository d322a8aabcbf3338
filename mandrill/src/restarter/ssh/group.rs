//! The command's process group on the host: the wrapper that reports it,
//! reading that report, and killing the group once the command has run
//! past its time-out.

use std::time::Duration;

use openssh::{ChildStdout, Session, Stdio};
use tokio::io::AsyncReadExt;

use super::output::Captured;
use super::pool::Destination;
use super::settings::KILL_TIMEOUT;
use crate::domain::Hostname;
use crate::restarter::RestartError;

/// What the remote shell runs before the command: `sh` prints the id of its
/// process group on a line of its own (`none` when it does not lead one, so
/// that a group that was never ours is never killed, nor its absence taken
/// for a confirmed end), then becomes the command. One line, no single
/// quote: it goes inside single quotes through any login shell.
pub(super) const REPORT_GROUP: &str = r#"if kill -0 -$$ 2>/dev/null; then echo "mandrill-pgid $$"; else echo "mandrill-pgid none"; fi; exec "$@""#;

/// The line [`REPORT_GROUP`] prints, up to the id.
const GROUP_MARKER: &[u8] = b"mandrill-pgid ";

/// Output the login shell may print before the group's line (a noisy
/// profile), kept as the command's; past this the line is given up on.
const MAX_BEFORE_MARKER: usize = 4096;

/// Stops process group `$1`: `SIGTERM`, a second for it to go, `SIGKILL`,
/// another second. Exits 0 once the group is gone ("No such process";
/// permission refused is not gone), 1 if it is still there, 2 without a
/// signal if the command itself (the group's leader, `$1`) had already
/// ended: it ended as its time-out came, perhaps having done its work, and
/// what it left running is left alone. `C` locale, so that the message is
/// the one looked for; dash's `kill` takes no `--`.
const KILL_GROUP: &str = r#"g=$1; gone() { kill -0 $1 2>&1 | grep -q "No such process"; }; settle() { i=0; while [ $i -lt 10 ]; do gone -$g && return 0; sleep 0.1; i=$((i+1)); done; gone -$g; }; gone $g && exit 2; kill -TERM -$g 2>/dev/null; settle && exit 0; kill -KILL -$g 2>/dev/null; settle && exit 0; exit 1"#;

/// Exits 0 once process `$1` is gone from the host ("No such process";
/// one that refuses the signal is still there). `C` locale, as above.
const ENDED: &str = r#"kill -0 $1 2>&1 | grep -q "No such process""#;

/// The command's process group on the host, as the wrapper reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    /// Not reported (yet): the command may or may not have started.
    Unseen,
    /// The command does not lead a group of its own: it cannot be stopped.
    NotLeader,
    /// The group's id.
    Leader(u32),
}

/// Stops a command that ran past `timeout`: its process group killed
/// over the same connection (a second channel), within [`KILL_TIMEOUT`].
/// A confirmed end is a time-out worth retrying; anything less leaves
/// the command possibly running, and says so.
pub(super) async fn stop(
    host: &Hostname,
    destination: &Destination,
    session: &Session,
    group: Group,
    timeout: Duration,
) -> RestartError {
    let unknown = |why: String| RestartError::OutcomeUnknown {
        host: host.clone(),
        cause: format!(
            "the command ran longer than {:?} on {destination} and {why}",
            timeout
        )
        .into(),
    };
    let pgid = match group {
        Group::Leader(pgid) => pgid,
        Group::NotLeader => {
            return unknown(
                "could not be stopped: it does not run in a process group of its own".into(),
            );
        }
        Group::Unseen => {
            return unknown("could not be stopped: its process group was never reported".into());
        }
    };
    match run_script(session, KILL_GROUP, "mandrill-kill", pgid).await {
        Ok(Ok(status)) if status.success() => {
            tracing::info!(%host, %destination, pgid, "the timed-out command's process group was killed");
            RestartError::TimedOut {
                host: host.clone(),
                after: timeout,
            }
        }
        Ok(Ok(status)) if status.code() == Some(2) => unknown(
            "ended by itself as the time-out came, before any signal: it may have run to its \
             end, but its exit status was not read"
                .into(),
        ),
        Ok(Ok(status)) if status.code() == Some(1) => unknown(format!(
            "its process group {pgid} was still there after SIGKILL (another user's \
             processes, e.g. under sudo, cannot be signalled)"
        )),
        Ok(Ok(status)) => unknown(format!(
            "the kill of its process group {pgid} failed ({status})"
        )),
        Ok(Err(e)) => unknown(format!("its process group {pgid} could not be killed: {e}")),
        Err(_elapsed) => unknown(format!(
            "the kill of its process group {pgid} did not finish within {KILL_TIMEOUT:?}"
        )),
    }
}

/// Whether the command, whose pid is its group's id (the wrapper execs
/// it), is gone from the host: asked over the same connection. `false` when
/// the answer is not a clear yes within [`KILL_TIMEOUT`].
pub(super) async fn ended(session: &Session, pgid: u32) -> bool {
    let answer = run_script(session, ENDED, "mandrill-probe", pgid).await;
    matches!(answer, Ok(Ok(status)) if status.success())
}

/// Runs `script` with `pgid` as `$1` on the host, in the `C` locale, over a
/// second channel of `session`, within [`KILL_TIMEOUT`]; its exit status.
async fn run_script(
    session: &Session,
    script: &str,
    name: &str,
    pgid: u32,
) -> Result<Result<std::process::ExitStatus, openssh::Error>, tokio::time::error::Elapsed> {
    let line = format!("exec env LC_ALL=C sh -c '{script}' {name} {pgid}");
    tokio::time::timeout(
        KILL_TIMEOUT,
        session
            .raw_command(line)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status(),
    )
    .await
}

/// Reads `stdout` up to the wrapper's line naming the command's process
/// group, keeping whatever came before or after it as the command's output.
/// `Unseen` if the stream ends, or holds too much, first.
pub(super) async fn read_group(
    stdout: Option<&mut ChildStdout>,
    into: &mut Captured,
    limit: usize,
) -> Group {
    let Some(stdout) = stdout else {
        return Group::Unseen;
    };
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1024];
    loop {
        if let Some((group, line)) = find_group(&seen) {
            into.push(&seen[..line.start], limit);
            into.push(&seen[line.end..], limit);
            return group;
        }
        if seen.len() > MAX_BEFORE_MARKER {
            into.push(&seen, limit);
            return Group::Unseen;
        }
        match stdout.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                into.push(&seen, limit);
                return Group::Unseen;
            }
            Ok(read) => seen.extend_from_slice(&buffer[..read]),
        }
    }
}

/// The group named by a complete line of [`REPORT_GROUP`] in `seen`, and
/// where that line is (its newline included).
fn find_group(seen: &[u8]) -> Option<(Group, std::ops::Range<usize>)> {
    let start = (0..seen.len())
        .find(|&at| (at == 0 || seen[at - 1] == b'\n') && seen[at..].starts_with(GROUP_MARKER))?;
    let length = seen[start..].iter().position(|&byte| byte == b'\n')?;
    let value = &seen[start + GROUP_MARKER.len()..start + length];
    let group = match std::str::from_utf8(value).map(str::parse::<u32>) {
        // pid 0 and 1 are never a restart's group.
        Ok(Ok(pgid)) if pgid > 1 => Group::Leader(pgid),
        _ if value == b"none" => Group::NotLeader,
        _ => Group::Unseen,
    };
    Some((group, start..start + length + 1))
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use super::KILL_GROUP;

    fn alive(pid: &str) -> bool {
        Command::new("kill")
            .args(["-0", pid])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    #[test]
    fn the_kill_leaves_alone_the_group_of_a_command_that_already_ended() {
        // A leader that ends at once, leaving a process in its group (and
        // reaped by `output`, as sshd reaps the command).
        let started = Command::new("sh")
            .args(["-c", "sleep 600 >/dev/null 2>&1 & echo $$ $!"])
            .process_group(0)
            .output()
            .unwrap();
        let started = String::from_utf8(started.stdout).unwrap();
        let (pgid, left) = started.trim().split_once(' ').unwrap();

        let kill = Command::new("sh")
            .args(["-c", KILL_GROUP, "mandrill-kill", pgid])
            .env("LC_ALL", "C")
            .status()
            .unwrap();

        let still_there = alive(left);
        let _ = Command::new("kill").args(["-KILL", left]).status();
        assert_eq!(kill.code(), Some(2), "ended by itself, no signal sent");
        assert!(still_there, "what it left running is left alone");
    }
}
