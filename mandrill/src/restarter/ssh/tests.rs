//! The ssh backend against a private `sshd` (tests/services/sshd.rs): real
//! connections, real host keys, real processes restarted.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::domain::{Domain, ParseRules, RestartRequest, Restarted};
use crate::restarter::hosts::{HostEntry, HostMap};
use crate::restarter::{RestartError, Restarter, SshRestarter, SshSettings};

/// The private sshd, shared with the integration tests that run the binary
/// against it.
#[path = "../../../tests/services/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use sshd::{KillOnDrop, PrivateSshd, alive};

/// Settings that reach `sshd` with the authorised key, running `argv`.
fn ssh_settings(sshd: &PrivateSshd, argv: &[&str]) -> SshSettings {
    toml::from_str(&sshd.settings_toml(argv, "host_key")).unwrap()
}

fn request(instance: &str) -> RestartRequest {
    let payload = format!(
        r#"{{"message_id":"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b","instance_name":"{instance}"}}"#
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    RestartRequest::parse(payload.as_bytes(), &rules).unwrap()
}

/// Every instance is reached at the loopback address.
fn loopback() -> HostMap {
    HostMap::new(&[HostEntry {
        pattern: "*".into(),
        address: Some("127.0.0.1".into()),
        port: None,
        user: None,
    }])
    .unwrap()
}

async fn restart(restarter: &SshRestarter, instance: &str) -> Result<Restarted, RestartError> {
    let request = request(instance);
    let reservation = restarter
        .reserve(&request)
        .await
        .expect("ssh never refuses");
    restarter.restart(&request, reservation).await
}

/// Waits until `condition` holds, failing after a generous deadline.
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const RESTART_APP: &str = r#"#!/bin/sh
# Restarts the "app" (a long sleep): stops the one named in the PID file,
# starts another and records its PID.
set -eu
pidfile=$1
if [ -s "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
sleep 600 </dev/null >/dev/null 2>&1 &
echo $! > "$pidfile"
echo "app restarted as $! for $2"
"#;

#[tokio::test]
async fn a_restart_over_ssh_replaces_the_target_process() {
    let sshd = PrivateSshd::start();
    let script = sshd.script("restart-app.sh", RESTART_APP);
    let pidfile = sshd.path("app.pid");
    let _app = KillOnDrop(pidfile.clone());
    let status = Command::new(&script)
        .arg(&pidfile)
        .arg("setup")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let before: u32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(before));

    let settings = ssh_settings(
        &sshd,
        &[
            script.to_str().unwrap(),
            pidfile.to_str().unwrap(),
            "{instance_name}",
        ],
    );
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();
    let restarted = restart(&restarter, "cattle-ab12").await.unwrap();

    let after: u32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(before, after, "the PID file names a new process");
    assert!(alive(after), "the new process runs");
    wait_until("the old process is gone", || !alive(before)).await;
    assert_eq!(
        restarted.output.as_deref(),
        Some(format!("app restarted as {after} for cattle-ab12\n").as_str())
    );
}

#[tokio::test]
async fn shell_metacharacters_arrive_as_one_literal_argument_each() {
    let sshd = PrivateSshd::start();
    let marker = sshd.path("pwned");
    let marker = marker.to_str().unwrap();
    let injections = [
        format!("a;touch {marker}"),
        format!("$(touch {marker})"),
        format!("`touch {marker}`|x&&y>z<w"),
        "it's \"quoted\" \\ *".to_owned(),
        "two  spaces\nand a new line".to_owned(),
        String::new(),
    ];
    let mut argv = vec![
        "sh",
        "-c",
        r#"for a in "$@"; do printf '[%s]\n' "$a"; done"#,
        "sh",
    ];
    argv.extend(injections.iter().map(String::as_str));
    argv.extend(["{instance_name}", "{host}"]);
    let restarter = SshRestarter::new(&ssh_settings(&sshd, &argv), loopback()).unwrap();

    let restarted = restart(&restarter, "cattle-ab12").await.unwrap();

    let mut expected: String = injections.iter().map(|arg| format!("[{arg}]\n")).collect();
    expected.push_str("[cattle-ab12]\n[127.0.0.1]\n");
    assert_eq!(restarted.output.as_deref(), Some(expected.as_str()));
    assert!(
        !Path::new(marker).exists(),
        "nothing the arguments held ran"
    );
}

#[tokio::test]
async fn an_unknown_or_changed_host_key_is_refused_for_good_and_nothing_runs() {
    let sshd = PrivateSshd::start();
    let marker = sshd.path("ran");
    let unknown = sshd.path("known_hosts.empty");
    fs::write(&unknown, "").unwrap();
    let changed = sshd.known_hosts("other_host_key");
    for (known_hosts, case) in [(unknown, "unknown"), (changed, "changed")] {
        let settings = SshSettings {
            known_hosts_file: Some(known_hosts.clone()),
            ..ssh_settings(&sshd, &["touch", marker.to_str().unwrap()])
        };
        let restarter = SshRestarter::new(&settings, loopback()).unwrap();

        let error = restart(&restarter, "cattle-ab12").await.unwrap_err();
        let RestartError::Permanent { .. } = &error else {
            panic!("{case} key: expected a permanent failure, got {error:?}");
        };
        let reason = error.with_causes().to_string();
        assert!(reason.contains("host key of"), "{case}: {reason}");
        assert!(reason.contains("127.0.0.1"), "{case}: {reason}");
        assert!(!error.is_retryable());
        assert!(!marker.exists(), "{case} key: the command did not run");
        let untouched = fs::read_to_string(&known_hosts).unwrap();
        assert!(!untouched.contains(&fs::read_to_string(sshd.path("host_key.pub")).unwrap()));
    }
    assert_eq!(sshd.logins(), 0);
}

#[tokio::test]
async fn a_key_the_host_does_not_know_is_refused_for_good() {
    let sshd = PrivateSshd::start();
    let settings = SshSettings {
        key_file: Some(sshd.path("stranger_key")),
        ..ssh_settings(&sshd, &["true"])
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    let error = restart(&restarter, "cattle-ab12").await.unwrap_err();
    let RestartError::Permanent { .. } = &error else {
        panic!("expected a permanent failure, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(reason.contains("authentication refused"), "{reason}");
    assert_eq!(sshd.logins(), 0);
}

#[tokio::test]
async fn a_host_whose_sshd_is_down_fails_for_now_and_a_retry_succeeds_once_it_is_back() {
    let mut sshd = PrivateSshd::start();
    let restarter = SshRestarter::new(&ssh_settings(&sshd, &["true"]), loopback()).unwrap();
    restart(&restarter, "cattle-ab12").await.unwrap();

    sshd.stop();
    let error = restart(&restarter, "cattle-ab12").await.unwrap_err();
    assert!(
        matches!(error, RestartError::Failed { .. }) && error.is_retryable(),
        "{error:?}"
    );
    let text = error.with_causes().to_string();
    assert!(text.contains("Connection refused"), "{text}");

    sshd.launch();
    restart(&restarter, "cattle-ab12").await.unwrap();
    assert_eq!(sshd.logins(), 2, "the retry opened a new connection");
}

#[tokio::test]
async fn restarts_of_one_host_share_one_connection_which_closes_when_idle() {
    let sshd = PrivateSshd::start();
    let settings = SshSettings {
        idle_timeout: Duration::from_secs(2),
        ..ssh_settings(&sshd, &["true"])
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    restart(&restarter, "cattle-ab12").await.unwrap();
    restart(&restarter, "cattle-cd34").await.unwrap();
    assert_eq!(sshd.logins(), 1, "both restarts used one connection");

    wait_until("the idle connection is closed", || {
        sshd.log().contains("Disconnected from user")
    })
    .await;
    restart(&restarter, "cattle-ab12").await.unwrap();
    assert_eq!(
        sshd.logins(),
        2,
        "a new connection after the idle one closed"
    );
}

/// Kills the sshd processes serving this session (its ancestors below the
/// listener), as a host going down for a reboot does.
const DROP_OWN_CONNECTION: &str = r#"#!/bin/sh
listener=$1
p=$PPID
pids=""
while [ "$p" -gt 1 ] && [ "$p" != "$listener" ]; do
  pids="$pids $p"
  p=$(cut -d' ' -f4 "/proc/$p/stat")
done
kill -9 $pids
"#;

#[tokio::test]
async fn a_connection_dropped_by_the_host_counts_as_restarted_only_when_configured() {
    let sshd = PrivateSshd::start();
    let script = sshd.script("drop-connection.sh", DROP_OWN_CONNECTION);
    let listener = sshd.pid().to_string();
    let argv = [script.to_str().unwrap(), listener.as_str()];

    let strict = SshRestarter::new(&ssh_settings(&sshd, &argv), loopback()).unwrap();
    let error = restart(&strict, "cattle-ab12").await.unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    let text = error.with_causes().to_string();
    assert!(text.contains("dropped the connection"), "{text}");

    let settings = SshSettings {
        reboot_drops_connection: true,
        ..ssh_settings(&sshd, &argv)
    };
    let lenient = SshRestarter::new(&settings, loopback()).unwrap();
    let restarted = restart(&lenient, "cattle-ab12").await.unwrap();
    let output = restarted.output.unwrap_or_default();
    assert!(output.contains("dropped the connection"), "{output}");
    assert_eq!(sshd.logins(), 2);
}

#[tokio::test]
async fn exit_codes_fail_for_now_or_for_good_and_a_slow_command_times_out() {
    let sshd = PrivateSshd::start();
    let settings = SshSettings {
        permanent_exit_codes: vec![3, 127],
        ..ssh_settings(
            &sshd,
            &["sh", "-c", "echo boom >&2; exit \"$1\"", "sh", "{group}"],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();
    // `{group}` is the instance name up to its last '-': the exit code.
    let error = restart(&restarter, "3-a").await.unwrap_err();
    let RestartError::Permanent { .. } = &error else {
        panic!("exit 3 is configured permanent, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(
        reason.contains("exited with 3") && reason.contains("boom"),
        "{reason}"
    );
    // 127 (a shell's "command not found") too, which openssh reports as
    // an error rather than an exit status.
    let error = restart(&restarter, "127-a").await.unwrap_err();
    let RestartError::Permanent { .. } = &error else {
        panic!("exit 127 is configured permanent, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(
        reason.contains("exited with 127") && reason.contains("boom"),
        "{reason}"
    );
    let error = restart(&restarter, "4-a").await.unwrap_err();
    assert!(
        matches!(&error, RestartError::Failed { .. } if error.with_causes().to_string().contains("exited with 4")),
        "{error:?}"
    );

    let settings = SshSettings {
        timeout: Duration::from_secs(1),
        ..ssh_settings(&sshd, &["sleep", "30"])
    };
    let slow = SshRestarter::new(&settings, loopback()).unwrap();
    let error = restart(&slow, "cattle-ab12").await.unwrap_err();
    assert!(matches!(error, RestartError::TimedOut { .. }), "{error:?}");
}

/// The PID a command wrote into `path`, once written.
async fn pid_in(path: &Path) -> u32 {
    wait_until("the command wrote its pid", || {
        fs::read_to_string(path).is_ok_and(|text| text.ends_with('\n'))
    })
    .await;
    fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn a_command_that_runs_past_its_timeout_is_killed_on_the_host_before_the_restart_returns() {
    let sshd = PrivateSshd::start();
    let pidfile = sshd.path("slow.pid");
    let _slow = KillOnDrop(pidfile.clone());
    let settings = SshSettings {
        timeout: Duration::from_secs(1),
        ..ssh_settings(
            &sshd,
            &[
                "sh",
                "-c",
                "echo $$ > \"$1\"; exec sleep 600",
                "sh",
                pidfile.to_str().unwrap(),
            ],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    let error = restart(&restarter, "cattle-ab12").await.unwrap_err();

    // Confirmed stopped: a retry cannot run beside it.
    assert!(
        matches!(error, RestartError::TimedOut { .. }) && error.is_retryable(),
        "{error:?}"
    );
    let pid = pid_in(&pidfile).await;
    assert!(
        !alive(pid),
        "the command still runs on the host after the time-out"
    );
}

#[tokio::test]
async fn a_timed_out_command_whose_kill_cannot_be_confirmed_may_still_run_and_is_not_retried() {
    let sshd = PrivateSshd::start();
    let pidfile = sshd.path("stuck.pid");
    let _stuck = KillOnDrop(pidfile.clone());
    // The command freezes the sshd process serving its connection (as a
    // host too loaded to answer does): nothing reaches the host any more,
    // the kill included.
    let settings = SshSettings {
        timeout: Duration::from_secs(1),
        ..ssh_settings(
            &sshd,
            &[
                "sh",
                "-c",
                "echo $$ > \"$1\"; kill -STOP $PPID; exec sleep 600",
                "sh",
                pidfile.to_str().unwrap(),
            ],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    let error = restart(&restarter, "cattle-ab12").await.unwrap_err();

    // Whether the group's line got through before the freeze or not, the
    // end cannot be confirmed.
    assert!(
        matches!(error, RestartError::OutcomeUnknown { .. }) && !error.is_retryable(),
        "{error:?}"
    );
    assert!(alive(pid_in(&pidfile).await), "it was indeed not stopped");
    // Dropping `sshd` kills the frozen process and the command with it.
}

#[tokio::test]
async fn a_timed_out_command_whose_host_refuses_the_kill_may_still_run_and_is_not_retried() {
    // One session per connection: the kill's second channel is refused.
    let sshd = PrivateSshd::start_with("MaxSessions 1\n");
    let pidfile = sshd.path("refused.pid");
    let _stuck = KillOnDrop(pidfile.clone());
    let settings = SshSettings {
        timeout: Duration::from_secs(3),
        ..ssh_settings(
            &sshd,
            &[
                "sh",
                "-c",
                "echo $$ > \"$1\"; exec sleep 600",
                "sh",
                pidfile.to_str().unwrap(),
            ],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    let error = restart(&restarter, "cattle-ab12").await.unwrap_err();

    let RestartError::OutcomeUnknown { .. } = &error else {
        panic!("expected the outcome to be unknown, got {error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(!error.is_retryable());
    let pid = pid_in(&pidfile).await;
    assert!(
        reason.contains(&format!("process group {pid} could not be killed")),
        "{reason}"
    );
    assert!(alive(pid), "it was indeed not stopped");
}

#[tokio::test]
async fn a_process_left_holding_the_output_pipe_does_not_hold_the_restart() {
    let sshd = PrivateSshd::start();
    let pidfile = sshd.path("daemon.pid");
    let _daemon = KillOnDrop(pidfile.clone());
    // A daemon started without redirecting its output keeps the channel
    // open after the command exited.
    let settings = SshSettings {
        timeout: Duration::from_secs(10),
        ..ssh_settings(
            &sshd,
            &[
                "sh",
                "-c",
                "sleep 600 & echo $! > \"$1\"; echo started",
                "sh",
                pidfile.to_str().unwrap(),
            ],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    let restarted = restart(&restarter, "cattle-ab12").await.unwrap();

    assert_eq!(restarted.output.as_deref(), Some("started\n"));
    let daemon = pid_in(&pidfile).await;
    assert!(
        alive(daemon),
        "a process the command left running is left alone"
    );
}

#[tokio::test]
async fn waiting_for_a_hung_hosts_connection_fits_in_the_restarts_bound() {
    // A host that accepts connections and never says a word, reached by
    // many restarts at once: each waits for the others' connections to the
    // same host, then tries its own.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let dir = TempDir::new().unwrap();
    let known_hosts = dir.path().join("known_hosts");
    fs::write(&known_hosts, "").unwrap();
    let settings = SshSettings {
        argv: vec!["true".into()],
        user: Some("chaos".into()),
        known_hosts_file: Some(known_hosts),
        port,
        connect_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        max_connections: 32,
        ..SshSettings::default()
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();
    // What `worker.restart_timeout` is checked against (7s). Each restart
    // fails within 2 × connect_timeout; one after another, 24 would take
    // well over 10s.
    let bound = settings.longest_restart();
    let started = Instant::now();

    let restarts = (0..24).map(|n| {
        let restarter = &restarter;
        async move {
            let result = restart(restarter, &format!("cattle-{n}")).await;
            (result, started.elapsed())
        }
    });
    let results = futures::future::join_all(restarts).await;

    for (result, took) in results {
        let error = result.unwrap_err();
        assert!(
            matches!(error, RestartError::Failed { .. }),
            "nothing ran: {error:?}"
        );
        assert!(
            took < bound,
            "a restart took {took:?}, past the {bound:?} restart_timeout is checked against"
        );
    }
    drop(silent);
}

#[tokio::test]
async fn root_or_no_user_is_refused_for_good_before_connecting() {
    let dir = TempDir::new().unwrap();
    let known_hosts = dir.path().join("known_hosts");
    fs::write(&known_hosts, "").unwrap();
    let settings = SshSettings {
        argv: vec!["true".into()],
        known_hosts_file: Some(known_hosts),
        ..SshSettings::default()
    };
    let as_root = HostMap::new(&[HostEntry {
        pattern: "*".into(),
        address: Some("192.0.2.1".into()),
        port: None,
        user: Some("root".into()),
    }])
    .unwrap();
    for (hosts, expected) in [(as_root, "root is refused"), (loopback(), "no ssh user")] {
        let restarter = SshRestarter::new(&settings, hosts).unwrap();
        let error = restart(&restarter, "cattle-ab12").await.unwrap_err();
        assert!(
            matches!(&error, RestartError::Permanent { .. } if error.with_causes().to_string().contains(expected)),
            "{error:?}"
        );
    }
    let missing = SshSettings {
        known_hosts_file: Some(dir.path().join("absent")),
        ..settings
    };
    let error = SshRestarter::new(&missing, loopback()).unwrap_err();
    assert_eq!(error.key, "restarter.ssh.known_hosts_file", "{error}");
    // The path once, then why it cannot be used (the io error, a source).
    let line = error.with_causes().to_string();
    assert_eq!(line.matches("absent").count(), 1, "{line}");
    assert!(line.ends_with("(os error 2)"), "{line}");
}

#[tokio::test]
async fn reserve_waits_for_a_free_connection() {
    let dir = TempDir::new().unwrap();
    let known_hosts = dir.path().join("known_hosts");
    fs::write(&known_hosts, "").unwrap();
    let settings = SshSettings {
        argv: vec!["true".into()],
        known_hosts_file: Some(known_hosts),
        max_connections: 1,
        ..SshSettings::default()
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();
    let request = request("cattle-ab12");
    let first = restarter
        .reserve(&request)
        .await
        .expect("ssh never refuses");
    let mut second = Box::pin(restarter.reserve(&request));
    assert!(
        futures::FutureExt::now_or_never(&mut second).is_none(),
        "no second connection while the first is held"
    );
    drop(first);
    second.await.expect("ssh never refuses");
}

#[tokio::test]
async fn idle_connections_are_closed_to_stay_within_max_connections_and_the_host_map_wins() {
    let sshd = PrivateSshd::start();
    let host_key = fs::read_to_string(sshd.path("host_key.pub")).unwrap();
    let known_hosts = sshd.path("known_hosts.both");
    fs::write(
        &known_hosts,
        format!(
            "[127.0.0.1]:{0} {host_key}[localhost]:{0} {host_key}",
            sshd.port
        ),
    )
    .unwrap();
    // The host map's port and user win over the section's.
    let settings = SshSettings {
        known_hosts_file: Some(known_hosts),
        max_connections: 1,
        port: 9,
        user: None,
        ..ssh_settings(&sshd, &["true"])
    };
    // Two destinations: the same sshd under two names.
    let entry = |pattern: &str, address: &str| HostEntry {
        pattern: pattern.into(),
        address: Some(address.into()),
        port: Some(sshd.port),
        user: Some(sshd::current_user()),
    };
    let hosts = HostMap::new(&[entry("a-*", "127.0.0.1"), entry("b-*", "localhost")]).unwrap();
    let restarter = SshRestarter::new(&settings, hosts).unwrap();

    restart(&restarter, "a-1").await.unwrap();
    restart(&restarter, "b-1").await.unwrap();

    assert_eq!(sshd.logins(), 2);
    wait_until("the first connection is closed", || {
        sshd.log().matches("Disconnected from user").count() == 1
    })
    .await;
}
