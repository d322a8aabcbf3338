//! Crash safety with the real binary: `kill -9` mid-run loses no request and
//! restarts no host twice, except a host whose restart was issued but whose
//! outcome was not yet committed when the process died.
//!
//! How restarts are counted: `restarter.journal` appends the host to a file
//! with one `write(2)` *before* each restart is issued. A killed process's
//! written lines survive in the kernel, so the journal counts every restart
//! issued, including one cut short by the kill (it over-counts, if anything,
//! which only makes the bound below harder to meet). The log is no use here:
//! it is written by a background thread and loses its buffer on SIGKILL.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use mandrill::Status;
use rand::Rng;
use support::{
    DEADLINE, Mandrill, count, fields_of, history, mandrill, queue_rows, sqlite_url, temp_dir,
};

const TOTAL: usize = 5_000;

/// A published payload's message id and instance.
fn parse(payload: &[u8]) -> (uuid::Uuid, String) {
    let request: serde_json::Value =
        serde_json::from_slice(payload).expect("published payloads are JSON");
    let id = request["message_id"].as_str().expect("a message id");
    let instance = request["instance_name"].as_str().expect("an instance");
    (id.parse().expect("a uuid"), instance.to_owned())
}

fn journal_lines(path: &std::path::Path) -> usize {
    std::fs::read(path)
        .map(|bytes| bytes.iter().filter(|&&b| b == b'\n').count())
        .unwrap_or(0)
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn kill_9_mid_run_loses_nothing_and_repeats_only_restarts_in_flight() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let journal = dir.join("restarts.journal");
    let names: String = (0..TOTAL).map(|i| format!("crash-{i:04}\n")).collect();
    std::fs::write(dir.join("names"), names).unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--file", "names"], &[]);
    assert!(status.success(), "{stderr}");
    let published: HashMap<uuid::Uuid, String> = queue_rows(&db)
        .iter()
        .map(|row| parse(&row.payload))
        .collect();
    assert_eq!(published.len(), TOTAL);

    let journal_setting = format!("restarter.journal={}", journal.display());
    let args = |until_idle: bool| {
        let mut args = vec![
            "--max-in-flight",
            "100",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.min_latency=1ms",
            "--set",
            "restarter.max_latency=5ms",
            // Leases of the killed run expire soon, so the second run
            // redelivers them without a long wait.
            "--set",
            "broker.ack_deadline=1s",
            "--set",
            &journal_setting,
            "--log-level",
            "warn,mandrill::service=info",
        ];
        if until_idle {
            args.push("--until-idle");
        }
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };

    // First run, killed once a random number of restarts were issued.
    let kill_after = rand::rng().random_range(TOTAL / 20..TOTAL * 9 / 10);
    let first_args = args(false);
    let first = Mandrill::run(&dir, &refs(&first_args));
    let give_up = Instant::now() + DEADLINE;
    while journal_lines(&journal) < kill_after {
        assert!(Instant::now() < give_up, "the first run made no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    first.signal("KILL");
    let (status, _) = first.wait_exit();
    assert!(!status.success(), "the first run was killed: {status}");

    // The database as the crash left it.
    let at_crash = queue_rows(&db);
    let in_flight: HashSet<String> = at_crash
        .iter()
        .filter(|row| row.leased)
        .map(|row| parse(&row.payload).1)
        .collect();
    let final_at_crash: HashSet<String> = history(&db)
        .iter()
        .filter(|e| e.status.is_final())
        .filter_map(|e| e.instance_name.clone())
        .collect();
    let restarts_before = journal_lines(&journal);

    // Second run, to the end of the queue.
    let second_args = args(true);
    let second = Mandrill::run(&dir, &refs(&second_args));
    let (status, lines) = second.wait_exit();
    assert!(status.success(), "exit status {status}");
    let stats = fields_of(&lines, "final stats");

    // Every published id exactly once in the history, with a final outcome.
    let entries = history(&db);
    assert_eq!(entries.len(), TOTAL);
    for entry in &entries {
        let id = entry.message_id.expect("every entry has its id");
        assert_eq!(
            entry.instance_name.as_ref(),
            published.get(&id),
            "{entry:?}"
        );
        assert_eq!(entry.status, Status::Restarted, "{entry:?}");
    }
    // Nothing left in the queue, nothing given up on.
    assert!(queue_rows(&db).is_empty());
    let (_, dead, _) = mandrill(&dir, &["dead-letters", "--json"], &[]);
    assert!(dead.is_empty(), "{dead}");

    // Restarts issued, per instance, across both runs: the journal names
    // hosts, and the history says whose instance each is.
    let instance_of: HashMap<&str, &str> = entries
        .iter()
        .filter_map(|e| Some((e.hostname.as_deref()?, e.instance_name.as_deref()?)))
        .collect();
    let text = std::fs::read_to_string(&journal).unwrap();
    let mut restarts: HashMap<&str, usize> = HashMap::new();
    for host in text.lines().filter_map(|line| line.split(' ').next()) {
        *restarts.entry(instance_of[host]).or_default() += 1;
    }
    assert_eq!(restarts.len(), TOTAL, "every host was restarted");
    let repeated: Vec<&str> = restarts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(host, _)| *host)
        .collect();
    for host in &repeated {
        assert_eq!(restarts[host], 2, "{host} restarted more than twice");
        // Only a restart the crash caught between issue and record repeats.
        assert!(
            in_flight.contains(*host),
            "{host} repeated but was not in flight"
        );
        assert!(
            !final_at_crash.contains(*host),
            "{host} repeated after its outcome was final"
        );
    }
    assert!(repeated.len() <= in_flight.len());
    eprintln!(
        "killed after {restarts_before} restarts issued (target {kill_after}); in flight at the crash: {}; \
         restarts repeated: {}; redeliveries acked as duplicates: {}",
        in_flight.len(),
        repeated.len(),
        count(&stats, "duplicates"),
    );
}
