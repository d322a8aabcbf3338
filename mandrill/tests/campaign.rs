//! `mandrill campaign` and `mandrill wait` through the real binary: a real
//! inventory file of ten hosts in one group, a requester key made by
//! `mandrill keygen`, one SQLite file as queue and store, the `command`
//! backend writing when each restart starts and ends, and a `command`
//! verification probe that fails for a host marked down.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use mandrill::Status;
use serde_json::Value;
use support::{Mandrill, history, mandrill, sqlite_url, temp_dir};

const GROUP_SIZE: usize = 10;

fn hosts() -> Vec<String> {
    (1..=GROUP_SIZE).map(|i| format!("cattle-{i:02}")).collect()
}

/// The inventory, a requester key, and a configuration whose budget lets
/// `max_disrupted` hosts down at once. Returns the events file the backend
/// writes (`start NAME` / `end NAME`).
fn setup(dir: &Path, max_disrupted: u32) -> PathBuf {
    let (status, _, stderr) = mandrill(dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    let mut inventory = String::new();
    for name in hosts() {
        inventory.push_str(&format!("[[hosts]]\nname = {name:?}\ngroup = \"cattle\"\n"));
    }
    inventory.push_str("[[hosts]]\nname = \"pet-01\"\ngroup = \"pets\"\n");
    fs::write(dir.join("hosts.toml"), inventory).unwrap();
    fs::create_dir(dir.join("down")).unwrap();
    let events = dir.join("events");
    let journal = dir.join("restarts.journal");
    let db = sqlite_url(dir);
    let script = format!(
        "echo \"start $1\" >> {events}; sleep 0.2; echo \"end $1\" >> {events}",
        events = events.display()
    );
    let config = format!(
        "[broker]\nurl = {db:?}\n[broker.sqlite]\npoll_interval = \"5ms\"\n\
         [store]\nurl = {db:?}\n\
         [restarter]\nkind = \"command\"\njournal = {journal:?}\n\
         [restarter.command]\nargv = [\"sh\", \"-c\", {script:?}, \"sh\", \"{{instance_name}}\"]\n\
         [verify]\nprobe = \"command\"\n\
         argv = [\"test\", \"!\", \"-e\", \"{down}/{{instance_name}}\"]\n\
         initial_delay = \"0s\"\ninterval = \"50ms\"\ntimeout = \"1s\"\n\
         [inventory]\nfile = \"hosts.toml\"\n\
         [safety]\ndry_run = false\nallow = [\"cattle-*\", \"pet-*\"]\npause_on_unrecovered = false\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n\
         [safety.rate]\ngroup_max = 0\n\
         [safety.budget]\nmax_disrupted = {max_disrupted}\nretry = \"100ms\"\n\n\
         [[requesters]]\nname = \"chaos\"\npublic_key_file = \"chaos.pub\"\nallow = [\"cattle-*\"]\n",
        journal = journal.display().to_string(),
        down = dir.join("down").display(),
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
    events
}

fn run(dir: &Path, args: &[&str]) -> (ExitStatus, String, String) {
    let mut all = args.to_vec();
    all.extend(["--config", "mandrill.toml"]);
    mandrill(dir, &all, &[])
}

/// `campaign start ARGS` signed as chaos: its stdout, which must succeed.
fn start(dir: &Path, args: &[&str]) -> String {
    let mut all = vec![
        "campaign",
        "start",
        "--group",
        "cattle",
        "--as",
        "chaos",
        "--key-file",
        "chaos.key",
    ];
    all.extend(args);
    let (status, out, stderr) = run(dir, &all);
    assert!(status.success(), "{out}{stderr}");
    out
}

/// The targets a `campaign start` printed, in order.
fn targets(out: &str) -> Vec<String> {
    out.lines()
        .filter(|line| line.starts_with("  "))
        .map(|line| line.split_whitespace().next().unwrap().to_owned())
        .collect()
}

/// `mandrill run --until-idle`, which must exit cleanly.
fn run_until_idle(dir: &Path) {
    let service = Mandrill::run(dir, &["--config", "mandrill.toml", "--until-idle"]);
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
}

fn status_json(dir: &Path, id: &str) -> Value {
    let (status, out, stderr) = run(dir, &["campaign", "status", id, "--json"]);
    assert!(status.success(), "{stderr}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn a_preview_prints_targets_and_acts_on_nothing() {
    let (_guard, dir) = temp_dir();
    let events = setup(&dir, 1);
    let out = start(&dir, &["--count", "3", "--preview"]);
    let chosen = targets(&out);
    assert_eq!(chosen.len(), 3, "{out}");
    assert!(chosen.iter().all(|host| hosts().contains(host)), "{out}");
    assert_eq!(
        out.lines().last(),
        Some("preview: nothing recorded, nothing published")
    );
    // No store, no queue (one file, never created), no restart.
    assert!(!dir.join("mandrill.db").exists(), "nothing written");
    assert!(!events.exists() && !dir.join("restarts.journal").exists());
}

/// Three of ten, one at a time (the budget), each verified recovered; the
/// `wait` started before the service exits 0 once all three are.
#[test]
fn count_3_of_10_restarts_exactly_3_never_more_than_the_budget_at_once_and_wait_exits_0() {
    let (_guard, dir) = temp_dir();
    let events = setup(&dir, 1);
    let out = start(&dir, &["--count", "3"]);
    let chosen = targets(&out);
    assert_eq!(chosen.len(), 3, "{out}");
    let id = out.lines().last().unwrap().to_owned();
    assert_eq!(
        uuid::Uuid::parse_str(&id).map(|_| ()),
        Ok(()),
        "the campaign id alone on the last line: {out}"
    );
    // Nothing received yet: not decided, so a short wait times out.
    let (status, waited, _) = run(&dir, &["wait", &id, "--timeout", "1s"]);
    assert_eq!(status.code(), Some(2), "{waited}");
    assert!(waited.contains("timed out"), "{waited}");

    let waiter = {
        let (dir, id) = (dir.clone(), id.clone());
        std::thread::spawn(move || run(&dir, &["wait", &id, "--timeout", "60s"]))
    };
    run_until_idle(&dir);
    let (status, waited, stderr) = waiter.join().unwrap();
    assert_eq!(status.code(), Some(0), "{waited}{stderr}");
    assert!(waited.ends_with("verdict: succeeded\n"), "{waited}");

    // Exactly the three targets were restarted, once each, one at a time.
    let journal = fs::read_to_string(dir.join("restarts.journal")).unwrap();
    let mut journaled: Vec<&str> = journal
        .lines()
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    journaled.sort_unstable();
    let mut expected: Vec<String> = chosen
        .iter()
        .map(|name| format!("{name}.example.net"))
        .collect();
    expected.sort_unstable();
    assert_eq!(journaled, expected, "{journal}");
    let events = fs::read_to_string(events).unwrap();
    let mut running = 0;
    for line in events.lines() {
        running += if line.starts_with("start") { 1 } else { -1 };
        assert!(
            running <= 1,
            "two restarts at once under a budget of 1: {events}"
        );
    }
    assert_eq!(events.lines().count(), 6, "{events}");

    // Every target's record: restarted, signed, naming the campaign.
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entries.len(), 3, "{entries:?}");
    for entry in &entries {
        assert_eq!(entry.status, Status::Restarted, "{entry:?}");
        assert!(entry.recovered_after.is_some(), "verified: {entry:?}");
        assert_eq!(entry.requested_by.as_deref(), Some("chaos"));
        assert!(
            entry
                .reason
                .as_deref()
                .unwrap()
                .starts_with(&format!("campaign {id}")),
            "{entry:?}"
        );
    }
    let status = status_json(&dir, &id);
    assert_eq!(status["verdict"], "succeeded", "{status}");
    assert_eq!(status["group"], "cattle");
    assert_eq!(status["requester"], "chaos");
    let targets = status["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 3);
    for target in targets {
        assert_eq!(target["state"], "restarted", "{target}");
        assert!(target["recovered_after"].as_f64().is_some(), "{target}");
    }
    // A request's own id is waited on too.
    let request = targets[0]["message_id"].as_str().unwrap();
    let (status, waited, _) = run(&dir, &["wait", request]);
    assert_eq!(status.code(), Some(0), "{waited}");
    // The text status names the verdict last.
    let (_, text, _) = run(&dir, &["campaign", "status", &id]);
    assert!(text.ends_with("verdict: succeeded\n"), "{text}");
}

/// One target whose probe never passes ends unrecovered: `wait` exits 1
/// naming it and why, and the other two are restarted all the same; the
/// game-day report shows the campaign with the same verdict per target.
#[test]
fn wait_exits_1_when_one_target_never_recovers_and_the_others_keep_their_record() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 3);
    let out = start(&dir, &["--count", "3"]);
    let chosen = targets(&out);
    let id = out.lines().last().unwrap().to_owned();
    let down = &chosen[1];
    fs::write(dir.join("down").join(down), "").unwrap();
    run_until_idle(&dir);

    let (status, waited, stderr) = run(&dir, &["wait", &id, "--timeout", "60s"]);
    assert_eq!(status.code(), Some(1), "{waited}{stderr}");
    assert!(
        waited.contains(&format!("{down} (")),
        "names the host: {waited}"
    );
    assert!(waited.contains("unrecovered"), "says why: {waited}");
    assert!(waited.ends_with("verdict: failed\n"), "{waited}");

    let status = status_json(&dir, &id);
    assert_eq!(status["verdict"], "failed");
    for target in status["targets"].as_array().unwrap() {
        let expected = if target["instance_name"] == down.as_str() {
            "unrecovered"
        } else {
            "restarted"
        };
        assert_eq!(target["state"], expected, "{target}");
    }
    // The game-day report has the campaign, judged alike.
    let (status, report, stderr) = run(&dir, &["report", "--since", "1h", "--format", "json"]);
    assert!(status.success(), "{stderr}");
    let report: Value = serde_json::from_str(&report).unwrap();
    let [campaign] = &report["campaigns"].as_array().unwrap()[..] else {
        panic!("one campaign: {report}")
    };
    assert_eq!(campaign["id"], id.as_str());
    assert_eq!(campaign["verdict"], "failed");
    let mut states: Vec<(String, String)> = campaign["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["host"].as_str().unwrap().into(),
                t["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    states.sort();
    let mut expected: Vec<(String, String)> = chosen
        .iter()
        .map(|host| {
            let state = if host == down {
                "unrecovered"
            } else {
                "restarted"
            };
            (host.clone(), state.to_owned())
        })
        .collect();
    expected.sort();
    assert_eq!(states, expected);
    let (_, markdown, _) = run(&dir, &["report", "--since", "1h"]);
    assert!(
        markdown.contains(&format!("## Campaign {id} over cattle: failed")),
        "{markdown}"
    );
    let entries = history(&sqlite_url(&dir));
    assert_eq!(
        entries
            .iter()
            .filter(|e| e.status == Status::Restarted)
            .count(),
        2,
        "{entries:?}"
    );
}

#[test]
fn a_majority_of_the_group_is_refused_unless_allowed() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    for size in [["--count", "6"], ["--percent", "60"]] {
        let (status, out, stderr) = run(
            &dir,
            &[
                "campaign",
                "start",
                "--group",
                "cattle",
                size[0],
                size[1],
                "--as",
                "chaos",
                "--key-file",
                "chaos.key",
            ],
        );
        assert_eq!(status.code(), Some(2), "{out}{stderr}");
        assert!(
            stderr.contains("majority") && stderr.contains("--allow-majority"),
            "{stderr}"
        );
        assert!(out.is_empty(), "{out}");
    }
    assert!(!dir.join("mandrill.db").exists(), "nothing written");
    let out = start(&dir, &["--count", "6", "--allow-majority", "--preview"]);
    assert_eq!(targets(&out).len(), 6, "{out}");
    // Half is not a majority.
    let out = start(&dir, &["--percent", "50", "--preview"]);
    assert_eq!(targets(&out).len(), 5, "{out}");
}

/// Inventory entries that share an address are one machine: a group of
/// ten machines, each listed under a second name too, is ten hosts to a
/// campaign, and no machine is drawn twice.
#[test]
fn aliases_neither_pad_a_campaigns_group_nor_make_a_machine_two_targets() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let mut inventory = String::new();
    for (i, name) in hosts().iter().enumerate() {
        for entry in [name.clone(), format!("{name}b")] {
            inventory.push_str(&format!(
                "[[hosts]]\nname = {entry:?}\ngroup = \"cattle\"\naddress = \"10.0.0.{}\"\n",
                i + 1
            ));
        }
    }
    fs::write(dir.join("hosts.toml"), inventory).unwrap();
    let out = start(&dir, &["--percent", "50", "--preview"]);
    let chosen = targets(&out);
    assert_eq!(chosen.len(), 5, "half of ten machines: {out}");
    assert!(chosen.iter().all(|host| hosts().contains(host)), "{out}");
    assert!(out.contains("5 of 10 hosts"), "{out}");
}

#[test]
fn bad_flag_combinations_fail_naming_the_flag() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let cases: [(&[&str], &str); 8] = [
        (
            &["--count", "3", "--percent", "20", "--preview"],
            "--percent",
        ),
        (&["--preview"], "--count"),
        (&["--count", "3"], "--as"),
        (&["--count", "0", "--preview"], "--count must be at least 1"),
        (&["--percent", "101", "--preview"], "--percent 101"),
        (
            &["--count", "3", "--spread", "2days", "--preview"],
            "safety.max_defer",
        ),
        (
            &["--count", "3", "--spread", "soon", "--preview"],
            "--spread",
        ),
        (
            &["--count", "1", "--preview", "--group", "nope"],
            "group nope has no host in the inventory",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["campaign", "start"];
        if !args.contains(&"--group") {
            all.extend(["--group", "cattle"]);
        }
        all.extend(args);
        let (status, out, stderr) = run(&dir, &all);
        assert_eq!(status.code(), Some(2), "{args:?}: {out}{stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // More targets than eligible hosts.
    let (status, _, stderr) = run(
        &dir,
        &[
            "campaign",
            "start",
            "--group",
            "cattle",
            "--count",
            "11",
            "--allow-majority",
            "--preview",
        ],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("eligible"), "{stderr}");
    assert!(!dir.join("mandrill.db").exists(), "nothing written");
}

/// With `--spread`, the first target goes at once and the second waits
/// for its signed `not_before`: deferred by that guard, never restarted
/// early.
#[test]
fn a_spread_target_waits_for_its_time_deferred_by_not_before() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let out = start(&dir, &["--count", "2", "--spread", "2h"]);
    let chosen = targets(&out);
    let id = out.lines().last().unwrap().to_owned();
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    let deadline = std::time::Instant::now() + support::DEADLINE;
    let status = loop {
        let status = status_json(&dir, &id);
        let states: Vec<&str> = status["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["state"].as_str().unwrap())
            .collect();
        if states == ["restarted", "deferred"] {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    service.signal("TERM");
    let (exit, lines) = service.wait_exit();
    assert!(exit.success(), "{lines:?}");
    let later = &status["targets"][1];
    assert_eq!(later["instance_name"], chosen[1].as_str());
    let detail = later["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("deferred by not_before: its publisher asked for no restart before"),
        "{detail}"
    );
    assert_eq!(status["verdict"], "in-progress");
    let journal = fs::read_to_string(dir.join("restarts.journal")).unwrap();
    assert_eq!(journal.lines().count(), 1, "only the first: {journal}");
    let (code, waited, _) = run(&dir, &["wait", &id, "--timeout", "1s"]);
    assert_eq!(code.code(), Some(2), "{waited}");
    assert!(waited.contains("deferred by not_before"), "{waited}");
}

/// A target whose request is rejected (its signature no longer verifies:
/// the requester's key was replaced) has no record of its own, only the
/// rejection: `wait` finds it and exits 1 saying why.
#[test]
fn wait_exits_1_when_a_target_is_rejected() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let out = start(&dir, &["--count", "1"]);
    let id = out.lines().last().unwrap().to_owned();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "other"], &[]);
    assert!(status.success(), "{stderr}");
    let config = fs::read_to_string(dir.join("mandrill.toml")).unwrap();
    fs::write(
        dir.join("mandrill.toml"),
        config.replace("chaos.pub", "other.pub"),
    )
    .unwrap();
    run_until_idle(&dir);
    let (status, waited, stderr) = run(&dir, &["wait", &id, "--timeout", "60s"]);
    assert_eq!(status.code(), Some(1), "{waited}{stderr}");
    assert!(
        waited.contains("rejected: signature rejected: the signature does not verify"),
        "{waited}"
    );
    let journal = fs::read_to_string(dir.join("restarts.journal")).unwrap_or_default();
    assert_eq!(journal, "", "nothing restarted");
}

/// A target's recorded error may quote a configured secret (here the
/// backend's output): `campaign status` masks it, in its JSON too, the form
/// automation reads.
#[test]
fn campaign_status_masks_a_secret_its_recorded_error_quotes_in_json_too() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let secret = "tok-S3CRET-5e1f";
    let config = fs::read_to_string(dir.join("mandrill.toml")).unwrap();
    let failing = format!("argv = [\"sh\", \"-c\", \"echo {secret} >&2; exit 1\"]");
    let config = config
        .lines()
        .map(|line| {
            if line.starts_with("argv = [\"sh\"") {
                &failing
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    fs::write(
        dir.join("mandrill.toml"),
        format!("[worker]\nmax_attempts = 1\n[admin]\ntoken = {secret:?}\n{config}\n"),
    )
    .unwrap();
    let out = start(&dir, &["--count", "1"]);
    let id = out.lines().last().unwrap().to_owned();
    run_until_idle(&dir);
    let (status, text, stderr) = run(&dir, &["campaign", "status", &id]);
    assert!(status.success(), "{stderr}");
    assert!(text.contains("failed"), "the target failed: {text}");
    let json = status_json(&dir, &id).to_string();
    assert!(json.contains("failed"), "{json}");
    for shown in [&text, &json] {
        assert!(!shown.contains(secret), "{shown}");
        assert!(
            shown.contains("****"),
            "the error is shown, masked: {shown}"
        );
    }
}

/// A broker that cannot be opened leaves nothing behind: no campaign is
/// recorded (it would read in progress for good, its targets "published").
#[test]
fn a_start_whose_broker_cannot_be_opened_records_no_campaign() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let (status, out, stderr) = run(
        &dir,
        &[
            "campaign",
            "start",
            "--group",
            "cattle",
            "--count",
            "1",
            "--as",
            "chaos",
            "--key-file",
            "chaos.key",
            "--set",
            "broker.url=nats://127.0.0.1:1",
        ],
    );
    assert!(!status.success(), "{out}");
    assert!(
        stderr.contains("nothing was recorded or published"),
        "{stderr}"
    );
    let (status, report, stderr) = run(&dir, &["report", "--since", "1h", "--format", "json"]);
    assert!(status.success(), "{stderr}");
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["campaigns"], serde_json::json!([]), "{report}");
}

/// `setup`'s configuration with the default one restart per group per day
/// (`group_max = 1`) and deferred requests looked at again every second.
fn with_one_restart_a_day(dir: &Path) {
    let path = dir.join("mandrill.toml");
    let config = fs::read_to_string(&path).unwrap();
    let config = config.replace("group_max = 0", "group_max = 1").replace(
        "pause_on_unrecovered = false\n",
        "pause_on_unrecovered = false\nrecheck = \"1s\"\n",
    );
    fs::write(path, config).unwrap();
}

/// With one host disrupted at most and no spread, the preview says the
/// second and third targets wait for the first's disruption to end (the
/// claims would defer them), not that all three run at once.
#[test]
fn a_preview_counts_the_earlier_targets_against_the_disruption_budget() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let out = start(&dir, &["--count", "3", "--preview"]);
    let lines: Vec<&str> = out.lines().filter(|line| line.starts_with("  ")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(!lines[0].contains("disruption budget"), "{out}");
    for line in &lines[1..] {
        assert!(line.contains("deferred by disruption budget"), "{out}");
    }
}

/// Issue 37's trap: after one restart in the group, `campaign start
/// --preview` said nothing, and the real start's targets were deferred a
/// day by the rate limit. The preview now gives each target's verdict and
/// when it would run.
#[test]
fn a_preview_shows_each_targets_deferral_by_the_rate_limit_and_when_it_would_run() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 2);
    with_one_restart_a_day(&dir);
    start(&dir, &["--count", "1"]);
    run_until_idle(&dir);
    let out = start(&dir, &["--count", "2", "--preview"]);
    let lines: Vec<&str> = out.lines().filter(|line| line.starts_with("  ")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    for line in lines {
        // The second counts the first as restarted before it.
        assert!(
            line.contains("deferred by rate limit: group cattle had ")
                && line.contains(" of its 1 restart per day; a slot frees at ")
                && line.contains("at the earliest"),
            "{out}"
        );
    }
    assert!(out.ends_with("preview: nothing recorded, nothing published\n"));
    // What runs is the store's leash, not the file's `dry_run`: unleashed
    // by an operator, the preview says nothing of dry runs; leashed, it
    // says by whom and why.
    let leash_note = |args: &[&str]| {
        let (status, _, stderr) = run(&dir, args);
        assert!(status.success(), "{stderr}");
        let mut all = vec!["campaign", "start", "--group", "cattle", "--as", "chaos"];
        all.extend(["--key-file", "chaos.key", "--count", "1", "--preview"]);
        let (status, _, stderr) = run(&dir, &all);
        assert!(status.success(), "{stderr}");
        stderr
            .lines()
            .find(|line| line.contains("dry run"))
            .map(str::to_owned)
    };
    assert_eq!(leash_note(&["unleash", "--reason", "game day"]), None);
    let note = leash_note(&["leash", "--by", "ana", "--reason", "lunch"]).unwrap();
    assert!(note.contains("leashed (by ana: lunch)"), "{note}");
}

/// Issue 37's trap: raising `group_max` with SIGHUP left the deferred
/// targets parked for a day (nacked for 86,362 s). A deferral is nacked
/// for at most `safety.recheck`, so the reload reaches them then.
#[test]
fn a_reload_raising_group_max_wakes_deferred_campaign_targets_within_the_recheck() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 2);
    with_one_restart_a_day(&dir);
    start(&dir, &["--count", "1"]);
    run_until_idle(&dir);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    let out = start(&dir, &["--count", "2"]);
    let id = out.lines().last().unwrap().to_owned();
    let deadline = std::time::Instant::now() + support::DEADLINE;
    loop {
        let status = status_json(&dir, &id);
        let held = status["targets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| {
                t["detail"]
                    .as_str()
                    .unwrap()
                    .starts_with("deferred by rate limit")
            })
            .count();
        if held == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let path = dir.join("mandrill.toml");
    let config = fs::read_to_string(&path).unwrap();
    fs::write(&path, config.replace("group_max = 1", "group_max = 10")).unwrap();
    service.signal("HUP");
    service.wait_for("configuration reloaded", 1);
    let (status, waited, stderr) = run(&dir, &["wait", &id, "--timeout", "60s"]);
    assert_eq!(status.code(), Some(0), "{waited}{stderr}");
    assert!(waited.ends_with("verdict: succeeded\n"), "{waited}");
    service.signal("TERM");
    let (exit, lines) = service.wait_exit();
    assert!(exit.success(), "{lines:?}");
}

/// `campaign stop` records the targets not yet issued `cancelled`, with
/// who and why; `campaign status` and `wait` (exit 3) report it; their
/// messages, delivered afterwards, are found final and acked, never
/// restarted (and never taken for another request: exactly three
/// records, none rejected).
#[test]
fn campaign_stop_cancels_the_targets_not_yet_issued_and_wait_and_status_report_it() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let out = start(&dir, &["--count", "3"]);
    let id = out.lines().last().unwrap().to_owned();
    let (status, stopped, stderr) = run(
        &dir,
        &[
            "campaign",
            "stop",
            &id,
            "--reason",
            "game day over",
            "--by",
            "ana",
        ],
    );
    assert!(status.success(), "{stopped}{stderr}");
    assert!(
        stopped.starts_with(&format!("campaign {id} stopped by ana at ")),
        "{stopped}"
    );
    assert!(stopped.contains("3 target(s) cancelled now"), "{stopped}");
    assert!(stopped.ends_with("verdict: cancelled\n"), "{stopped}");

    let status = status_json(&dir, &id);
    assert_eq!(status["verdict"], "cancelled", "{status}");
    assert_eq!(status["stopped"]["by"], "ana");
    assert_eq!(status["stopped"]["reason"], "game day over");
    for target in status["targets"].as_array().unwrap() {
        assert_eq!(target["state"], "cancelled", "{target}");
        let detail = target["detail"].as_str().unwrap();
        assert!(
            detail.contains("stopped by ana") && detail.contains("game day over"),
            "{detail}"
        );
    }
    let (code, waited, _) = run(&dir, &["wait", &id, "--timeout", "10s"]);
    assert_eq!(code.code(), Some(3), "{waited}");
    assert!(waited.contains("stopped by ana"), "{waited}");
    assert!(waited.ends_with("verdict: cancelled\n"), "{waited}");

    // The messages are delivered after the stop: final, acked, nothing run.
    run_until_idle(&dir);
    let journal = fs::read_to_string(dir.join("restarts.journal")).unwrap_or_default();
    assert_eq!(journal, "", "nothing restarted");
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert!(
        entries.iter().all(|e| e.status == Status::Cancelled),
        "{entries:?}"
    );
    let (_, text, _) = run(&dir, &["campaign", "status", &id]);
    assert!(text.contains("stopped by ana at "), "{text}");
}

/// A real start warns, before it publishes, about a target that would
/// wait past its horizon: here the calendar is frozen for two days, longer
/// than a signed request's 24 hours, so it would be denied at the opening.
#[test]
fn a_real_start_warns_when_a_target_would_wait_past_its_token() {
    let (_guard, dir) = temp_dir();
    setup(&dir, 1);
    let now = jiff::Timestamp::now().as_second();
    let at = |second: i64| jiff::Timestamp::from_second(second).unwrap().to_string();
    let path = dir.join("mandrill.toml");
    let mut config = fs::read_to_string(&path).unwrap();
    config.push_str(&format!(
        "[[safety.calendar.freezes]]\nfrom = {:?}\nto = {:?}\nname = \"release\"\n",
        at(now - 3600),
        at(now + 2 * 86_400)
    ));
    fs::write(&path, config).unwrap();
    let (status, out, stderr) = run(
        &dir,
        &[
            "campaign",
            "start",
            "--group",
            "cattle",
            "--count",
            "1",
            "--as",
            "chaos",
            "--key-file",
            "chaos.key",
        ],
    );
    assert!(status.success(), "{out}{stderr}");
    assert!(
        out.contains("deferred by calendar: frozen (release)"),
        "{out}"
    );
    assert!(
        stderr.contains("would wait past its horizon: its signed token ends at")
            && stderr.contains("it would be denied then"),
        "{stderr}"
    );
}
