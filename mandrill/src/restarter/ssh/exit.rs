//! What the command's end means: success, an exit code (permanent when
//! listed in `permanent_exit_codes`), or a connection the host dropped.

use openssh::Session;

use super::SshRestarter;
use super::output;
use super::pool::Destination;
use crate::domain::{Hostname, Restarted};
use crate::restarter::{Cause, RestartError};

impl SshRestarter {
    /// What the command's exit (or the error in its place) means.
    pub(super) async fn exit(
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
