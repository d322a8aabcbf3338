//! `mandrill dead-letters` and `requeue` where the dead letters live on a
//! server: NATS (the `{stream}_DEAD` stream on the loopback server, names of
//! the test's own) and Pub/Sub (a private emulator). The real binary: a
//! malformed payload and an unsigned request are dead-lettered, listed with
//! their reasons, and the unsigned one, requeued once signatures are no
//! longer required, is consumed again and restarted. (The SQLite queue's
//! are in `tests/queue.rs`.)

mod services;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use mandrill::Status;
use serde_json::Value;
use services::{NatsNames, PrivatePubSub, nats_server};
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

/// A queue on a server, as flags, and how to publish the bytes `ff fe`
/// (not UTF-8: malformed, whatever the signature rules) into it as any
/// client allowed to could (`mandrill publish` refuses what is not a
/// request).
struct Queue {
    flags: Vec<String>,
    publish_malformed: Box<dyn Fn()>,
}

impl Queue {
    /// `mandrill COMMAND` on this queue, with `extra` arguments.
    fn args<'a>(&'a self, command: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![command];
        args.extend(self.flags.iter().map(String::as_str));
        args.extend(extra);
        args
    }

    /// The dead letters, as `mandrill dead-letters --json` prints them.
    fn dead_letters(&self, dir: &Path) -> Vec<Value> {
        let (status, stdout, stderr) = mandrill(dir, &self.args("dead-letters", &["--json"]), &[]);
        assert!(status.success(), "{stderr}");
        stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// `mandrill run` on this queue, restarts simulated and quick.
    fn run(&self, dir: &Path, extra: &[&str]) -> Mandrill {
        let mut args: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        args.extend([
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.max_latency=1ms",
        ]);
        args.extend(extra);
        let service = Mandrill::run(dir, &args);
        service.wait_for("mandrill started", 1);
        service
    }
}

fn dead_letters_are_listed_with_their_reasons_and_one_requeued(dir: &Path, queue: &Queue) {
    let strict = queue.run(dir, &["--set", "safety.require_signed=true"]);
    (queue.publish_malformed)();
    let (status, _, stderr) = mandrill(dir, &queue.args("publish", &["cattle-u1"]), &[]);
    assert!(status.success(), "{stderr}");
    strict.wait_for("dead-lettered", 2);

    let dead = queue.dead_letters(dir);
    assert_eq!(dead.len(), 2, "{dead:?}");
    let reason = |d: &Value| d["reason"].as_str().unwrap_or_default().to_owned();
    let unsigned = dead
        .iter()
        .find(|d| reason(d).contains("a signature is required"))
        .unwrap_or_else(|| panic!("the unsigned request's reason: {dead:?}"));
    let malformed = dead
        .iter()
        .find(|d| reason(d).starts_with("payload is not valid utf-8"))
        .unwrap_or_else(|| panic!("the malformed payload's reason: {dead:?}"));
    let rejected = history(&sqlite_url(dir))
        .into_iter()
        .find(|e| e.instance_name.as_deref() == Some("cattle-u1"))
        .expect("the unsigned request recorded");
    assert_eq!(rejected.status, Status::Rejected);
    let message_id = rejected.message_id.expect("its message id").to_string();
    assert_eq!(unsigned["message_id"], message_id.as_str(), "{unsigned}");
    assert!(
        unsigned["payload"].as_str().unwrap().contains("cattle-u1"),
        "{unsigned}"
    );
    assert_eq!(malformed["payload"], "\u{fffd}\u{fffd}", "shown lossily");
    assert_eq!(malformed["payload_size"], 2);
    assert_eq!(malformed["message_id"], Value::Null);
    for d in &dead {
        assert!(d["dead_at"].is_string(), "{d}");
        assert_eq!(d["truncated"], false, "{d}");
    }
    let (status, table, _) = mandrill(dir, &queue.args("dead-letters", &[]), &[]);
    assert!(status.success());
    assert_eq!(
        table.lines().count(),
        3,
        "a header and two dead letters: {table}"
    );
    assert!(table.contains("a signature is required"), "{table}");
    assert!(table.contains(&message_id), "{table}");

    // Signatures no longer required: the unsigned request, requeued, runs.
    strict.signal("TERM");
    let (status, _) = strict.wait_exit();
    assert!(status.success());
    let relaxed = queue.run(dir, &[]);
    let (status, _, stderr) = mandrill(dir, &queue.args("requeue", &["99999"]), &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("99999"), "{stderr}");
    let id = match &unsigned["id"] {
        Value::String(id) => id.clone(),
        other => other.to_string(),
    };
    let (status, stdout, stderr) = mandrill(dir, &queue.args("requeue", &[&id]), &[]);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "requeued 1 dead letters");
    relaxed.wait_for("restarted", 1);
    // Logged as issued; recorded by the store's next commit.
    let deadline = Instant::now() + DEADLINE;
    while !history(&sqlite_url(dir))
        .into_iter()
        .any(|e| e.message_id == rejected.message_id && e.status == Status::Restarted)
    {
        assert!(
            Instant::now() < deadline,
            "the requeued request was not recorded restarted"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = queue.dead_letters(dir);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["id"], malformed["id"]);
    relaxed.signal("TERM");
    let (status, _) = relaxed.wait_exit();
    assert!(status.success());
}

#[test]
fn dead_letters_on_nats_are_listed_with_their_reasons_and_one_requeued() {
    let (_guard, dir) = temp_dir();
    let names = std::sync::Arc::new(NatsNames::new(&nats_server()));
    let mut flags = vec!["--broker".to_owned(), names.url.clone()];
    flags.extend(names.flags());
    let publisher = names.clone();
    let queue = Queue {
        flags,
        publish_malformed: Box::new(move || publisher.publish_as_anyone("malformed", b"\xff\xfe")),
    };
    dead_letters_are_listed_with_their_reasons_and_one_requeued(&dir, &queue);
}

#[test]
fn dead_letters_on_pubsub_are_listed_with_their_reasons_and_one_requeued() {
    let (_guard, dir) = temp_dir();
    let pubsub = std::sync::Arc::new(PrivatePubSub::start());
    let mut flags = vec!["--broker".to_owned(), pubsub.url()];
    flags.extend(pubsub.flags());
    let publisher = pubsub.clone();
    let queue = Queue {
        flags,
        // base64 of `ff fe`.
        publish_malformed: Box::new(move || publisher.publish_raw("//4=")),
    };
    dead_letters_are_listed_with_their_reasons_and_one_requeued(&dir, &queue);
}
