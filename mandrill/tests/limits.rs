//! The counting guards through the real binary, across processes: the rate
//! limit holds exactly however many instances share the work (two on one
//! SQLite file; three on NATS JetStream + PostgreSQL), and the disruption
//! budget never lets more hosts of a group be down at once than it allows.
//! Restarts are counted from the restart journal (`restarter.journal`: a
//! line written before each restart is issued, with its time), never from
//! the store that enforces the limits.

mod services;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use mandrill::Status;
use services::{Database, NatsNames, nats_server};
use support::{
    DEADLINE, Mandrill, history, mandrill, queue_rows, sqlite_url, temp_dir, until_both_deferred,
    wait_for_deferrals,
};

/// The journal's lines: (host, milliseconds since the epoch).
fn journal(path: &Path) -> Vec<(String, i64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let (host, at) = line.split_once(' ').expect("host and time");
            (host.to_owned(), at.parse().expect("milliseconds"))
        })
        .collect()
}

const REQUESTS: usize = 200;
const LIMIT: usize = 5;
/// More requests to publish when one instance took a whole round.
const ROUND: usize = 50;

/// Rate-limited and fast: every request is either one of the five allowed
/// restarts or deferred (for about an hour, so once each).
fn limited(journal: &Path) -> Vec<String> {
    [
        "--set",
        "safety.rate.group_max=5",
        "--set",
        "safety.rate.window=1h",
        "--set",
        "restarter.failure_rate=0",
        "--set",
        "restarter.max_latency=5ms",
        "--set",
        "debug.status_interval=0s",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        "--set".into(),
        format!("restarter.journal={}", journal.display()),
    ])
    .collect()
}

fn stop(instance: Mandrill) {
    instance.signal("TERM");
    let (status, lines) = instance.wait_exit();
    assert!(status.success(), "exit {status}: {lines:?}");
}

#[test]
fn two_instances_on_one_sqlite_file_issue_exactly_the_rate_limit() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let publish = |n: usize, rate: &str| {
        let (status, _, stderr) = mandrill(
            &dir,
            &[
                "publish",
                "--broker",
                &db,
                "--random",
                &n.to_string(),
                "--rate",
                rate,
            ],
            &[],
        );
        assert!(status.success(), "publish failed: {stderr}");
    };
    // One request creates the database; the rest are published once both
    // instances are pulling, each holding at most 4 at a time and polling
    // every 5 ms, and spread at 400 a second, so that both take part. (All
    // in one transaction, one instance once deferred all 195 before the
    // other got the file's write lock: SQLite's lock is not fair.)
    publish(1, "1000");
    let journal_path = dir.join("restarts.journal");
    let mut args = vec!["--db".to_owned(), db.clone(), "--broker".into(), db.clone()];
    args.extend(limited(&journal_path));
    args.extend([
        "--max-in-flight".into(),
        "4".into(),
        "--set".into(),
        "broker.sqlite.poll_interval=5ms".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (a, b) = (Mandrill::run(&dir, &args), Mandrill::run(&dir, &args));
    a.wait_for("mandrill started", 1);
    b.wait_for("mandrill started", 1);
    publish(REQUESTS - 1, "400");
    let published = until_both_deferred((&a, &b), REQUESTS, LIMIT, (ROUND, 4 * REQUESTS), |n| {
        publish(n, "400")
    });
    stop(a);
    stop(b);

    assert_eq!(
        journal(&journal_path).len(),
        LIMIT,
        "exactly the limit issued"
    );
    let entries = history(&db);
    let restarted = entries
        .iter()
        .filter(|e| e.status == Status::Restarted)
        .count();
    assert_eq!(restarted, LIMIT);
    // None lost: every other request is still queued, deferred, with
    // nothing claimed and no attempt used.
    assert_eq!(queue_rows(&db).len(), published - LIMIT);
    let waiting: Vec<_> = entries
        .iter()
        .filter(|e| e.status != Status::Restarted)
        .collect();
    assert_eq!(waiting.len(), published - LIMIT);
    assert!(
        waiting
            .iter()
            .all(|e| e.status == Status::Received && e.attempts == 0),
        "{waiting:?}"
    );

    // The status shows the group's use of its limits: the five hosts
    // restarted seconds ago, with no probe, still settle, and count as
    // the disruption budget counts them.
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "status",
            "--db",
            &db,
            "--set",
            "safety.rate.group_max=5",
            "--set",
            "safety.rate.window=1h",
        ],
        &[],
    );
    assert!(status.success(), "status failed: {stderr}");
    assert!(
        stdout.contains("group cattle: 5 restarts in the last hour, 5 hosts disrupted"),
        "{stdout}"
    );
    assert!(
        stdout.contains("limits:    restarts per group per hour: 5"),
        "{stdout}"
    );

    // History as JSON carries the decisions.
    let (status, stdout, _) = mandrill(
        &dir,
        &["history", "--db", &db, "--json", "--limit", "1000"],
        &[],
    );
    assert!(status.success());
    let deferred = stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|line| line["decisions"][0]["guard"] == "rate limit")
        .count();
    assert_eq!(deferred, published - LIMIT);

    // Every decision is explained.
    let id = waiting[0].message_id.unwrap().to_string();
    let (status, stdout, stderr) = mandrill(&dir, &["explain", "--db", &db, &id], &[]);
    assert!(status.success(), "explain failed: {stderr}");
    assert!(
        stdout.contains("deferred by rate limit: group cattle had 5 of its 5 restarts per hour"),
        "{stdout}"
    );
    let done = entries
        .iter()
        .find(|e| e.status == Status::Restarted)
        .unwrap();
    let id = done.message_id.unwrap().to_string();
    let (status, stdout, _) = mandrill(&dir, &["explain", "--db", &db, "--json", &id], &[]);
    assert!(status.success());
    let story: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(story["entry"]["status"], "restarted");
    assert_eq!(story["attempts"][0]["outcome"], "restarted");
    assert!(
        story["attempts"][0]["verdict"]
            .as_str()
            .unwrap()
            .contains("of 5 per hour"),
        "{story}"
    );
}

#[test]
fn three_instances_on_nats_and_postgres_issue_exactly_the_rate_limit() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    let journal_path = dir.join("restarts.journal");
    let mut args = vec![
        "--broker".to_owned(),
        names.url.clone(),
        "--db".into(),
        db.url.clone(),
    ];
    args.extend(names.flags());
    args.extend(limited(&journal_path));
    args.extend(["--max-in-flight".into(), "32".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let instances: Vec<Mandrill> = (0..3).map(|_| Mandrill::run(&dir, &args)).collect();
    let refs: Vec<&Mandrill> = instances.iter().collect();
    for instance in &instances {
        instance.wait_for("mandrill started", 1);
    }
    let mut publish = vec!["publish".to_owned(), "--broker".into(), names.url.clone()];
    publish.extend(names.flags());
    publish.extend(["--random".into(), REQUESTS.to_string()]);
    let publish: Vec<&str> = publish.iter().map(String::as_str).collect();
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "publish failed: {stderr}");

    wait_for_deferrals(&refs, REQUESTS - LIMIT);
    let took_part = instances
        .iter()
        .filter(|i| !i.messages("deferred").is_empty() || !i.messages("acked").is_empty())
        .count();
    assert!(took_part >= 2, "the work was shared");
    for instance in instances {
        stop(instance);
    }
    assert_eq!(
        journal(&journal_path).len(),
        LIMIT,
        "exactly the limit issued"
    );
    let statuses = db.statuses();
    let restarted: i64 = statuses
        .iter()
        .filter(|(status, _)| status == "restarted")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(restarted, LIMIT as i64, "{statuses:?}");
    let total: i64 = statuses.iter().map(|(_, n)| n).sum();
    assert_eq!(
        total, REQUESTS as i64,
        "every request recorded: {statuses:?}"
    );
}

#[test]
fn the_disruption_budget_never_lets_more_than_its_share_of_a_group_down() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let hosts: Vec<String> = (0..10).map(|n| format!("cattle-{n:02}")).collect();
    let mut publish = vec!["publish", "--broker", &db];
    publish.extend(hosts.iter().map(String::as_str));
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "publish failed: {stderr}");
    // A group of 10 with a 20% budget: 2 down at once. Each restart takes
    // 400 ms (slow to come back), and a deferral is retried quickly. No
    // settle: this counts the restarts in flight (the settle has its own
    // test below).
    let config = dir.join("mandrill.toml");
    std::fs::write(
        &config,
        "[safety.budget]\nmax_disrupted_percent = 20\nretry = \"100ms\"\n\
         group_sizes = { cattle = 10 }\nsettle = \"0s\"\n",
    )
    .unwrap();
    let journal_path = dir.join("restarts.journal");
    let journal_setting = format!("restarter.journal={}", journal_path.display());
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
            "--max-in-flight",
            "10",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.min_latency=400ms",
            "--set",
            "restarter.max_latency=400ms",
            "--set",
            &journal_setting,
        ],
    );
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "run failed: {lines:?}");

    let starts = journal(&journal_path);
    assert_eq!(starts.len(), 10, "every host restarted once: {starts:?}");
    // A restart disrupts its host from its start until its outcome is
    // recorded, at least 400 ms later: no 400 ms holds three starts.
    let mut times: Vec<i64> = starts.iter().map(|(_, at)| *at).collect();
    times.sort_unstable();
    for (i, start) in times.iter().enumerate() {
        let together = times[..=i].iter().filter(|t| **t > start - 400).count();
        assert!(together <= 2, "{together} hosts down at once: {times:?}");
    }
    assert!(
        !lines
            .iter()
            .filter(|l| l["fields"]["message"] == "deferred")
            .collect::<Vec<_>>()
            .is_empty(),
        "the budget had to defer some"
    );
    assert!(
        history(&db)
            .iter()
            .all(|e| e.status == Status::Restarted && e.attempts == 1)
    );
}

/// Without a verification probe, a host whose restart the backend reported
/// done counts as disrupted for `safety.budget.settle` (5 minutes by
/// default): with `max_disrupted = 1`, the group's second host is deferred
/// by the budget, retry after retry, while the first is restarted and
/// recorded but still settling.
#[test]
fn without_a_probe_a_restarted_host_holds_the_budget_while_it_settles() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let (status, _, stderr) = mandrill(
        &dir,
        &["publish", "--broker", &db, "cattle-01", "cattle-02"],
        &[],
    );
    assert!(status.success(), "publish failed: {stderr}");
    let config = dir.join("mandrill.toml");
    std::fs::write(
        &config,
        "[safety.budget]\nmax_disrupted = 1\nretry = \"100ms\"\n",
    )
    .unwrap();
    let journal_path = dir.join("restarts.journal");
    let journal_setting = format!("restarter.journal={}", journal_path.display());
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--db",
            &db,
            "--broker",
            &db,
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.max_latency=5ms",
            "--set",
            "broker.sqlite.poll_interval=5ms",
            "--set",
            &journal_setting,
        ],
    );
    // The first host's restart is done and recorded...
    let deadline = Instant::now() + DEADLINE;
    while !history(&db).iter().any(|e| e.status == Status::Restarted) {
        assert!(Instant::now() < deadline, "no restart recorded");
        std::thread::sleep(Duration::from_millis(50));
    }
    // ...and the other is still deferred by the budget, retried every
    // 100 ms: five more deferrals after it was recorded.
    let before = service.messages("deferred").len();
    wait_for_deferrals(&[&service], before + 5);
    let deferred = service.messages("deferred");
    assert!(
        deferred[before..]
            .iter()
            .all(|line| line["fields"]["guard"] == "disruption budget"),
        "{deferred:?}"
    );
    let warned = service
        .messages("safety.pause_on_unrecovered needs a verification probe (verify.probe): without one no restart is ever found unrecovered, so it never pauses; the budget counts a restarted host as disrupted for safety.budget.settle instead")
        .len();
    stop(service);
    // A simulated backend has no host a probe could reach: start-up does
    // not warn about a probe nobody could configure.
    assert_eq!(
        warned, 0,
        "no warning about a probe with a simulated backend"
    );
    let starts = journal(&journal_path);
    assert_eq!(starts.len(), 1, "one host restarted: {starts:?}");
    let entries = history(&db);
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.status == Status::Restarted)
            .count(),
        1,
        "{entries:?}"
    );
}

/// A dry run issues nothing, so it never hides a host that is still
/// disrupted. With the command backend and no probe, a restarted host
/// counts for `safety.budget.settle` (5 minutes); `max_disrupted = 1`.
/// `web-1` is restarted; a reload leashes the service and `web-1` is asked
/// for again (recorded `dry-run`); a reload unleashes it and `web-2` is
/// asked for: it is held back by the budget while `web-1` settles, as it
/// is without the dry run in between.
#[test]
fn a_dry_run_never_hides_a_host_that_still_settles() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let config = dir.join("mandrill.toml");
    let journal_path = dir.join("restarts.journal");
    let write_config = |dry_run: bool| {
        std::fs::write(
            &config,
            format!(
                "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
                 [restarter]\nkind = \"command\"\njournal = {journal:?}\n\n\
                 [restarter.command]\nargv = [\"true\", \"{{host}}\"]\n\n\
                 [safety]\nallow = [\"web-*\"]\nrequire_signed = false\ndry_run = {dry_run}\n\n\
                 [safety.rate]\ngroup_max = 0\n\n\
                 [safety.budget]\nmax_disrupted = 1\nretry = \"100ms\"\n\n\
                 [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \
                 \"sat\", \"sun\"]\nhours = [\"00:00-24:00\"]\n",
                journal = journal_path.to_str().unwrap(),
            ),
        )
        .unwrap();
    };
    let publish = |host: &str| {
        let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, host], &[]);
        assert!(status.success(), "publish failed: {stderr}");
    };
    let wait_for_status = |status: Status, count: usize| {
        let deadline = Instant::now() + DEADLINE;
        while history(&db).iter().filter(|e| e.status == status).count() < count {
            assert!(Instant::now() < deadline, "no {status} recorded");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    write_config(false);
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--set",
            "broker.sqlite.poll_interval=5ms",
        ],
    );
    publish("web-1");
    wait_for_status(Status::Restarted, 1);

    write_config(true);
    service.signal("HUP");
    service.wait_for(
        "LEASHED (dry run) by reload: restarts are decided and recorded, none is issued",
        1,
    );
    service.wait_for("configuration reloaded", 1);
    publish("web-1");
    wait_for_status(Status::DryRun, 1);

    write_config(false);
    service.signal("HUP");
    service.wait_for(
        "UNLEASHED by reload: restarts of real hosts will be issued",
        1,
    );
    service.wait_for("configuration reloaded", 2);
    publish("web-2");
    // `web-2` is deferred by the budget, retry after retry (or, if the dry
    // run hid `web-1`, restarted: then the wait ends at once).
    let before = service.messages("deferred").len();
    let deadline = Instant::now() + DEADLINE;
    while service.messages("deferred").len() < before + 5
        && history(&db)
            .iter()
            .filter(|e| e.status == Status::Restarted)
            .count()
            < 2
    {
        assert!(
            Instant::now() < deadline,
            "web-2 neither deferred nor restarted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let deferred = service.messages("deferred");
    stop(service);
    let starts: Vec<String> = journal(&journal_path)
        .into_iter()
        .map(|(host, _)| host)
        .collect();
    assert_eq!(
        starts,
        ["web-1.example.net"],
        "web-2 restarted while web-1 settles"
    );
    assert!(
        deferred[before..]
            .iter()
            .all(|line| line["fields"]["guard"] == "disruption budget"),
        "{deferred:?}"
    );
}

/// A message's `group` never chooses the group it is counted in. The
/// operator puts `cattle-*` in group `g1` and allows one restart per group
/// per day; five requests for `cattle-a1` … `cattle-a5` naming groups `g1`
/// … `g5` restart one host (each counted in the group it named, they
/// restarted all five), and the four naming another group than `g1` are
/// denied for the mismatch, with both names in the reason. Five more naming
/// `g1` itself are deferred by the limit.
#[test]
fn a_group_named_in_the_message_never_widens_the_rate_limit() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let journal_path = dir.join("restarts.journal");
    let config = dir.join("mandrill.toml");
    std::fs::write(
        &config,
        format!(
            "[safety.groups]\ng1 = [\"cattle-*\"]\n\n[safety.rate]\ngroup_max = 1\nwindow = \"1d\"\n\n\
             [restarter]\nfailure_rate = 0.0\nmax_latency = \"5ms\"\njournal = {:?}\n",
            journal_path.display().to_string()
        ),
    )
    .unwrap();
    let requests = dir.join("requests.jsonl");
    let line = |instance: &str, group: &str| {
        format!(
            r#"{{"message_id":"{}","instance_name":"{instance}","group":"{group}"}}"#,
            uuid::Uuid::new_v4()
        )
    };
    let lines: Vec<String> = (1..=5)
        .map(|n| line(&format!("cattle-a{n}"), &format!("g{n}")))
        .collect();
    std::fs::write(&requests, lines.join("\n")).unwrap();
    let config = config.display().to_string();
    let publish = |file: &Path| {
        let (status, _, stderr) = mandrill(
            &dir,
            &[
                "publish",
                "--config",
                &config,
                "--broker",
                &db,
                "--file",
                &file.display().to_string(),
            ],
            &[],
        );
        assert!(status.success(), "publish failed: {stderr}");
    };
    publish(&requests);
    let instance = Mandrill::run(
        &dir,
        &[
            "--config",
            &config,
            "--db",
            &db,
            "--broker",
            &db,
            "--set",
            "debug.status_interval=0s",
        ],
    );
    instance.wait_for("denied", 4);
    let deadline = Instant::now() + DEADLINE;
    while journal(&journal_path).is_empty() {
        assert!(Instant::now() < deadline, "no restart issued");
        std::thread::sleep(Duration::from_millis(50));
    }
    let agreeing: Vec<String> = (1..=5)
        .map(|n| line(&format!("cattle-b{n}"), "g1"))
        .collect();
    let agreeing_file = dir.join("agreeing.jsonl");
    std::fs::write(&agreeing_file, agreeing.join("\n")).unwrap();
    publish(&agreeing_file);
    wait_for_deferrals(&[&instance], 5);
    stop(instance);

    let restarts = journal(&journal_path);
    assert_eq!(restarts.len(), 1, "one restart, not five: {restarts:?}");
    assert!(restarts[0].0.starts_with("cattle-a1"), "{restarts:?}");
    let entries = history(&db);
    let count = |status: Status| entries.iter().filter(|e| e.status == status).count();
    assert_eq!(count(Status::Restarted), 1);
    assert_eq!(count(Status::Denied), 4);
    assert_eq!(
        queue_rows(&db).len(),
        5,
        "the five naming g1 wait in the queue, deferred"
    );

    let (status, stdout, _) = mandrill(
        &dir,
        &["history", "--db", &db, "--json", "--limit", "1000"],
        &[],
    );
    assert!(status.success());
    let denied: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|line| line["status"] == "denied")
        .collect();
    assert_eq!(denied.len(), 4, "{stdout}");
    for entry in &denied {
        let decision = &entry["decisions"][0];
        assert_eq!(decision["guard"], "group", "{entry}");
        let reason = decision["reason"].as_str().unwrap();
        assert!(
            reason.contains("group mismatch") && reason.contains("is in group g1"),
            "{reason}"
        );
    }
    let id = denied[0]["message_id"].as_str().unwrap();
    let (status, stdout, stderr) = mandrill(&dir, &["explain", "--db", &db, id], &[]);
    assert!(status.success(), "explain failed: {stderr}");
    assert!(
        stdout.contains("group mismatch") && stdout.contains("is in group g1"),
        "{stdout}"
    );
}
