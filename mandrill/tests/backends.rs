//! The real backends end to end: `mandrill publish`, then `mandrill run`
//! with `restarter.kind = "ssh"` against a private sshd, restarting a real
//! process, verified by a probe, and checked in `mandrill history`.

mod services;
mod support;

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mandrill::Status;
use services::sshd::{KillOnDrop, PrivateSshd, alive};
use support::{Mandrill, history, mandrill, sqlite_url, temp_dir};

/// A calendar open at all times: these tests must not depend on the day
/// they run (with a real backend the default is Mon–Fri 09:00–15:00 UTC).
const ALWAYS_OPEN: &str = "\n[safety.calendar]\n\
    weekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
    hours = [\"00:00-24:00\"]\n";

/// Restarts the "app" (a long sleep): stops the one named in the PID file,
/// starts another, records its PID and says so.
const RESTART_APP: &str = r#"#!/bin/sh
set -eu
pidfile=$1
if [ -s "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
sleep 600 </dev/null >/dev/null 2>&1 &
echo $! > "$pidfile"
echo "app restarted as $! for $2"
"#;

/// Whether a log line's message starts with `prefix`.
fn logged(lines: &[serde_json::Value], prefix: &str) -> bool {
    lines.iter().any(|line| {
        line["fields"]["message"]
            .as_str()
            .is_some_and(|message| message.starts_with(prefix))
    })
}

fn read_pid(path: &std::path::Path) -> u32 {
    fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

#[test]
fn published_request_restarts_a_real_process_over_ssh_and_history_shows_its_recovery() {
    let sshd = PrivateSshd::start();
    let (_guard, dir) = temp_dir();
    let script = sshd.script("restart-app.sh", RESTART_APP);
    let pidfile = sshd.path("app.pid");
    let _app = KillOnDrop(pidfile.clone());
    let started = Command::new(&script)
        .arg(&pidfile)
        .arg("setup")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(started.success());
    let before = read_pid(&pidfile);

    let ssh = sshd.settings_toml(
        &[
            script.to_str().unwrap(),
            pidfile.to_str().unwrap(),
            "{instance_name}",
        ],
        "host_key",
    );
    let port = sshd.port;
    let db = sqlite_url(&dir);
    // The host map points every instance at the loopback sshd; the probe
    // checks that sshd answers again (the "host" came back).
    let config = format!(
        "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
         [worker]\nrestart_timeout = \"2m\"\n\n\
         [restarter]\nkind = \"ssh\"\n\n[restarter.ssh]\n{ssh}\n\
         [verify]\nprobe = \"tcp\"\nport = {port}\ninitial_delay = \"0s\"\ntimeout = \"20s\"\n\n\
         [safety]\nallow = [\"cattle-*\"]\n# Not about signing: unsigned requests, as before.\nrequire_signed = false\n{always_open}\n\
         [[hosts]]\npattern = \"cattle-*\"\naddress = \"127.0.0.1\"\n",
        always_open = ALWAYS_OPEN,
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();

    let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, "cattle-ab12"], &[]);
    assert!(status.success(), "publish failed: {stderr}");
    let service = Mandrill::run(
        &dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
    );
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "run failed: {lines:?}");

    let after = read_pid(&pidfile);
    assert_ne!(before, after, "the app was restarted");
    assert!(alive(after));
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(before) {
        assert!(Instant::now() < deadline, "the old app process lives on");
        std::thread::sleep(Duration::from_millis(50));
    }

    let entries = history(&db);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(entry.status, Status::Restarted);
    assert_eq!(entry.attempts, 1);
    assert!(entry.recovered_after.is_some(), "{entry:?}");
    let output = entry.output.as_deref().unwrap_or_default();
    assert!(
        output.contains(&format!("app restarted as {after} for cattle-ab12")),
        "{output:?}"
    );
    // And the operator sees it: the table has the recovery time, the JSON
    // line carries it in seconds.
    let (status, table, _) = mandrill(&dir, &["history", "--db", &db], &[]);
    assert!(status.success());
    assert!(
        table.contains("RECOVERED") && table.contains("restarted"),
        "{table}"
    );
    let (status, json, _) = mandrill(&dir, &["history", "--db", &db, "--json"], &[]);
    assert!(status.success());
    let line: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert!(line["recovered_after"].as_f64().is_some(), "{line}");
    assert_eq!(line["status"], "restarted");
}

#[test]
fn a_host_key_the_known_hosts_file_does_not_hold_is_dead_lettered_without_running_anything() {
    let sshd = PrivateSshd::start();
    let (_guard, dir) = temp_dir();
    let marker = sshd.path("ran");
    // A known_hosts file holding another host's key: strict checking refuses.
    let ssh = sshd.settings_toml(&["touch", marker.to_str().unwrap()], "other_host_key");
    let db = sqlite_url(&dir);
    let config = format!(
        "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
         [worker]\nrestart_timeout = \"2m\"\n\n\
         [restarter]\nkind = \"ssh\"\n\n[restarter.ssh]\n{ssh}\n\
         [safety]\nallow = [\"cattle-*\"]\n# Not about signing: unsigned requests, as before.\nrequire_signed = false\n{always_open}\n\
         [[hosts]]\npattern = \"*\"\naddress = \"127.0.0.1\"\n",
        always_open = ALWAYS_OPEN,
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, "cattle-cd34"], &[]);
    assert!(status.success(), "publish failed: {stderr}");
    let (status, lines) = Mandrill::run(
        &dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
    )
    .wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    assert!(
        !marker.exists(),
        "nothing may run on a host whose key is unknown"
    );
    let entries = history(&db);
    assert_eq!(entries[0].status, Status::Failed);
    assert_eq!(entries[0].attempts, 1, "a permanent refusal is not retried");
    let error = entries[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("host key"), "{error}");
    let (status, dead, _) = mandrill(&dir, &["dead-letters", "--broker", &db], &[]);
    assert!(status.success());
    assert!(dead.contains("host key"), "{dead}");
}

/// The command backend, leashed by default: every decision is made and the
/// exact argv recorded as `dry-run`, and nothing runs; an instance outside
/// `safety.allow` is denied; `--unleash` acts.
#[test]
fn a_real_backend_is_leashed_by_default_and_records_the_exact_argv() {
    let (_guard, dir) = temp_dir();
    let marker = dir.join("restarted");
    let db = sqlite_url(&dir);
    let config = format!(
        "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
         [restarter]\nkind = \"command\"\n\n[restarter.command]\n\
         argv = [\"touch\", {marker:?}, \"{{instance_name}}\"]\n\n\
         [safety]\nallow = [\"cattle-*\"]\n# Not about signing: unsigned requests, as before.\nrequire_signed = false\n{always_open}",
        marker = marker.to_str().unwrap(),
        always_open = ALWAYS_OPEN,
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
    let (status, _, stderr) = mandrill(
        &dir,
        &["publish", "--broker", &db, "cattle-ab12", "pet-01"],
        &[],
    );
    assert!(status.success(), "publish failed: {stderr}");
    let (status, lines) =
        Mandrill::run(&dir, &["--config", "mandrill.toml", "--until-idle"]).wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    assert!(
        logged(&lines, "LEASHED (dry run)"),
        "the mode is said loudly"
    );
    // A real backend without a probe: pause_on_unrecovered could never
    // pause, and start-up says so (a simulated one does not).
    assert!(
        logged(
            &lines,
            "safety.pause_on_unrecovered needs a verification probe"
        ),
        "{lines:?}"
    );
    assert!(!marker.exists(), "a leashed service must not run anything");
    let entries = history(&db);
    let find = |name: &str| {
        entries
            .iter()
            .find(|e| e.instance_name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in {entries:?}"))
    };
    let leashed = find("cattle-ab12");
    assert_eq!(leashed.status, Status::DryRun);
    let action = leashed.output.as_deref().unwrap_or_default();
    assert!(
        action.contains(&format!("{:?}", marker.to_str().unwrap()))
            && action.contains("\"cattle-ab12\"")
            && action.starts_with("run [\"touch\""),
        "{action}"
    );
    let denied = find("pet-01");
    assert_eq!(denied.status, Status::Denied);
    assert!(
        denied
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("safety.allow")
    );

    // Unleashed, the same configuration acts.
    let (status, _, _) = mandrill(&dir, &["publish", "--broker", &db, "cattle-cd34"], &[]);
    assert!(status.success());
    let (status, lines) = Mandrill::run(
        &dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
    )
    .wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    assert!(logged(&lines, "UNLEASHED"), "the mode is said loudly");
    assert!(marker.exists(), "unleashed, the command runs");
}

/// A reload whose file changed its own `safety.dry_run` (here from unset
/// to `true`) turns the leash, over the `--unleash` the service started
/// with, and the log says so and why (a reload that leaves it as it was
/// keeps the mode: `tests/leash.rs`).
#[test]
fn a_reload_whose_file_changes_its_own_dry_run_turns_the_leash_over_unleash() {
    let (_guard, dir) = temp_dir();
    let marker = dir.join("restarted");
    let db = sqlite_url(&dir);
    let config = |safety: &str| {
        format!(
            "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
             [restarter]\nkind = \"command\"\n\n[restarter.command]\n\
             argv = [\"touch\", {marker:?}]\n\n\
             [safety]\nallow = [\"cattle-*\"]\nrequire_signed = false\n{safety}{ALWAYS_OPEN}",
            marker = marker.to_str().unwrap(),
        )
    };
    fs::write(dir.join("mandrill.toml"), config("")).unwrap();
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml", "--unleash"]);
    service.wait_for("UNLEASHED: restarts of real hosts will be issued", 1);

    fs::write(dir.join("mandrill.toml"), config("dry_run = true\n")).unwrap();
    service.signal("HUP");
    let leashed = service.wait_for(
        "LEASHED (dry run) by reload: restarts are decided and recorded, none is issued",
        1,
    );
    assert_eq!(
        leashed[0]["fields"]["why"], "the configuration file's own safety.dry_run changed",
        "{leashed:?}"
    );
    let turned = service.wait_for(
        "the configuration file's own safety.dry_run changed: this instance's own leash \
         follows it (over a start-up flag)",
        1,
    );
    assert_eq!(turned[0]["fields"]["from"], "unset", "{turned:?}");
    assert_eq!(turned[0]["fields"]["to"], "true", "{turned:?}");
    assert_eq!(turned[0]["fields"]["leashed"], true, "{turned:?}");
    service.wait_for("configuration reloaded", 1);

    let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, "cattle-ab12"], &[]);
    assert!(status.success(), "publish failed: {stderr}");
    service.wait_for("acked", 1);
    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success());
    assert!(!marker.exists(), "leashed by the reload, nothing runs");
    let entries = history(&db);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].status, Status::DryRun);
}

/// What a host writes reaches the text log escaped: a newline in a failed
/// restart's output cannot forge a log line of its own (here one saying
/// the host was restarted), nor an escape sequence clear the operator's
/// terminal.
#[test]
fn a_hosts_output_cannot_forge_a_log_line_or_reach_the_terminal() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let forged = "printf 'ok\\n2099-01-01T00:00:00Z  INFO forged: restarted\\033[2J'; exit 1";
    let config = format!(
        "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
         [worker]\nmax_attempts = 1\n\n[log]\nformat = \"text\"\n\n\
         [restarter]\nkind = \"command\"\n\n[restarter.command]\n\
         argv = [\"sh\", \"-c\", {forged:?}]\n\n\
         [safety]\nallow = [\"cattle-*\"]\nrequire_signed = false\n{ALWAYS_OPEN}"
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
    let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &db, "cattle-ab12"], &[]);
    assert!(status.success(), "publish failed: {stderr}");
    let (status, _, log) = mandrill(
        &dir,
        &[
            "run",
            "--config",
            "mandrill.toml",
            "--until-idle",
            "--unleash",
        ],
        &[],
    );
    assert!(status.success(), "{log}");
    assert!(log.contains("restart failed on the last attempt"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log:?}");
    assert!(
        !log.lines().any(|line| line.starts_with("2099-")),
        "a forged line: {log}"
    );
}
