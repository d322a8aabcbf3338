//! Recovery verification, `[verify]`: after a restart the backend confirmed,
//! probe the host until it is healthy or `timeout` passes. [`Verified`]
//! wraps any restarter, so every backend gets it.
//!
//! `recovered_after` is measured from the moment the backend returned to the
//! end of the first healthy probe that counts, so it is at most one
//! `interval` (plus a probe) late. With `expect_down`, a healthy probe
//! counts only after a failed one: a host that has not gone down yet (the
//! restart is still on its way) is not "recovered".

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

use super::hosts::{HostMap, Target};
use super::process::{ProcessRunner, for_log};
use super::template::{ArgvTemplate, Template, Values};
use super::{Cause, Ec2Restarter, Reservation, Reserving, RestartError, Restarter, SettingError};
use crate::causes::WithCauses;
use crate::domain::{RestartRequest, Restarted};
use crate::settings::{duration, settings};

/// Probe intervals are drawn uniformly within this fraction either side of
/// `interval` (±20%), so that hosts restarted together are not probed in
/// lockstep.
const JITTER: f64 = 0.2;

/// Output a `command` probe keeps per stream, for the reason of a failure.
const PROBE_MAX_OUTPUT: usize = 1024;

/// How the host's health is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ProbeKind {
    /// No verification: a restart the backend confirmed is done.
    #[default]
    None,
    /// A TCP connection to `{host}:port` is accepted.
    Tcp,
    /// A GET of `url` answers a status in `expect_status`.
    Http,
    /// `argv` exits 0.
    Command,
    /// EC2 says the instance recovered from the `ec2` restarter's action
    /// (running with both status checks `ok`; a terminated member's group
    /// back at its desired capacity).
    Ec2,
}

settings! {
    /// `[verify]`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct VerifySettings {
        /// none | tcp | http | command | ec2
        pub probe: ProbeKind = ProbeKind::None,
        /// tcp probe: port on the host.
        ///
        /// At the host's address: the host map's, else the hostname.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub port: Option<u16> = None,
        /// http probe: URL template to GET, e.g. `http://{host}:8080/health`
        /// (plain http only).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub url: Option<String> = None,
        /// http probe: the statuses that mean healthy.
        pub expect_status: Vec<u16> = vec![200],
        /// command probe: argv template (no shell); exit 0 means healthy.
        pub argv: Vec<String> = Vec::new(),
        /// Wait before the first probe, for the restart to take hold.
        #[serde(with = "duration")]
        pub initial_delay: Duration = Duration::from_secs(2),
        /// Wait between probes, ±20% at random.
        #[serde(with = "duration")]
        pub interval: Duration = Duration::from_secs(1),
        /// Limit on one probe (a connection to a host that is down may hang).
        #[serde(with = "duration")]
        pub probe_timeout: Duration = Duration::from_secs(2),
        /// Give up after this: the host is recorded unrecovered.
        ///
        /// Measured from the restart's return. worker.restart_timeout must
        /// cover the restart and this.
        #[serde(with = "duration")]
        pub timeout: Duration = Duration::from_secs(60),
        /// Count a healthy probe only after a failed one.
        ///
        /// So that a host that has not gone down yet is not taken for one
        /// that came back.
        pub expect_down: bool = false,
    }
}

impl VerifySettings {
    /// Checks the settings, naming the failing key within the section.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        Probe::new(self).map(drop)?;
        for (key, value) in [
            ("interval", self.interval),
            ("probe_timeout", self.probe_timeout),
            ("timeout", self.timeout),
        ] {
            if self.probe != ProbeKind::None && value.is_zero() {
                return Err((key, "must be more than zero".into()));
            }
        }
        Ok(())
    }
}

/// A parsed probe.
#[derive(Debug, Clone)]
enum Probe {
    None,
    Tcp { port: u16 },
    Http { url: Template, expect: Vec<u16> },
    Command { argv: ArgvTemplate },
    Ec2,
}

impl Probe {
    fn new(settings: &VerifySettings) -> Result<Self, (&'static str, String)> {
        Ok(match settings.probe {
            ProbeKind::None => Self::None,
            ProbeKind::Tcp => match settings.port {
                Some(port) if port != 0 => Self::Tcp { port },
                _ => return Err(("port", "is required by the tcp probe (1 to 65535)".into())),
            },
            ProbeKind::Http => {
                let Some(raw) = &settings.url else {
                    return Err(("url", "is required by the http probe".into()));
                };
                if !raw.starts_with("http://") {
                    return Err((
                        "url",
                        format!("{raw:?} must start with http:// (https probes are not supported)"),
                    ));
                }
                let url = Template::parse(raw).map_err(|why| ("url", why))?;
                if settings.expect_status.is_empty()
                    || settings
                        .expect_status
                        .iter()
                        .any(|s| !(100..=599).contains(s))
                {
                    return Err((
                        "expect_status",
                        "must list HTTP statuses (100 to 599)".into(),
                    ));
                }
                Self::Http {
                    url,
                    expect: settings.expect_status.clone(),
                }
            }
            ProbeKind::Command => Self::Command {
                argv: ArgvTemplate::parse(&settings.argv).map_err(|why| ("argv", why))?,
            },
            ProbeKind::Ec2 => Self::Ec2,
        })
    }
}

/// Wraps a restarter with recovery verification. See the module docs.
pub(crate) struct Verified {
    inner: Arc<dyn Restarter>,
    probe: Probe,
    settings: VerifySettings,
    runner: ProcessRunner,
    hosts: HostMap,
    /// The `ec2` restarter, which the `ec2` probe asks.
    ec2: Option<Arc<Ec2Restarter>>,
}

impl Verified {
    /// Wraps `inner`, probing hosts found through `hosts` (the `ec2` probe:
    /// asking `ec2`).
    pub(crate) fn new(
        inner: Arc<dyn Restarter>,
        settings: &VerifySettings,
        hosts: HostMap,
        ec2: Option<Arc<Ec2Restarter>>,
    ) -> Result<Self, SettingError> {
        let probe = Probe::new(settings)
            .map_err(|(key, why)| SettingError::new(format!("verify.{key}"), why))?;
        if matches!(probe, Probe::Ec2) && ec2.is_none() {
            return Err(SettingError::new(
                "verify.probe",
                "\"ec2\" needs restarter.kind = \"ec2\"",
            ));
        }
        // The command probe gets the command backend's default environment.
        let runner = ProcessRunner::new(
            None,
            &super::CommandSettings::default().env_allow,
            &[],
            settings.probe_timeout,
            PROBE_MAX_OUTPUT,
        );
        Ok(Self {
            inner,
            probe,
            settings: settings.clone(),
            runner,
            hosts,
            ec2,
        })
    }

    /// `inner` wrapped when a probe is configured, else `inner` itself.
    pub(crate) fn wrap(
        inner: Arc<dyn Restarter>,
        settings: &VerifySettings,
        hosts: HostMap,
        ec2: Option<Arc<Ec2Restarter>>,
    ) -> Result<Arc<dyn Restarter>, SettingError> {
        if settings.probe == ProbeKind::None {
            VerifySettings::validate(settings)
                .map_err(|(key, why)| SettingError::new(format!("verify.{key}"), why))?;
            return Ok(inner);
        }
        Ok(Arc::new(Self::new(inner, settings, hosts, ec2)?))
    }

    /// One probe: `Ok` when healthy, else what it saw.
    async fn check(&self, target: &Target, request: &RestartRequest) -> Result<(), Cause> {
        let values = Values {
            host: &target.address,
            request,
        };
        let probe = async {
            match &self.probe {
                Probe::None => Ok(()),
                Probe::Tcp { port } => tcp(&target.address, *port).await,
                Probe::Http { url, expect } => http(&url.render_url(&values), expect).await,
                Probe::Command { argv } => self.command(&argv.render(&values)).await,
                Probe::Ec2 => match &self.ec2 {
                    Some(ec2) => ec2.recovered(request).await,
                    None => Err("no ec2 restarter to ask".into()),
                },
            }
        };
        tokio::time::timeout(self.settings.probe_timeout, probe)
            .await
            .unwrap_or_else(|_| {
                Err(format!("no answer within {:?}", self.settings.probe_timeout).into())
            })
    }

    async fn command(&self, argv: &[String]) -> Result<(), Cause> {
        let finished = self.runner.run(argv).await.map_err(Cause::from_error)?;
        if finished.status.success() {
            return Ok(());
        }
        let mut seen = format!("{:?} ended with {}", argv[0], finished.status);
        if let Some(text) = finished.output.text() {
            seen.push_str(&format!("; output: {text}"));
        }
        Err(seen.into())
    }

    /// The wait before the next probe, jittered.
    fn next_interval(&self) -> Duration {
        let factor = rand::rng().random_range(1.0 - JITTER..=1.0 + JITTER);
        self.settings.interval.mul_f64(factor)
    }
}

async fn tcp(address: &str, port: u16) -> Result<(), Cause> {
    TcpStream::connect((address, port))
        .await
        .map(drop)
        .map_err(|e| Cause::new(format!("connecting to {address}:{port}"), e))
}

/// A GET with hyper's HTTP/1.1 client on one fresh connection (no pool: a
/// probe must see the host as it is now, not a connection from before the
/// restart).
async fn http(url: &str, expect: &[u16]) -> Result<(), Cause> {
    // The URL as it may be shown (the reason is stored, notified and
    // logged): no user, password or query values, which may hold a token.
    let shown = url::Url::parse(url).map_or_else(
        |_| "the probe's URL".to_owned(),
        |parsed| super::http::redacted(&parsed),
    );
    let fail = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| {
        Cause::new(format!("GET {shown}: {what}"), e)
    };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| fail("not a URL", e.into()))?;
    let Some(host) = uri.host() else {
        return Err(format!("GET {shown}: the URL names no host").into());
    };
    // The Host header names the host and port only, never credentials.
    let authority = match uri.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    // `host` keeps an IPv6 address's brackets; connecting wants it bare.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| fail("connecting", e.into()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail("handshake", e.into()))?;
    let request = hyper::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "mandrill-verify")
        .body(String::new())
        .map_err(|e| fail("building the request", e.into()))?;
    // The connection is driven here, beside the request, not spawned.
    let mut connection = std::pin::pin!(connection);
    let response = tokio::select! {
        response = sender.send_request(request) => response.map_err(|e| fail("request", e.into()))?,
        ended = &mut connection => {
            return Err(match ended {
                Ok(()) => format!("GET {shown}: connection closed before an answer").into(),
                Err(e) => fail("connection", e.into()),
            });
        }
    };
    let status = response.status().as_u16();
    if expect.contains(&status) {
        Ok(())
    } else {
        Err(format!("GET {shown} answered {status}").into())
    }
}

#[async_trait]
impl Restarter for Verified {
    fn describe(&self, request: &RestartRequest) -> String {
        self.inner.describe(request)
    }

    fn reserve<'a>(&'a self, request: &'a RestartRequest) -> Reserving<'a> {
        // Refusals pass through: nothing is journaled or probed for them.
        self.inner.reserve(request)
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let restarted = self.inner.restart(request, reservation).await?;
        if matches!(self.probe, Probe::None) {
            return Ok(restarted);
        }
        let issued = Instant::now();
        let deadline = issued + self.settings.timeout;
        let target = self.hosts.target(request);
        let mut went_down = !self.settings.expect_down;
        let mut last_seen;
        tokio::time::sleep_until(deadline.min(issued + self.settings.initial_delay)).await;
        loop {
            match self.check(&target, request).await {
                Ok(()) if went_down => {
                    let recovered_after = issued.elapsed();
                    debug!(host = %request.hostname, ?recovered_after, "recovered");
                    return Ok(Restarted {
                        recovered_after: Some(recovered_after),
                        output: restarted.output,
                    });
                }
                Ok(()) => {
                    last_seen = Cause::from("healthy, but it never went down (verify.expect_down)");
                }
                Err(seen) => {
                    debug!(host = %request.hostname, seen = %for_log(&WithCauses(&seen).to_string(), 200), "not healthy yet");
                    went_down = true;
                    last_seen = seen;
                }
            }
            // The last probe runs at the deadline itself.
            if Instant::now() >= deadline {
                return Err(RestartError::Unrecovered {
                    host: request.hostname.clone(),
                    after: self.settings.timeout,
                    cause: Cause::new("last probe", last_seen),
                    output: restarted.output,
                });
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + self.next_interval())).await;
        }
    }
}

#[cfg(test)]
mod tests;
