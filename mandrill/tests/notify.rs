//! Notifications from the real binary to real local receivers: the JSON and
//! Slack bodies a running pipeline sends, and endpoints that are down or slow
//! neither holding the pipeline nor shutdown beyond `notifier.flush_timeout`.

mod support;

use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use serde_json::Value;
use support::{DEADLINE, Mandrill, count, fields_of, mandrill, sqlite_url, temp_dir};

/// What a receiver got: (path, body).
type Received = Arc<Mutex<Vec<(String, String)>>>;

/// An HTTP receiver on 127.0.0.1:0, on a runtime of its own, answering
/// every POST after `delay`. Lives as long as the test process.
fn receiver(delay: Duration) -> (String, Received) {
    let received: Received = Arc::default();
    let record = received.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = Router::new().route(
                "/{*path}",
                post(move |uri: axum::http::Uri, body: String| {
                    let record = record.clone();
                    async move {
                        tokio::time::sleep(delay).await;
                        record.lock().unwrap().push((uri.path().to_owned(), body));
                        "ok"
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{}", rx.recv().unwrap()), received)
}

/// Bodies received on `path`, as JSON.
fn bodies(received: &Received, path: &str) -> Vec<Value> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p == path)
        .map(|(_, body)| serde_json::from_str(body).unwrap())
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn admin_addr(service: &Mandrill) -> String {
    let line = service.wait_for("admin listening", 1).remove(0);
    line["fields"]["addr"].as_str().unwrap().to_owned()
}

/// Turns the switch with the token the service generated beside its store.
fn post_pause(addr: &str, path: &str, dir: &std::path::Path) -> u16 {
    use std::io::{Read as _, Write as _};
    let token = std::fs::read_to_string(dir.join("mandrill.db.admin-token")).unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    let body = r#"{"reason":"game day","by":"ana"}"#;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        token.trim(),
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response[9..12].parse().unwrap()
}

#[test]
fn a_running_pipeline_sends_json_and_slack_notifications_and_never_logs_the_url() {
    let (_guard, dir) = temp_dir();
    let (base, received) = receiver(Duration::ZERO);
    let secret_path = "/services/T0/B0/hook-s3cret-9f2";
    std::fs::write(
        dir.join("mandrill.toml"),
        format!(
            "[[notify]]\nurl = \"{base}/generic\"\n\
             events = [\"restarted\", \"failed\", \"dead-lettered\", \"paused\", \"resumed\"]\n\
             [[notify]]\nurl = \"{base}{secret_path}\"\nformat = \"slack\"\n\
             events = [\"paused\", \"resumed\"]\n"
        ),
    )
    .unwrap();
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            "mandrill.toml",
            "--db",
            &sqlite_url(&dir),
            "--simulate=50",
            "--set",
            "restarter.failure_rate=0.3",
            "--set",
            "worker.max_attempts=1",
            "--set",
            "simulate.malformed_rate=0.1",
        ],
    );
    let addr = admin_addr(&service);
    wait_until("restarted, failed and dead-lettered notifications", || {
        let events: Vec<Value> = bodies(&received, "/generic")
            .iter()
            .map(|b| b["event"].clone())
            .collect();
        ["restarted", "failed", "dead-lettered"]
            .iter()
            .all(|kind| events.contains(&Value::from(*kind)))
    });
    assert_eq!(post_pause(&addr, "/api/pause", &dir), 200);
    assert_eq!(post_pause(&addr, "/api/resume", &dir), 200);
    wait_until("the switch's notifications", || {
        bodies(&received, secret_path).len() == 2
    });
    let chat = bodies(&received, secret_path);
    let texts: Vec<&str> = chat.iter().map(|b| b["text"].as_str().unwrap()).collect();
    assert!(
        texts.contains(&"mandrill: restarts PAUSED by ana: game day"),
        "{texts:?}"
    );
    assert!(
        texts.contains(&"mandrill: restarts resumed by ana: game day"),
        "{texts:?}"
    );
    let generic = bodies(&received, "/generic");
    let restarted = generic.iter().find(|b| b["event"] == "restarted").unwrap();
    assert!(restarted["message_id"].is_string() && restarted["instance_name"].is_string());
    let failed = generic.iter().find(|b| b["event"] == "failed").unwrap();
    assert!(failed["detail"].is_string(), "{failed}");
    // Malformed payloads are dead-lettered too, with their reason.
    assert!(
        generic
            .iter()
            .any(|b| b["event"] == "dead-lettered" && b["detail"].is_string())
    );
    assert!(
        generic
            .iter()
            .any(|b| b["event"] == "paused" && b["by"] == "ana")
    );

    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let stats = fields_of(&lines, "final stats");
    assert!(count(&stats, "notifications_sent") >= 5, "{stats}");
    assert_eq!(count(&stats, "notifications_failed"), 0, "{stats}");
    let log = serde_json::to_string(&lines).unwrap();
    assert!(
        !log.contains("hook-s3cret-9f2"),
        "the webhook's key was logged"
    );
}

#[test]
fn endpoints_down_or_slow_hold_neither_the_pipeline_nor_shutdown_beyond_the_bound() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let requests = 200;
    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "publish",
            "--broker",
            &db,
            "--random",
            &requests.to_string(),
        ],
        &[],
    );
    assert!(status.success(), "{stderr}");
    // Slow: answers after an hour, and waited for as long.
    let (slow, received) = receiver(Duration::from_secs(3600));
    // Down: nothing listens there.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    std::fs::write(
        dir.join("mandrill.toml"),
        format!(
            "[[notify]]\nurl = \"{slow}/slow\"\nevents = [\"restarted\"]\ntimeout = \"1h\"\n\
             [[notify]]\nurl = \"http://{down}/down\"\nevents = [\"restarted\"]\n\
             [notifier]\nqueue_capacity = 16\nflush_timeout = \"1s\"\n"
        ),
    )
    .unwrap();
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            "mandrill.toml",
            "--db",
            &db,
            "--broker",
            &db,
            "--until-idle",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.min_latency=0s",
            "--set",
            "restarter.max_latency=1ms",
        ],
    );
    // Without the bound, the slow endpoint would hold the exit for an hour.
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let stats = fields_of(&lines, "final stats");
    assert_eq!(count(&stats, "acked"), requests, "{stats}");
    assert_eq!(count(&stats, "restarted"), requests, "{stats}");
    // Every (event, endpoint) pair is accounted for, none was sent.
    assert_eq!(count(&stats, "notifications_sent"), 0, "{stats}");
    assert_eq!(
        count(&stats, "notifications_failed") + count(&stats, "notifications_dropped"),
        2 * requests,
        "{stats}"
    );
    assert!(count(&stats, "notifications_dropped") > 0, "{stats}");
    assert!(received.lock().unwrap().is_empty());
    assert!(!lines.iter().any(|l| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("did not stop in time"))
    }));
}

#[test]
fn every_turn_of_the_switch_is_notified_whoever_made_it_the_command_line_and_the_pause_file_included()
 {
    let (_guard, dir) = temp_dir();
    let (base, received) = receiver(Duration::ZERO);
    let pause_file = dir.join("PAUSE");
    std::fs::write(
        dir.join("mandrill.toml"),
        format!(
            "[[notify]]\nurl = \"{base}/switch\"\nevents = [\"paused\", \"resumed\"]\n\
             [safety]\npause_file = \"{}\"\n",
            pause_file.display()
        ),
    )
    .unwrap();
    let db = sqlite_url(&dir);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml", "--db", &db]);
    service.wait_for("mandrill started", 1);
    let told = |n: usize| {
        wait_until(&format!("{n} switch notifications"), || {
            bodies(&received, "/switch").len() >= n
        });
        bodies(&received, "/switch")
    };
    let cli = |args: &[&str]| {
        let (status, _, stderr) = mandrill(&dir, args, &[]);
        assert!(status.success(), "{stderr}");
    };

    // Another process: `mandrill pause` and `resume` write the store.
    cli(&["pause", "--db", &db, "--by", "ana", "--reason", "game day"]);
    let paused = told(1).remove(0);
    assert_eq!(
        (&paused["event"], &paused["by"], &paused["detail"]),
        (&"paused".into(), &"ana".into(), &"game day".into()),
        "{paused}"
    );
    cli(&[
        "resume",
        "--db",
        &db,
        "--by",
        "bob",
        "--reason",
        "all clear",
    ]);
    let resumed = told(2).remove(1);
    assert_eq!(
        (&resumed["event"], &resumed["by"], &resumed["detail"]),
        (&"resumed".into(), &"bob".into(), &"all clear".into()),
        "{resumed}"
    );

    // The pause file: touched, then removed.
    std::fs::write(&pause_file, "").unwrap();
    let by_file = told(3).remove(2);
    assert_eq!(by_file["event"], "paused", "{by_file}");
    assert!(
        by_file["by"].as_str().unwrap().starts_with("pause-file@")
            && by_file["detail"]
                .as_str()
                .unwrap()
                .ends_with("PAUSE exists"),
        "{by_file}"
    );
    std::fs::remove_file(&pause_file).unwrap();
    let file_gone = told(4).remove(3);
    assert_eq!(file_gone["event"], "resumed", "{file_gone}");
    assert!(
        file_gone["detail"]
            .as_str()
            .unwrap()
            .ends_with("PAUSE removed"),
        "{file_gone}"
    );

    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success());
    // Each turn told once, in order.
    let events: Vec<Value> = bodies(&received, "/switch")
        .iter()
        .map(|b| b["event"].clone())
        .collect();
    assert_eq!(
        events,
        ["paused", "resumed", "paused", "resumed"],
        "{events:?}"
    );
}
