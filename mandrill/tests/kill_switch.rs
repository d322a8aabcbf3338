//! The kill switch through the real binary: `mandrill pause` mid-run stops
//! every restart (counted from the restart journal, written before each
//! restart is issued), `mandrill status` says so, `mandrill resume` lets the
//! deferred requests complete, each exactly once.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use mandrill::Status;
use support::{Mandrill, history, mandrill, sqlite_url, temp_dir};

fn journal_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// When each restart was issued (the journal's second field), in
/// milliseconds since the epoch.
fn journal_times(path: &Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split(' ').nth(1).unwrap().parse().unwrap())
        .collect()
}

fn now_millis() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[test]
fn pause_stops_every_restart_at_once_and_resume_completes_the_rest() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let journal = dir.join("restarts.journal");
    let requests = 120;
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
    assert!(status.success(), "publish failed: {stderr}");
    let journal_setting = format!("restarter.journal={}", journal.display());
    let service = Mandrill::run(
        &dir,
        &[
            "--db",
            &db,
            "--broker",
            &db,
            "--until-idle",
            "--max-in-flight",
            "4",
            "--set",
            "restarter.min_latency=50ms",
            "--set",
            "restarter.max_latency=50ms",
            "--set",
            "restarter.failure_rate=0",
            "--set",
            &journal_setting,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while journal_lines(&journal) < 10 {
        assert!(Instant::now() < deadline, "no restarts began");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "pause",
            "--db",
            &db,
            "--reason",
            "game day over",
            "--by",
            "sre",
        ],
        &[],
    );
    assert!(status.success(), "pause failed: {stderr}");
    let paused_at = now_millis();
    assert!(stdout.contains("paused by sre (game day over)"), "{stdout}");
    // Restarts already claimed when the pause committed may still be
    // issued (at most the handlers in flight); nothing is claimed after.
    let at_pause = journal_lines(&journal);
    service.wait_for(
        "restarts paused (kill switch): pulling stops until resumed",
        1,
    );
    std::thread::sleep(Duration::from_secs(2));
    let settled = journal_lines(&journal);
    assert!(
        settled <= at_pause + 4,
        "{at_pause} at pause, {settled} after"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        journal_lines(&journal),
        settled,
        "restarts went on while paused"
    );
    assert!(
        settled < requests,
        "the pause came too late to prove anything"
    );

    let (status, stdout, _) = mandrill(&dir, &["status", "--db", &db], &[]);
    assert!(status.success());
    assert!(
        stdout.contains("PAUSED") && stdout.contains("game day over"),
        "{stdout}"
    );

    // By the journal's clock: nothing issued later than poll_interval (1 s)
    // + 1 s after `pause` returned.
    let late: Vec<i64> = journal_times(&journal)
        .into_iter()
        .filter(|at| *at > paused_at + 2_000)
        .collect();
    assert!(late.is_empty(), "restarts issued while paused: {late:?}");
    let (status, _, stderr) = mandrill(&dir, &["resume", "--db", &db, "--by", "sre"], &[]);
    assert!(status.success(), "resume failed: {stderr}");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    assert_eq!(
        journal_lines(&journal),
        requests,
        "each request restarted once"
    );
    let entries = history(&db);
    assert_eq!(entries.len(), requests);
    assert!(
        entries
            .iter()
            .all(|e| e.status == Status::Restarted && e.attempts == 1),
        "a pause costs no attempt"
    );
    let (_, stdout, _) = mandrill(&dir, &["status", "--db", &db, "--json"], &[]);
    let status: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["paused"], false);
}

/// `mandrill resume` when nothing is paused says so truthfully (it used to
/// say restarts "may be claimed again", as if it had lifted a pause), exits
/// 0 and records nothing: the switch keeps its last turn.
#[test]
fn resume_with_nothing_paused_says_so_and_records_nothing() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let (status, stdout, stderr) = mandrill(&dir, &["resume", "--db", &db, "--by", "sre"], &[]);
    assert!(status.success(), "resume failed: {stderr}");
    assert_eq!(
        stdout.trim(),
        "nothing was paused: restarts were not paused, and no resume was recorded"
    );
    let switch = |db: &str| {
        let (status, stdout, stderr) = mandrill(&dir, &["status", "--db", db, "--json"], &[]);
        assert!(status.success(), "status failed: {stderr}");
        serde_json::from_str::<serde_json::Value>(stdout.trim()).unwrap()["switch"].clone()
    };
    assert_eq!(switch(&db)["by"], serde_json::Value::Null);

    // Paused, then resumed: said as before.
    let (status, _, stderr) = mandrill(&dir, &["pause", "--db", &db, "--by", "sre"], &[]);
    assert!(status.success(), "pause failed: {stderr}");
    let (status, stdout, _) = mandrill(
        &dir,
        &["resume", "--db", &db, "--by", "sre", "--reason", "done"],
        &[],
    );
    assert!(status.success());
    assert!(
        stdout.starts_with("resumed by sre (done): restarts may be claimed again"),
        "{stdout}"
    );
    let (status, stdout, _) = mandrill(&dir, &["resume", "--db", &db, "--by", "ana"], &[]);
    assert!(status.success());
    assert!(stdout.starts_with("nothing was paused"), "{stdout}");
    assert_eq!(
        switch(&db)["by"],
        "sre",
        "the second resume recorded nothing"
    );
}
