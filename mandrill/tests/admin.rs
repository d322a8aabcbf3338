//! The admin server on the real binary: metrics a real Prometheus scrapes,
//! readiness that turns on SIGTERM before the drain, the token.

mod support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{DEADLINE, Mandrill, mandrill, sqlite_url, temp_dir};

/// The address from the `admin listening` line.
fn admin_addr(service: &Mandrill) -> String {
    let line = service.wait_for("admin listening", 1).remove(0);
    line["fields"]["addr"].as_str().unwrap().to_owned()
}

/// `GET path` over HTTP/1.1; status and body.
fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    send(addr, "GET", path, headers, "")
}

/// `POST path` with `body`; status and body.
fn post(addr: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    send(addr, "POST", path, headers, body)
}

fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("Host"))
    {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    // Bodies checked here are text, or checked only for being there.
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn get_json(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let (status, body) = get(addr, path, headers);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Polls `probe` until it returns `Some`, or panics after the deadline.
fn wait_until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_non_loopback_bind_without_a_token_is_refused_naming_the_key() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(
        &dir,
        &["run", "--simulate", "--set", "admin.listen=0.0.0.0:0"],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("admin.token"), "{stderr}");
}

#[test]
fn history_needs_the_token_which_is_never_logged() {
    let (_guard, dir) = temp_dir();
    let token = "admin-canary-7d1f";
    let service = Mandrill::run_with_env(
        &dir,
        &["--db", &sqlite_url(&dir), "--simulate=50"],
        &[("MANDRILL_ADMIN__TOKEN", token)],
    );
    let addr = admin_addr(&service);
    service.wait_for("saved", 1);
    for headers in [&[][..], &[("Authorization", "Bearer wrong")][..]] {
        let (status, body) = get(&addr, "/api/requests?limit=5", headers);
        assert_eq!(status, 401, "{body}");
        assert!(!body.contains("instance"), "{body}");
    }
    let bearer = format!("Bearer {token}");
    let (status, body) = get_json(
        &addr,
        "/api/requests?limit=5",
        &[("Authorization", &bearer)],
    );
    assert_eq!(status, 200, "{body}");
    let requests = body["requests"].as_array().unwrap();
    assert!(!requests.is_empty() && requests.len() <= 5, "{body}");
    let id = requests[0]["message_id"].as_str().unwrap();
    let (status, one) = get_json(
        &addr,
        &format!("/api/requests/{id}"),
        &[("Authorization", &bearer)],
    );
    assert_eq!(
        (status, one["message_id"].as_str()),
        (200, Some(id)),
        "{one}"
    );
    // Its whole story, as `mandrill explain` tells it.
    assert_eq!(one["attempts"][0]["attempt"], 1, "{one}");
    let explanation = one["explanation"].as_str().unwrap();
    assert!(
        explanation.contains("attempt 1 claimed and issued"),
        "{explanation}"
    );
    let (status, _) = get(&addr, &format!("/api/requests/{id}"), &[]);
    assert_eq!(status, 401);
    let auth = [("Authorization", bearer.as_str())];
    let (status, restarted) = get_json(&addr, "/api/requests?status=restarted", &auth);
    assert_eq!(status, 200);
    let restarted = restarted["requests"].as_array().unwrap();
    assert!(
        restarted.iter().all(|r| r["status"] == "restarted"),
        "{restarted:?}"
    );
    assert_eq!(get(&addr, "/api/requests?limit=many", &auth).0, 400);
    let (status, overview) = get_json(&addr, "/api/status", &[]);
    assert_eq!(status, 200);
    assert_eq!(overview["mode"], "unleashed");
    assert_eq!(overview["ready"], true);
    assert!(
        overview["counters"]["pulled"].as_u64() > Some(0),
        "{overview}"
    );
    // Probes and scrapes need no token.
    assert_eq!(get(&addr, "/healthz", &[]).0, 200);
    assert_eq!(get(&addr, "/metrics", &[]).0, 200);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let log = serde_json::to_string(&lines).unwrap();
    assert!(log.contains("admin listening") && !log.contains(token));
}

#[test]
fn pause_and_resume_need_the_token_and_turn_the_switch_the_worker_obeys() {
    let (_guard, dir) = temp_dir();
    let token = "switch-token-5c2e";
    let service = Mandrill::run_with_env(
        &dir,
        &[
            "--db",
            &sqlite_url(&dir),
            "--simulate=50",
            "--set",
            "safety.poll_interval=100ms",
        ],
        &[("MANDRILL_ADMIN__TOKEN", token)],
    );
    let addr = admin_addr(&service);
    service.wait_for("saved", 1);
    let json_body = [("Content-Type", "application/json")];
    let paused = |addr: &str| get_json(addr, "/api/status", &[]).1["paused"].clone();
    // Refused without the token or with a wrong one, and nothing changes.
    for path in ["/api/pause", "/api/resume"] {
        for wrong in ["", "Bearer switch-token-5c2", "Bearer switch-token-5c2ee"] {
            let mut headers = json_body.to_vec();
            if !wrong.is_empty() {
                headers.push(("Authorization", wrong));
            }
            let (status, body) = post(&addr, path, &headers, r#"{"reason":"nope"}"#);
            assert_eq!(status, 401, "{path} {wrong:?}: {body}");
        }
        let form = [("Content-Type", "application/x-www-form-urlencoded")];
        let (status, _) = post(&addr, path, &form, "reason=nope&token=wrong");
        assert_eq!(status, 401, "{path} with a wrong form token");
        assert_eq!(
            paused(&addr),
            false,
            "{path} refused, yet the switch turned"
        );
    }
    assert!(
        service
            .messages("restarts paused (kill switch): pulling stops until resumed")
            .is_empty()
    );

    let bearer = format!("Bearer {token}");
    let mut headers = json_body.to_vec();
    headers.push(("Authorization", &bearer));
    let (status, body) = post(
        &addr,
        "/api/pause",
        &headers,
        r#"{"reason":"incident 7","by":"ana"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (_, overview) = get_json(&addr, "/api/status", &[]);
    assert_eq!(overview["paused"], true, "{overview}");
    assert_eq!(overview["switch"]["by"], "ana");
    assert_eq!(overview["switch"]["reason"], "incident 7");
    // The worker reads the switch and stops pulling.
    service.wait_for(
        "restarts paused (kill switch): pulling stops until resumed",
        1,
    );
    let (_, page) = get(&addr, "/", &[]);
    assert!(
        page.contains("PAUSED: paused by ana (incident 7)"),
        "{page}"
    );
    assert!(page.contains("action=\"/api/resume\""), "{page}");

    // Resumed from the dashboard's form, token as a field: back to the page.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let (status, _) = post(
        &addr,
        "/api/resume",
        &form,
        &format!("reason=all+clear&token={token}"),
    );
    assert_eq!(status, 303);
    assert_eq!(paused(&addr), false);
    let (_, overview) = get_json(&addr, "/api/status", &[]);
    assert_eq!(overview["switch"]["by"], "admin-api", "{overview}");
    service.wait_for("restarts resumed (kill switch): pulling again", 1);
    let saved_before = service.messages("saved").len();
    service.wait_for("saved", saved_before + 1);
    // A cross-site form post is refused even with the token.
    let mut cross = form.to_vec();
    cross.push(("Origin", "https://elsewhere.example"));
    let (status, _) = post(&addr, "/api/pause", &cross, &format!("token={token}"));
    assert_eq!(status, 403);
    assert_eq!(paused(&addr), false);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    assert!(!serde_json::to_string(&lines).unwrap().contains(token));
}

#[test]
fn debug_mode_logs_step_timings_and_runtime_metrics_which_metrics_exposes() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(
        &dir,
        &["--db", &sqlite_url(&dir), "--simulate=50", "--debug"],
    );
    let addr = admin_addr(&service);
    let timings = service.wait_for("message step timings", 3);
    let steps = timings
        .iter()
        .map(|line| line["fields"]["steps"].as_str().unwrap().to_owned())
        .find(|steps| steps.contains("saved +"))
        .expect("a restarted message's timings");
    assert!(steps.starts_with("pulled +"), "{steps}");
    assert!(timings[0]["fields"]["message_id"].is_string());
    // The status line, every 10s at most in debug mode, with the runtime's metrics.
    let status = service.wait_for("status", 1).remove(0);
    assert!(status["fields"]["workers"].as_u64() >= Some(1), "{status}");
    assert!(status["fields"]["tasks"].as_u64() >= Some(1), "{status}");
    let (_, text) = get(&addr, "/metrics", &[]);
    for name in [
        "mandrill_runtime_workers ",
        "mandrill_runtime_alive_tasks ",
        "mandrill_runtime_global_queue_depth ",
        "mandrill_runtime_busy_seconds_total ",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    let (_, overview) = get_json(&addr, "/api/status", &[]);
    assert!(
        overview["runtime"]["alive_tasks"].as_u64() >= Some(1),
        "{overview}"
    );
    let mode = service.messages(
        "DEBUG MODE: stalls, runtime metrics and per-message step timings are logged; \
         not for production throughput",
    );
    assert_eq!(mode[0]["fields"]["stall_threshold"], "10ms", "{mode:?}");
    service.signal("TERM");
    assert!(service.wait_exit().0.success());
}

/// Without a token the server is bound to loopback, and a web page that
/// re-resolves its own name to 127.0.0.1 (DNS rebinding) still names its
/// own Host: refused (421), so it can neither read the API nor resume
/// restarts. Every answer forbids framing (no clickjacking of the
/// dashboard's buttons).
#[test]
fn without_a_token_only_a_loopback_host_is_served_and_nothing_may_frame_it() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(&dir, &["--db", &sqlite_url(&dir), "--simulate=5"]);
    let addr = admin_addr(&service);
    let port = addr.rsplit_once(':').unwrap().1;
    let rebound = format!("rebind.attacker.example:{port}");
    let (status, _) = post(
        &addr,
        "/api/pause",
        &[
            ("Host", rebound.as_str()),
            ("Content-Type", "application/json"),
        ],
        r#"{"reason":"rebound"}"#,
    );
    assert_eq!(status, 421);
    let (status, _) = get(&addr, "/api/requests", &[("Host", rebound.as_str())]);
    assert_eq!(status, 421);
    assert_eq!(get_json(&addr, "/api/status", &[]).1["paused"], false);
    for host in [addr.clone(), format!("localhost:{port}")] {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        write!(
            stream,
            "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let head = response
            .split("\r\n\r\n")
            .next()
            .unwrap()
            .to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{host}: {head}");
        assert!(head.contains("x-frame-options: deny"), "{head}");
        assert!(head.contains("frame-ancestors 'none'"), "{head}");
    }
}

#[test]
fn readyz_turns_503_on_sigterm_while_work_is_still_in_flight() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(
        &dir,
        &[
            "--db",
            &sqlite_url(&dir),
            "--simulate=20",
            "--set",
            "restarter.min_latency=3s",
            "--set",
            "restarter.max_latency=3s",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "worker.shutdown_grace=1m",
        ],
    );
    let addr = admin_addr(&service);
    wait_until("ready", || {
        (get(&addr, "/readyz", &[]).0 == 200).then_some(())
    });
    wait_until("work in flight", || {
        let (_, status) = get_json(&addr, "/api/status", &[]);
        (status["in_flight"].as_u64() > Some(0)).then_some(())
    });
    service.signal("TERM");
    let (status, body) = wait_until("not ready", || {
        let (status, body) = get(&addr, "/readyz", &[]);
        (status == 503).then_some((status, body))
    });
    assert!(body.contains("shutting down"), "{status} {body}");
    // Still draining: the restarts take seconds, so they are in flight now.
    let (_, now) = get_json(&addr, "/api/status", &[]);
    assert!(now["in_flight"].as_u64() > Some(0), "{now}");
    assert_eq!(now["shutting_down"], true);
    assert!(service.messages("final stats").is_empty());
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let restarted: u64 = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "final stats")
        .map(|l| l["fields"]["restarted"].as_u64().unwrap())
        .sum();
    assert!(restarted > 0, "the in-flight restarts were drained");
}

/// A process killed and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn promtool_accepts_the_metrics_and_a_private_prometheus_scrapes_them() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(&dir, &["--db", &sqlite_url(&dir), "--simulate=50"]);
    let addr = admin_addr(&service);
    service.wait_for("saved", 1);
    let (status, text) = get(&addr, "/metrics", &[]);
    assert_eq!(status, 200);
    for name in [
        "mandrill_requests_total{outcome=\"restarted\"}",
        "mandrill_dead_letters_total",
        "mandrill_in_flight",
        "mandrill_leashed 0",
        "mandrill_build_info{version=",
        "mandrill_handling_seconds_bucket{le=\"+Inf\"}",
        "mandrill_restart_seconds_count",
        "mandrill_recovery_seconds_sum",
        "mandrill_notifications_total{result=\"dropped\"} 0",
        "mandrill_group_restarts_in_window{group=\"cattle\"}",
        "mandrill_group_disrupted_hosts{group=\"cattle\"}",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }

    // Every series the Grafana dashboard in deploy/ queries is exposed.
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana-dashboard.json"),
    )
    .unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    let exprs = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap())
        .map(|target| target["expr"].as_str().unwrap().to_owned());
    for expr in exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("mandrill_") {
                assert!(
                    text.contains(&format!("\n{word}")),
                    "{word} (in {expr}) is not exposed"
                );
            }
        }
    }

    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's `prometheus` package; .ci/run installs it)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: mandrill\n    \
             static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian's `prometheus` package)"),
    );
    let series = wait_until("a mandrill series in Prometheus", || {
        let stream = TcpStream::connect(&web).ok()?;
        drop(stream);
        let (status, body) = get_json(&web, "/api/v1/query?query=mandrill_requests_total", &[]);
        let result = body["data"]["result"].as_array()?.clone();
        (status == 200 && !result.is_empty()).then_some(result)
    });
    assert!(
        series
            .iter()
            .all(|s| s["metric"]["job"] == "mandrill" && s["metric"]["outcome"].is_string()),
        "{series:?}"
    );
}

/// Runs headless Chromium with `args` then `url`, within the deadline;
/// returns its standard output.
fn chromium(profile: &Path, args: &[&str], url: &str) -> String {
    let child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium (Debian's `chromium` package; .ci/run installs it)");
    let mut child = Killed(child);
    let deadline = Instant::now() + DEADLINE;
    while child.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "chromium did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    out
}

#[test]
fn the_dashboard_shows_requests_in_a_real_browser() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(
        &dir,
        &[
            "--db",
            &sqlite_url(&dir),
            "--simulate=50",
            "--set",
            "simulate.malformed_rate=0.2",
        ],
    );
    let addr = admin_addr(&service);
    service.wait_for("saved", 3);
    let url = format!("http://{addr}/");
    let dom = chromium(&dir.join("profile"), &["--dump-dom"], &url);
    assert!(dom.contains("id=\"mode\""), "{dom}");
    assert!(dom.contains("id=\"chart\""), "{dom}");
    assert!(
        dom.contains("class=\"request\""),
        "no request listed:\n{dom}"
    );
    assert!(dom.contains("href=\"/api/requests/"), "{dom}");
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    chromium(
        &dir.join("profile"),
        &[
            &format!("--screenshot={}", screenshot.display()),
            "--window-size=1000,900",
            "--hide-scrollbars",
        ],
        &url,
    );
    let png = std::fs::read(&screenshot).expect("a screenshot was saved");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
}

#[test]
fn a_profile_needs_the_token_and_its_flamegraph_names_mandrills_functions() {
    let (_guard, dir) = temp_dir();
    let token = "profile-token-31";
    let service = Mandrill::run_with_env(
        &dir,
        &["--db", &sqlite_url(&dir), "--simulate=500"],
        &[("MANDRILL_ADMIN__TOKEN", token)],
    );
    let addr = admin_addr(&service);
    service.wait_for("saved", 10);
    let path = "/debug/pprof/profile?seconds=2&format=svg";
    for headers in [&[][..], &[("Authorization", "Bearer profile-token-3")][..]] {
        let (status, body) = get(&addr, path, headers);
        assert_eq!(status, 401, "{body}");
    }
    // The refused requests started nothing: a profile can be taken now.
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];
    let (status, svg) = get(&addr, path, &auth);
    assert_eq!(status, 200, "{svg}");
    assert!(
        svg.contains("<svg"),
        "not an SVG: {}",
        &svg[..svg.len().min(300)]
    );
    assert!(
        svg.contains("mandrill::"),
        "no mandrill frame in the flamegraph"
    );
    let (status, protobuf) = get(&addr, "/debug/pprof/profile?seconds=1", &auth);
    assert_eq!(status, 200);
    assert!(!protobuf.is_empty() && !protobuf.contains("<svg"));
    assert_eq!(get(&addr, "/debug/pprof/profile?seconds=0", &auth).0, 400);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    assert!(!serde_json::to_string(&lines).unwrap().contains(token));
}

#[test]
fn the_example_production_configuration_loads_with_its_secrets_from_the_environment() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/mandrill.toml");
    let environment = [
        (
            "MANDRILL_STORE__URL",
            "postgres://mandrill:pw@db.internal/mandrill",
        ),
        ("MANDRILL_BROKER__NATS__PASSWORD", "nats-pw"),
        ("MANDRILL_ADMIN__TOKEN", "admin-token"),
    ];
    let sources = |environment: &[(&str, &str)]| mandrill::config::Sources {
        file: Some(path.clone()),
        environment: environment
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        overrides: Vec::new(),
    };
    let (config, renamed) = sources(&environment).load_with_renames().unwrap();
    assert!(
        renamed.is_empty(),
        "the example uses today's names: {renamed:?}"
    );
    assert_eq!(
        config.broker.nats.password,
        Some(mandrill::settings::Secret("nats-pw".into()))
    );
    assert!(config.dry_run(), "the example starts leashed");
    assert_eq!(config.admin.listen, "0.0.0.0:9730");
    assert_eq!(config.notify.len(), 1, "the example has a notification");
    assert!(
        !format!("{config:?}").contains("XXXXXXXX"),
        "its URL is masked"
    );
    // Without the token, the example refuses to start, naming it.
    let error = sources(&environment[..2]).load().unwrap_err();
    assert!(error.to_string().contains("admin.token"), "{error}");
}
