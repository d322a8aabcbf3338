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
//! the command may still run (or, ended by itself as the time-out came,
//! may have done its work), and the error says so
//! ([`RestartError::OutcomeUnknown`]), so that no retry runs beside it.
//! Output is read to its end before the exit status (reading the status
//! ends the session, and the rest of the output with it); a process the
//! command leaves behind with the output pipe open does not hold the
//! restart: the host is asked whether the command is gone (or the status
//! is read beside the output once `timeout` is near), and output is then
//! read for a few seconds more.
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
//!
//! Here, a restart's course (connect, start); beside it, one file each:
//! waiting for the command's end (`wait.rs`), the connection pool
//! (`pool.rs`), the process group's report, probe and kill (`group.rs`),
//! what the command's end means (`exit.rs`), quoting the command line
//! (`quote.rs`), bounded output (`output.rs`), settings.

mod exit;
mod group;
mod output;
mod pool;
mod quote;
mod settings;
#[cfg(test)]
mod tests;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use openssh::{Session, Stdio};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::hosts::HostMap;
use super::template::{ArgvTemplate, Values};
use super::{Cause, Reservation, Reserving, RestartError, Restarter, SettingError};
use crate::domain::{Hostname, RestartRequest, Restarted};

pub(crate) use settings::SshSettings;

use group::REPORT_GROUP;
use pool::{ConnectError, Destination, Pool};
use quote::quote_command_line;

/// A command running over a pooled connection.
type RemoteChild = openssh::Child<Arc<Session>>;

/// Restarts hosts by running a command over SSH. See the module docs.
#[derive(Debug)]
pub(crate) struct SshRestarter {
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
    pub(crate) fn new(settings: &SshSettings, hosts: HostMap) -> Result<Self, SettingError> {
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
