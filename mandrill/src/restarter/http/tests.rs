//! The webhook restarter against a real HTTP server on loopback (axum on a
//! free port), plainly and over TLS with a throwaway CA, alone and driven by
//! the worker with the in-memory broker and store. The server's answer is
//! chosen by the instance name's first word (`ok-1`, `missing-1`, …) and it
//! records every request, recomputing its signature.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap as ServerHeaders, StatusCode as ServerStatus, Uri};
use axum::response::{IntoResponse, Response};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::*;
use crate::domain::{Domain, ParseRules};
use crate::restarter::hosts::HostEntry;

/// The key the server checks signatures with; the restarter reads it from a
/// file that ends in a newline.
const KEY: &[u8] = b"not-so-secret-key";

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    method: String,
    headers: ServerHeaders,
    body: Vec<u8>,
    /// Whether `X-Mandrill-Signature` matched the server's own HMAC of the
    /// time and body, signed within five minutes; `None` when the header
    /// was absent.
    signature_valid: Option<bool>,
    at: Instant,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Received>>>);

impl Log {
    fn all(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }
}

/// A webhook server on a free loopback port, stopped when dropped.
struct Webhook {
    addr: SocketAddr,
    log: Log,
    task: JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn router(log: Log) -> Router {
    Router::new().fallback(answer).with_state(log)
}

impl Webhook {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Log::default();
        let app = router(log.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, log, task }
    }

    /// The URL template for this server, reached through the host map.
    fn url(&self) -> String {
        format!(
            "http://{{host}}:{}/restart/{{instance_name}}",
            self.addr.port()
        )
    }
}

async fn answer(
    State(log): State<Log>,
    method: axum::http::Method,
    uri: Uri,
    headers: ServerHeaders,
    body: Bytes,
) -> Response {
    let signature_valid = headers
        .get("x-mandrill-signature")
        .map(|value| verify(value.as_bytes(), &body));
    let path = uri.path().to_owned();
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    let earlier = {
        let mut log = log.0.lock().unwrap();
        let earlier = log.iter().filter(|r| r.path == path).count();
        log.push(Received {
            path,
            method: method.to_string(),
            headers,
            body: body.to_vec(),
            signature_valid,
            at: Instant::now(),
        });
        earlier
    };
    let kind = name.split('-').next().unwrap_or_default();
    match kind {
        "ok" => (ServerStatus::OK, format!("restarting {name}\n")).into_response(),
        "silent" => ServerStatus::NO_CONTENT.into_response(),
        "chatty" => (ServerStatus::ACCEPTED, "x".repeat(3 * MAX_OUTPUT_BYTES)).into_response(),
        "missing" => (ServerStatus::NOT_FOUND, "no such host\nanywhere").into_response(),
        "busy" => (
            ServerStatus::SERVICE_UNAVAILABLE,
            [("retry-after", "2")],
            "overloaded",
        )
            .into_response(),
        "busydate" => {
            let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
            (
                ServerStatus::SERVICE_UNAVAILABLE,
                [("retry-after", later)],
                "overloaded",
            )
                .into_response()
        }
        "throttled" => ServerStatus::TOO_MANY_REQUESTS.into_response(),
        "lazy" => ServerStatus::REQUEST_TIMEOUT.into_response(),
        "moved" => (ServerStatus::FOUND, [("location", "/elsewhere")]).into_response(),
        "flaky" if earlier == 0 => (
            ServerStatus::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            "try again in a second",
        )
            .into_response(),
        "flaky" => (ServerStatus::OK, "restarted on the second try").into_response(),
        "slow" => {
            // Answers long after the client's timeout; the task is aborted
            // when the server is dropped.
            tokio::time::sleep(Duration::from_secs(60)).await;
            ServerStatus::OK.into_response()
        }
        _ => (ServerStatus::BAD_REQUEST, "unknown test host").into_response(),
    }
}

/// The server's own check of `t=<unix>,v1=<hex>` against the body it
/// received, now.
fn verify(header: &[u8], body: &[u8]) -> bool {
    verify_with(KEY, header, body)
}

fn verify_with(key: &[u8], header: &[u8], body: &[u8]) -> bool {
    let Ok(header) = std::str::from_utf8(header) else {
        return false;
    };
    let Some((Some(t), Some(v1))) = header
        .split_once(',')
        .map(|(t, v1)| (t.strip_prefix("t="), v1.strip_prefix("v1=")))
    else {
        return false;
    };
    let (Ok(t), Ok(digest)) = (t.parse::<u64>(), hex::decode(v1)) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if now.abs_diff(t) > 300 {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&digest).is_ok()
}

fn request_with_id(instance: &str, message_id: Uuid) -> RestartRequest {
    let payload = format!(r#"{{"message_id":"{message_id}","instance_name":"{instance}"}}"#);
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
}

fn request(instance: &str) -> RestartRequest {
    request_with_id(instance, Uuid::new_v4())
}

/// Every instance reached at `address`.
fn hosts(address: &str) -> HostMap {
    HostMap::new(&[HostEntry {
        pattern: "*".into(),
        address: Some(address.into()),
        port: None,
        user: None,
    }])
    .unwrap()
}

fn settings(url: String) -> HttpSettings {
    HttpSettings {
        url,
        timeout: Duration::from_secs(10),
        // The URLs' host is the `{host}` placeholder (the host map's
        // loopback address), which counts as not loopback at load.
        allow_plain_http: true,
        ..HttpSettings::default()
    }
}

async fn restart(restarter: &HttpRestarter, instance: &str) -> Result<Restarted, RestartError> {
    restarter
        .restart(&request(instance), Reservation::unlimited())
        .await
}

#[tokio::test]
async fn a_2xx_answer_is_a_restart_whose_output_is_the_body() {
    let server = Webhook::start().await;
    let restarter = HttpRestarter::new(&settings(server.url()), hosts("127.0.0.1")).unwrap();
    let restarted = restart(&restarter, "ok-1").await.unwrap();
    assert_eq!(restarted.output.as_deref(), Some("restarting ok-1\n"));
    assert_eq!(restarted.recovered_after, None);
    let received = server.log.all();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].method, "POST");
    assert_eq!(received[0].path, "/restart/ok-1");
    assert_eq!(
        received[0].headers["content-type"], "application/json",
        "the default body is json"
    );
    // An empty answer records no output.
    let silent = restart(&restarter, "silent-1").await.unwrap();
    assert_eq!(silent.output, None);
}

#[tokio::test]
async fn a_long_answer_is_recorded_truncated() {
    let server = Webhook::start().await;
    let restarter = HttpRestarter::new(&settings(server.url()), hosts("127.0.0.1")).unwrap();
    let output = restart(&restarter, "chatty-1")
        .await
        .unwrap()
        .output
        .unwrap();
    assert!(output.len() <= MAX_OUTPUT_BYTES, "{}", output.len());
    assert!(output.ends_with('…'));
    assert!(output.starts_with("xxxx"));
}

#[tokio::test]
async fn a_4xx_answer_is_a_permanent_refusal_with_status_and_body() {
    let server = Webhook::start().await;
    let restarter = HttpRestarter::new(&settings(server.url()), hosts("127.0.0.1")).unwrap();
    let error = restart(&restarter, "missing-1").await.unwrap_err();
    let RestartError::Permanent { .. } = &error else {
        panic!("expected a permanent refusal, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(reason.contains("404 Not Found"), "{reason}");
    // The body is quoted on one line: a reason is logged.
    assert!(reason.contains("no such host anywhere"), "{reason}");
    assert!(!error.is_retryable());
    // A redirect is not followed, and is not worth retrying either.
    let error = restart(&restarter, "moved-1").await.unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    let reason = error.with_causes().to_string();
    assert!(reason.contains("302 Found"), "{reason}");
    assert_eq!(server.log.all().len(), 2, "the redirect was not followed");
}

#[tokio::test]
async fn a_5xx_408_or_429_answer_is_retried_after_the_delay_asked_for() {
    let server = Webhook::start().await;
    let restarter = HttpRestarter::new(&settings(server.url()), hosts("127.0.0.1")).unwrap();
    let error = restart(&restarter, "busy-1").await.unwrap_err();
    let RestartError::Failed { retry_after, .. } = &error else {
        panic!("expected a retryable failure, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(
        reason.contains("503 Service Unavailable: overloaded"),
        "{reason}"
    );
    assert_eq!(*retry_after, Some(Duration::from_secs(2)));
    // The HTTP-date form: two minutes from the server's now.
    let error = restart(&restarter, "busydate-1").await.unwrap_err();
    let after = error.retry_after().expect("a retry-after date");
    assert!(
        after > Duration::from_secs(100) && after <= Duration::from_secs(120),
        "{after:?}"
    );
    for instance in ["throttled-1", "lazy-1"] {
        let error = restart(&restarter, instance).await.unwrap_err();
        assert!(
            matches!(
                error,
                RestartError::Failed {
                    retry_after: None,
                    ..
                }
            ),
            "{instance}: {error:?}"
        );
    }
}

#[tokio::test]
async fn an_answer_slower_than_the_timeout_is_a_retryable_timeout() {
    let server = Webhook::start().await;
    let mut settings = settings(server.url());
    settings.timeout = Duration::from_millis(300);
    let restarter = HttpRestarter::new(&settings, hosts("127.0.0.1")).unwrap();
    let started = Instant::now();
    let error = restart(&restarter, "slow-1").await.unwrap_err();
    assert!(
        matches!(error, RestartError::TimedOut { after, .. } if after == settings.timeout),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(started.elapsed() >= settings.timeout);
}

#[tokio::test]
async fn a_refused_connection_is_a_retryable_failure() {
    // A port that was free a moment ago: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://user:hunter2@127.0.0.1:{port}/restart?token=hunter2");
    let restarter = HttpRestarter::new(&settings(url), HostMap::default()).unwrap();
    let error = restart(&restarter, "ok-1").await.unwrap_err();
    let RestartError::Failed { .. } = &error else {
        panic!("expected a retryable failure, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(reason.to_lowercase().contains("refused"), "{reason}");
    // The URL in the reason (logged, stored) has its secrets masked.
    assert!(!reason.contains("hunter2"), "{reason}");
    assert!(reason.contains("token=****"), "{reason}");
}

#[tokio::test]
async fn the_body_is_signed_and_the_message_id_is_the_idempotency_key() {
    let server = Webhook::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("webhook.key");
    std::fs::write(&key_file, [KEY, b"\n"].concat()).unwrap();
    let mut settings = settings(server.url());
    settings.hmac_secret_file = Some(key_file);
    settings
        .headers
        .insert("Authorization".into(), "Bearer for-{group}".into());
    let restarter = HttpRestarter::new(&settings, hosts("127.0.0.1")).unwrap();
    let id = Uuid::new_v4();
    restarter
        .restart(&request_with_id("ok-7", id), Reservation::unlimited())
        .await
        .unwrap();
    let received = &server.log.all()[0];
    assert_eq!(
        received.signature_valid,
        Some(true),
        "{:?}",
        received.headers
    );
    assert_eq!(received.headers["idempotency-key"], id.to_string().as_str());
    assert_eq!(received.headers["authorization"], "Bearer for-ok");
    let body: serde_json::Value = serde_json::from_slice(&received.body).unwrap();
    assert_eq!(body["message_id"], id.to_string());
    assert_eq!(body["instance_name"], "ok-7");
    assert_eq!(body["host"], "127.0.0.1");
    assert_eq!(body["group"], "ok");
    // Neither the key nor a header value shows in the restarter's debug form.
    let shown = format!("{restarter:?}");
    assert!(!shown.contains("not-so-secret"), "{shown}");
    assert!(!shown.contains("Bearer"), "{shown}");
    assert!(shown.contains("****"), "{shown}");
}

#[tokio::test]
async fn the_key_can_come_from_the_environment() {
    // PATH is set wherever tests run; setting a variable of our own would
    // race with other test threads reading the environment.
    let key = std::env::var_os("PATH").expect("PATH is set");
    let server = Webhook::start().await;
    let mut settings = settings(server.url());
    settings.hmac_secret_env = Some("PATH".into());
    let restarter = HttpRestarter::new(&settings, hosts("127.0.0.1")).unwrap();
    restart(&restarter, "ok-env").await.unwrap();
    let received = &server.log.all()[0];
    let signature = received.headers["x-mandrill-signature"].as_bytes();
    assert!(verify_with(
        key.as_encoded_bytes(),
        signature,
        &received.body
    ));
    assert!(!format!("{restarter:?}").contains(&*key.to_string_lossy()));
}

#[tokio::test]
async fn a_tampered_body_fails_the_servers_check() {
    // The check itself must be able to fail, or the test above proves nothing.
    let signer = Signer {
        header: HeaderName::from_static("x-mandrill-signature"),
        key: Secret(KEY.to_vec()),
    };
    let signature = signer.sign(b"{\"a\": 1}", SystemTime::now());
    assert!(verify(signature.as_bytes(), b"{\"a\": 1}"));
    assert!(!verify(signature.as_bytes(), b"{\"a\": 2}"));
    let stale = signer.sign(b"{\"a\": 1}", SystemTime::now() - Duration::from_secs(301));
    assert!(!verify(stale.as_bytes(), b"{\"a\": 1}"));
}

/// The receiver's check from docs/backends.md, run by Python's own `hmac`:
/// `verify(key, header, body, now)` is the documented function; this
/// driver reads its arguments from files and prints `ok` or `refused`.
fn python_verifies(key: &[u8], header: &str, body: &[u8], now: u64) -> bool {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/backends.md"))
        .unwrap();
    let receiver = docs
        .split("```python\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(code, _)| code))
        .find(|code| code.contains("def verify("))
        .expect("docs/backends.md shows the receiver's check in Python");
    let dir = tempfile::tempdir().unwrap();
    let (key_file, body_file) = (dir.path().join("key"), dir.path().join("body"));
    std::fs::write(&key_file, key).unwrap();
    std::fs::write(&body_file, body).unwrap();
    let driver = format!(
        "{receiver}\nimport sys\n\
         key = open(sys.argv[1], 'rb').read()\n\
         body = open(sys.argv[3], 'rb').read()\n\
         print('ok' if verify(key, sys.argv[2], body, now=int(sys.argv[4])) else 'refused')\n"
    );
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(driver)
        .arg(&key_file)
        .arg(header)
        .arg(&body_file)
        .arg(now.to_string())
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    match String::from_utf8_lossy(&output.stdout).trim() {
        "ok" => true,
        "refused" => false,
        other => panic!("unexpected answer from the receiver: {other}"),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn signatures_bind_the_time_so_a_captured_request_cannot_be_replayed_later() {
    let server = Webhook::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("webhook.key");
    std::fs::write(&key_file, [KEY, b"\n"].concat()).unwrap();
    let mut settings = settings(server.url());
    settings.hmac_secret_file = Some(key_file);
    let restarter = HttpRestarter::new(&settings, hosts("127.0.0.1")).unwrap();
    // The same request twice: the same body, a second or more apart.
    let request = request("ok-replay");
    restarter
        .restart(&request, Reservation::unlimited())
        .await
        .unwrap();
    let first_second = unix_now();
    let deadline = Instant::now() + Duration::from_secs(5);
    while unix_now() == first_second {
        assert!(Instant::now() < deadline, "the clock did not move");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    restarter
        .restart(&request, Reservation::unlimited())
        .await
        .unwrap();

    let received = server.log.all();
    let header = |at: usize| {
        received[at].headers["x-mandrill-signature"]
            .to_str()
            .unwrap()
    };
    assert_eq!(received[0].body, received[1].body);
    assert_ne!(header(0), header(1), "another time, another signature");
    let (t, v1) = header(0).split_once(',').unwrap();
    let t: u64 = t.strip_prefix("t=").unwrap().parse().unwrap();
    let body = &received[0].body;
    let now = unix_now();
    // Checked by an implementation of its own (Python's hmac).
    assert!(python_verifies(KEY, header(0), body, now), "{}", header(0));
    assert!(python_verifies(KEY, header(1), body, now), "{}", header(1));
    // A tampered body, a key of another, a replay after five minutes, and
    // the old signature under a fresh time are all refused.
    let mut tampered = body.clone();
    tampered[0] ^= 1;
    assert!(!python_verifies(KEY, header(0), &tampered, now));
    assert!(!python_verifies(b"another key", header(0), body, now));
    assert!(!python_verifies(KEY, header(0), body, t + 301));
    let retimed = format!("t={},{v1}", t + 301);
    assert!(!python_verifies(KEY, &retimed, body, t + 301));
}

#[tokio::test]
async fn substituted_values_stay_single_json_strings() {
    let server = Webhook::start().await;
    // The host map's address can hold quotes and backslashes (not
    // whitespace: the host map refuses it; template.rs proves newlines are
    // escaped). The URL names the server directly, so the odd address only
    // reaches the body.
    let address = r#"evil"},"injected":{"x\"#;
    let url = format!(
        "http://127.0.0.1:{}/restart/{{instance_name}}",
        server.addr.port()
    );
    let restarter = HttpRestarter::new(&settings(url), hosts(address)).unwrap();
    restart(&restarter, "ok-2").await.unwrap();
    let received = &server.log.all()[0];
    let body: serde_json::Value = serde_json::from_slice(&received.body).unwrap();
    assert_eq!(body["host"], address);
    assert_eq!(body.as_object().unwrap().len(), 4, "{body}");
}

#[tokio::test]
async fn a_url_that_renders_invalid_is_a_permanent_error_and_nothing_is_sent() {
    let server = Webhook::start().await;
    // The URL is valid for the sample request checked at load; this host
    // map address makes it invalid for real requests.
    let restarter = HttpRestarter::new(&settings(server.url()), hosts("bad[host")).unwrap();
    let error = restart(&restarter, "ok-3").await.unwrap_err();
    assert!(
        matches!(&error, RestartError::Permanent { cause, .. } if cause.to_string().contains("url renders to an invalid address")),
        "{error:?}"
    );
    assert!(server.log.all().is_empty());
}

mod settings_check {
    use super::*;

    fn check(edit: impl FnOnce(&mut HttpSettings)) -> Result<(), (&'static str, String)> {
        let mut settings = HttpSettings {
            url: "https://chaos.internal/restart/{instance_name}".into(),
            ..HttpSettings::default()
        };
        edit(&mut settings);
        settings.validate()
    }

    #[test]
    fn the_defaults_with_a_url_are_valid_and_round_trip_through_toml() {
        check(|_| {}).unwrap();
        let text = r#"
            method = "PUT"
            url = "https://chaos.internal/restart/{instance_name}?token=abc"
            timeout = "5s"
            hmac_secret_env = "WEBHOOK_KEY"
            ca_file = "/etc/mandrill/ca.pem"
            [headers]
            Authorization = "Bearer abc"
        "#;
        let settings: HttpSettings = toml::from_str(text).unwrap();
        settings.validate().unwrap();
        assert_eq!(settings.timeout, Duration::from_secs(5));
        assert_eq!(settings.hmac_header, "X-Mandrill-Signature");
        let again: HttpSettings = toml::from_str(&toml::to_string(&settings).unwrap()).unwrap();
        assert_eq!(again, settings);
        // Tokens in headers and in the URL never reach a log.
        let shown = format!("{settings:?}");
        assert!(!shown.contains("abc"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
    }

    #[test]
    fn masked_urls_keep_the_address_and_hide_credentials_and_query() {
        use super::super::settings::masked_url;
        assert_eq!(
            masked_url("https://bot:pw@chaos.internal/restart/{instance_name}?token=abc"),
            "https://****@chaos.internal/restart/{instance_name}?****"
        );
        assert_eq!(
            masked_url("http://{host}:8080/a@b"),
            "http://{host}:8080/a@b",
            "an @ in the path is not user info"
        );
    }

    #[test]
    fn plain_http_goes_only_to_loopback_unless_allowed() {
        for url in [
            "http://chaos.internal/restart/{instance_name}",
            "http://10.0.0.7:8080/restart",
            "http://{host}:8080/restart",
            "http://127.0.0.1.example.net/restart",
        ] {
            let (key, why) = check(|s| s.url = url.into()).unwrap_err();
            assert_eq!(key, "url", "{url}");
            assert!(why.contains("allow_plain_http = true"), "{url}: {why}");
            check(|s| {
                s.url = url.into();
                s.allow_plain_http = true;
            })
            .unwrap();
        }
        for url in [
            "http://127.0.0.1:8080/restart/{instance_name}",
            "http://127.3.2.1/restart",
            "http://[::1]:8080/restart",
            "http://localhost:8080/restart",
            "https://{host}/restart",
        ] {
            check(|s| s.url = url.into()).unwrap();
        }
    }

    #[test]
    fn bad_settings_name_their_key() {
        let key = |edit: fn(&mut HttpSettings)| check(edit).unwrap_err().0;
        assert_eq!(key(|s| s.url.clear()), "url");
        assert_eq!(key(|s| s.url = "ftp://x/{host}".into()), "url");
        assert_eq!(key(|s| s.url = "{host}/restart".into()), "url");
        assert_eq!(key(|s| s.url = "https://x/{hostname}".into()), "url");
        assert_eq!(key(|s| s.method = "RE START".into()), "method");
        assert_eq!(key(|s| s.body = "{nope}".into()), "body");
        assert_eq!(key(|s| s.hmac_header = "bad header".into()), "hmac_header");
        assert_eq!(key(|s| s.timeout = Duration::ZERO), "timeout");
        assert_eq!(
            key(|s| {
                s.hmac_secret_env = Some("A".into());
                s.hmac_secret_file = Some("/a".into());
            }),
            "hmac_secret_env"
        );
        for (name, value) in [
            ("bad name", "x"),
            ("X-Ok", "line\nbreak"),
            ("Idempotency-Key", "x"),
            ("Content-Length", "1"),
        ] {
            let result = check(|s| {
                s.headers.insert(name.into(), value.into());
            });
            assert_eq!(result.unwrap_err().0, "headers", "{name}");
        }
        // The signature header cannot be overwritten while signing.
        let result = check(|s| {
            s.hmac_secret_env = Some("A".into());
            s.headers.insert("x-mandrill-signature".into(), "x".into());
        });
        assert_eq!(result.unwrap_err().0, "headers");
    }

    #[test]
    fn a_missing_key_or_ca_file_fails_construction_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let build = |edit: &dyn Fn(&mut HttpSettings)| {
            let mut settings = HttpSettings {
                url: "https://chaos.internal/restart/{instance_name}".into(),
                ..HttpSettings::default()
            };
            edit(&mut settings);
            let error = HttpRestarter::new(&settings, HostMap::default()).unwrap_err();
            crate::causes::WithCauses(&error).to_string()
        };
        let missing = dir.path().join("missing.pem");
        let error = build(&|s| s.ca_file = Some(missing.clone()));
        let cannot_read = format!(
            "restarter.http.ca_file: cannot read {}: ",
            missing.display()
        );
        assert!(error.starts_with(&cannot_read), "{error}");
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
        let error = build(&|s| s.ca_file = Some(not_pem.clone()));
        assert!(error.starts_with("restarter.http.ca_file:"), "{error}");
        assert!(error.contains("no PEM certificate"), "{error}");
        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let error = build(&|s| s.ca_file = Some(broken.clone()));
        assert!(error.starts_with("restarter.http.ca_file:"), "{error}");
        let empty_key = dir.path().join("empty.key");
        std::fs::write(&empty_key, "\n").unwrap();
        let error = build(&|s| s.hmac_secret_file = Some(empty_key.clone()));
        assert!(error.contains("is empty"), "{error}");
        let error = build(&|s| s.hmac_secret_env = Some("MANDRILL_TEST_NO_SUCH_VARIABLE".into()));
        assert_eq!(
            error,
            "restarter.http.hmac_secret_env: the variable MANDRILL_TEST_NO_SUCH_VARIABLE is not set"
        );
    }
}

mod pure {
    use super::*;

    #[test]
    fn only_408_429_and_5xx_are_retryable() {
        for (status, retryable) in [
            (400, false),
            (401, false),
            (403, false),
            (404, false),
            (408, true),
            (409, false),
            (422, false),
            (429, true),
            (500, true),
            (502, true),
            (503, true),
            (302, false),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(is_retryable(status), retryable, "{status}");
        }
    }

    #[test]
    fn retry_after_accepts_seconds_and_dates_and_is_capped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
            retry_after(&headers, now)
        };
        assert_eq!(at("2"), Some(Duration::from_secs(2)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(at(&later), Some(Duration::from_secs(90)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(at(&earlier), Some(Duration::ZERO), "a past date means now");
        assert_eq!(at("99999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(at("soon"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn logged_urls_hide_credentials_and_query_values() {
        let url =
            Url::parse("https://bot:pa55@chaos.internal/restart/a?token=abc&id=7#frag").unwrap();
        assert_eq!(
            redacted(&url),
            "https://****:****@chaos.internal/restart/a?token=****&id=****"
        );
        let plain = Url::parse("https://chaos.internal/restart/a").unwrap();
        assert_eq!(redacted(&plain), "https://chaos.internal/restart/a");
    }

    #[test]
    fn outputs_are_bounded_on_character_boundaries() {
        assert_eq!(recorded_output(b""), None);
        assert_eq!(recorded_output(b"a\0b").unwrap(), "a\u{fffd}b");
        let long = "€".repeat(MAX_OUTPUT_BYTES);
        let output = recorded_output(long.as_bytes()).unwrap();
        assert!(output.len() <= MAX_OUTPUT_BYTES);
        assert!(output.ends_with('…'));
        assert_eq!(one_line("  a\nb\r\tc  "), "a b  c");
    }
}

mod tls {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    use tokio_rustls::TlsAcceptor;
    use tokio_rustls::rustls::ServerConfig;
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    use super::*;

    /// Accepts TCP connections and completes the TLS handshake; a failed
    /// handshake (the client distrusting the certificate) is skipped.
    struct TlsListener {
        tcp: tokio::net::TcpListener,
        acceptor: TlsAcceptor,
    }

    impl axum::serve::Listener for TlsListener {
        type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
        type Addr = SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            loop {
                let Ok((stream, peer)) = self.tcp.accept().await else {
                    continue;
                };
                if let Ok(tls) = self.acceptor.accept(stream).await {
                    return (tls, peer);
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<Self::Addr> {
            self.tcp.local_addr()
        }
    }

    /// A throwaway CA (its PEM) and a webhook serving a certificate it
    /// signed for 127.0.0.1.
    async fn start_tls() -> (String, Webhook) {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "mandrill test ca");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let mut server_params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server_params.signed_by(&server_key, &ca).unwrap();

        install_crypto_provider();
        let config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![server_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )
            .unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        };
        let log = Log::default();
        let app = router(log.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        (ca.pem(), Webhook { addr, log, task })
    }

    #[tokio::test]
    async fn https_with_the_ca_file_succeeds_and_without_it_fails() {
        let (ca_pem, server) = start_tls().await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let url = format!(
            "https://{{host}}:{}/restart/{{instance_name}}",
            server.addr.port()
        );

        let mut trusting = settings(url.clone());
        trusting.ca_file = Some(ca_file);
        let restarter = HttpRestarter::new(&trusting, hosts("127.0.0.1")).unwrap();
        let restarted = restart(&restarter, "ok-tls").await.unwrap();
        assert_eq!(restarted.output.as_deref(), Some("restarting ok-tls\n"));

        // Without the CA the certificate is not trusted: nothing reaches the
        // handler, and the failure says why.
        let restarter = HttpRestarter::new(&settings(url), hosts("127.0.0.1")).unwrap();
        let error = restart(&restarter, "ok-untrusted").await.unwrap_err();
        let text = error.with_causes().to_string();
        assert!(text.contains("certificate"), "{text}");
        assert_eq!(server.log.all().len(), 1);
    }
}

mod through_the_worker {
    //! The lead's worker, unchanged, with this backend: a 404 is
    //! dead-lettered without a retry; a 503 with `Retry-After` is redelivered
    //! after about that delay and then succeeds.

    use crate::backoff::Backoff;
    use crate::broker::{MemoryBroker, Publisher};
    use crate::domain::Status;
    use crate::stats::Stats;
    use crate::store::{MemoryStore, Store};
    use crate::worker::{Shutdown, Worker, WorkerConfig};

    use super::*;

    fn config() -> WorkerConfig {
        WorkerConfig {
            max_in_flight: 10,
            pull_batch: 10,
            max_attempts: 3,
            max_deliveries: 10,
            // Long enough that a redelivery sooner than this proves the
            // webhook's Retry-After was used.
            retry_backoff: Backoff {
                initial: Duration::from_secs(30),
                max: Duration::from_secs(60),
            },
            record_attempts: 3,
            record_backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(100),
            },
            restart_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
            lease_extension_interval: None,
            max_pull_failures: 5,
            pull_backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(100),
            },
            parse: ParseRules {
                domain: Domain::default(),
                max_payload_bytes: 1024,
            },
            switch_poll_interval: Duration::from_secs(1),
            store_timeout: crate::store::DEFAULT_TIMEOUT,
            policy: crate::safety::PolicyHandle::default(),
        }
    }

    /// Waits, in real time, until `condition` holds or 20 s pass.
    async fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    struct Running {
        broker: Arc<MemoryBroker>,
        store: Arc<MemoryStore>,
        stats: Arc<Stats>,
        shutdown: Shutdown,
        worker: JoinHandle<Result<(), crate::worker::WorkerError>>,
    }

    async fn run(server: &Webhook, instance: &str) -> (Running, Uuid) {
        let restarter = HttpRestarter::new(&settings(server.url()), hosts("127.0.0.1")).unwrap();
        let broker = Arc::new(MemoryBroker::new(
            Duration::from_secs(10),
            Duration::from_millis(50),
        ));
        let store = Arc::new(MemoryStore::new());
        let stats = Arc::new(Stats::default());
        let id = Uuid::new_v4();
        let payload = format!(r#"{{"message_id":"{id}","instance_name":"{instance}"}}"#);
        broker.publish(payload.into()).await.unwrap();
        let shutdown = Shutdown::new();
        let worker = Worker::new(
            config(),
            broker.clone(),
            store.clone() as Arc<dyn Store>,
            Arc::new(restarter),
            stats.clone(),
        );
        let worker = tokio::spawn(worker.run(shutdown.clone()));
        let running = Running {
            broker,
            store,
            stats,
            shutdown,
            worker,
        };
        (running, id)
    }

    impl Running {
        async fn stop(self) {
            self.shutdown.request();
            self.worker.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_404_is_dead_lettered_at_once_without_a_retry() {
        let server = Webhook::start().await;
        let (running, id) = run(&server, "missing-9").await;
        let stats = running.stats.clone();
        wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
        assert_eq!(server.log.all().len(), 1, "called once, never retried");
        assert_eq!(stats.nacked.get(), 0);
        assert_eq!(
            running.store.lookup(id).await.unwrap(),
            Some(Status::Failed)
        );
        let reason = &running.broker.dead_letters()[0].reason;
        assert!(reason.contains("404 Not Found"), "{reason}");
        running.stop().await;
    }

    #[tokio::test]
    async fn a_503_with_retry_after_is_redelivered_after_that_delay() {
        let server = Webhook::start().await;
        let (running, id) = run(&server, "flaky-9").await;
        let stats = running.stats.clone();
        wait_until("acked", || stats.acked.get() == 1).await;
        assert_eq!(stats.nacked.get(), 1);
        let calls = server.log.all();
        assert_eq!(calls.len(), 2);
        // Redelivered no sooner than the webhook asked (1 s), and well
        // before the worker's own 30 s backoff.
        let gap = calls[1].at - calls[0].at;
        assert!(gap >= Duration::from_millis(900), "{gap:?}");
        assert!(gap < Duration::from_secs(20), "{gap:?}");
        // Same message, same idempotency key on both calls.
        for call in &calls {
            assert_eq!(call.headers["idempotency-key"], id.to_string().as_str());
        }
        let entry = running
            .store
            .entries()
            .into_iter()
            .find(|e| e.message_id == Some(id))
            .unwrap();
        assert_eq!(entry.status, Status::Restarted);
        assert_eq!(entry.output.as_deref(), Some("restarted on the second try"));
        running.stop().await;
    }
}
