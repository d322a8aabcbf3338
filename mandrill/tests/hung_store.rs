//! A store that hangs instead of failing (a PostgreSQL server that stops
//! answering, a network black hole): a proxy of the test's own
//! (`services/black_hole.rs`) stands between the real binary and the real
//! PostgreSQL, and at some point passes nothing more. Every store call is
//! bounded by `store.timeout`: shutdown ends within
//! `worker.shutdown_grace` + 3 × `store.timeout` with nothing acked that is
//! not recorded, the admin API answers within the timeout, and a pause or
//! resume whose answer was lost says its outcome is unknown (HTTP 504,
//! exit code 3) instead of "failed".

mod services;
mod support;

use std::collections::HashSet;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use services::Database;
use services::black_hole::BlackHole;
use support::{Mandrill, mandrill, queue_rows, sqlite_url, temp_dir};

/// `store.timeout` in these tests.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// `worker.shutdown_grace` in these tests.
const GRACE: Duration = Duration::from_secs(1);
/// What the bounds leave for everything else (start-up of the processes,
/// the broker's close, a slow machine).
const SLACK: Duration = Duration::from_secs(10);

fn store_timeout_setting() -> String {
    format!("store.timeout={}s", STORE_TIMEOUT.as_secs())
}

/// The message ids in a SQLite queue's payloads.
fn queued_ids(queue: &str) -> HashSet<String> {
    queue_rows(queue)
        .iter()
        .map(|row| {
            let payload: Value = serde_json::from_slice(&row.payload).unwrap();
            payload["message_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Each request's status in the store, read directly (not through the
/// proxy).
fn statuses(url: &str) -> Vec<(String, String)> {
    use sqlx::Connection as _;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        let rows =
            sqlx::query_as("SELECT message_id, status FROM requests WHERE message_id IS NOT NULL")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        conn.close().await.unwrap();
        rows
    })
}

/// The kill switch as stored, read directly.
fn paused(url: &str) -> bool {
    use sqlx::Connection as _;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        let paused = sqlx::query_scalar("SELECT paused FROM control WHERE id = 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        paused
    })
}

#[test]
fn sigterm_while_postgres_hangs_ends_within_the_grace_and_the_bound_acking_nothing_unrecorded() {
    let (_guard, dir) = temp_dir();
    let database = Database::create();
    let proxy = BlackHole::to(BlackHole::upstream_of(&database.url));
    let store = proxy.url_for(&database.url);
    let queue = sqlite_url(&dir).replace("mandrill.db", "queue.db");
    let (status, _, stderr) = mandrill(
        &dir,
        &["publish", "--broker", &queue, "--random", "400"],
        &[],
    );
    assert!(status.success(), "publish failed: {stderr}");
    let published = queued_ids(&queue);
    assert_eq!(published.len(), 400);
    let grace = format!("worker.shutdown_grace={}s", GRACE.as_secs());
    let timeout = store_timeout_setting();
    let service = Mandrill::run(
        &dir,
        &[
            "--broker",
            &queue,
            "--db",
            &store,
            "--max-in-flight",
            "16",
            "--set",
            &timeout,
            "--set",
            &grace,
            "--set",
            "restarter.min_latency=100ms",
            "--set",
            "restarter.max_latency=300ms",
            "--set",
            "restarter.failure_rate=0",
        ],
    );
    database.wait_finished(20, support::DEADLINE);
    // Restarts under way now cannot record their outcome: their handlers
    // retry in place, the store is marked down.
    proxy.hang();
    service.wait_for("store unreachable: pausing pulls until it answers", 1);
    service.signal("TERM");
    // Unbounded, a handler would wait on its outcome's write for good, and
    // the drain on the handler.
    let (status, lines) = service.wait_exit_within(GRACE + 3 * STORE_TIMEOUT + SLACK);
    assert!(status.success(), "exit status {status}");
    // Nothing acked that is not recorded: every message gone from the
    // queue has a final status in the store (read behind the proxy's back).
    let left = queued_ids(&queue);
    let recorded: std::collections::HashMap<String, String> =
        statuses(&database.url).into_iter().collect();
    let acked: Vec<&String> = published.difference(&left).collect();
    assert!(!acked.is_empty(), "some were acked before the hang");
    for id in &acked {
        let status = recorded.get(*id).map(String::as_str);
        assert!(
            matches!(status, Some("restarted" | "failed" | "rejected")),
            "{id} acked but recorded as {status:?}"
        );
    }
    // And the outcomes that could not be recorded were nacked, not lost.
    let messages: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["fields"]["message"].as_str())
        .collect();
    assert!(messages.contains(&"final stats"), "{messages:?}");
}

/// `GET`/`POST` over HTTP/1.1 with a read timeout of `within`: the status
/// and the JSON body, or `None` if nothing came back in time.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    within: Duration,
) -> Option<(u16, Value)> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(within)).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    if stream.read_to_end(&mut response).is_err() {
        return None;
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response.get(9..12)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

#[test]
fn the_admin_api_answers_within_the_store_timeout_and_a_lost_pause_is_an_unknown_outcome() {
    let (_guard, dir) = temp_dir();
    let database = Database::create();
    // Each connection hangs once it sends the history's, a story's or the
    // switch's statement: the server gets it, its answer never comes back.
    let proxy = BlackHole::hanging_on(
        BlackHole::upstream_of(&database.url),
        &[
            "ORDER BY updated_at DESC",
            "FROM requests WHERE message_id = $1",
            "UPDATE control SET paused",
        ],
    );
    let store = proxy.url_for(&database.url);
    let token = "hung-store-token-41d9";
    let timeout = store_timeout_setting();
    let service = Mandrill::run_with_env(
        &dir,
        &[
            "--broker",
            "memory",
            "--db",
            &store,
            "--set",
            &timeout,
            "--set",
            &format!("worker.shutdown_grace={}s", GRACE.as_secs()),
        ],
        &[("MANDRILL_ADMIN__TOKEN", token)],
    );
    let addr = service.wait_for("admin listening", 1)[0]["fields"]["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    service.wait_for("mandrill started", 1);
    let within = STORE_TIMEOUT + SLACK;
    let id = uuid::Uuid::new_v4();
    for path in ["/api/requests", &format!("/api/requests/{id}")] {
        let (status, body) = http(&addr, "GET", path, token, within)
            .unwrap_or_else(|| panic!("GET {path} did not answer within {within:?}"));
        assert_eq!(status, 504, "GET {path}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("did not answer"),
            "{body}"
        );
    }
    for (path, turned) in [("/api/pause", true), ("/api/resume", false)] {
        let (status, body) = http(&addr, "POST", path, token, within)
            .unwrap_or_else(|| panic!("POST {path} did not answer within {within:?}"));
        assert_eq!(status, 504, "POST {path}: {body}");
        assert_eq!(body["outcome"], "unknown", "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("may or may not"),
            "{body}"
        );
        // Unknown, not failed: the server did turn it.
        assert_eq!(paused(&database.url), turned, "after {path}");
    }
    service.signal("TERM");
    let (status, _) = service.wait_exit_within(GRACE + 3 * STORE_TIMEOUT + SLACK);
    assert!(status.success(), "exit status {status}");
}

/// Runs `mandrill ARGS`, killing it if it does not exit within `within`.
fn mandrill_within(dir: &std::path::Path, args: &[&str], within: Duration) -> (ExitStatus, String) {
    let mut child = Command::new(support::binary())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mandrill runs");
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mandrill {args:?} did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn mandrill_pause_whose_answer_is_lost_says_the_outcome_is_unknown_with_exit_code_3() {
    let (_guard, dir) = temp_dir();
    let database = Database::create();
    let proxy = BlackHole::hanging_on(
        BlackHole::upstream_of(&database.url),
        &["UPDATE control SET paused"],
    );
    let store = proxy.url_for(&database.url);
    let timeout = store_timeout_setting();
    // Connecting and migrating pass; the switch's statement reaches the
    // server and its answer is lost.
    for (command, turned) in [("pause", true), ("resume", false)] {
        let (status, stderr) = mandrill_within(
            &dir,
            &[
                command, "--db", &store, "--set", &timeout, "--reason", "test",
            ],
            2 * STORE_TIMEOUT + SLACK,
        );
        assert_eq!(status.code(), Some(3), "{command}: {stderr}");
        assert!(
            stderr.contains("outcome unknown") && stderr.contains("mandrill status"),
            "{command}: {stderr}"
        );
        assert_eq!(paused(&database.url), turned, "after {command}");
    }
}
