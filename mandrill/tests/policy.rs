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
         outside Mon–Fri 09:00–15:00 Europe/Stockholm; next window opens 2026-11-23 09:00 CET\n  \
         expiry: published then, expires 2026-11-26 15:00 CET if still waiting \
         (safety.max_defer 1day of open calendar time; closed time does not count)\n  \
         limits: group cattle: at most 1 restart per day, at most 1 host disrupted at once \
         (counted against the store when claimed)\n\
         pet-01\n  eligibility: deny: pet-01 matches no safety.allow pattern\n  calendar: \
         defer until 2026-11-23 09:00 CET: outside Mon–Fri 09:00–15:00 Europe/Stockholm; \
         next window opens 2026-11-23 09:00 CET\n  expiry: published then, expires \
         2026-11-26 15:00 CET if still waiting (safety.max_defer 1day of open calendar time; \
         closed time does not count)\n  limits: group pet: at most 1 restart per \
         day, at most 1 host disrupted at once (counted against the store when claimed)\n"
    );

    // The second the window opens, as JSON.
    let (status, out, err) = check(&["--json", "--at", "2026-11-23T08:00:00Z", "cattle-ab12"]);
    assert!(status.success(), "{err}");
    let line: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(line["instance"], "cattle-ab12");
    assert_eq!(line["eligibility"]["verdict"], "allow");
    assert_eq!(line["calendar"]["verdict"], "allow");
    assert_eq!(line["dry_run"], true);
    assert_eq!(line["group"], "cattle");
    // Published at the opening: a day of open time is four working days.
    assert_eq!(line["expires_at"], "2026-11-26T14:00:00Z");
    assert_eq!(line["max_defer"], "1day");

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

/// Issue 37's trap: on a Saturday, with Mon–Fri 09:00–15:00 and a day's
/// `max_defer`, the check said "defer until Monday" and nothing about the
/// expiry (and the worker expired the request before Monday). Now it says
/// when the request would expire: a day of open time after Monday's
/// opening, closed time not counted.
#[test]
fn policy_check_on_a_saturday_says_the_request_waits_for_monday_and_when_it_expires() {
    let (_keep, dir) = temp_dir();
    fs::write(
        dir.join("mandrill.toml"),
        "[restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"true\"]\n\
         [safety]\nallow = [\"cattle-*\"]\nmax_defer = \"1day\"\n\
         [safety.calendar]\nhours = [\"09:00-15:00\"]\n",
    )
    .unwrap();
    let (status, out, err) = mandrill(
        &dir,
        &[
            "policy",
            "check",
            "--config",
            "mandrill.toml",
            "--at",
            "2026-11-28T10:00:00Z",
            "cattle-ab12",
        ],
        &[],
    );
    assert!(status.success(), "{err}");
    assert!(
        out.contains("calendar: defer until 2026-11-30 09:00 UTC"),
        "{out}"
    );
    assert!(
        out.contains(
            "expiry: published then, expires 2026-12-03 15:00 UTC if still waiting \
             (safety.max_defer 1day of open calendar time; closed time does not count)"
        ),
        "{out}"
    );
}

/// A leashed candidate restarts nothing, so its dry runs count against no
/// limit, as the service's do; and the leash an operator turned in the
/// store decides over the candidate's own `safety.dry_run`, as it does
/// for every instance.
#[test]
fn policy_replay_counts_no_dry_run_and_obeys_the_stores_leash() {
    let (_keep, dir) = temp_dir();
    let db = support::sqlite_url(&dir);
    let mut publish = vec!["publish", "--broker", &db];
    publish.extend(["cattle-01", "cattle-02", "cattle-03", "cattle-04"]);
    let (status, _, err) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "{err}");
    let run = ["run", "--db", &db, "--broker", &db, "--until-idle"];
    let (status, _, err) = mandrill(&dir, &run, &[("MANDRILL_RESTARTER__FAILURE_RATE", "0")]);
    assert!(status.success(), "{err}");
    fs::write(
        dir.join("candidate.toml"),
        "[safety]\ndry_run = true\n[safety.rate]\ngroup_max = 2\nhost_cooldown = \"1h\"\n",
    )
    .unwrap();
    let replay = || {
        let args = [
            "policy",
            "replay",
            "--config",
            "candidate.toml",
            "--db",
            &db,
            "--since",
            "1h",
        ];
        let (status, out, err) = mandrill(&dir, &args, &[]);
        assert!(status.success(), "{err}");
        out
    };
    let out = replay();
    assert!(
        out.ends_with(
            "4 requests decided in the last hour replayed: 4 would be decided differently \
             (4 restart → dry-run)\n"
        ),
        "{out}"
    );
    let (status, _, err) = mandrill(&dir, &["unleash", "--db", &db, "--reason", "game day"], &[]);
    assert!(status.success(), "{err}");
    let out = replay();
    assert!(
        out.ends_with(
            "4 requests decided in the last hour replayed: 2 would be decided differently \
             (2 restart → defer)\n"
        ),
        "{out}"
    );
}

#[test]
fn policy_replay_shows_what_a_candidate_policy_would_have_decided_differently() {
    let (_keep, dir) = temp_dir();
    let db = support::sqlite_url(&dir);
    let names = [
        "cattle-01",
        "cattle-02",
        "cattle-03",
        "cattle-04",
        "pet-01",
        "pet-02",
    ];
    let mut publish = vec!["publish", "--broker", &db];
    publish.extend(names);
    let (status, _, err) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "{err}");
    let (status, _, err) = mandrill(
        &dir,
        &[
            "run",
            "--db",
            &db,
            "--broker",
            &db,
            "--until-idle",
            "--set",
            "restarter.failure_rate=0",
        ],
        &[],
    );
    assert!(status.success(), "{err}");
    // The candidate: no pets, and two restarts per group per day.
    fs::write(
        dir.join("candidate.toml"),
        "[safety]\ndeny = [\"pet-*\"]\n[safety.rate]\ngroup_max = 2\n",
    )
    .unwrap();
    let replay = |json: bool| {
        let mut args = vec![
            "policy",
            "replay",
            "--config",
            "candidate.toml",
            "--db",
            &db,
            "--since",
            "1h",
        ];
        if json {
            args.push("--json");
        }
        let (status, out, err) = mandrill(&dir, &args, &[]);
        assert!(status.success(), "{err}");
        out
    };
    let out = replay(false);
    assert!(
        out.ends_with(
            "6 requests decided in the last hour replayed: 4 would be decided differently \
             (2 restart → defer, 2 restart → deny)\n"
        ),
        "{out}"
    );
    assert_eq!(
        out.matches("would be deny: denied by safety.deny: pet-0")
            .count(),
        2,
        "{out}"
    );
    assert_eq!(
        out.matches("would be defer: deferred by rate limit: group cattle had 2 of its 2")
            .count(),
        2,
        "{out}"
    );
    let lines: Vec<Value> = replay(true)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[4]["changed"], 4);
    assert!(lines[..4].iter().all(|l| l["recorded"] == "restarted"));
    // Nothing was changed by replaying: the history is as it was.
    let history = support::history(&db);
    assert_eq!(history.len(), 6);
    assert!(history.iter().all(|e| e.status.as_str() == "restarted"));
}
