//! The admin server on the real binary: metrics a real Prometheus scrapes,
//! readiness that turns on SIGTERM before the drain, the token.

#[path = "admin/console.rs"]
mod console;
mod support;
#[path = "admin/tools.rs"]
mod tools;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
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
    assert!(explanation.contains("attempt 1 claimed"), "{explanation}");
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
    // A status that is none (dry_run for dry-run) is refused, not "no such
    // requests"; a filtered answer says how much it searched.
    let (status, body) = get(&addr, "/api/requests?status=dry_run", &auth);
    assert_eq!(status, 400, "{body}");
    let (_, filtered) = get_json(&addr, "/api/requests?status=restarted", &auth);
    assert_eq!(filtered["searched_all"], true, "{filtered}");
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

/// What the API answers passes the redactor, as every log line does: a
/// recorded error quoting a configured secret (here a backend's output
/// echoing `admin.token`) is masked in the history and in the story.
#[test]
fn the_api_masks_a_secret_a_recorded_error_quotes() {
    let (_guard, dir) = temp_dir();
    let token = "admin-canary-0b5e";
    let db = sqlite_url(&dir);
    let config = format!(
        "[broker]\nurl = {db:?}\n[broker.sqlite]\npoll_interval = \"5ms\"\n\
         [store]\nurl = {db:?}\n[worker]\nmax_attempts = 1\n[admin]\ntoken = {token:?}\n\
         [restarter]\nkind = \"command\"\n\
         [restarter.command]\nargv = [\"sh\", \"-c\", \"echo {token} >&2; exit 1\"]\n\
         [safety]\nallow = [\"cattle-*\"]\nrequire_signed = false\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n"
    );
    std::fs::write(dir.join("mandrill.toml"), config).unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, "cattle-ab12"], &[]);
    assert!(status.success(), "{stderr}");
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml", "--unleash"]);
    let addr = admin_addr(&service);
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];
    let body = wait_until("the request failed", || {
        let (_, body) = get(&addr, "/api/requests?status=failed", &auth);
        body.contains("cattle-ab12").then_some(body)
    });
    let list: Value = serde_json::from_str(&body).unwrap();
    let id = list["requests"][0]["message_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, one) = get(&addr, &format!("/api/requests/{id}"), &auth);
    assert_eq!(status, 200, "{one}");
    for answer in [&body, &one] {
        assert!(!answer.contains(token), "{answer}");
        assert!(answer.contains("exited with code 1"), "{answer}");
        assert!(
            answer.contains("****"),
            "the error is shown, masked: {answer}"
        );
    }
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
    assert!(
        page.contains("data-post=\"/api/resume\">Resume all restarts"),
        "{page}"
    );

    // Resumed by a form, token as a field: back to the page.
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

/// `POST /api/leash` and `/api/unleash` turn the leash in the store as
/// `mandrill leash` and `unleash` do: always with the token, unleashing
/// with a reason, never for a group; `/api/status` and `/metrics` then say
/// the mode with who, why and when, and the worker obeys it (with the
/// simulated backend, whose own mode is unleashed, requests become dry
/// runs).
#[test]
fn leash_and_unleash_need_the_token_and_turn_the_leash_every_instance_obeys() {
    let (_guard, dir) = temp_dir();
    let token = "leash-token-81aa";
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
    let mode = |addr: &str| get_json(addr, "/api/status", &[]).1["mode"].clone();
    for path in ["/api/leash", "/api/unleash"] {
        let (status, body) = post(&addr, path, &json_body, r#"{"reason":"nope"}"#);
        assert_eq!(status, 401, "{path}: {body}");
    }
    assert_eq!(mode(&addr), "unleashed");
    let bearer = format!("Bearer {token}");
    let mut headers = json_body.to_vec();
    headers.push(("Authorization", &bearer));
    let (status, body) = post(&addr, "/api/leash", &headers, r#"{"group":"web"}"#);
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(
        &addr,
        "/api/leash",
        &headers,
        r#"{"reason":"game day over","by":"ana"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (_, overview) = get_json(&addr, "/api/status", &[]);
    assert_eq!(overview["mode"], "leashed", "{overview}");
    assert_eq!(overview["leash"]["by"], "ana", "{overview}");
    assert_eq!(overview["leash"]["reason"], "game day over", "{overview}");
    assert_eq!(overview["leash"]["from"], "store", "{overview}");
    service.wait_for(
        "LEASHED (dry run) by the leash recorded in the store: every instance sharing it \
         records restarts as dry runs, none is issued",
        1,
    );
    let (_, metrics) = get(&addr, "/metrics", &[]);
    assert!(metrics.contains("mandrill_leashed 1"), "{metrics}");
    // Requests claimed from now on are dry runs.
    service.wait_for(
        "dry run: not restarting (leashed: `mandrill status` says by whom; `mandrill unleash \
         --reason …` acts)",
        1,
    );

    let (status, body) = post(&addr, "/api/unleash", &headers, r#"{"by":"bob"}"#);
    assert_eq!(status, 400, "unleashing needs a reason: {body}");
    assert_eq!(mode(&addr), "leashed");
    let (status, body) = post(
        &addr,
        "/api/unleash",
        &headers,
        r#"{"reason":"game day 2","by":"bob"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(mode(&addr), "unleashed");
    service.wait_for(
        "UNLEASHED by the leash recorded in the store: every instance sharing it issues \
         restarts",
        1,
    );
    let restarted = service.messages("restarted").len();
    service.wait_for("restarted", restarted + 5);
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

/// Any process on the host can reach a loopback port: without
/// `admin.token`, turning the switch needs the token the service generated
/// into a file only its user can read, while read-only pages keep the
/// loopback rule.
#[test]
fn without_admin_token_the_switch_needs_the_generated_token_even_on_loopback() {
    use std::os::unix::fs::PermissionsExt as _;
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let service = Mandrill::run(&dir, &["--db", &db, "--simulate=5"]);
    let addr = admin_addr(&service);
    // The default place: beside the SQLite store.
    let token_file = dir.join("mandrill.db.admin-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    assert!(token.len() >= 32, "{token:?}");

    // Paused by an operator, through the store.
    let (status, _, stderr) = mandrill(
        &dir,
        &["pause", "--db", &db, "--by", "sre", "--reason", "host lost"],
        &[],
    );
    assert!(status.success(), "{stderr}");
    let paused_by = |addr: &str| get_json(addr, "/api/status", &[]).1["switch"]["by"].clone();
    let json_body = ("Content-Type", "application/json");
    for path in ["/api/resume", "/api/pause"] {
        for wrong in ["", "Bearer not-the-token"] {
            let mut headers = vec![json_body];
            if !wrong.is_empty() {
                headers.push(("Authorization", wrong));
            }
            let (status, body) = post(&addr, path, &headers, r#"{"by":"local process"}"#);
            assert_eq!(status, 401, "{path} {wrong:?}: {body}");
        }
        let form = [("Content-Type", "application/x-www-form-urlencoded")];
        assert_eq!(
            post(&addr, path, &form, "by=local+process").0,
            401,
            "{path}"
        );
    }
    assert_eq!(paused_by(&addr), "sre", "the operator's pause stands");
    // Read-only pages keep the loopback rule.
    assert_eq!(get(&addr, "/api/requests?limit=1", &[]).0, 200);

    let bearer = format!("Bearer {token}");
    let (status, body) = post(
        &addr,
        "/api/resume",
        &[json_body, ("Authorization", &bearer)],
        r#"{"by":"ana","reason":"host back"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (_, overview) = get_json(&addr, "/api/status", &[]);
    assert_eq!(
        (
            overview["paused"].as_bool(),
            overview["switch"]["by"].as_str()
        ),
        (Some(false), Some("ana")),
        "{overview}"
    );
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    assert!(!serde_json::to_string(&lines).unwrap().contains(token));
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

/// `mandrill ARGS` as a user runs it: the admin settings as the default
/// configuration has them (the harness's `mandrill` picks port 0).
fn mandrill_as_configured(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(support::binary())
        .args(args)
        .current_dir(dir)
        .env_remove("MANDRILL_ADMIN__LISTEN")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn two_instances_on_one_sqlite_file_with_the_default_config_both_serve_and_status_finds_them() {
    let (_guard, dir) = temp_dir();
    let journal = dir.join("restarts.journal");
    let journal_setting = format!("restarter.journal={}", journal.display());
    // The default queue and store, `sqlite:mandrill.db` in the working
    // directory, and the default admin settings; restarts slow enough that
    // neither instance can take the whole queue before the other pulls.
    let args = [
        "--max-in-flight",
        "1",
        "--set",
        "restarter.failure_rate=0",
        "--set",
        "restarter.min_latency=20ms",
        "--set",
        "restarter.max_latency=20ms",
        "--set",
        &journal_setting,
    ];
    let first = Mandrill::run_with_default_admin(&dir, &args);
    let first_addr = admin_addr(&first);
    let second = Mandrill::run_with_default_admin(&dir, &args);
    let second_addr = admin_addr(&second);
    assert_ne!(first_addr, second_addr);
    for addr in [&first_addr, &second_addr] {
        let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
        assert!((9730..=9739).contains(&port), "{addr}");
        assert_eq!(get(addr, "/healthz", &[]).0, 200, "{addr}");
    }

    // The command line finds both, from the files beside the store.
    let (ok, stdout, stderr) = mandrill_as_configured(&dir, &["status", "--json"]);
    assert!(ok, "{stderr}");
    let status: Value = serde_json::from_str(stdout.trim()).unwrap();
    let mut listed: Vec<String> = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|instance| instance["addr"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected = vec![first_addr.clone(), second_addr.clone()];
    expected.sort();
    assert_eq!(listed, expected, "{status}");
    let (_, text, _) = mandrill_as_configured(&dir, &["status"]);
    assert!(
        text.contains(&format!("http://{first_addr}/"))
            && text.contains(&format!("http://{second_addr}/")),
        "{text}"
    );

    // Both work the one queue: every request recorded, and restarted, once.
    let requests = 200;
    let (ok, _, stderr) = mandrill_as_configured(&dir, &["publish", "--random", "200"]);
    assert!(ok, "{stderr}");
    let url = format!("sqlite:{}", dir.join("mandrill.db").display());
    wait_until("every request restarted", || {
        let entries = support::history(&url);
        (entries.len() == requests
            && entries
                .iter()
                .all(|e| e.status == mandrill::Status::Restarted))
        .then_some(())
    });
    let mut restarted_by = Vec::new();
    for service in [first, second] {
        service.signal("TERM");
        let (status, lines) = service.wait_exit();
        assert!(status.success());
        restarted_by.push(support::count(
            &support::fields_of(&lines, "final stats"),
            "restarted",
        ));
    }
    assert!(restarted_by.iter().all(|&n| n > 0), "{restarted_by:?}");
    assert_eq!(restarted_by.iter().sum::<u64>(), requests as u64);
    let journaled = std::fs::read_to_string(&journal).unwrap().lines().count();
    assert_eq!(journaled, requests, "each request restarted once");
    assert!(
        support::history(&url).iter().all(|e| e.attempts == 1),
        "no attempt repeated"
    );
    // Stopped instances take their address files with them.
    let (_, stdout, _) = mandrill_as_configured(&dir, &["status", "--json"]);
    let status: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["instances"], serde_json::json!([]), "{status}");
    assert_eq!(
        std::fs::read_dir(dir.join("mandrill.db.instances"))
            .unwrap()
            .count(),
        0
    );
}

/// `mandrill status` tells the mode the running service is in, from the
/// service itself, not the file it reads: started with `--unleash` on a
/// file that says `dry_run = true`, the service restarts hosts.
#[test]
fn status_reports_each_running_instances_own_mode_and_says_when_the_file_disagrees() {
    let (_guard, dir) = temp_dir();
    let config = dir.join("mandrill.toml");
    std::fs::write(&config, "[safety]\ndry_run = true\n").unwrap();
    let config = config.to_str().unwrap();
    let service = Mandrill::run(&dir, &["--config", config, "--unleash"]);
    let addr = admin_addr(&service);
    service.wait_for("mandrill started", 1);

    let (_, api) = get_json(&addr, "/api/status", &[]);
    assert_eq!(api["mode"], "unleashed", "{api}");
    assert!(
        api["leash"]["by"].as_str().unwrap().contains("--unleash"),
        "{api}"
    );

    let (ok, stdout, stderr) =
        mandrill_as_configured(&dir, &["status", "--config", config, "--json"]);
    assert!(ok, "{stderr}");
    let status: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["mode"], "unleashed", "{status}");
    assert_eq!(status["configured_mode"], "leashed (dry run)", "{status}");
    assert!(status["disagreement"].is_string(), "{status}");
    let instance = &status["instances"][0];
    assert_eq!(instance["addr"], addr.as_str(), "{status}");
    assert_eq!(instance["mode"], "unleashed", "{status}");
    assert!(instance["leash"]["since"].is_string(), "{status}");
    let (_, text, _) = mandrill_as_configured(&dir, &["status", "--config", config]);
    assert!(
        text.contains("mode:      unleashed, as the running instances say"),
        "{text}"
    );
    assert!(
        text.contains(
            "WARNING:   the running service is unleashed, but the configuration says leashed"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "http://{addr}/ (pid {}): unleashed since ",
            service.pid()
        )),
        "{text}"
    );

    // A reload that does not change the file's own `dry_run` keeps the
    // mode as it runs (issue 37: it used to leash, "the stricter wins").
    service.signal("HUP");
    service.wait_for("configuration reloaded", 1);
    let (_, api) = get_json(&addr, "/api/status", &[]);
    assert_eq!(api["mode"], "unleashed", "{api}");

    // An operator's leash in the store decides, with who, why and when.
    let (ok, _, stderr) = mandrill_as_configured(
        &dir,
        &[
            "leash", "--config", config, "--by", "ana", "--reason", "done",
        ],
    );
    assert!(ok, "{stderr}");
    let (_, api) = get_json(&addr, "/api/status", &[]);
    assert_eq!(api["mode"], "leashed", "{api}");
    assert_eq!(api["leash"]["by"], "ana", "{api}");
    assert_eq!(api["leash"]["reason"], "done", "{api}");
    assert_eq!(api["leash"]["from"], "store", "{api}");
    assert!(api["leash"]["since"].is_string(), "{api}");
    let (_, stdout, _) = mandrill_as_configured(&dir, &["status", "--config", config, "--json"]);
    let status: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["mode"], "leashed (dry run)", "{status}");
    assert_eq!(status["configured_mode"], "leashed (dry run)", "{status}");
    assert_eq!(status["disagreement"], Value::Null, "{status}");
    assert_eq!(status["instances"][0]["leash"]["by"], "ana", "{status}");

    service.signal("TERM");
    assert!(service.wait_exit().0.success());
}
