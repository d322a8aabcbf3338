//! `[restarter.ssh]`: the ssh backend's settings, owned here.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::restarter::template::ArgvTemplate;
use crate::settings::{duration, settings};

/// The longest the kill of a timed-out command takes: `SIGTERM`, a second
/// for its process group to go, `SIGKILL`, another second, and the round
/// trips over the open connection. Past it the command may still run.
pub(crate) const KILL_TIMEOUT: Duration = Duration::from_secs(4);

settings! {
    /// `[restarter.ssh]`: how the ssh backend reaches hosts and what it runs
    /// there.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct SshSettings {
        /// Remote command templates, e.g. `["sudo", "systemctl", "restart",
        /// "app"]`, each shell-quoted as one argument.
        ///
        /// `{host}`, `{instance_name}`, `{message_id}` and `{group}` are
        /// replaced by whole values, and every argument is shell-quoted,
        /// because ssh hands the host one command line for the user's shell:
        /// each arrives as exactly one literal argument.
        pub argv: Vec<String> = Vec::new(),
        /// Login user, unless the host map names one; one of the two is
        /// required.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub user: Option<String> = None,
        /// Allow logging in as root.
        ///
        /// Off by default: log in as a user allowed to run just the restart
        /// command (e.g. through sudo).
        pub allow_root: bool = false,
        /// Private key; default the agent's keys and ssh's own.
        ///
        /// When set, only this key is offered. Keys with a passphrase must go
        /// through the agent.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub key_file: Option<PathBuf> = None,
        /// ssh-agent socket, instead of the environment's `SSH_AUTH_SOCK`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub agent_socket: Option<PathBuf> = None,
        /// Host keys checked strictly; required.
        ///
        /// A host whose key is missing or different is refused, never added.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub known_hosts_file: Option<PathBuf> = None,
        /// Port, unless the host map names one.
        pub port: u16 = 22,
        /// Limit on connecting (whole seconds, at least 1s).
        ///
        /// Covers the TCP connection and the server's greeting;
        /// authentication may take as long again.
        #[serde(with = "duration")]
        pub connect_timeout: Duration = Duration::from_secs(5),
        /// Limit on the remote command; then its process group is killed.
        ///
        /// The kill goes over the same connection, and the restart has timed
        /// out (and is retried), or, if the kill cannot be confirmed within
        /// 4s, may still be running (the host stays held; no retry runs
        /// beside it). Keep `worker.restart_timeout` above twice
        /// `connect_timeout` plus this plus 4s.
        #[serde(with = "duration")]
        pub timeout: Duration = Duration::from_secs(15),
        /// Connections open at once, and restarts in flight over ssh.
        ///
        /// Beyond it, a restart waits; idle connections are closed first to
        /// make room.
        pub max_connections: usize = 16,
        /// Close a host's connection unused this long (whole seconds, at
        /// least 1s).
        #[serde(with = "duration")]
        pub idle_timeout: Duration = Duration::from_secs(60),
        /// Keepalive period while a command runs.
        ///
        /// So that a host that vanishes is noticed (three missed answers end
        /// the connection).
        #[serde(with = "duration")]
        pub server_alive_interval: Duration = Duration::from_secs(10),
        /// A connection dropped by the host while the command runs (as a
        /// reboot does) counts as restarted, not failed.
        pub reboot_drops_connection: bool = false,
        /// Bytes of output (stdout then stderr) kept with the outcome.
        pub max_output: usize = 4096,
        /// Remote exit codes that mean: do not retry (dead-lettered at once).
        pub permanent_exit_codes: Vec<i32> = Vec::new(),
    }
}

impl SshSettings {
    /// The longest a restart can take: a connection within twice
    /// `connect_timeout` (waiting for another restart's connection to the
    /// host and replacing a closed one included), the command within
    /// `timeout`, and its kill within [`KILL_TIMEOUT`].
    pub(crate) fn longest_restart(&self) -> Duration {
        self.connect_timeout
            .saturating_mul(2)
            .saturating_add(self.timeout)
            .saturating_add(KILL_TIMEOUT)
    }

    /// Checks what can be checked without touching the disk or a host,
    /// naming the failing key relative to `[restarter.ssh]`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        ArgvTemplate::parse(&self.argv).map_err(|why| ("argv", why))?;
        if let Some(user) = &self.user {
            check_user(user, self.allow_root).map_err(|why| ("user", why))?;
        }
        let Some(known_hosts) = &self.known_hosts_file else {
            return Err((
                "known_hosts_file",
                "is required: the file holding the key of every host to restart".into(),
            ));
        };
        check_path(known_hosts).map_err(|why| ("known_hosts_file", why))?;
        if let Some(key) = &self.key_file {
            check_path(key).map_err(|why| ("key_file", why))?;
        }
        if self.port == 0 {
            return Err(("port", "must not be 0".into()));
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("idle_timeout", self.idle_timeout),
            ("server_alive_interval", self.server_alive_interval),
        ] {
            if value < Duration::from_secs(1) {
                return Err((key, "must be at least 1s (ssh counts whole seconds)".into()));
            }
        }
        if self.timeout.is_zero() {
            return Err(("timeout", "must be more than 0s".into()));
        }
        if self.max_connections == 0 {
            return Err(("max_connections", "must be at least 1".into()));
        }
        if self.permanent_exit_codes.contains(&0) {
            return Err((
                "permanent_exit_codes",
                "must not contain 0 (success)".into(),
            ));
        }
        Ok(())
    }
}

/// Refuses a user ssh could misread, and root unless allowed.
pub(super) fn check_user(user: &str, allow_root: bool) -> Result<(), String> {
    if user.is_empty()
        || user.starts_with('-')
        || user
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '@')
    {
        return Err(format!("{user:?} is not a user name"));
    }
    if user == "root" && !allow_root {
        return Err(
            "root is refused: log in as a user allowed to run the restart command, or set \
             allow_root = true"
                .into(),
        );
    }
    Ok(())
}

/// Refuses paths that ssh's configuration syntax would alter (`%` tokens,
/// quotes).
fn check_path(path: &std::path::Path) -> Result<(), String> {
    let text = path.to_string_lossy();
    if text.is_empty() || text.contains(['"', '%']) || text.chars().any(char::is_control) {
        return Err(format!(
            "{text:?} cannot be handed to ssh (no quotes, '%' or control characters)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> SshSettings {
        SshSettings {
            argv: vec![
                "sudo".into(),
                "systemctl".into(),
                "restart".into(),
                "app".into(),
            ],
            user: Some("chaos".into()),
            known_hosts_file: Some("/etc/mandrill/known_hosts".into()),
            ..SshSettings::default()
        }
    }

    #[test]
    fn a_section_parses_with_defaults_and_round_trips() {
        let settings: SshSettings = toml::from_str(
            r#"
            argv = ["sudo", "systemctl", "restart", "app-{group}"]
            user = "chaos"
            known_hosts_file = "/etc/mandrill/known_hosts"
            key_file = "/etc/mandrill/id_ed25519"
            timeout = "2m"
            reboot_drops_connection = true
            permanent_exit_codes = [3]
            "#,
        )
        .unwrap();
        assert_eq!(settings.port, 22);
        assert_eq!(settings.timeout, Duration::from_secs(120));
        assert_eq!(settings.idle_timeout, Duration::from_secs(60));
        assert!(settings.reboot_drops_connection);
        settings.validate().unwrap();
        let again: SshSettings = toml::from_str(&toml::to_string(&settings).unwrap()).unwrap();
        assert_eq!(again, settings);
        let unknown = toml::from_str::<SshSettings>("passwd = \"x\"").unwrap_err();
        assert!(unknown.to_string().contains("unknown field"), "{unknown}");
    }

    #[test]
    fn root_is_refused_unless_allowed() {
        let root = SshSettings {
            user: Some("root".into()),
            ..valid()
        };
        let (key, why) = root.validate().unwrap_err();
        assert_eq!(key, "user");
        assert!(why.contains("allow_root"), "{why}");
        SshSettings {
            allow_root: true,
            ..root
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn missing_or_bad_values_name_their_key() {
        let cases: [(SshSettings, &str); 7] = [
            (
                SshSettings {
                    argv: vec![],
                    ..valid()
                },
                "argv",
            ),
            (
                SshSettings {
                    argv: vec!["x".into(), "{hostname}".into()],
                    ..valid()
                },
                "argv",
            ),
            (
                SshSettings {
                    known_hosts_file: None,
                    ..valid()
                },
                "known_hosts_file",
            ),
            (
                SshSettings {
                    key_file: Some("/k/%h".into()),
                    ..valid()
                },
                "key_file",
            ),
            (
                SshSettings {
                    user: Some("-oProxyCommand=x".into()),
                    ..valid()
                },
                "user",
            ),
            (
                SshSettings {
                    idle_timeout: Duration::from_millis(500),
                    ..valid()
                },
                "idle_timeout",
            ),
            (
                SshSettings {
                    permanent_exit_codes: vec![0],
                    ..valid()
                },
                "permanent_exit_codes",
            ),
        ];
        for (settings, expected) in cases {
            let (key, why) = settings.validate().unwrap_err();
            assert_eq!(key, expected, "{why}");
            assert!(!why.starts_with(char::is_uppercase), "lower-case: {why}");
        }
    }
}
