//! Many `mandrill` processes on one NATS JetStream consumer and one
//! PostgreSQL database, and what other publishers on that stream cannot
//! do: the real binary, the real servers of this machine.

mod services;
mod support;

use std::time::Duration;

use mandrill::Status;
use services::{Database, NatsNames, PrivateNats, nats_server};
use support::{Mandrill, count, fields_of, history, mandrill, temp_dir};

/// Publishes `n` random requests through the binary.
fn publish(dir: &std::path::Path, url: &str, names: &NatsNames, n: usize) {
    let mut args = vec!["publish".to_owned(), "--broker".into(), url.into()];
    args.extend(names.flags());
    args.extend(["--random".into(), n.to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout, stderr) = mandrill(dir, &args, &[]);
    assert!(status.success(), "publish failed: {stderr}");
    assert_eq!(stdout.lines().count(), n, "one line per request: {stdout}");
}

fn instance(
    dir: &std::path::Path,
    url: &str,
    names: &NatsNames,
    db: &Database,
    extra: &[&str],
) -> Mandrill {
    let mut args: Vec<String> = vec!["--broker".into(), url.into(), "--db".into(), db.url.clone()];
    args.extend(names.flags());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Mandrill::run(dir, &args)
}

const FAST: &[&str] = &[
    "--max-in-flight",
    "64",
    "--set",
    "restarter.max_latency=20ms",
    "--set",
    "restarter.failure_rate=0.05",
    "--set",
    "worker.retry_initial=100ms",
    "--set",
    "worker.max_attempts=10",
    "--set",
    "broker.max_deliveries=20",
    "--set",
    "broker.ack_deadline=5s",
    "--set",
    "debug.status_interval=0s",
];

#[test]
fn three_instances_share_the_work_and_survive_a_kill() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    publish(&dir, &names.url, &names, 10_000);

    let instances: Vec<Mandrill> = (0..3)
        .map(|_| instance(&dir, &names.url, &names, &db, FAST))
        .collect();
    for instance in &instances {
        instance.wait_for("mandrill started", 1);
    }
    // Every instance takes part before one of them dies.
    for instance in &instances {
        instance.wait_for("acked", 50);
    }
    let mut instances = instances.into_iter();
    let victim = instances.next().unwrap();
    victim.signal("KILL");
    let (_, victim_log) = victim.wait_exit();
    let victim_acked = victim_log
        .iter()
        .filter(|l| l["fields"]["message"] == "acked")
        .count();
    assert!(victim_acked > 0);

    db.wait_finished(10_000, Duration::from_secs(240));
    let mut survivors_acked = Vec::new();
    for survivor in instances {
        survivor.signal("TERM");
        let (status, lines) = survivor.wait_exit();
        assert!(status.success(), "exit status {status}");
        let stats = fields_of(&lines, "final stats");
        assert_eq!(
            count(&stats, "pulled"),
            count(&stats, "acked") + count(&stats, "nacked") + count(&stats, "dead_lettered")
        );
        survivors_acked.push(count(&stats, "acked"));
    }
    assert!(
        survivors_acked.iter().all(|&n| n > 0),
        "work not spread: {survivors_acked:?}"
    );

    // Exactly once: message_id is unique in the table, and every one of the
    // 10,000 published ids has a final outcome; nothing is left mid-way.
    let statuses = db.statuses();
    let total: i64 = statuses.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 10_000, "{statuses:?}");
    assert_eq!(db.finished(), 10_000, "{statuses:?}");
}

/// A client allowed to publish on the subject, holding no key, sends
/// garbage under a request's `message_id` as JetStream's `Nats-Msg-Id` just
/// before `mandrill publish` sends the request: the request is restarted
/// all the same (the broker's duplicate id is the digest of the bytes).
#[test]
fn garbage_published_first_under_a_requests_id_does_not_keep_it_from_running() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    // The first publish creates the stream the forger publishes to.
    publish(&dir, &names.url, &names, 1);
    let id = uuid::Uuid::new_v4();
    names.publish_as_anyone(&id.to_string(), b"garbage");
    std::fs::write(
        dir.join("requests.jsonl"),
        format!("{{\"message_id\":\"{id}\",\"instance_name\":\"cattle-real\"}}\n"),
    )
    .unwrap();
    let mut args = vec!["publish".to_owned(), "--broker".into(), names.url.clone()];
    args.extend(names.flags());
    args.extend(["--file".into(), "requests.jsonl".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, _, stderr) = mandrill(&dir, &args, &[]);
    assert!(status.success(), "publish failed: {stderr}");

    let running = instance(
        &dir,
        &names.url,
        &names,
        &db,
        &["--set", "restarter.failure_rate=0"],
    );
    // The first request, the garbage (rejected) and the real one.
    db.wait_finished(3, Duration::from_secs(60));
    running.signal("TERM");
    let (status, _) = running.wait_exit();
    assert!(status.success(), "exit status {status}");
    let history = history(&db.url);
    let real = history
        .iter()
        .find(|entry| entry.message_id == Some(id))
        .unwrap_or_else(|| panic!("the request was never recorded: {history:?}"));
    assert_eq!(real.status, Status::Restarted, "{real:?}");
    assert_eq!(real.instance_name.as_deref(), Some("cattle-real"));
}

#[test]
fn sigterm_on_one_instance_hands_its_waiting_work_to_the_others() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    publish(&dir, &names.url, &names, 200);
    // One blocking thread and slow restarts: most of what an instance holds
    // is waiting for capacity, so a shutdown nacks it.
    let slow: &[&str] = &[
        "--max-in-flight",
        "30",
        "--set",
        "restarter.kind=simulate-blocking",
        "--set",
        "restarter.blocking_threads=1",
        "--set",
        "restarter.min_latency=100ms",
        "--set",
        "restarter.max_latency=100ms",
        "--set",
        "restarter.failure_rate=0",
        "--set",
        "worker.shutdown_grace=0s",
        // The consumer is shared: its settings must match the other instance's.
        "--set",
        "broker.ack_deadline=5s",
        "--set",
        "broker.max_deliveries=20",
    ];
    let leaving = instance(&dir, &names.url, &names, &db, slow);
    leaving.wait_for("saved", 2);
    let staying = instance(&dir, &names.url, &names, &db, FAST);
    staying.wait_for("mandrill started", 1);
    leaving.signal("TERM");
    let (status, lines) = leaving.wait_exit();
    assert!(status.success());
    let stats = fields_of(&lines, "final stats");
    assert!(count(&stats, "nacked") >= 1, "{stats}");

    // Nacked without delay, the messages go to the other instance.
    db.wait_finished(200, Duration::from_secs(60));
    staying.signal("TERM");
    let (status, _) = staying.wait_exit();
    assert!(status.success());
}

#[test]
fn consumer_recovers_when_the_nats_server_restarts() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let mut server = PrivateNats::start();
    let names = NatsNames::new(&server.url());
    publish(&dir, &names.url, &names, 2_000);
    let extra: Vec<&str> = FAST
        .iter()
        .copied()
        .chain([
            "--set",
            "worker.max_pull_failures=1000",
            "--set",
            "worker.pull_backoff=50ms",
        ])
        .collect();
    let service = instance(&dir, &names.url, &names, &db, &extra);
    service.wait_for("acked", 200);
    server.stop();
    service.wait_for("nats disconnected; reconnecting", 1);
    server.resume();
    db.wait_finished(2_000, Duration::from_secs(240));
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    let stats = fields_of(&lines, "final stats");
    assert_eq!(
        count(&stats, "pulled"),
        count(&stats, "acked")
            + count(&stats, "nacked")
            + count(&stats, "dead_lettered")
            + count(&stats, "settle_failures")
    );
    assert_eq!(db.finished(), 2_000, "{:?}", db.statuses());
}

/// A second deployment naming another consumer on the same work-queue
/// stream fails start-up saying what that means and what to do, naming
/// the consumer already there, rather than with NATS's raw "filtered
/// consumer not unique on workqueue stream".
#[test]
fn another_consumer_on_the_work_queue_fails_start_up_saying_what_to_do() {
    let (_guard, dir) = temp_dir();
    let names = NatsNames::new(&nats_server());
    let db = support::sqlite_url(&dir);
    let mut args = vec!["--broker".to_owned(), names.url.clone(), "--db".into(), db];
    args.extend(names.flags());
    let first: Vec<&str> = args.iter().map(String::as_str).collect();
    let running = Mandrill::run(&dir, &first);
    running.wait_for("mandrill started", 1);
    let consumer = first
        .iter()
        .find_map(|arg| arg.strip_prefix("broker.nats.consumer="))
        .unwrap()
        .to_owned();

    let other = format!("broker.nats.consumer={consumer}-other");
    let mut second = vec!["run"];
    second.extend(&first);
    second.extend(["--set", &other]);
    let (status, _, stderr) = mandrill(&dir, &second, &[]);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot open consumer {consumer}-other: stream MANDRILL_TEST_{}",
            names.flags()[1].rsplit('_').next().unwrap()
        )) && stderr.contains(&format!("another consumer already reads it ({consumer})"))
            && stderr.contains("must name the same broker.nats.consumer")
            && !stderr.contains("not unique"),
        "{stderr}"
    );
    running.signal("TERM");
    let (status, _) = running.wait_exit();
    assert!(status.success());
}
