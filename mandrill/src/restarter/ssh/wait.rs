//! Waiting for the command's end: its output read to the end (bounded),
//! the host asked whether the command is gone, then its exit status; past
//! `timeout`, its process group stopped.

use std::time::Duration;

use openssh::Session;
use tokio::time::Instant;

use super::group::{self, Group, read_group};
use super::output::{self, Captured};
use super::pool::Destination;
#[cfg(doc)]
use super::settings::KILL_TIMEOUT;
use super::{RemoteChild, SshRestarter};
use crate::domain::{Hostname, Restarted};
use crate::restarter::RestartError;

/// How long output is still read once the command has ended, for a pipe
/// that a process it left running keeps open (as the command backend
/// does): sshd closes the channel only once every holder of its pipes has.
/// Longer than the command backend's second: the output crosses the network
/// and the multiplexing master, which a loaded machine can delay.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(3);

/// While the output has not ended, how soon the host is first asked whether
/// the command is still there, and the longest pause between an answer and
/// the next ask (each pause doubles): only a command that leaves a process
/// holding its output is asked more than once or twice.
const FIRST_PROBE: Duration = Duration::from_secs(1);
const LAST_PROBE: Duration = Duration::from_secs(4);

/// How long before `timeout` the status is read beside the output whatever
/// the asks said (a quarter of `timeout`, if less): an end the asks have not
/// seen yet must not be taken for a time-out, whose kill would make the
/// restart retryable after it happened.
const LAST_CALL: Duration = Duration::from_secs(2);

/// How long the status may still take once the host said the command is
/// gone (sshd sent it then), past `timeout` if need be: less than
/// [`KILL_TIMEOUT`], which bounds this phase as it bounds a kill.
const STATUS_AFTER_GONE: Duration = Duration::from_secs(1);

/// What ended the wait for the command's output.
enum Seen {
    /// Both streams ended: the status follows.
    OutputEnded,
    /// The exit status, read beside the output (no group to ask about, or
    /// `timeout` near).
    Exited(Result<std::process::ExitStatus, openssh::Error>),
    /// The host says the command is gone; a process it left holds the pipes.
    CommandGone,
    /// `timeout` passed.
    TimedOut,
}

/// How the command's run ended.
enum End {
    /// Its exit status (or the error in its place).
    Status(Result<std::process::ExitStatus, openssh::Error>),
    /// It ran past `timeout`.
    TimedOut,
    /// The host said it was gone, and its status never came.
    StatusLost,
}

impl SshRestarter {
    /// Waits for the command's exit until `command_by`, its output captured
    /// and bounded; past it, stops the command's process group.
    ///
    /// The exit status is read only once the output has ended, or once the
    /// command is seen gone from the host: reading it ends the multiplexed
    /// session, and the master then drops output still on its way, which
    /// sshd may send after the status (openssh-rust/openssh#103). Without a
    /// group to ask about, and in the last stretch before `timeout`, it is
    /// read beside the output, whose tail may then be lost: a lost tail is
    /// better than an end taken for a time-out.
    pub(super) async fn run(
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
        // Empty until the wrapper's line has been looked for.
        let group = std::sync::OnceLock::new();
        let end = {
            let reading = async {
                tokio::join!(
                    async {
                        let _ = group.set(read_group(stdout.as_mut(), &mut out, limit).await);
                        output::capture(stdout, &mut out, limit).await;
                    },
                    output::capture(stderr, &mut err, limit),
                )
            };
            let mut reading = std::pin::pin!(reading);
            let mut waiting = std::pin::pin!(child.wait());
            let mut probe = std::pin::pin!(None);
            let mut probe_every = FIRST_PROBE;
            let mut next_probe = Instant::now() + probe_every;
            let last_call = command_by - LAST_CALL.min(self.timeout / 4);
            // Once set, the status is read beside the output (and may cut
            // it short, as above).
            let mut wait_now = false;
            // Read while waiting, so that the command never blocks on a full
            // pipe.
            let seen = loop {
                tokio::select! {
                    _ = &mut reading => break Seen::OutputEnded,
                    status = &mut waiting, if wait_now => break Seen::Exited(status),
                    () = tokio::time::sleep_until(next_probe),
                        if probe.is_none() && !wait_now =>
                    {
                        match group.get().copied() {
                            Some(Group::Leader(pgid)) => {
                                probe.set(Some(group::ended(session, pgid)));
                            }
                            // No group to ask about.
                            Some(Group::NotLeader | Group::Unseen) => wait_now = true,
                            // Its line not read yet (a slow login shell).
                            None => next_probe = Instant::now() + probe_every,
                        }
                    }
                    ended = async { probe.as_mut().as_pin_mut().expect("guarded").await },
                        if probe.is_some() =>
                    {
                        probe.set(None);
                        if ended {
                            break Seen::CommandGone;
                        }
                        probe_every = (probe_every * 2).min(LAST_PROBE);
                        next_probe = Instant::now() + probe_every;
                    }
                    () = tokio::time::sleep_until(last_call), if !wait_now => wait_now = true,
                    () = tokio::time::sleep_until(command_by) => break Seen::TimedOut,
                }
            };
            // A process the command left behind may hold the pipes open: its
            // output is read for a while, not waited for.
            let drained_by = command_by.min(Instant::now() + DRAIN_AFTER_EXIT);
            match seen {
                Seen::OutputEnded => match tokio::time::timeout_at(command_by, waiting).await {
                    Ok(status) => End::Status(status),
                    Err(_elapsed) => End::TimedOut,
                },
                Seen::CommandGone => {
                    let _ = tokio::time::timeout_at(drained_by, reading).await;
                    // Gone, so its status was sent. Nothing is killed: this
                    // second comes out of the kill's time, which leaves the
                    // rest to `exit`'s look at the connection.
                    let status_by = command_by.max(Instant::now() + STATUS_AFTER_GONE);
                    match tokio::time::timeout_at(status_by, waiting).await {
                        Ok(status) => End::Status(status),
                        Err(_elapsed) => End::StatusLost,
                    }
                }
                Seen::Exited(status) => {
                    let _ = tokio::time::timeout_at(drained_by, reading).await;
                    End::Status(status)
                }
                Seen::TimedOut => End::TimedOut,
            }
        };
        let output = Captured::describe(&out, &err, limit);
        match end {
            End::Status(status) => self.exit(host, destination, session, status, output).await,
            End::TimedOut => Err(group::stop(
                host,
                destination,
                session,
                group.get().copied().unwrap_or(Group::Unseen),
                self.timeout,
            )
            .await),
            // It ran: a retry would restart the host again.
            End::StatusLost => Err(RestartError::OutcomeUnknown {
                host: host.clone(),
                cause: format!(
                    "the command ended on {destination}, but its exit status did not arrive{}",
                    output::suffix(output.as_deref())
                )
                .into(),
            }),
        }
    }
}
