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
//! Failure classes: a host key refused or authentication refused (and a
//! configured exit code, a missing or root user) are permanent; a connection
//! refused or timed out, a non-zero exit and a dropped connection are worth
//! retrying, except that a connection the host drops while the command runs
//! counts as the restart when `reboot_drops_connection` is set.

mod output;
mod pool;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use openssh::{Session, Stdio};
use tokio::sync::Semaphore;

use super::hosts::HostMap;
use super::template::{ArgvTemplate, Values};
use super::{Reservation, Reserving, RestartError, Restarter};
use crate::domain::{Hostname, RestartRequest, Restarted};

pub use output::{Captured, read_bounded};
pub use settings::SshSettings;

use pool::{ConnectError, Destination, Pool};

/// A command running over a pooled connection.
type RemoteChild = openssh::Child<Arc<Session>>;

/// Restarts hosts by running a command over SSH. See the module docs.
#[derive(Debug)]
pub struct SshRestarter {
    argv: ArgvTemplate,
    hosts: HostMap,
    default_user: Option<String>,
    allow_root: bool,
    port: u16,
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
    pub fn new(settings: &SshSettings, hosts: HostMap) -> Result<Self, String> {
        settings
            .validate()
            .map_err(|(key, why)| format!("restarter.ssh.{key}: {why}"))?;
        // `validate` refused an unparsable argv.
        let argv = ArgvTemplate::parse(&settings.argv).map_err(|why| format!("argv {why}"))?;
        Ok(Self {
            argv,
            hosts,
            default_user: settings.user.clone(),
            allow_root: settings.allow_root,
            port: settings.port,
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

    /// Starts `command_line` over the pooled connection to `destination`.
    /// Nothing has run if this fails, so a connection that closed between
    /// its check and its use is replaced once.
    async fn start(
        &self,
        host: &Hostname,
        destination: &Destination,
        command_line: &str,
    ) -> Result<(Arc<Session>, RemoteChild), RestartError> {
        let mut replaced = false;
        loop {
            let session = self.pool.get(destination).await.map_err(|e| match e {
                ConnectError::Refused(reason) => RestartError::Permanent {
                    host: host.clone(),
                    reason,
                },
                ConnectError::Unreachable(reason) => RestartError::failed(host, reason),
            })?;
            let spawned = Session::to_raw_command(Arc::clone(&session), command_line)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .await;
            match spawned {
                Ok(child) => return Ok((session, child)),
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
                        format!("could not start the command on {destination}: {e}"),
                    ));
                }
            }
        }
    }

    /// Waits for the command's exit, its output captured and bounded.
    async fn finish(
        &self,
        host: &Hostname,
        destination: &Destination,
        session: &Session,
        mut child: RemoteChild,
    ) -> Result<Restarted, RestartError> {
        let stdout = child.stdout().take();
        let stderr = child.stderr().take();
        // The pipes end when the command (and whatever kept them open) ends
        // or the connection drops; only then is the exit status final.
        let (stdout, stderr) = tokio::join!(
            read_bounded(stdout, self.max_output),
            read_bounded(stderr, self.max_output)
        );
        let output = Captured::describe(&stdout, &stderr, self.max_output);
        match child.wait().await {
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
                format!("the command on {destination} failed: {e}"),
            )),
        }
    }
}

impl SshRestarter {
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
            RestartError::Permanent {
                host: host.clone(),
                reason,
            }
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
            .map_err(|reason| RestartError::Permanent {
                host: host.clone(),
                reason,
            })?;
        let argv = self.argv.render(&Values {
            host: &destination.address,
            request,
        });
        let command_line = quote_command_line(&argv);
        let (session, child) = self.start(host, &destination, &command_line).await?;
        tracing::debug!(%host, %destination, command = %output::excerpt(&command_line), "running the restart command over ssh");
        let result = tokio::time::timeout(
            self.timeout,
            self.finish(host, &destination, &session, child),
        )
        .await;
        self.pool.release(&destination, session);
        match result {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(RestartError::TimedOut {
                host: host.clone(),
                after: self.timeout,
            }),
        }
    }
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
