//! Many `mandrill` processes on one Pub/Sub subscription (a private
//! emulator) and one PostgreSQL database: the real binary.

mod services;
mod support;

use std::time::Duration;

use services::{Database, PrivatePubSub};
use support::{Mandrill, count, fields_of, mandrill, temp_dir};

fn publish(dir: &std::path::Path, pubsub: &PrivatePubSub, n: usize) {
    let url = pubsub.url();
    let mut args = vec!["publish".to_owned(), "--broker".into(), url];
    args.extend(pubsub.flags());
    args.extend(["--random".into(), n.to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout, stderr) = mandrill(dir, &args, &[]);
    assert!(status.success(), "publish failed: {stderr}");
    assert_eq!(stdout.lines().count(), n, "one line per request: {stdout}");
}

fn instance(dir: &std::path::Path, pubsub: &PrivatePubSub, db: &Database) -> Mandrill {
    instance_with(dir, pubsub, db, FAST)
}

fn instance_with(
    dir: &std::path::Path,
    pubsub: &PrivatePubSub,
    db: &Database,
    extra: &[&str],
) -> Mandrill {
    let mut args: Vec<String> = vec![
        "--broker".into(),
        pubsub.url(),
        "--db".into(),
        db.url.clone(),
    ];
    args.extend(pubsub.flags());
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
    // Pub/Sub's shortest: a killed instance's leases come back after it.
    "--set",
    "broker.ack_deadline=10s",
    "--set",
    "debug.status_interval=0s",
];

#[test]
fn three_instances_share_the_work_and_survive_a_kill_on_pubsub() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let pubsub = PrivatePubSub::start();
    // Consumers first: they create the subscription, without which Pub/Sub
    // drops what is published (and `mandrill publish` refuses).
    let instances: Vec<Mandrill> = (0..3).map(|_| instance(&dir, &pubsub, &db)).collect();
    for instance in &instances {
        instance.wait_for("mandrill started", 1);
    }
    publish(&dir, &pubsub, 5_000);
    for instance in &instances {
        instance.wait_for("acked", 20);
    }
    let mut instances = instances.into_iter();
    let victim = instances.next().unwrap();
    victim.signal("KILL");
    let (_, victim_log) = victim.wait_exit();
    assert!(victim_log.iter().any(|l| l["fields"]["message"] == "acked"));

    db.wait_finished(5_000, Duration::from_secs(240));
    for survivor in instances {
        survivor.signal("TERM");
        let (status, lines) = survivor.wait_exit();
        assert!(status.success(), "exit status {status}");
        let stats = fields_of(&lines, "final stats");
        assert_eq!(
            count(&stats, "pulled"),
            count(&stats, "acked") + count(&stats, "nacked") + count(&stats, "dead_lettered")
        );
        assert!(count(&stats, "acked") > 0, "{stats}");
    }
    // Exactly once: every published id has one final outcome.
    let statuses = db.statuses();
    let total: i64 = statuses.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 5_000, "{statuses:?}");
    assert_eq!(db.finished(), 5_000, "{statuses:?}");
}

#[test]
fn sigterm_on_one_instance_hands_its_waiting_work_to_the_others_on_pubsub() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let pubsub = PrivatePubSub::start();
    // One blocking thread and slow restarts: most of what an instance holds
    // is waiting for capacity, so a shutdown nacks it (deadline 0 on
    // Pub/Sub: redelivered at once).
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
        // The subscription is shared: its settings must match the other's.
        "--set",
        "broker.ack_deadline=10s",
        "--set",
        "broker.max_deliveries=20",
    ];
    let leaving = instance_with(&dir, &pubsub, &db, slow);
    leaving.wait_for("mandrill started", 1);
    publish(&dir, &pubsub, 200);
    leaving.wait_for("saved", 2);
    let staying = instance(&dir, &pubsub, &db);
    staying.wait_for("mandrill started", 1);
    leaving.signal("TERM");
    let (status, lines) = leaving.wait_exit();
    assert!(status.success());
    let stats = fields_of(&lines, "final stats");
    assert!(count(&stats, "nacked") >= 1, "{stats}");

    // Well before a lease could run out: the nacked messages went straight
    // to the other instance.
    db.wait_finished(200, Duration::from_secs(60));
    staying.signal("TERM");
    let (status, _) = staying.wait_exit();
    assert!(status.success());
}

#[test]
fn until_idle_is_refused_on_pubsub_rather_than_waiting_forever() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(
        &dir,
        &["run", "--broker", "pubsub://p/requests", "--until-idle"],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--until-idle is not supported on Pub/Sub"),
        "{stderr}"
    );
}
