//! Recovery verification against real listeners, a real HTTP server and
//! real probe commands, in real time (lower bounds tight, upper generous).

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::*;
use crate::restarter::process::testing::{every_host_at, request, script};

/// Generous slack for upper bounds on a shared 2-core machine.
const MARGIN: Duration = Duration::from_secs(10);

/// A "host" on loopback: a TCP listener on a fixed port that a restart
/// takes down and, after `down_for`, brings back (or never, for `None`).
/// `up_for` keeps it up a while after the restart returned, as a host does
/// while its shutdown is still on the way.
struct FlakyHost {
    port: u16,
    listener: Mutex<Option<TcpListener>>,
    up_for: Duration,
    down_for: Option<Duration>,
    comeback: Mutex<Option<JoinHandle<()>>>,
}

impl FlakyHost {
    async fn start(up_for: Duration, down_for: Option<Duration>) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Arc::new(Self {
            port: listener.local_addr().unwrap().port(),
            listener: Mutex::new(Some(listener)),
            up_for,
            down_for,
            comeback: Mutex::new(None),
        })
    }
}

impl Drop for FlakyHost {
    fn drop(&mut self) {
        if let Some(task) = self.comeback.lock().unwrap().take() {
            task.abort();
        }
    }
}

/// The "backend": returns at once, leaving the host to go down and come
/// back on its own schedule, as a real one does.
#[async_trait]
impl Restarter for FlakyHost {
    async fn restart(
        &self,
        _request: &RestartRequest,
        _reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let mut listener = self.listener.lock().unwrap().take();
        let (port, up_for, down_for) = (self.port, self.up_for, self.down_for);
        // Down before the restart returns: left to the task, a probe made at
        // once could reach the listener before the task ran (seen: a host
        // that never came back "recovered after 1 ms").
        if up_for.is_zero() {
            listener = None;
        }
        // The host's own life, not synchronisation: it goes down after
        // `up_for` and returns after `down_for`, on the same port.
        let task = tokio::spawn(async move {
            tokio::time::sleep(up_for).await;
            drop(listener);
            let Some(down_for) = down_for else {
                return;
            };
            tokio::time::sleep(down_for).await;
            let back = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            // Held until the test ends (the task is aborted on drop).
            std::future::pending::<()>().await;
            drop(back);
        });
        *self.comeback.lock().unwrap() = Some(task);
        Ok(Restarted {
            recovered_after: None,
            output: Some("restart issued".into()),
        })
    }
}

fn tcp_settings(port: u16) -> VerifySettings {
    VerifySettings {
        probe: ProbeKind::Tcp,
        port: Some(port),
        initial_delay: Duration::ZERO,
        interval: Duration::from_millis(100),
        probe_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(20),
        ..VerifySettings::default()
    }
}

async fn verify(
    host: Arc<dyn Restarter>,
    settings: &VerifySettings,
    address: &str,
) -> Result<Restarted, RestartError> {
    settings.validate().unwrap();
    let verified = Verified::new(host, settings, every_host_at(address), None).unwrap();
    let request = request("cattle-ab12");
    let reservation = verified.reserve(&request).await.expect("no refusal");
    verified.restart(&request, reservation).await
}

#[tokio::test]
async fn host_back_after_two_seconds_is_recovered_after_about_two_seconds() {
    let down_for = Duration::from_secs(2);
    let host = FlakyHost::start(Duration::ZERO, Some(down_for)).await;
    let restarted = verify(host.clone(), &tcp_settings(host.port), "127.0.0.1")
        .await
        .unwrap();
    let recovered_after = restarted.recovered_after.unwrap();
    assert!(recovered_after >= down_for, "{recovered_after:?}");
    assert!(recovered_after < down_for + MARGIN, "{recovered_after:?}");
    assert_eq!(restarted.output.as_deref(), Some("restart issued"));
}

#[tokio::test]
async fn host_that_never_comes_back_is_unrecovered_with_what_the_last_probe_saw() {
    let host = FlakyHost::start(Duration::ZERO, None).await;
    let settings = VerifySettings {
        timeout: Duration::from_secs(1),
        ..tcp_settings(host.port)
    };
    let started = Instant::now();
    let error = verify(host.clone(), &settings, "127.0.0.1")
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(1));
    let RestartError::Unrecovered {
        host: name,
        after,
        output,
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(*after, Duration::from_secs(1));
    let reason = error.with_causes().to_string();
    let expected = format!(
        "{name} did not recover within 1s: last probe: connecting to 127.0.0.1:{}: ",
        host.port
    );
    assert!(reason.starts_with(&expected), "{reason}");
    // The probe's own error survives as a source, not only as words.
    let mut source = std::error::Error::source(&error);
    let mut io = None;
    while let Some(error) = source {
        io = io.or(error.downcast_ref::<std::io::Error>());
        source = error.source();
    }
    assert_eq!(
        io.map(std::io::Error::kind),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    assert!(reason.contains("refused"), "{reason}");
    assert_eq!(output.as_deref(), Some("restart issued"));
    assert!(!error.is_retryable(), "the restart happened");
}

#[tokio::test]
async fn expect_down_ignores_a_host_that_has_not_gone_down_yet() {
    // Up for a second after the restart returns, down for a second.
    let up_for = Duration::from_secs(1);
    let down_for = Duration::from_secs(1);

    // Without expect_down the first probe finds the old, still-running host.
    let host = FlakyHost::start(up_for, Some(down_for)).await;
    let fooled = verify(host.clone(), &tcp_settings(host.port), "127.0.0.1")
        .await
        .unwrap();
    assert!(fooled.recovered_after.unwrap() < up_for);

    let host = FlakyHost::start(up_for, Some(down_for)).await;
    let settings = VerifySettings {
        expect_down: true,
        ..tcp_settings(host.port)
    };
    let recovered_after = verify(host.clone(), &settings, "127.0.0.1")
        .await
        .unwrap()
        .recovered_after
        .unwrap();
    assert!(recovered_after >= up_for + down_for, "{recovered_after:?}");
    assert!(recovered_after < up_for + down_for + MARGIN);
}

#[tokio::test]
async fn host_that_never_goes_down_is_unrecovered_under_expect_down() {
    let host = FlakyHost::start(Duration::from_secs(3600), None).await;
    let settings = VerifySettings {
        expect_down: true,
        timeout: Duration::from_millis(500),
        ..tcp_settings(host.port)
    };
    let error = verify(host.clone(), &settings, "127.0.0.1")
        .await
        .unwrap_err();
    let text = error.with_causes().to_string();
    assert!(text.contains("never went down"), "{text}");
}

/// A backend that succeeds at once and touches nothing.
struct Confirmed;

#[async_trait]
impl Restarter for Confirmed {
    async fn restart(
        &self,
        _request: &RestartRequest,
        _reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        Ok(Restarted::default())
    }
}

/// An axum server answering 503 to the first `unhealthy` requests, then 200.
/// Returns its address, how many requests it saw, and the server task.
async fn health_server(unhealthy: usize) -> (SocketAddr, Arc<AtomicUsize>, JoinHandle<()>) {
    use axum::http::StatusCode;
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let app = axum::Router::new().route(
        "/health/{instance}",
        axum::routing::get(
            move |axum::extract::Path(instance): axum::extract::Path<String>| {
                let counter = counter.clone();
                async move {
                    assert_eq!(instance, "cattle-ab12");
                    if counter.fetch_add(1, Ordering::SeqCst) < unhealthy {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::OK
                    }
                }
            },
        ),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (address, seen, server)
}

fn http_settings(address: SocketAddr) -> VerifySettings {
    VerifySettings {
        probe: ProbeKind::Http,
        url: Some(format!(
            "http://{{host}}:{}/health/{{instance_name}}",
            address.port()
        )),
        ..tcp_settings(0)
    }
}

#[tokio::test]
async fn http_probe_waits_through_503_until_200() {
    let (address, seen, server) = health_server(3).await;
    let restarted = verify(Arc::new(Confirmed), &http_settings(address), "127.0.0.1")
        .await
        .unwrap();
    server.abort();
    assert!(restarted.recovered_after.is_some());
    assert_eq!(seen.load(Ordering::SeqCst), 4, "three 503s, then the 200");
}

/// The reason is stored, notified and logged: it says what the probe saw,
/// without the probe URL's credentials and query values (a token), which
/// it once quoted whole.
#[tokio::test]
async fn http_probe_that_never_sees_an_expected_status_is_unrecovered() {
    let (address, _seen, server) = health_server(usize::MAX).await;
    let settings = VerifySettings {
        timeout: Duration::from_millis(500),
        url: Some(format!(
            "http://probe:S3cr3t@{{host}}:{}/health/{{instance_name}}?token=T0ken",
            address.port()
        )),
        ..http_settings(address)
    };
    let error = verify(Arc::new(Confirmed), &settings, "127.0.0.1")
        .await
        .unwrap_err();
    server.abort();
    let reason = error.with_causes().to_string();
    assert!(reason.contains("answered 503"), "{reason}");
    assert!(reason.contains("/health/cattle-ab12"), "{reason}");
    assert!(
        !reason.contains("S3cr3t") && !reason.contains("T0ken"),
        "{reason}"
    );
}

#[tokio::test]
async fn command_probe_is_healthy_when_its_argv_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("healthy");
    // The probe fails (with a word on stderr) until the flag file exists;
    // the third probe creates it, so the fourth passes.
    let probe = script(
        dir.path(),
        "probe.sh",
        r#"count=$(($(cat "$1.count" 2>/dev/null || echo 0) + 1)); echo $count > "$1.count"
[ $count -ge 3 ] && touch "$1"
[ -e "$1" ] && [ $count -gt 3 ] || { echo "not yet: $2" >&2; exit 1; }
"#,
    );
    let settings = VerifySettings {
        probe: ProbeKind::Command,
        argv: vec![
            "sh".into(),
            probe.to_str().unwrap().into(),
            "{host}".into(),
            "{instance_name}".into(),
        ],
        ..tcp_settings(0)
    };
    let restarted = verify(Arc::new(Confirmed), &settings, flag.to_str().unwrap())
        .await
        .unwrap();
    assert!(restarted.recovered_after.is_some());
    let count = std::fs::read_to_string(dir.path().join("healthy.count")).unwrap();
    assert_eq!(count.trim(), "4");

    // A probe that always fails reports its own output.
    let settings = VerifySettings {
        argv: vec!["sh".into(), "-c".into(), "echo down >&2; exit 7".into()],
        timeout: Duration::from_millis(300),
        ..settings
    };
    let error = verify(Arc::new(Confirmed), &settings, "unused")
        .await
        .unwrap_err();
    let reason = error.with_causes().to_string();
    assert!(reason.contains("exit status: 7"), "{reason}");
    assert!(reason.contains("[stderr]\ndown"), "{reason}");
}

#[tokio::test]
async fn failed_restart_is_not_probed_and_keeps_its_error() {
    struct Refused;
    #[async_trait]
    impl Restarter for Refused {
        async fn restart(
            &self,
            request: &RestartRequest,
            _reservation: Reservation,
        ) -> Result<Restarted, RestartError> {
            Err(RestartError::permanent(&request.hostname, "no"))
        }
    }
    // Port 1 on loopback refuses: were it probed, this would be Unrecovered.
    let error = verify(Arc::new(Refused), &tcp_settings(1), "127.0.0.1")
        .await
        .unwrap_err();
    assert!(matches!(error, RestartError::Permanent { .. }), "{error:?}");
}

#[test]
fn settings_load_from_toml_and_bad_ones_name_their_key() {
    let loaded: VerifySettings = toml::from_str(
        r#"
        probe = "http"
        url = "http://{host}:8080/health"
        expect_status = [200, 204]
        initial_delay = "5s"
        interval = "2s"
        timeout = "3m"
        expect_down = true
        "#,
    )
    .unwrap();
    loaded.validate().unwrap();
    assert_eq!(loaded.timeout, Duration::from_secs(180));
    let round_trip: VerifySettings = toml::from_str(&toml::to_string(&loaded).unwrap()).unwrap();
    assert_eq!(round_trip, loaded);
    VerifySettings::default().validate().unwrap();

    let key = |toml_text: &str| {
        toml::from_str::<VerifySettings>(toml_text)
            .unwrap()
            .validate()
            .unwrap_err()
            .0
    };
    assert_eq!(key(r#"probe = "tcp""#), "port");
    assert_eq!(key(r#"probe = "http""#), "url");
    assert_eq!(key("probe = \"http\"\nurl = \"https://{host}/\""), "url");
    assert_eq!(key("probe = \"http\"\nurl = \"http://{nope}/\""), "url");
    assert_eq!(
        key("probe = \"http\"\nurl = \"http://{host}/\"\nexpect_status = []"),
        "expect_status"
    );
    assert_eq!(key(r#"probe = "command""#), "argv");
    assert_eq!(
        key("probe = \"tcp\"\nport = 22\ninterval = \"0s\""),
        "interval"
    );
    assert!(toml::from_str::<VerifySettings>(r#"probe = "ping""#).is_err());
}
