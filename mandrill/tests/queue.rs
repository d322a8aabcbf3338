//! The SQLite queue through the real binary: `publish`, `run --until-idle`,
//! `dead-letters`, `requeue`, and two consumer processes on one database.

mod support;

use std::collections::HashMap;

use mandrill::Status;
use serde_json::Value;
use support::{Mandrill, count, fields_of, history, mandrill, queue_rows, sqlite_url, temp_dir};

#[test]
fn publish_rejects_bad_lines_by_number_and_publishes_nothing() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    std::fs::write(
        dir.join("requests.txt"),
        "cattle-0001\n# a comment\n\nCattle_Bad\n{\"message_id\":\"nope\",\"instance_name\":\"x\"}\ncattle-0002\n",
    )
    .unwrap();
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "publish",
            "--broker",
            &db,
            "--file",
            "requests.txt",
            "cattle-0003",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("requests.txt:4:"), "{stderr}");
    assert!(stderr.contains("Cattle_Bad"), "{stderr}");
    assert!(stderr.contains("requests.txt:5:"), "{stderr}");
    assert!(stderr.contains("nothing was published"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    // Validation comes first: the queue was not even created.
    assert!(!dir.join("mandrill.db").exists());

    let (status, stdout, stderr) = mandrill(
        &dir,
        &["publish", "--broker", &db, "cattle-0003", "--random", "4"],
        &[],
    );
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("published 5 requests"), "{stderr}");
    let rows = queue_rows(&db);
    assert_eq!(rows.len(), 5);
    // Minted time-ordered (version 7), so that the stores' indexes on
    // message_id grow at their right edge.
    let ids: Vec<uuid::Uuid> = rows
        .iter()
        .map(|row| {
            let wire: serde_json::Value = serde_json::from_slice(&row.payload).unwrap();
            wire["message_id"].as_str().unwrap().parse().unwrap()
        })
        .collect();
    assert!(
        ids.iter()
            .all(|id| id.get_version() == Some(uuid::Version::SortRand)),
        "{ids:?}"
    );
    let millis = |id: &uuid::Uuid| id.get_timestamp().unwrap().to_unix();
    assert!(
        ids.windows(2).all(|w| millis(&w[0]) <= millis(&w[1])),
        "{ids:?}"
    );
    // Standard output is what was published: each id with its host, in
    // the queue's order, and nothing else.
    let printed = printed(&stdout);
    assert_eq!(
        printed.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        ids,
        "{stdout}"
    );
    assert_eq!(printed[0].1, "cattle-0003.example.net", "{stdout}");
    assert!(
        printed[1..]
            .iter()
            .all(|(_, host)| host.starts_with("cattle-") && host.ends_with(".example.net")),
        "{stdout}"
    );
}

/// `mandrill publish`'s standard output: `<message id> <host>` a line.
fn printed(stdout: &str) -> Vec<(uuid::Uuid, String)> {
    stdout
        .lines()
        .map(|line| {
            let (id, host) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("not `ID HOST`: {line:?}"));
            (id.parse().unwrap(), host.to_owned())
        })
        .collect()
}

#[test]
fn publish_reads_standard_input_and_spreads_at_a_rate() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let mut child = Command::new(support::binary())
        .args(["publish", "--broker", &db, "--file", "-"])
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = uuid::Uuid::new_v4();
    let json = format!(r#"{{"message_id":"{id}","instance_name":"from-json","extra":1}}"#);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("from-stdin\n{json}\n").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("published 2 requests"),
        "{output:?}"
    );
    let lines = printed(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(lines.len(), 2, "{output:?}");
    assert_eq!(lines[0].1, "from-stdin.example.net");
    assert_eq!(lines[1], (id, "from-json.example.net".to_owned()));
    let rows = queue_rows(&db);
    // A JSON line is published as written, unknown fields included.
    assert_eq!(rows[1].payload, json.as_bytes());

    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "publish", "--broker", &db, "--random", "30", "--rate", "1000",
        ],
        &[],
    );
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("published 30 requests"), "{stderr}");
    assert_eq!(printed(&stdout).len(), 30, "{stdout}");
    assert_eq!(queue_rows(&db).len(), 32);
    let (status, _, stderr) =
        mandrill(&dir, &["publish", "--broker", &db, "--rate", "0", "x"], &[]);
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains("--rate"), "{stderr}");
}

#[test]
fn run_until_idle_handles_everything_published_then_exits_zero() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let names: String = (0..200).map(|i| format!("idle-{i:04}\n")).collect();
    std::fs::write(dir.join("names"), names).unwrap();
    let (status, stdout, stderr) = mandrill(&dir, &["publish", "--file", "names"], &[]);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("published 200 requests"), "{stderr}");
    assert_eq!(printed(&stdout).len(), 200, "{stdout}");

    // Defaults: the queue and the store share ./mandrill.db.
    let service = Mandrill::run(
        &dir,
        &[
            "--until-idle",
            "--set",
            "restarter.failure_rate=0.3",
            "--set",
            "restarter.max_latency=5ms",
            "--set",
            "worker.retry_initial=5ms",
            "--set",
            "worker.max_attempts=10",
        ],
    );
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    fields_of(
        &lines,
        "queue is idle: nothing visible, delayed or in flight; shutting down",
    );
    let stats = fields_of(&lines, "final stats");
    assert_eq!(count(&stats, "acked") + count(&stats, "dead_lettered"), 200);
    assert!(queue_rows(&db).is_empty());
    let entries = history(&db);
    assert_eq!(entries.len(), 200);
    assert!(entries.iter().all(|e| e.status.is_final()), "{entries:?}");
}

/// `[nats]` and `broker.poll_interval`, names from before each adapter
/// owned its section, are unknown keys like any other: refused at start-up,
/// naming the key, before anything is published.
#[test]
fn settings_under_retired_names_are_refused_naming_the_key() {
    let (_guard, dir) = temp_dir();
    for (flags, env, key) in [
        (
            vec!["--set", "broker.poll_interval=5ms"],
            vec![],
            "broker.poll_interval",
        ),
        (vec![], vec![("MANDRILL_NATS__STREAM", "OLD_NAME")], "nats"),
    ] {
        let mut args = vec!["publish"];
        args.extend(flags);
        args.push("cattle-1");
        let (status, _, stderr) = mandrill(&dir, &args, &env);
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(key), "{key} not named: {stderr}");
    }
    assert!(!dir.join("mandrill.db").exists() || history(&sqlite_url(&dir)).is_empty());
}

#[test]
fn malformed_payloads_are_dead_lettered_listed_and_can_be_requeued() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Written through the library: `mandrill publish` would refuse them.
    runtime.block_on(async {
        let config = mandrill::SqliteOptions {
            url: db.clone(),
            ..Default::default()
        };
        let broker = mandrill::SqliteBroker::connect(&config).await.unwrap();
        let payloads = [&b"{\"message_id\": "[..], b"\xff\xfe", b"", b"[1,2]"];
        broker
            .publish_all(
                payloads
                    .iter()
                    .map(|p| bytes::Bytes::copy_from_slice(p))
                    .collect(),
            )
            .await
            .unwrap();
        mandrill::Close::close(&broker).await;
    });
    let (status, stdout, stderr) = mandrill(&dir, &["publish", "cattle-good"], &[]);
    assert!(status.success(), "{stderr}: {stdout}");

    let run = || {
        let service = Mandrill::run(
            &dir,
            &[
                "--until-idle",
                "--set",
                "restarter.failure_rate=0",
                "--set",
                "restarter.max_latency=1ms",
            ],
        );
        let (status, lines) = service.wait_exit();
        assert!(status.success(), "exit status {status}");
        fields_of(&lines, "final stats")
    };
    let stats = run();
    assert_eq!(count(&stats, "rejected"), 4);
    assert_eq!(count(&stats, "acked"), 1);

    let (status, stdout, stderr) = mandrill(&dir, &["dead-letters", "--json"], &[]);
    assert!(status.success(), "{stderr}");
    let dead: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 4);
    for entry in &dead {
        let reason = entry["reason"].as_str().unwrap();
        assert!(reason.starts_with("payload is"), "{entry}");
        assert_eq!(entry["deliveries"], 1);
    }
    let (status, table, _) = mandrill(&dir, &["dead-letters"], &[]);
    assert!(status.success());
    assert_eq!(table.lines().count(), 5, "{table}");
    let rejected = history(&db)
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .count();
    assert_eq!(rejected, 4);

    // Unknown ids: nothing requeued.
    let (status, _, stderr) = mandrill(&dir, &["requeue", "1", "99999"], &[]);
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("99999"), "{stderr}");
    let first = dead[0]["id"].as_i64().unwrap().to_string();
    let (status, stdout, _) = mandrill(&dir, &["requeue", &first], &[]);
    assert!(status.success());
    assert_eq!(stdout.trim(), "requeued 1 dead letters");
    let (status, stdout, _) = mandrill(&dir, &["requeue", "--all"], &[]);
    assert!(status.success());
    assert_eq!(stdout.trim(), "requeued 3 dead letters");
    assert_eq!(queue_rows(&db).len(), 4);
    // Still malformed, so dead-lettered again, each on a first delivery.
    let stats = run();
    assert_eq!(count(&stats, "dead_lettered"), 4);
}

#[test]
fn two_consumer_processes_never_handle_the_same_message() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let total = 1_000;
    let names: String = (0..total).map(|i| format!("pair-{i:04}\n")).collect();
    std::fs::write(dir.join("names"), names).unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--file", "names"], &[]);
    assert!(status.success(), "{stderr}");

    let consumer = |journal: &str| {
        Mandrill::run(
            &dir,
            &[
                "--until-idle",
                "--max-in-flight",
                "10",
                "--set",
                "restarter.failure_rate=0",
                // Long enough that one process alone would take ~3 s for
                // the lot: the second has started long before, so both
                // really consume (with 2-8 ms, the faster SQLite writer let
                // the first finish everything before the second pulled).
                "--set",
                "restarter.min_latency=20ms",
                "--set",
                "restarter.max_latency=40ms",
                "--set",
                &format!("restarter.journal={journal}"),
                "--log-level",
                "warn,mandrill::service=info",
            ],
        )
    };
    let (a, b) = (consumer("a.journal"), consumer("b.journal"));
    let (status_a, _) = a.wait_exit();
    let (status_b, _) = b.wait_exit();
    assert!(status_a.success() && status_b.success());

    let journal = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let (journal_a, journal_b) = (journal("a.journal"), journal("b.journal"));
    let mut restarts: HashMap<&str, usize> = HashMap::new();
    for host in journal_a
        .lines()
        .chain(journal_b.lines())
        .filter_map(|line| line.split(' ').next())
    {
        *restarts.entry(host).or_default() += 1;
    }
    assert_eq!(restarts.len(), total);
    assert!(
        restarts.values().all(|&n| n == 1),
        "a host was restarted twice"
    );
    // Both really consumed: the claim is what kept them apart.
    assert!(journal_a.lines().count() > 0 && journal_b.lines().count() > 0);
    let entries = history(&db);
    assert_eq!(entries.len(), total);
    assert!(
        entries
            .iter()
            .all(|e| e.status == Status::Restarted && e.attempts == 1)
    );
    assert!(queue_rows(&db).is_empty());
}
