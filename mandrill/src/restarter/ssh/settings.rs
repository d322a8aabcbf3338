//! `[restarter.ssh]`: the ssh backend's settings, owned here.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::restarter::template::ArgvTemplate;

/// The longest the kill of a timed-out command takes: `SIGTERM`, a second
/// for its process group to go, `SIGKILL`, another second, and the round
/// trips over the open connection. Past it the command may still run.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(4);

/// How the ssh backend reaches hosts and what it runs there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SshSettings {
    /// The command to run on the host, as an argv template, e.g. `["sudo",
    /// "systemctl", "restart", "app"]`. `{host}`, `{instance_name}`,
    /// `{message_id}` and `{group}` are replaced by whole values, and every
    /// argument is shell-quoted, because ssh hands the host one command line
    /// for the user's shell: each arrives as exactly one literal argument.
    pub argv: Vec<String>,
    /// The user to log in as, unless the host map names one; one of the two
    /// is required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Whether `root` may be the user. Off by default: log in as a user
    /// allowed to run just the restart command (e.g. through sudo).
    pub allow_root: bool,
    /// The private key to authenticate with (then only this key is
    /// offered). Unset: the SSH agent's keys and ssh's default identities.
    /// Keys with a passphrase must go through the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The SSH agent's socket, instead of the environment's `SSH_AUTH_SOCK`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_socket: Option<PathBuf>,
    /// The known_hosts file every host's key is checked against (required).
    /// A host whose key is missing or different is refused, never added.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_hosts_file: Option<PathBuf>,
    /// The port, unless the host map names one.
    pub port: u16,
    /// Longest wait for the TCP connection and the server's greeting (whole
    /// seconds, at least 1s); authentication may take as long again.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Longest wait for the command to start and finish; then its process
    /// group is killed over the same connection, and the restart has timed
    /// out (and is retried), or, if the kill cannot be confirmed within 4s,
    /// may still be running (the host stays held; no retry runs beside it).
    /// Keep `worker.restart_timeout` above twice `connect_timeout` plus this
    /// plus 4s.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Most restarts in flight over ssh at once, and most connections kept
    /// open: idle ones are closed first to make room.
    pub max_connections: usize,
    /// A connection unused for this long is closed (whole seconds, at least
    /// 1s).
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// How often ssh checks that a quiet host is still there while a command
    /// runs, so that a host that vanishes is noticed (three missed answers
    /// end the connection).
    #[serde(with = "duration")]
    pub server_alive_interval: Duration,
    /// Whether a connection the host drops while the command runs (as a
    /// reboot does) counts as restarted rather than as a failure.
    pub reboot_drops_connection: bool,
    /// Most bytes of the command's output (stdout then stderr) kept with the
    /// outcome.
    pub max_output: usize,
    /// Exit codes that mean retrying cannot help: the message is
    /// dead-lettered at once.
    pub permanent_exit_codes: Vec<i32>,
}

impl Default for SshSettings {
    fn default() -> Self {
        Self {
            argv: Vec::new(),
            user: None,
            allow_root: false,
            key_file: None,
            agent_socket: None,
            known_hosts_file: None,
            port: 22,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
            max_connections: 16,
            idle_timeout: Duration::from_secs(60),
            server_alive_interval: Duration::from_secs(10),
            reboot_drops_connection: false,
            max_output: 4096,
            permanent_exit_codes: Vec::new(),
        }
    }
}

impl SshSettings {
    /// The longest a restart can take: a connection within twice
    /// `connect_timeout` (waiting for another restart's connection to the
    /// host and replacing a closed one included), the command within
    /// `timeout`, and its kill within [`KILL_TIMEOUT`].
    pub fn longest_restart(&self) -> Duration {
        self.connect_timeout
            .saturating_mul(2)
            .saturating_add(self.timeout)
            .saturating_add(KILL_TIMEOUT)
    }

    /// Checks what can be checked without touching the disk or a host,
    /// naming the failing key relative to `[restarter.ssh]`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
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

/// Durations as humantime strings (`10s`, `1m 30s`), as in the rest of the
/// configuration.
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_duration(*value))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration ({e})")))
    }
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
