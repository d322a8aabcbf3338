//! Recovery objectives through the real binary, and `deploy/alerts.yml`:
//! a group whose hosts never come back breaches its objective and is
//! paused, alone (another group's hosts are still restarted), with its
//! cause recorded and shown by `mandrill status` and `/metrics`, until
//! `mandrill resume --group`; the alerting rules pass promtool's check
//! and unit tests, and name only metrics a real scrape exports. One file
//! past 400 lines: one feature, from its configuration to its alerts.

mod support;

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mandrill::Status;
use mandrill::Story;
use serde_json::Value;
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

/// Healthy unless the host is one of group `slow`'s: those never come back.
const PROBE: &str = "#!/bin/sh\ncase \"$1\" in slow-*) exit 1 ;; esac\nexit 0\n";

fn write_config(dir: &Path) {
    let db = sqlite_url(dir);
    fs::write(
        dir.join("hosts.toml"),
        "[[hosts]]\nname = \"slow-1\"\ngroup = \"slow\"\n\
         [[hosts]]\nname = \"slow-2\"\ngroup = \"slow\"\n\
         [[hosts]]\nname = \"fast-1\"\ngroup = \"fast\"\n\
         [[hosts]]\nname = \"fast-2\"\ngroup = \"fast\"\n",
    )
    .unwrap();
    let probe = dir.join("probe.sh");
    fs::write(&probe, PROBE).unwrap();
    let mut permissions = fs::metadata(&probe).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    fs::set_permissions(&probe, permissions).unwrap();
    let config = format!(
        "[broker]\nurl = {db:?}\n[store]\nurl = {db:?}\n\
         [restarter]\nkind = \"command\"\n\
         [restarter.command]\nargv = [\"true\", \"{{instance_name}}\"]\n\
         [verify]\nprobe = \"command\"\nargv = [{probe:?}, \"{{instance_name}}\"]\n\
         initial_delay = \"0s\"\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
         [inventory]\nfile = \"hosts.toml\"\n\
         [safety]\ndry_run = false\nrequire_signed = false\nallow = [\"slow-*\", \"fast-*\"]\n\
         poll_interval = \"200ms\"\n\
         # The group's pause, not the whole fleet's, is under test.\n\
         pause_on_unrecovered = false\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n\
         [safety.rate]\ngroup_max = 0\n[safety.budget]\nmax_disrupted = 0\n\n\
         [[recovery_objective]]\ngroup = \"slow\"\nmax = \"30s\"\npause_on_breach = true\n\n\
         [[recovery_objective]]\ngroup = \"fast\"\npercentile = 50\nmax = \"30s\"\n",
        probe = probe.display().to_string(),
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
}

fn publish(dir: &Path, instance: &str) {
    let (status, _, stderr) = mandrill(
        dir,
        &["publish", "--config", "mandrill.toml", instance],
        &[],
    );
    assert!(status.success(), "publish {instance}: {stderr}");
}

/// Polls `probe` until it returns `Some`, or panics after the deadline
/// with the story of every request in the store at `db`.
fn wait_until<T>(db: &str, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:#?}",
            {
                let instances = ["slow-1", "slow-2", "fast-1", "fast-2"];
                instances.map(|instance| story_of(db, instance))
            }
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The status of `instance`'s request, once it has a row.
fn status_of(db: &str, instance: &str) -> Option<Status> {
    history(db)
        .into_iter()
        .find(|entry| entry.instance_name.as_deref() == Some(instance))
        .map(|entry| entry.status)
}

/// Everything recorded about `instance`'s request.
fn story_of(db: &str, instance: &str) -> Option<Story> {
    let entry = history(db)
        .into_iter()
        .find(|entry| entry.instance_name.as_deref() == Some(instance))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let records = mandrill::Records::open(db).await.unwrap();
        let story = records.story(entry.message_id?).await.unwrap();
        records.close().await;
        story
    })
}

/// `GET path` over HTTP/1.1: the body.
fn get(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

fn status_json(dir: &Path) -> Value {
    let (status, stdout, stderr) =
        mandrill(dir, &["status", "--config", "mandrill.toml", "--json"], &[]);
    assert!(status.success(), "status: {stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// Every `mandrill_*` name in `deploy/alerts.yml`'s expressions (each
/// on its `expr:` line; promtool checks the file in full).
fn alert_metric_names() -> Vec<String> {
    let rules =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/alerts.yml"))
            .unwrap();
    let mut names: Vec<String> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("expr:"))
        .flat_map(|expr| {
            expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("mandrill_"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn a_breached_objective_pauses_its_group_alone_until_resumed() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    write_config(&dir);
    publish(&dir, "slow-1");
    publish(&dir, "fast-1");
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    let addr = service.wait_for("admin listening", 1)[0]["fields"]["addr"]
        .as_str()
        .unwrap()
        .to_owned();

    // slow-1 never comes back: the objective is breached, the group paused.
    let paused = service.wait_for("group paused until `mandrill resume --group`", 1);
    assert_eq!(paused[0]["fields"]["group"], "slow", "{paused:?}");
    assert_eq!(status_of(&db, "slow-1"), Some(Status::Unrecovered));
    wait_until(&db, "fast-1 restarted", || {
        (status_of(&db, "fast-1") == Some(Status::Restarted)).then_some(())
    });

    // A host of the paused group is deferred, naming the pause and its
    // cause; the other group's host is restarted.
    publish(&dir, "slow-2");
    publish(&dir, "fast-2");
    wait_until(&db, "fast-2 restarted", || {
        (status_of(&db, "fast-2") == Some(Status::Restarted)).then_some(())
    });
    let deferral = wait_until(&db, "slow-2 deferred by the group pause", || {
        let story = story_of(&db, "slow-2")?;
        story
            .decisions
            .into_iter()
            .find(|decision| decision.guard == "group pause")
    });
    assert_eq!(deferral.verdict, "deferred");
    assert!(
        deferral.reason.contains("group slow")
            && deferral.reason.contains("recovery objective breached"),
        "{deferral:?}"
    );
    assert!(story_of(&db, "slow-2").unwrap().attempts.is_empty());

    // `status` shows the pause with its cause, and each group's recovery
    // against its objective.
    let status = status_json(&dir);
    let pauses = status["group_pauses"].as_array().unwrap();
    assert_eq!(pauses.len(), 1, "{status}");
    assert_eq!(pauses[0]["group"], "slow");
    assert_eq!(pauses[0]["by"], "recovery-objective");
    assert!(
        pauses[0]["reason"]
            .as_str()
            .unwrap()
            .contains("p95 recovery unrecovered exceeds objective 30.0s"),
        "{status}"
    );
    let objectives = status["recovery_objectives"].as_array().unwrap();
    assert_eq!(objectives[0]["group"], "slow");
    assert_eq!(objectives[0]["met"], false);
    assert_eq!(objectives[0]["at_percentile"], "unrecovered");
    assert_eq!(objectives[1]["group"], "fast");
    assert_eq!(objectives[1]["met"], true);
    assert_eq!(objectives[1]["samples"], 2);
    let (code, text, _) = mandrill(&dir, &["status", "--config", "mandrill.toml"], &[]);
    assert!(code.success());
    assert!(text.contains("group slow: PAUSED"), "{text}");
    assert!(
        text.contains("recovery slow:") && text.contains("BREACHED"),
        "{text}"
    );

    // /metrics, the same; and every metric the alerting rules use is one
    // the running binary exports.
    let metrics = get(&addr, "/metrics");
    for line in [
        "mandrill_paused 0",
        "mandrill_group_paused{group=\"slow\"} 1",
        "mandrill_group_paused{group=\"fast\"} 0",
        "mandrill_recovery_objective_met{group=\"slow\"} 0",
        "mandrill_recovery_objective_met{group=\"fast\"} 1",
        "mandrill_recovery_objective_seconds{group=\"slow\"} 30.000",
        "mandrill_group_recovery_seconds{group=\"slow\",percentile=\"95\"} +Inf",
        "mandrill_group_recovery_samples{group=\"fast\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    // The median objective of `fast` is one series, not two.
    assert_eq!(
        metrics
            .matches("mandrill_group_recovery_seconds{group=\"fast\",percentile=\"50\"}")
            .count(),
        1,
        "{metrics}"
    );
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's `prometheus` package; .ci/run installs it)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let names = alert_metric_names();
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        assert!(
            metrics.contains(&format!("\n# TYPE {name} ")),
            "{name} (deploy/alerts.yml) is not exported:\n{metrics}"
        );
    }

    // An operator lifts the pause: slow-2 is restarted (and, its probe
    // failing, unrecovered), and the same breach does not pause again.
    let (code, stdout, stderr) = mandrill(
        &dir,
        &["resume", "--config", "mandrill.toml", "--group", "slow"],
        &[],
    );
    assert!(code.success(), "{stderr}");
    assert!(stdout.contains("group slow resumed"), "{stdout}");
    wait_until(&db, "slow-2 restarted after the resume", || {
        (status_of(&db, "slow-2") == Some(Status::Unrecovered)).then_some(())
    });
    assert_eq!(status_json(&dir)["group_pauses"], serde_json::json!([]));

    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "{lines:?}");
}

/// A reload that adds `[[recovery_objective]]` puts it in force in the
/// running service (its log says "setting reloaded"): the admin `/api/status`
/// judges it.
#[test]
fn a_reload_puts_an_added_recovery_objective_in_force() {
    let (_guard, dir) = temp_dir();
    write_config(&dir);
    let file = dir.join("mandrill.toml");
    let with = fs::read_to_string(&file).unwrap();
    let (without, _) = with.split_once("\n\n[[recovery_objective]]").unwrap();
    fs::write(&file, without).unwrap();
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    let addr = service.wait_for("admin listening", 1)[0]["fields"]["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    service.wait_for("mandrill started", 1);
    let judged = |addr: &str| -> Vec<Value> {
        let status: Value = serde_json::from_str(&get(addr, "/api/status")).unwrap();
        status["recovery_objectives"].as_array().unwrap().clone()
    };
    assert!(judged(&addr).is_empty());
    fs::write(&file, with).unwrap();
    service.signal("HUP");
    service.wait_for("configuration reloaded", 1);
    let objectives = judged(&addr);
    let groups: Vec<&str> = objectives
        .iter()
        .map(|objective| objective["group"].as_str().unwrap())
        .collect();
    assert_eq!(groups, ["slow", "fast"], "{objectives:?}");
    service.signal("TERM");
    assert!(service.wait_exit().0.success());
}

#[test]
fn pause_and_resume_of_a_group_need_a_shared_store_and_say_what_they_did() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let by_hand = ["--db", db.as_str(), "--group", "web", "--by", "ana"];
    let (code, stdout, stderr) = mandrill(
        &dir,
        &[&["pause"][..], &by_hand, &["--reason", "game day"]].concat(),
        &[],
    );
    assert!(code.success(), "{stderr}");
    assert!(
        stdout.contains("group web paused by ana (game day)"),
        "{stdout}"
    );
    let (_, stdout, _) = mandrill(
        &dir,
        &[&["pause"][..], &by_hand, &["--reason", "again"]].concat(),
        &[],
    );
    assert!(stdout.contains("was paused already"), "{stdout}");
    let (code, stdout, _) = mandrill(&dir, &["status", "--db", &db, "--json"], &[]);
    assert!(code.success());
    let status: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["group_pauses"][0]["reason"], "game day");
    // The kill switch is not turned by a group's pause.
    assert_eq!(status["paused"], false);
    let (code, stdout, _) = mandrill(&dir, &[&["resume"][..], &by_hand].concat(), &[]);
    assert!(code.success());
    assert!(stdout.contains("group web resumed by ana"), "{stdout}");
    let (_, stdout, _) = mandrill(&dir, &[&["resume"][..], &by_hand].concat(), &[]);
    assert!(stdout.contains("group web was not paused"), "{stdout}");
}

#[test]
fn a_bad_recovery_objective_is_refused_at_start_naming_its_key() {
    let (_guard, dir) = temp_dir();
    fs::write(
        dir.join("bad.toml"),
        "[[recovery_objective]]\ngroup = \"web\"\nmax = \"2m\"\npercentile = 0\n",
    )
    .unwrap();
    let (code, _, stderr) = mandrill(&dir, &["run", "--simulate", "--config", "bad.toml"], &[]);
    assert_eq!(code.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("recovery_objective[0].percentile"),
        "{stderr}"
    );
}

#[test]
fn the_alerting_rules_pass_promtool_check_and_their_unit_tests() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let output = Command::new("promtool")
            .args(args)
            .current_dir(&deploy)
            .output()
            .expect("promtool (Debian's `prometheus` package; .ci/run installs it)");
        assert!(
            output.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
