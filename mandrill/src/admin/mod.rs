//! The operator's HTTP surface: `/metrics` for Prometheus, `/healthz` and
//! `/readyz` for probes, a JSON API over the counters and the history, and
//! a dashboard at `/`.
//!
//! The only module of the service that imports `axum`. It runs as one of the
//! service's tracked companions: bound before the worker starts (so that an
//! address it cannot take fails start-up, naming `admin.listen`), stopped
//! after the worker has drained, so that probes see the whole shutdown. The address
//! it took is logged and written to `admin.instances_dir` (`instances.rs`):
//! with a port range, a second instance on the machine takes the next port.

mod auth;
mod campaigns;
mod dashboard;
mod instances;
pub(crate) mod metrics;
mod profile;
mod routes;
mod switch;
mod token_file;

pub(crate) use dashboard::escape;

use crate::safety::PolicyHandle;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::config::{AdminListen, AdminSettings};
use crate::notify::Notifier;
use crate::settings::Secret;
use crate::stats::Stats;
use crate::store::Store;
use crate::worker::Shutdown;

pub(crate) use instances::{RunningModes, leashed_name, modes as instance_modes};

/// How long a page the operator reads during an outage (`/metrics`, the
/// dashboard, the switch) waits for the store: it renders without the
/// store's part rather than wait for the store (a pool bounds only getting
/// a connection, 10 s, already past Prometheus's default scrape timeout; a
/// query on a connection that hangs is not bounded at all), so the
/// process's own figures are never lost with the store.
pub(crate) const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// A bound admin listener, not yet serving.
pub(crate) struct Admin {
    listener: TcpListener,
    token: Option<Secret>,
    switch_token: Secret,
    /// This instance's entry in `admin.instances_dir`, removed when the
    /// server stops; `None` if it could not be written.
    registration: Option<instances::Registration>,
    /// Where every instance's entry is, for the dashboard.
    instances_dir: Option<std::path::PathBuf>,
}

/// What the routes read.
pub(crate) struct State {
    pub(crate) stats: Arc<Stats>,
    /// Asked for its backlog by `/readyz`, as a reachability probe.
    pub(crate) broker: Arc<dyn Broker>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) shutdown: Shutdown,
    pub(crate) token: Option<Secret>,
    /// What turning the kill switch needs, always: `admin.token`, else the
    /// generated one (see `token_file.rs`).
    pub(crate) switch_token: Secret,
    /// The safety policy in force (a reload may change the leash).
    pub(crate) policy: PolicyHandle,
    pub(crate) metrics: metrics::Exposition,
    /// Told when the kill switch is turned here (its watch tells the rest).
    pub(crate) notifier: Option<Arc<Notifier>>,
    /// `[[schedule]]`: the next planned restarts are shown.
    pub(crate) schedules: crate::schedule::Outlook,
    /// `admin.instances_dir`: the dashboard lists the instances there.
    pub(crate) instances_dir: Option<std::path::PathBuf>,
    /// The configured secrets, masked in every answer ([`auth::scrubbed`]).
    pub(crate) redactor: crate::config::Redactor,
}

impl State {
    /// Restarts are recorded as dry runs, not issued: the store's leash
    /// as the worker last read it (every `safety.poll_interval`), else the
    /// instance's own.
    pub(crate) fn leashed(&self) -> bool {
        self.policy.leash().leashed
    }
}

impl Admin {
    /// Binds `admin.listen` (its first free port, for a range); `None` if
    /// it is `""`. Logs the bound address (`admin listening`), which tells
    /// a caller of port 0 or a range where it is, and writes it into
    /// `instances_dir`. Without `admin.token`, the kill switch's token is
    /// read from `token_file`, or generated into it.
    pub(crate) async fn bind(
        config: &AdminSettings,
        token_file: Option<&std::path::Path>,
        instances_dir: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<Self>> {
        let Some(address) = config.address()? else {
            return Ok(None);
        };
        let switch_token = match (&config.token, token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(path)) => {
                let token = token_file::load_or_create(path)
                    .context("admin.token is not set, so the kill switch's token is generated")?;
                info!(
                    path = %path.display(),
                    "admin token file: the admin API's actions (pause, resume, leash, unleash, a campaign's stop) need its token"
                );
                token
            }
            (None, None) => anyhow::bail!(
                "admin.token is not set and there is no admin.token_file for a generated one"
            ),
        };
        let listener = bind_first_free(address).await?;
        let addr = listener
            .local_addr()
            .context("the admin listener has no address")?;
        if addr.port() != address.first_port && address.is_range() {
            info!(
                %addr,
                taken = address.first_port,
                "the admin server's first port is taken (another instance?); took the next free one"
            );
        }
        info!(%addr, protected = config.token.is_some(), "admin listening");
        // Not fatal: the address is logged, and a store whose directory is
        // not writable (PostgreSQL from a read-only working directory) must
        // not stop a service that ran before.
        let registration = instances_dir.and_then(|dir| match instances::register(dir, addr) {
            Ok(registration) => Some(registration),
            Err(error) => {
                warn!(error = %format!("{error:#}"), "mandrill status cannot list this instance's admin address");
                None
            }
        });
        Ok(Some(Self {
            listener,
            token: config.token.clone(),
            switch_token,
            registration,
            instances_dir: instances_dir.map(std::path::Path::to_path_buf),
        }))
    }

    /// Serves until `stop`. `/readyz` turns 503 as soon as `shutdown` is
    /// requested, while this keeps serving through the drain.
    #[allow(clippy::too_many_arguments)] // the service's parts, each once
    pub(crate) async fn serve(
        self,
        stats: Arc<Stats>,
        broker: Arc<dyn Broker>,
        store: Arc<dyn Store>,
        shutdown: Shutdown,
        policy: PolicyHandle,
        notifier: Option<Arc<Notifier>>,
        schedules: crate::schedule::Outlook,
        redactor: crate::config::Redactor,
        stop: CancellationToken,
    ) {
        let state = Arc::new(State {
            stats,
            broker,
            store,
            shutdown,
            token: self.token,
            switch_token: self.switch_token,
            policy,
            metrics: metrics::Exposition::new(),
            notifier,
            schedules,
            instances_dir: self.instances_dir,
            redactor,
        });
        let served = axum::serve(self.listener, routes::router(state))
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            warn!(%error, "the admin server stopped");
        }
        drop(self.registration);
    }
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// A request the API cannot take, and why.
pub(crate) fn bad_request(why: String) -> Response {
    json(StatusCode::BAD_REQUEST, serde_json::json!({ "error": why }))
}

/// A listener on the first port of `address` that is free. A port taken
/// is passed over only inside a range: a single port is the operator's
/// choice, and taken it fails start-up naming `admin.listen`.
async fn bind_first_free(address: AdminListen) -> anyhow::Result<TcpListener> {
    for candidate in address.addresses() {
        match TcpListener::bind(candidate).await {
            Ok(listener) => return Ok(listener),
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && address.is_range()
                    && candidate.port() < address.last_port => {}
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse && address.is_range() => {
                return Err(error).with_context(|| {
                    format!("cannot listen on admin.listen {address}: every port is taken")
                });
            }
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("cannot listen on admin.listen {candidate}"));
            }
        }
    }
    unreachable!("a range holds at least its first port")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[tokio::test]
    async fn a_taken_port_is_passed_over_in_a_range_and_fails_start_up_when_named() {
        // Two ports in a row, the first taken (by "another instance"):
        // found by holding a pair that the system gave out as free.
        let (taken, next) = loop {
            let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = taken.local_addr().unwrap().port();
            if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
                break (taken, port + 1);
            }
        };
        let port = taken.local_addr().unwrap().port();
        let listen = |last_port| AdminListen {
            ip: "127.0.0.1".parse().unwrap(),
            first_port: port,
            last_port,
        };
        let bound = bind_first_free(listen(next)).await.unwrap();
        assert_eq!(bound.local_addr().unwrap().port(), next);
        // Both taken now: the range is used up.
        let error = format!("{:#}", bind_first_free(listen(next)).await.unwrap_err());
        assert!(
            error.contains("admin.listen") && error.contains("every port is taken"),
            "{error}"
        );
        // One port, named: taken is an error naming the key.
        let error = format!("{:#}", bind_first_free(listen(port)).await.unwrap_err());
        assert!(
            error.contains(&format!("admin.listen 127.0.0.1:{port}")),
            "{error}"
        );
    }

    fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }

    #[test]
    fn only_admin_imports_axum() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let admin = src.join("admin");
        // Tests and the benchmark start local web servers with it; they are
        // not the service.
        let elsewhere = |path: &Path| {
            path.starts_with(src.join("bench"))
                || path.ends_with("tests.rs")
                || path.components().any(|part| part.as_os_str() == "tests")
        };
        let offenders: Vec<_> = files
            .iter()
            .filter(|path| !path.starts_with(&admin) && !elsewhere(path))
            .filter(|path| std::fs::read_to_string(path).unwrap().contains("axum::"))
            .collect();
        assert!(offenders.is_empty(), "{offenders:?}");
    }
}
