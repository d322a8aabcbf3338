//! Stop conditions against a real local HTTP server and real programs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use super::*;

fn http(name: &str, url: &str) -> StopConditionSettings {
    StopConditionSettings {
        name: name.into(),
        http: Some(url.into()),
        expect_status: None,
        expect_empty_json_array: false,
        command: None,
        timeout: Duration::from_secs(5),
    }
}

fn command(name: &str, argv: &[&str], timeout: Duration) -> StopConditionSettings {
    StopConditionSettings {
        name: name.into(),
        http: None,
        expect_status: None,
        expect_empty_json_array: false,
        command: Some(argv.iter().map(|a| (*a).to_owned()).collect()),
        timeout,
    }
}

/// A server on 127.0.0.1:0 answering every request with `status`.
async fn server(status: Arc<AtomicU16>) -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(move || {
        let status = status.clone();
        async move { axum::http::StatusCode::from_u16(status.load(Ordering::SeqCst)).unwrap() }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn an_http_check_passes_only_on_the_expected_status_and_never_shows_a_secret() {
    let status = Arc::new(AtomicU16::new(503));
    let addr = server(status.clone()).await;
    let url = format!("http://alerts:hunter22@{addr}/firing?token=s3cret");
    let checks = StopConditions::new(&[http("alerts", &url)]).unwrap();
    let reason = checks.check().await.unwrap_err();
    assert!(
        reason.starts_with("deferred by stop condition \"alerts\": GET http://"),
        "{reason}"
    );
    assert!(reason.ends_with("answered 503, expected 200"), "{reason}");
    assert!(
        !reason.contains("hunter22") && !reason.contains("s3cret"),
        "{reason}"
    );
    status.store(200, Ordering::SeqCst);
    // Healthy: its result, for the request's story, without the secret.
    let results = checks.check().await.unwrap().join(", ");
    assert!(
        results.starts_with("\"alerts\" healthy (GET http://")
            && results.ends_with("answered 200)"),
        "{results}"
    );
    assert!(
        !results.contains("hunter22") && !results.contains("s3cret"),
        "{results}"
    );

    // Another expected status; and a server that is not there fails closed.
    let teapot = StopConditions::new(&[StopConditionSettings {
        expect_status: Some(418),
        ..http("teapot", &format!("http://{addr}/"))
    }])
    .unwrap();
    assert!(
        teapot
            .check()
            .await
            .unwrap_err()
            .contains("answered 200, expected 418")
    );
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let gone = StopConditions::new(&[http("gone", &format!("http://{closed}/"))]).unwrap();
    let reason = gone.check().await.unwrap_err();
    assert!(
        reason.contains("\"gone\": GET http://") && reason.contains("failed"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_command_check_passes_on_exit_0_and_a_hung_one_fails_at_its_timeout() {
    let second = Duration::from_secs(1);
    StopConditions::new(&[command("ok", &["true"], second)])
        .unwrap()
        .check()
        .await
        .unwrap();
    let reason = StopConditions::new(&[command("no", &["false"], second)])
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert!(
        reason.starts_with("deferred by stop condition \"no\": \"false\" exited with"),
        "{reason}"
    );
    let failing = StopConditions::new(&[
        command("ok", &["true"], second),
        command(
            "deploys",
            &["sh", "-c", "echo deploy in progress >&2; exit 3"],
            second,
        ),
    ])
    .unwrap();
    let reason = failing.check().await.unwrap_err();
    assert!(
        reason.starts_with("deferred by stop condition \"deploys\": \"sh\" exited with"),
        "{reason}"
    );
    // Each result in the order they ran: the one before it was healthy.
    assert!(
        reason.ends_with(
            "deploy in progress; checked before it: \"ok\" healthy (\"true\" exited with \
             exit status: 0)"
        ),
        "{reason}"
    );

    let hung = StopConditions::new(&[command(
        "slow",
        &["sleep", "30"],
        Duration::from_millis(200),
    )])
    .unwrap();
    let reason = hung.check().await.unwrap_err();
    assert!(
        reason.contains("\"slow\"") && reason.contains("ran longer than"),
        "{reason}"
    );
}

#[tokio::test]
async fn an_http_check_that_hangs_past_its_timeout_fails() {
    // Accepts the connection and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            kept.push(socket);
        }
    });
    let checks = StopConditions::new(&[StopConditionSettings {
        timeout: Duration::from_millis(200),
        ..http("alerts", &format!("http://{addr}/"))
    }])
    .unwrap();
    let reason = checks.check().await.unwrap_err();
    assert!(reason.contains("did not answer within 200ms"), "{reason}");
}

/// A server on 127.0.0.1:0 answering every request 200 with `body`, as
/// Alertmanager's `/api/v2/alerts` does whether alerts fire or not.
async fn alerts_server(body: Arc<std::sync::Mutex<String>>) -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(move || {
        let body = body.lock().unwrap().clone();
        async move { ([("content-type", "application/json")], body) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn an_empty_json_array_check_fails_while_the_array_has_anything_in_it() {
    let body = Arc::new(std::sync::Mutex::new("[]\n".to_owned()));
    let addr = alerts_server(body.clone()).await;
    let url = format!(
        "http://{addr}/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=severity%3D%22page%22"
    );
    let checks = StopConditions::new(&[StopConditionSettings {
        expect_empty_json_array: true,
        ..http("alerts", &url)
    }])
    .unwrap();
    checks.check().await.unwrap();

    *body.lock().unwrap() = r#"[{"labels":{"alertname":"HostDown"}},{"labels":{}}]"#.into();
    let reason = checks.check().await.unwrap_err();
    assert!(
        reason.starts_with("deferred by stop condition \"alerts\": GET http://")
            && reason.ends_with("answered a JSON array of 2 items, expected an empty one"),
        "{reason}"
    );
    // Fail closed on anything that is not an array.
    for other in ["", "{}", "not json", "[", "null"] {
        *body.lock().unwrap() = other.into();
        let reason = checks.check().await.unwrap_err();
        assert!(
            reason.ends_with("answered no JSON array, expected an empty one"),
            "{other:?}: {reason}"
        );
    }
    *body.lock().unwrap() = format!("[{}]", "0,".repeat(40_000) + "0");
    let reason = checks.check().await.unwrap_err();
    assert!(reason.contains("more than 64 KiB"), "{reason}");
    // Without the setting the body is not looked at: 200 is healthy.
    let status_only = StopConditions::new(&[http("alerts", &url)]).unwrap();
    status_only.check().await.unwrap();
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    let key = |settings: &[StopConditionSettings]| StopConditions::new(settings).unwrap_err().0;
    let ok = http("a", "http://127.0.0.1/");
    assert_eq!(
        key(&[ok.clone(), http("b", "ftp://x/")]),
        "safety.stop_conditions[1].http"
    );
    assert_eq!(
        key(&[StopConditionSettings {
            expect_status: Some(99),
            ..ok.clone()
        }]),
        "safety.stop_conditions[0].expect_status"
    );
    assert_eq!(
        key(&[StopConditionSettings {
            command: Some(vec!["true".into()]),
            ..ok.clone()
        }]),
        "safety.stop_conditions[0]"
    );
    assert_eq!(
        key(&[StopConditionSettings {
            expect_empty_json_array: true,
            ..command("c", &["true"], Duration::from_secs(1))
        }]),
        "safety.stop_conditions[0].expect_empty_json_array"
    );
    assert_eq!(
        key(&[command("c", &[], Duration::from_secs(1))]),
        "safety.stop_conditions[0].command"
    );
    assert_eq!(
        key(&[command("c", &["true"], Duration::ZERO)]),
        "safety.stop_conditions[0].timeout"
    );
    assert_eq!(
        key(&[StopConditionSettings {
            name: " ".into(),
            ..ok
        }]),
        "safety.stop_conditions[0].name"
    );
}

/// The checks run one after another, a command's up to its timeout and then
/// the wait for its killed process to be reaped: the claim's hold must
/// cover all of it.
#[test]
fn the_longest_run_adds_every_timeout_and_a_commands_reaping() {
    let checks = StopConditions::new(&[
        http("alerts", "http://127.0.0.1:9/alerts"),
        command("quiet", &["true"], Duration::from_secs(30)),
    ])
    .unwrap();
    assert_eq!(
        checks.longest_run(),
        Duration::from_secs(5 + 30) + crate::restarter::process::REAP_AFTER_KILL
    );
    assert_eq!(StopConditions::default().longest_run(), Duration::ZERO);
}
