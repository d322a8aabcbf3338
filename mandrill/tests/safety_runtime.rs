//! The safety policy of a running service, through the real binary: SIGHUP
//! reloads `[safety]`, a stop condition against a real HTTP server defers
//! restarts until it is healthy, and the pause file turns the kill switch.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Instant;

use mandrill::HistoryEntry;
use mandrill::Status;
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

/// Waits until the history at `db` has an entry for `instance` that
/// satisfies `done`; returns it.
fn wait_for_entry(db: &str, instance: &str, done: impl Fn(&HistoryEntry) -> bool) -> HistoryEntry {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(entry) = history(db)
            .into_iter()
            .find(|e| e.instance_name.as_deref() == Some(instance) && done(e))
        {
            return entry;
        }
        assert!(
            Instant::now() < deadline,
            "no such entry for {instance}: {:?}",
            history(db)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn publish(dir: &Path, db: &str, names: &[&str]) {
    let mut args = vec!["publish", "--broker", db];
    args.extend_from_slice(names);
    let (status, _, stderr) = mandrill(dir, &args, &[]);
    assert!(status.success(), "publish failed: {stderr}");
}

#[test]
fn sighup_reloads_the_safety_policy_and_keeps_it_when_the_reload_is_invalid() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let config = dir.join("mandrill.toml");
    std::fs::write(&config, "[restarter]\nfailure_rate = 0.0\n").unwrap();
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--db",
            &db,
            "--broker",
            &db,
            "--simulate=2",
        ],
    );
    service.wait_for("mandrill started", 1);
    publish(&dir, &db, &["pet-01"]);
    let before = wait_for_entry(&db, "pet-01", |e| e.status == Status::Restarted);
    assert_eq!(before.attempts, 1);

    std::fs::write(
        &config,
        "[restarter]\nfailure_rate = 0.0\n[safety]\ndeny = [\"pet-*\"]\n",
    )
    .unwrap();
    service.signal("HUP");
    // Logged last, after the policy and each key.
    service.wait_for("configuration reloaded", 1);
    assert_eq!(service.messages("safety policy reloaded").len(), 1);
    let reloaded: Vec<_> = service
        .messages("setting reloaded")
        .into_iter()
        .map(|line| line["fields"]["key"].clone())
        .collect();
    assert_eq!(reloaded, ["safety.deny"]);
    publish(&dir, &db, &["pet-02"]);
    let denied = wait_for_entry(&db, "pet-02", |e| e.status == Status::Denied);
    assert_eq!(denied.attempts, 0, "a denial claims nothing");

    // An invalid [safety] is refused naming the key; the policy in force
    // stays, so pet-* is still denied.
    std::fs::write(
        &config,
        "[restarter]\nfailure_rate = 0.0\n[safety]\ndeny = [\"\"]\n",
    )
    .unwrap();
    service.signal("HUP");
    let failed = service.wait_for("reload failed; keeping the running configuration", 1);
    let error = failed[0]["fields"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("safety.deny[0]"), "{error}");
    publish(&dir, &db, &["pet-03"]);
    wait_for_entry(&db, "pet-03", |e| e.status == Status::Denied);

    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success());
}

/// A server on 127.0.0.1:0 answering every request with `status`, on a
/// runtime of its own; it stops with the returned runtime.
fn alert_server(status: Arc<AtomicU16>) -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(async {
        let app = axum::Router::new().fallback(move || {
            let status = status.clone();
            async move { axum::http::StatusCode::from_u16(status.load(Ordering::SeqCst)).unwrap() }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    });
    (runtime, addr)
}

#[test]
fn a_failing_stop_condition_defers_the_restart_until_it_turns_healthy() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let status = Arc::new(AtomicU16::new(503));
    let (_server, addr) = alert_server(status.clone());
    let config = dir.join("mandrill.toml");
    std::fs::write(
        &config,
        format!(
            "[broker]\nmax_deliveries = 1000\n\
             [restarter]\nfailure_rate = 0.0\nmax_latency = \"10ms\"\n\
             [safety]\nstop_retry = \"200ms\"\n\
             [[safety.stop_conditions]]\nname = \"deploys\"\ncommand = [\"true\"]\n\
             [[safety.stop_conditions]]\nname = \"alerts\"\nhttp = \"http://{addr}/firing\"\n"
        ),
    )
    .unwrap();
    publish(&dir, &db, &["cattle-ab12"]);
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--db",
            &db,
            "--broker",
            &db,
            "--until-idle",
        ],
    );
    let deferred = service.wait_for("deferred", 3);
    let reason = deferred[0]["fields"]["reason"].as_str().unwrap_or_default();
    assert_eq!(
        reason,
        format!(
            "deferred by stop condition \"alerts\": GET http://{addr}/firing answered 503, \
             expected 200; checked before it: \"deploys\" healthy (\"true\" exited with exit \
             status: 0)"
        )
    );
    assert!(
        service.messages("restarted").is_empty(),
        "restarted while unhealthy"
    );

    status.store(200, Ordering::SeqCst);
    let (exit, lines) = service.wait_exit();
    assert!(exit.success(), "run failed: {lines:?}");
    let entries = history(&db);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].status, Status::Restarted);
    assert_eq!(entries[0].attempts, 1, "a deferral gives its claim back");

    // explain tells it in time order, each stop condition's result too:
    // received, the deferral, the claim, both checks healthy, the end.
    let id = entries[0].message_id.unwrap().to_string();
    let (status, story, stderr) = mandrill(&dir, &["explain", "--db", &db, &id], &[]);
    assert!(status.success(), "{stderr}");
    let events: Vec<&str> = story
        .lines()
        .filter(|line| line.starts_with("  20"))
        .collect();
    let at = |what: &str| {
        events
            .iter()
            .position(|line| line.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in {story}"))
    };
    assert_eq!(at("  received"), 0, "{story}");
    let order = [
        at("deferred by stop condition \"alerts\""),
        at("attempt 1 claimed"),
        at(&format!(
            "checked stop conditions before attempt 1: \"deploys\" healthy (\"true\" exited with exit status: 0), \
             \"alerts\" healthy (GET http://{addr}/firing answered 200)"
        )),
        at("attempt 1 ended: restarted"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}: {story}");
}

fn status_text(dir: &Path, db: &str) -> String {
    let (status, stdout, stderr) = mandrill(dir, &["status", "--db", db], &[]);
    assert!(status.success(), "status failed: {stderr}");
    stdout
}

/// Polls `mandrill status` until its output satisfies `done`.
fn wait_for_status(dir: &Path, db: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = status_text(dir, db);
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "status never changed: {text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_pause_file_pauses_while_it_exists_and_its_removal_resumes() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let pause = dir.join("PAUSE");
    let setting = format!("safety.pause_file={}", pause.display());
    let service = Mandrill::run(&dir, &["--db", &db, "--broker", &db, "--set", &setting]);
    service.wait_for("mandrill started", 1);
    assert!(status_text(&dir, &db).contains("restarts:  running"));

    std::fs::write(&pause, "").unwrap();
    let paused = wait_for_status(&dir, &db, |text| text.contains("PAUSED"));
    assert!(
        paused.contains("paused by pause-file") && paused.contains("PAUSE exists"),
        "{paused}"
    );
    service.wait_for(
        "restarts paused (kill switch): pulling stops until resumed",
        1,
    );

    std::fs::remove_file(&pause).unwrap();
    wait_for_status(&dir, &db, |text| text.contains("restarts:  running"));
    service.wait_for("restarts resumed (kill switch): pulling again", 1);

    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success());
}
