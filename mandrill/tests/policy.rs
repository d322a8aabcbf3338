//! `mandrill policy check`: the guards' verdicts from the real binary,
//! at a given time, without acting.

mod support;

use std::fs;

use serde_json::Value;
use support::{mandrill, temp_dir};

const CONFIG: &str = r#"
[restarter]
kind = "command"
[restarter.command]
argv = ["true", "{host}"]
[safety]
allow = ["cattle-*"]
[safety.calendar]
timezone = "Europe/Stockholm"
excluded_dates = ["12-25"]
"#;

#[test]
fn policy_check_prints_each_guards_verdict_at_a_given_time_without_acting() {
    let (_keep, dir) = temp_dir();
    fs::write(dir.join("mandrill.toml"), CONFIG).unwrap();
    let check = |args: &[&str]| {
        let mut all = vec!["policy", "check", "--config", "mandrill.toml"];
        all.extend_from_slice(args);
        mandrill(&dir, &all, &[])
    };

    // Sunday evening: eligible, but the calendar defers to Monday 09:00 CET.
    let (status, out, err) = check(&["--at", "2026-11-22T20:00:00Z", "cattle-ab12", "pet-01"]);
    assert!(status.success(), "{err}");
    assert_eq!(
        out,
        "cattle-ab12\n  eligibility: allow\n  calendar: defer until 2026-11-23 09:00 CET: \
         outside Mon–Fri 09:00–15:00 Europe/Stockholm; next window opens 2026-11-23 09:00 CET\n\
         pet-01\n  eligibility: deny: pet-01 matches no safety.allow pattern\n  calendar: \
         defer until 2026-11-23 09:00 CET: outside Mon–Fri 09:00–15:00 Europe/Stockholm; \
         next window opens 2026-11-23 09:00 CET\n"
    );

    // The second the window opens, as JSON.
    let (status, out, err) = check(&["--json", "--at", "2026-11-23T08:00:00Z", "cattle-ab12"]);
    assert!(status.success(), "{err}");
    let line: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(line["instance"], "cattle-ab12");
    assert_eq!(line["eligibility"]["verdict"], "allow");
    assert_eq!(line["calendar"]["verdict"], "allow");
    assert_eq!(line["dry_run"], true);

    // Christmas (a yearly exclusion) on a Friday, as JSON.
    let (_, out, _) = check(&["--json", "--at", "2026-12-25T10:00:00Z", "cattle-ab12"]);
    let line: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(line["calendar"]["verdict"], "defer");
    assert_eq!(line["calendar"]["until"], "2026-12-28T08:00:00Z");
    let reason = line["calendar"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("2026-12-25 is an excluded date"),
        "{reason}"
    );

    // Bad input is a usage error, and nothing was created in the directory.
    let (status, _, err) = check(&["--at", "yesterday", "cattle-ab12"]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--at \"yesterday\""), "{err}");
    let (status, _, err) = check(&["not_a_label"]);
    assert_eq!(status.code(), Some(2), "{err}");
    let entries: Vec<_> = fs::read_dir(&dir).unwrap().collect();
    assert_eq!(entries.len(), 1, "only the config file");
}
