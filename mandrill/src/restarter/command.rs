//! The `command` backend: runs an argv template per request, never through
//! a shell (`["ssh", "{host}", "sudo", "systemctl", "restart", "app"]`). Each
//! placeholder becomes exactly one whole argument, so neither an instance
//! name nor a host-map address can add an argument or reach a shell.
//!
//! Exit 0 is success; an exit code listed in `permanent_exit_codes` is a
//! permanent failure (dead-lettered at once); any other ending, a timeout
//! included, is a failure worth retrying. The captured output goes with the
//! outcome either way.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tracing::debug;

use super::hosts::HostMap;
use super::process::{ProcessRunner, RunError, for_log};
use super::template::{ArgvTemplate, Values};
use super::{Cause, Reservation, RestartError, Restarter, SettingError};
use crate::causes::WithCauses;
use crate::domain::{RestartRequest, Restarted};
use crate::settings::{duration, settings};

/// The most output kept per stream, so that a record stays small.
const MAX_OUTPUT_LIMIT: usize = 1024 * 1024;

settings! {
    /// `[restarter.command]`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct CommandSettings {
        /// Program and argument templates ({host} {instance_name}
        /// {message_id} {group}); no shell.
        ///
        /// Each placeholder is replaced by one whole value. The program
        /// itself must be literal.
        pub argv: Vec<String> = Vec::new(),
        /// Kill the run, with its process group, after this.
        ///
        /// A timed-out run counts as a failure worth retrying. Keep it below
        /// worker.restart_timeout.
        #[serde(with = "duration")]
        pub timeout: Duration = Duration::from_secs(20),
        /// Directory the program runs in; default the service's own.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub working_dir: Option<PathBuf> = None,
        /// Inherited environment variables kept; the rest is cleared.
        ///
        /// So secrets in the service's environment stay there. The default
        /// keeps what ssh and kubectl need.
        pub env_allow: Vec<String> = ["PATH", "HOME", "USER", "LANG", "SSH_AUTH_SOCK"]
            .map(String::from)
            .to_vec(),
        /// Extra fixed environment variables, over inherited ones.
        pub env: BTreeMap<String, String> = BTreeMap::new(),
        /// Bytes of stdout and of stderr kept with the outcome, each.
        ///
        /// The rest is read and discarded.
        pub max_output: usize = 4096,
        /// Exit codes that mean: do not retry (dead-lettered at once).
        ///
        /// E.g. the host is unknown: retrying will not help.
        pub permanent_exit_codes: Vec<i32> = Vec::new(),
    }
}

impl CommandSettings {
    /// Checks the settings, naming the failing key within the section.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        ArgvTemplate::parse(&self.argv).map_err(|why| ("argv", why))?;
        if self.timeout.is_zero() {
            return Err(("timeout", "must be more than zero".into()));
        }
        for name in &self.env_allow {
            check_env_name(name).map_err(|why| ("env_allow", why))?;
        }
        for (name, value) in &self.env {
            check_env_name(name).map_err(|why| ("env", why))?;
            if value.contains('\0') {
                return Err(("env", format!("the value of {name} contains a NUL byte")));
            }
        }
        if self.max_output > MAX_OUTPUT_LIMIT {
            return Err((
                "max_output",
                format!("is {} bytes (at most {MAX_OUTPUT_LIMIT})", self.max_output),
            ));
        }
        if let Some(code) = self
            .permanent_exit_codes
            .iter()
            .find(|c| !(1..=255).contains(*c))
        {
            return Err((
                "permanent_exit_codes",
                format!("{code} is not a failing exit code (1 to 255)"),
            ));
        }
        Ok(())
    }
}

fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return Err(format!("{name:?} is not an environment variable name"));
    }
    Ok(())
}

/// Runs the configured argv per restart. See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct CommandRestarter {
    argv: ArgvTemplate,
    runner: ProcessRunner,
    permanent_exit_codes: Vec<i32>,
    hosts: HostMap,
}

impl CommandRestarter {
    /// Builds the backend from validated settings; refuses a working
    /// directory that does not exist.
    pub(crate) fn new(settings: &CommandSettings, hosts: HostMap) -> Result<Self, SettingError> {
        let argv = ArgvTemplate::parse(&settings.argv)
            .map_err(|why| SettingError::new("restarter.command.argv", why))?;
        if let Some(dir) = &settings.working_dir
            && !dir.is_dir()
        {
            return Err(SettingError::new(
                "restarter.command.working_dir",
                format!("{} is not a directory", dir.display()),
            ));
        }
        let env: Vec<(String, String)> = settings
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let runner = ProcessRunner::new(
            settings.working_dir.clone(),
            &settings.env_allow,
            &env,
            settings.timeout,
            settings.max_output,
        );
        Ok(Self {
            argv,
            runner,
            permanent_exit_codes: settings.permanent_exit_codes.clone(),
            hosts,
        })
    }
}

#[async_trait]
impl Restarter for CommandRestarter {
    fn describe(&self, request: &RestartRequest) -> String {
        let target = self.hosts.target(request);
        let argv = self.argv.render(&Values {
            host: &target.address,
            request,
        });
        format!("run {argv:?}")
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        _reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let host = &request.hostname;
        let target = self.hosts.target(request);
        let argv = self.argv.render(&Values {
            host: &target.address,
            request,
        });
        let program = &argv[0];
        let finished = match self.runner.run(&argv).await {
            Ok(finished) => finished,
            Err(error) => {
                debug!(%host, error = %for_log(&WithCauses(&error).to_string(), 300), "restart command did not finish");
                let permanent = error.is_permanent();
                let output = match &error {
                    RunError::TimedOut { output, .. } => output.text(),
                    RunError::Spawn { .. } | RunError::Wait { .. } => None,
                };
                let cause = match output {
                    Some(text) => format!("{error}; output: {text}").into(),
                    None => Cause::from_error(error),
                };
                return Err(if permanent {
                    RestartError::permanent(host, cause)
                } else {
                    RestartError::failed(host, cause)
                });
            }
        };
        let output = finished.output.text();
        let code = finished.status.code();
        debug!(
            %host,
            ?code,
            output = %for_log(output.as_deref().unwrap_or(""), 300),
            "restart command ended"
        );
        let with_output = |what: String| match &output {
            Some(text) => format!("{what}; output: {text}"),
            None => what,
        };
        match code {
            Some(0) => Ok(Restarted {
                recovered_after: None,
                output,
            }),
            Some(code) if self.permanent_exit_codes.contains(&code) => {
                Err(RestartError::permanent(
                    host,
                    with_output(format!(
                        "{program:?} exited with code {code}, listed in \
                         restarter.command.permanent_exit_codes"
                    )),
                ))
            }
            Some(code) => Err(RestartError::failed(
                host,
                with_output(format!("{program:?} exited with code {code}")),
            )),
            None => Err(RestartError::failed(
                host,
                with_output(format!(
                    "{program:?} was killed by signal {}",
                    finished.status.signal().unwrap_or_default()
                )),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
