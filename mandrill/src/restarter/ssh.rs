//! The `ssh` backend: runs the configured command on the host over SSH.
//!
//! It drives the system's OpenSSH client through the `openssh` crate: one
//! master connection per (address, port, user), multiplexed for every
//! restart of that host and closed by ssh itself once idle for
//! `idle_timeout` (`ControlPersist`). ssh reads a configuration this backend
//! writes, never the user's `~/.ssh/config` or `/etc/ssh/ssh_config`, and
//! checks host keys strictly against `known_hosts_file` alone: an unknown or
//! changed key fails the restart for good before anything runs.
//!
//! The command runs in a process group of its own (sshd makes every
//! session's command a session leader; a one-line `sh` wrapper reports the
//! group's id first). One that runs past `timeout` is stopped over the same
//! connection: `SIGTERM`, then `SIGKILL`, to the whole group, until the
//! group is gone. Only a confirmed end is a retryable time-out; otherwise
//! the command may still run, and the error says so
//! ([`RestartError::OutcomeUnknown`]), so that no retry runs beside it. A
//! process the command leaves behind with the output pipe open does not
//! hold the restart: output is read for one second after the exit status.
//!
//! Every phase has its bound, and together they are what
//! `worker.restart_timeout` must exceed ([`SshSettings::longest_restart`]):
//! getting a connection (waiting for another restart's connection to the
//! host, and replacing a closed one, included) at most twice
//! `connect_timeout`; starting the command and running it, `timeout`; the
//! kill, [`KILL_TIMEOUT`].
//!
//! Failure classes: a host key refused or authentication refused (and a
//! configured exit code, a missing or root user) are permanent; a connection
//! refused or timed out, a non-zero exit, a dropped connection and a
//! time-out whose kill was confirmed are worth retrying, except that a
//! connection the host drops while the command runs counts as the restart
//! when `reboot_drops_connection` is set.

mod output;
mod pool;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use openssh::{ChildStdout, Session, Stdio};
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::hosts::HostMap;
use super::template::{ArgvTemplate, Values};
use super::{Cause, Reservation, Reserving, RestartError, Restarter, SettingError};
use crate::domain::{Hostname, RestartRequest, Restarted};

pub use output::{Captured, read_bounded};
pub use settings::{KILL_TIMEOUT, SshSettings};

use pool::{ConnectError, Destination, Pool};

/// A command running over a pooled connection.
type RemoteChild = openssh::Child<Arc<Session>>;

/// How long output is still read after the command's exit status arrived,
/// for a pipe that a process it left running keeps open (as the command
/// backend does). sshd reports the exit when the command ends, but closes
/// the channel only once every holder of its pipes has. Longer than the
/// command backend's second: the channel's end crosses the network and the
/// multiplexing master, which a loaded machine can delay past a second.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(3);

/// What the remote shell runs before the command: `sh` prints the id of its
/// process group on a line of its own (`none` when it does not lead one, so
/// that a group that was never ours is never killed, nor its absence taken
/// for a confirmed end), then becomes the command. One line, no single
/// quote: it goes inside single quotes through any login shell.
const REPORT_GROUP: &str = r#"if kill -0 -$$ 2>/dev/null; then echo "mandrill-pgid $$"; else echo "mandrill-pgid none"; fi; exec "$@""#;

/// The line [`REPORT_GROUP`] prints, up to the id.
const GROUP_MARKER: &[u8] = b"mandrill-pgid ";

/// Output the login shell may print before the group's line (a noisy
/// profile), kept as the command's; past this the line is given up on.
const MAX_BEFORE_MARKER: usize = 4096;

/// Stops process group `$1`: `SIGTERM`, a second for it to go, `SIGKILL`,
/// another second. Exits 0 once the group is gone ("No such process";
/// permission refused is not gone), 1 if it is still there. `C` locale, so
/// that the message is the one looked for; dash's `kill` takes no `--`.
const KILL_GROUP: &str = r#"g=$1; gone() { kill -0 -$g 2>&1 | grep -q "No such process"; }; settle() { i=0; while [ $i -lt 10 ]; do gone && return 0; sleep 0.1; i=$((i+1)); done; gone; }; gone && exit 0; kill -TERM -$g 2>/dev/null; settle && exit 0; kill -KILL -$g 2>/dev/null; settle && exit 0; exit 1"#;

/// The command's process group on the host, as the wrapper reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    /// Not reported (yet): the command may or may not have started.
    Unseen,
    /// The command does not lead a group of its own: it cannot be stopped.
    NotLeader,
    /// The group's id.
    Leader(u32),
}

/// Restarts hosts by running a command over SSH. See the module docs.
#[derive(Debug)]
pub struct SshRestarter {
    argv: ArgvTemplate,
    hosts: HostMap,
    default_user: Option<String>,
    allow_root: bool,
    port: u16,
    connect_timeout: Duration,
    timeout: Duration,
    reboot_drops_connection: bool,
    max_output: usize,
    permanent_exit_codes: Vec<i32>,
    /// One permit per restart in flight: `max_connections`.
    permits: Arc<Semaphore>,
    pool: Pool,
}

impl SshRestarter {
    /// Checks the settings, the key and known_hosts files, and prepares the
    /// private directory for ssh's configuration and control sockets. No
    /// connection is opened until the first restart.
    pub fn new(settings: &SshSettings, hosts: HostMap) -> Result<Self, SettingError> {
        settings
            .validate()
            .map_err(|(key, why)| SettingError::new(format!("restarter.ssh.{key}"), why))?;
        // `validate` refused an unparsable argv.
        let argv = ArgvTemplate::parse(&settings.argv)
            .map_err(|why| SettingError::new("restarter.ssh.argv", why))?;
        Ok(Self {
            argv,
            hosts,
            default_user: settings.user.clone(),
            allow_root: settings.allow_root,
            port: settings.port,
            connect_timeout: settings.connect_timeout,
            timeout: settings.timeout,
            reboot_drops_connection: settings.reboot_drops_connection,
            max_output: settings.max_output,
            permanent_exit_codes: settings.permanent_exit_codes.clone(),
            permits: Arc::new(Semaphore::new(settings.max_connections)),
            pool: Pool::new(settings)?,
        })
    }

    /// Where to connect for `request`: the host map's address, port and user
    /// over the section's defaults. Refuses what ssh could misread.
    fn destination(&self, request: &RestartRequest) -> Result<Destination, String> {
        let target = self.hosts.target(request);
        let address = target.address;
        if address.starts_with('-') || address.contains('@') || address.contains('/') {
            return Err(format!("{address:?} is not an address ssh can connect to"));
        }
        let Some(user) = target.user.or_else(|| self.default_user.clone()) else {
            return Err(format!(
                "no ssh user for {address}: set restarter.ssh.user or the host map's user"
            ));
        };
        settings::check_user(&user, self.allow_root)?;
        Ok(Destination {
            address,
            port: target.port.unwrap_or(self.port),
            user,
        })
    }

    /// A connection to `destination` by `connect_by`: the pooled one, or a
    /// new one. Nothing has run if this fails.
    async fn connect(
        &self,
        host: &Hostname,
        destination: &Destination,
        connect_by: Instant,
    ) -> Result<Arc<Session>, RestartError> {
        match tokio::time::timeout_at(connect_by, self.pool.get(destination)).await {
            Ok(Ok(session)) => Ok(session),
            Ok(Err(ConnectError::Refused(cause))) => Err(RestartError::permanent(host, cause)),
            Ok(Err(ConnectError::Unreachable(cause))) => Err(RestartError::failed(host, cause)),
            Err(_elapsed) => Err(RestartError::failed(
                host,
                format!(
                    "no connection to {destination} within {:?} (2 × connect_timeout, waiting \
                     for another restart's connection and retries included)",
                    self.connect_timeout * 2
                ),
            )),
        }
    }

    /// Starts `command_line` over the pooled connection to `destination`:
    /// the connection by `connect_by`, the command by `command_by`. Nothing
    /// has run if starting fails, so a connection that closed between its
    /// check and its use is replaced once (by `connect_by` still); a start
    /// cut short by `command_by` may have begun.
    async fn start(
        &self,
        host: &Hostname,
        destination: &Destination,
        command_line: &str,
        connect_by: Instant,
    ) -> Result<(Arc<Session>, RemoteChild, Instant), RestartError> {
        let mut replaced = false;
        let mut command_by = None;
        loop {
            let session = self.connect(host, destination, connect_by).await?;
            // The command's time starts once there is a connection to run
            // it on, and is not given again for a replaced one.
            let command_by = *command_by.get_or_insert_with(|| Instant::now() + self.timeout);
            let mut command = Session::to_raw_command(Arc::clone(&session), command_line);
            command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let Ok(spawned) = tokio::time::timeout_at(command_by, command.spawn()).await else {
                return Err(RestartError::OutcomeUnknown {
                    host: host.clone(),
                    cause: format!(
                        "starting the command on {destination} took longer than {:?}; it may \
                         have started",
                        self.timeout
                    )
                    .into(),
                });
            };
            match spawned {
                Ok(child) => return Ok((session, child, command_by)),
                // A connection that closed after its check is replaced; one
                // still up refused the session (e.g. sshd's MaxSessions).
                Err(e) if !replaced && session.check().await.is_err() => {
                    tracing::debug!(%host, %destination, error = %e, "the pooled ssh connection closed; replacing it");
                    self.pool.discard(destination, session);
                    replaced = true;
                }
                Err(e) => {
                    return Err(RestartError::failed(
                        host,
                        Cause::new(format!("could not start the command on {destination}"), e),
                    ));
                }
            }
        }
    }

    /// Waits for the command's exit until `command_by`, its output captured
    /// and bounded; past it, stops the command's process group.
    async fn run(
        &self,
        host: &Hostname,
        destination: &Destination,
        session: &Session,
        mut child: RemoteChild,
        command_by: Instant,
    ) -> Result<Restarted, RestartError> {
        let mut stdout = child.stdout().take();
        let stderr = child.stderr().take();
        let limit = self.max_output;
        let (mut out, mut err) = (Captured::default(), Captured::default());
        let mut group = Group::Unseen;
        let exited = {
            let reading = async {
                tokio::join!(
                    async {
                        group = read_group(stdout.as_mut(), &mut out, limit).await;
                        output::capture(stdout, &mut out, limit).await;
                    },
                    output::capture(stderr, &mut err, limit),
                )
            };
            let mut reading = std::pin::pin!(reading);
            let mut waiting = std::pin::pin!(child.wait());
            let mut read_all = false;
            // Read while waiting, so that the command never blocks on a full
            // pipe; the exit status arrives when the command ends, whatever
            // still holds its pipes.
            let exited = loop {
                tokio::select! {
                    status = &mut waiting => break Some(status),
                    _ = &mut reading, if !read_all => read_all = true,
                    () = tokio::time::sleep_until(command_by) => break None,
                }
            };
            if exited.is_some() && !read_all {
                let drained_by = command_by.min(Instant::now() + DRAIN_AFTER_EXIT);
                let _ = tokio::time::timeout_at(drained_by, reading).await;
            }
            exited
        };
        let output = Captured::describe(&out, &err, limit);
        match exited {
            Some(status) => self.exit(host, destination, session, status, output).await,
            None => Err(self.stop(host, destination, session, group).await),
        }
    }

    /// What the command's exit (or the error in its place) means.
    async fn exit(
        &self,
        host: &Hostname,
        destination: &Destination,
        session: &Session,
        status: Result<std::process::ExitStatus, openssh::Error>,
        output: Option<String>,
    ) -> Result<Restarted, RestartError> {
        match status {
            Ok(status) if status.success() => Ok(Restarted {
                recovered_after: None,
                output,
            }),
            Ok(status) => Err(self.exited(
                host,
                destination,
                status.code().unwrap_or(-1),
                output.as_deref(),
            )),
            // openssh answers exit 127 (the remote shell found no such
            // command) with an error rather than the status: it is an exit
            // code like any other, `permanent_exit_codes` included.
            Err(openssh::Error::Remote(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(self.exited(host, destination, 127, output.as_deref()))
            }
            Err(openssh::Error::RemoteProcessTerminated | openssh::Error::Disconnected) => {
                if self.pool.connection_lost(session).await {
                    if self.reboot_drops_connection {
                        tracing::info!(%host, %destination, "the host dropped the connection while the command ran: counted as restarted (reboot_drops_connection)");
                        let note = "(the host dropped the connection: counted as restarted)";
                        return Ok(Restarted {
                            recovered_after: None,
                            output: Some(match output {
                                Some(output) => format!("{}\n{note}", output.trim_end()),
                                None => note.to_owned(),
                            }),
                        });
                    }
                    return Err(RestartError::failed(
                        host,
                        format!(
                            "{destination} dropped the connection while the command ran (if the \
                             command reboots the host, set reboot_drops_connection = true){}",
                            output::suffix(output.as_deref())
                        ),
                    ));
                }
                Err(RestartError::failed(
                    host,
                    format!(
                        "the command was killed by a signal on {destination}{}",
                        output::suffix(output.as_deref())
                    ),
                ))
            }
            Err(e) => Err(RestartError::failed(
                host,
                Cause::new(format!("the command on {destination} failed"), e),
            )),
        }
    }
}

impl SshRestarter {
    /// Stops a command that ran past `timeout`: its process group killed
    /// over the same connection (a second channel), within [`KILL_TIMEOUT`].
    /// A confirmed end is a time-out worth retrying; anything less leaves
    /// the command possibly running, and says so.
    async fn stop(
        &self,
        host: &Hostname,
        destination: &Destination,
        session: &Session,
        group: Group,
    ) -> RestartError {
        let unknown = |why: String| RestartError::OutcomeUnknown {
            host: host.clone(),
            cause: format!(
                "the command ran longer than {:?} on {destination} and {why}",
                self.timeout
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
                return unknown(
                    "could not be stopped: its process group was never reported".into(),
                );
            }
        };
        let kill = format!("exec env LC_ALL=C sh -c '{KILL_GROUP}' mandrill-kill {pgid}");
        let killed = tokio::time::timeout(
            KILL_TIMEOUT,
            session
                .raw_command(kill)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status(),
        )
        .await;
        match killed {
            Ok(Ok(status)) if status.success() => {
                tracing::info!(%host, %destination, pgid, "the timed-out command's process group was killed");
                RestartError::TimedOut {
                    host: host.clone(),
                    after: self.timeout,
                }
            }
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

    /// A command that ran and exited with `code` (not 0): permanent if the
    /// code is listed in `permanent_exit_codes`, else worth retrying.
    fn exited(
        &self,
        host: &Hostname,
        destination: &Destination,
        code: i32,
        output: Option<&str>,
    ) -> RestartError {
        let reason = format!(
            "the command exited with {code} on {destination}{}",
            output::suffix(output)
        );
        if self.permanent_exit_codes.contains(&code) {
            RestartError::permanent(host, reason)
        } else {
            RestartError::failed(host, reason)
        }
    }
}

#[async_trait]
impl Restarter for SshRestarter {
    fn describe(&self, request: &RestartRequest) -> String {
        match self.destination(request) {
            Ok(destination) => {
                let argv = self.argv.render(&Values {
                    host: &destination.address,
                    request,
                });
                format!("ssh {destination} -- {}", quote_command_line(&argv))
            }
            Err(reason) => format!("ssh to {}: refused: {reason}", request.hostname),
        }
    }

    fn reserve<'a>(&'a self, _request: &'a RestartRequest) -> Reserving<'a> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Reserving::now(Ok(Reservation::permit(permit)));
        }
        Reserving::wait(async move {
            let permit = Arc::clone(&self.permits)
                .acquire_owned()
                .await
                // The semaphore is never closed.
                .expect("the ssh connection semaphore is never closed");
            Ok(Reservation::permit(permit))
        })
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let _reservation = reservation;
        let host = &request.hostname;
        let destination = self
            .destination(request)
            .map_err(|reason| RestartError::permanent(host, reason))?;
        let argv = self.argv.render(&Values {
            host: &destination.address,
            request,
        });
        let command_line = quote_command_line(&argv);
        let connect_by = Instant::now() + self.connect_timeout * 2;
        let wrapped = format!("exec sh -c '{REPORT_GROUP}' mandrill-restart {command_line}");
        let (session, child, command_by) =
            self.start(host, &destination, &wrapped, connect_by).await?;
        tracing::debug!(%host, %destination, command = %output::excerpt(&command_line), "running the restart command over ssh");
        let result = self
            .run(host, &destination, &session, child, command_by)
            .await;
        self.pool.release(&destination, session);
        result
    }
}

/// Reads `stdout` up to the wrapper's line naming the command's process
/// group, keeping whatever came before or after it as the command's output.
/// `Unseen` if the stream ends, or holds too much, first.
async fn read_group(stdout: Option<&mut ChildStdout>, into: &mut Captured, limit: usize) -> Group {
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

/// The command line the remote shell receives: every argument quoted for a
/// POSIX shell, so that each arrives as exactly one literal argument
/// whatever it contains (`;`, `$(…)`, quotes, spaces, newlines).
pub fn quote_command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One argument quoted for a POSIX shell: left alone when it holds only
/// characters no shell treats specially, else single-quoted, with each `'`
/// written as `'\''`.
fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,:+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        return arg.to_owned();
    }
    let mut quoted = String::with_capacity(arg.len() + 2);
    quoted.push('\'');
    for c in arg.chars() {
        if c == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_argument_is_quoted_for_the_remote_shell() {
        let argv: Vec<String> = [
            "sudo",
            "systemctl",
            "restart",
            "app@x.service",
            "a;b",
            "it's",
            "",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            quote_command_line(&argv),
            r#"sudo systemctl restart app@x.service 'a;b' 'it'\''s' ''"#
        );
    }
}
