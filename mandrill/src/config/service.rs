//! The service's own sections: `[simulate]`, `[log]`, `[debug]`, `[admin]`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::settings::{Secret, duration, settings};

settings! {
    /// `[simulate]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct SimulateSettings {
        /// Publish random requests into the broker (demo mode); refused
        /// with a real restarter.kind.
        pub enabled: bool = false,
        /// Requests per second (at most 1000000; reloadable).
        pub rate: f64 = 2.0,
        /// Fraction of published payloads that are deliberately malformed.
        pub malformed_rate: f64 = 0.0,
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    /// One human-readable line per step.
    Text,
    /// One JSON object per line.
    Json,
}

settings! {
    /// `[log]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct LogSettings {
        /// text | json
        pub format: LogFormat = LogFormat::Text,
        /// A tracing filter, e.g. `info` or `mandrill=debug` (reloadable).
        pub level: String = "info".into(),
    }
}

settings! {
    /// `[debug]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct DebugSettings {
        /// Warn when the runtime falls this far behind (blocking code on it).
        #[serde(with = "duration")]
        pub stall_threshold: Duration = Duration::from_millis(100),
        /// Log a status line (counters, in-flight messages) this often; `0s` never.
        #[serde(with = "duration")]
        pub status_interval: Duration = Duration::from_secs(60),
        /// Debug mode (`mandrill run --debug`): stall threshold at most 10ms,
        /// status line with runtime metrics every 10s at most, per-message
        /// step timings at debug level.
        ///
        /// See [`DebugSettings::stall_threshold`] and
        /// [`DebugSettings::status_interval`] for what it lowers.
        pub enabled: bool = false,
    }
}

impl DebugSettings {
    /// The stall threshold in effect: at most 10ms in debug mode (asyncio's
    /// debug mode reports callbacks over 100ms, which is this service's
    /// default already).
    pub(crate) fn stall_threshold(&self) -> Duration {
        if self.enabled {
            self.stall_threshold.min(Duration::from_millis(10))
        } else {
            self.stall_threshold
        }
    }

    /// The status line's period in effect: at most 10s in debug mode, even
    /// if it was turned off.
    pub(crate) fn status_interval(&self) -> Duration {
        match self.status_interval {
            interval if !self.enabled => interval,
            interval if interval.is_zero() => Duration::from_secs(10),
            interval => interval.min(Duration::from_secs(10)),
        }
    }
}

settings! {
    /// `[admin]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct AdminSettings {
        /// `IP:PORT` of the admin server (/metrics, /healthz, /readyz, /api),
        /// or `IP:FIRST-LAST` for the first free port of a range; "" disables
        /// it. The port taken is logged and written to `admin.instances_dir`.
        ///
        /// Loopback only by default, and ports no common service or
        /// well-known exporter uses (not in /etc/services; 8080, 9090, 9100
        /// are). A range by default, so that a second instance on the same
        /// machine (several may share one SQLite file) serves too instead of
        /// failing to start; a single port that is taken fails start-up.
        pub listen: String = "127.0.0.1:9730-9739".into(),
        /// Bearer token for the admin server's protected endpoints; required
        /// off loopback.
        ///
        /// Without it the history and profiling answer a loopback `Host`
        /// only, and the kill switch (`POST /api/pause`, `/api/resume`)
        /// needs the token the service generates into `admin.token_file`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub token: Option<Secret> = None,
        /// Where the generated token is kept when admin.token is not set
        /// (mode 0600, reused while it exists; remove it to rotate).
        ///
        /// Default: beside the SQLite store, `<store file>.admin-token`;
        /// with another store, `mandrill-admin.token` in the working
        /// directory.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub token_file: Option<PathBuf> = None,
        /// Where each running instance writes the address its admin server
        /// took, one file per instance named by it (mode 0600), for
        /// `mandrill status` and scripts; removed at shutdown.
        ///
        /// Default: beside the SQLite store, `<store file>.instances`; with
        /// another store, `mandrill-instances` in the working directory.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub instances_dir: Option<PathBuf> = None,
    }
}

/// The generated token's file name when the store is not a SQLite file.
const TOKEN_FILE_NAME: &str = "mandrill-admin.token";

/// The running instances' directory when the store is not a SQLite file.
const INSTANCES_DIR_NAME: &str = "mandrill-instances";

impl super::Config {
    /// Where the admin server's generated token is kept: `None` when the
    /// server is off or `admin.token` is set (no token is generated then).
    /// See [`AdminSettings::token_file`].
    pub(crate) fn admin_token_file(&self) -> Option<PathBuf> {
        if self.admin.listen.is_empty() || self.admin.token.is_some() {
            return None;
        }
        if let Some(path) = &self.admin.token_file {
            return Some(path.clone());
        }
        Some(self.beside_the_store(".admin-token", TOKEN_FILE_NAME))
    }

    /// Where running instances write their admin server's address: `None`
    /// when the server is off. See [`AdminSettings::instances_dir`].
    pub(crate) fn admin_instances_dir(&self) -> Option<PathBuf> {
        if self.admin.listen.is_empty() {
            return None;
        }
        if let Some(path) = &self.admin.instances_dir {
            return Some(path.clone());
        }
        Some(self.beside_the_store(".instances", INSTANCES_DIR_NAME))
    }

    /// `<store file><suffix>` for a SQLite store (as `sqlite:PATH`,
    /// `sqlite://PATH` or with `?options`), else `otherwise` in the working
    /// directory: where the state is, so that every instance sharing it
    /// finds the same path.
    fn beside_the_store(&self, suffix: &str, otherwise: &str) -> PathBuf {
        let database = self
            .store
            .url
            .strip_prefix("sqlite:")
            .map(|rest| rest.trim_start_matches("//"))
            .map(|rest| rest.split('?').next().unwrap_or(rest))
            .filter(|path| !path.is_empty() && *path != ":memory:");
        match database {
            Some(path) => PathBuf::from(format!("{path}{suffix}")),
            None => PathBuf::from(otherwise),
        }
    }
}

/// Where the admin server listens: one address and a range of ports, the
/// first free one taken (a single port is a range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdminListen {
    /// The address to bind.
    pub ip: std::net::IpAddr,
    /// The first port tried.
    pub first_port: u16,
    /// The last port tried; `first_port` when one port is named.
    pub last_port: u16,
}

impl AdminListen {
    /// Whether a port that is taken is passed over for the next one.
    pub(crate) fn is_range(&self) -> bool {
        self.first_port != self.last_port
    }

    /// The addresses to try, in order.
    pub(crate) fn addresses(&self) -> impl Iterator<Item = std::net::SocketAddr> + use<> {
        let ip = self.ip;
        (self.first_port..=self.last_port).map(move |port| std::net::SocketAddr::new(ip, port))
    }

    /// `IP:PORT` or `IP:FIRST-LAST` (`[IPv6]:…`).
    fn parse(text: &str) -> Option<Self> {
        if let Ok(address) = text.parse::<std::net::SocketAddr>() {
            return Some(Self {
                ip: address.ip(),
                first_port: address.port(),
                last_port: address.port(),
            });
        }
        let (host, ports) = text.rsplit_once(':')?;
        let (first, last) = ports.split_once('-')?;
        let (first_port, last_port) = (first.parse::<u16>().ok()?, last.parse::<u16>().ok()?);
        // Port 0 already means "any free port"; a range of it means nothing.
        if first_port == 0 || last_port < first_port {
            return None;
        }
        let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => std::net::IpAddr::V6(v6.parse().ok()?),
            None => std::net::IpAddr::V4(host.parse().ok()?),
        };
        Some(Self {
            ip,
            first_port,
            last_port,
        })
    }
}

impl std::fmt::Display for AdminListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let first = std::net::SocketAddr::new(self.ip, self.first_port);
        if self.is_range() {
            write!(f, "{first}-{}", self.last_port)
        } else {
            write!(f, "{first}")
        }
    }
}

impl AdminSettings {
    /// Where to listen, `None` if disabled. Checked by
    /// [`Config::validate`](super::Config::validate): off loopback only with a token.
    pub(crate) fn address(&self) -> Result<Option<AdminListen>, ConfigError> {
        if self.listen.is_empty() {
            return Ok(None);
        }
        let address = AdminListen::parse(&self.listen).ok_or_else(|| {
            ConfigError::invalid(
                "admin.listen",
                format!(
                    "{:?} is not IP:PORT (e.g. 127.0.0.1:9730) nor IP:FIRST-LAST \
                     (e.g. 127.0.0.1:9730-9739), or \"\" to disable",
                    self.listen
                ),
            )
        })?;
        match &self.token {
            Some(token) if token.0.is_empty() => {
                Err(ConfigError::invalid("admin.token", "must not be empty"))
            }
            // Else the service would start, and every action, the kill
            // switch among them, answer 401 when it is needed.
            Some(token) if !token.fits_a_header() => Err(ConfigError::invalid(
                "admin.token",
                "must be printable ASCII with no space or newline at either end: \
                 no client could send it in an Authorization header",
            )),
            None if !address.ip.is_loopback() => Err(ConfigError::invalid(
                "admin.token",
                format!(
                    "required when admin.listen ({address}) is not a loopback address: \
                     anyone who can reach it could read the service's history"
                ),
            )),
            _ => Ok(Some(address)),
        }
    }
}
