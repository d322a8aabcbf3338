//! A full disk under the SQLite store and queue: writing fails while it is
//! full, and resumes, losing nothing, once there is room again.
//!
//! The real thing needs a small filesystem to fill: a tmpfs, mounted here
//! (tests run as root in CI). Where mounting is not permitted, those tests
//! say so and pass without running. The failure mode itself (SQLite ending a
//! transaction on its own, which left the writers' connections refusing every
//! later transaction) is also reproduced without root, by a trigger, in the
//! SQLite store's unit tests (`sqlite::store::tests::writes`).

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use support::tmpfs::Tmpfs;
use support::{DEADLINE, Mandrill, history, mandrill, queue_rows, temp_dir};

/// Waits until `path` holds at least `lines` lines.
fn wait_for_lines(path: &Path, lines: usize) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let found = std::fs::read(path)
            .map(|bytes| bytes.iter().filter(|&&b| b == b'\n').count())
            .unwrap_or(0);
        if found >= lines {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {found} of {lines} lines in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the service logs a failed store and a failed queue
/// transaction: both writers met the full disk (they share the file, and
/// handlers in flight keep recording while pulls fail).
fn wait_for_failed_writes(service: &Mandrill) {
    service.wait_for("queue transaction failed", 1);
    service.wait_for("store transaction failed", 1);
}

#[test]
fn service_on_a_full_disk_resumes_when_there_is_room_and_records_everything_once() {
    let Some(disk) = Tmpfs::mount("16m") else {
        return;
    };
    // The journal lives off the small disk: it counts restarts throughout.
    let (_guard, dir) = temp_dir();
    let journal = dir.join("restarts.journal");
    let db = format!("sqlite:{}", disk.path().join("mandrill.db").display());
    let total = 1000;
    let names: String = (0..total).map(|i| format!("full-{i:04}\n")).collect();
    std::fs::write(dir.join("names"), names).unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, "--file", "names"], &[]);
    assert!(status.success(), "{stderr}");

    let journal_setting = format!("restarter.journal={}", journal.display());
    let service = Mandrill::run(
        &dir,
        &[
            "--until-idle",
            "--broker",
            &db,
            "--db",
            &db,
            "--max-in-flight",
            "4",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            "restarter.min_latency=5ms",
            "--set",
            "restarter.max_latency=15ms",
            "--set",
            &journal_setting,
            "--set",
            "broker.ack_deadline=2s",
            "--set",
            "broker.max_deliveries=1000",
            "--set",
            "worker.max_attempts=1000",
            "--set",
            "worker.max_pull_failures=1000",
            "--set",
            "worker.record_backoff=20ms",
        ],
    );
    // Mid-run: some requests handled, most still queued.
    wait_for_lines(&journal, total / 50);
    let filler = disk.fill();
    wait_for_failed_writes(&service);
    // Room again: the disk grows and the filler goes.
    disk.resize("64m");
    std::fs::remove_file(filler).unwrap();

    let (status, lines) = service.wait_exit();
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        lines
            .iter()
            .map(|line| line.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(queue_rows(&db).is_empty(), "messages left in the queue");
    let entries = history(&db);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for entry in &entries {
        let host = entry.hostname.clone().unwrap_or_default();
        *seen.entry(host).or_default() += 1;
    }
    assert_eq!(seen.len(), total, "every request is recorded");
    assert!(seen.values().all(|&n| n == 1), "a request recorded twice");
    assert!(
        entries
            .iter()
            .all(|e| e.status == mandrill::Status::Restarted),
        "{entries:?}"
    );
}
