//! The admin server with the tools an operator points at it: a real
//! Prometheus and promtool, Chromium on the dashboard, the profiler, and the
//! example production configuration.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{admin_addr, get, get_json, wait_until};
use crate::support::{DEADLINE, Mandrill, sqlite_url, temp_dir};

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

/// Without `admin.token` a profile is open on loopback, but not to another
/// site's page in the operator's browser: an `<img>` pointing at it would
/// keep the process sampling, a minute at a time.
#[test]
fn a_profile_is_never_taken_for_another_sites_page() {
    let (_guard, dir) = temp_dir();
    let service = Mandrill::run(&dir, &["--db", &sqlite_url(&dir)]);
    let addr = admin_addr(&service);
    let path = "/debug/pprof/profile?seconds=1";
    for site in ["cross-site", "same-site"] {
        let (status, body) = get(&addr, path, &[("Sec-Fetch-Site", site)]);
        assert_eq!(status, 403, "{site}: {body}");
    }
    let (status, protobuf) = get(&addr, path, &[("Sec-Fetch-Site", "none")]);
    assert_eq!(status, 200, "{protobuf}");
    service.signal("TERM");
    assert!(service.wait_exit().0.success());
}
