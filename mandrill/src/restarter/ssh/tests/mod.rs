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
#[path = "../../../../tests/services/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use sshd::{KillOnDrop, PrivateSshd, alive};

mod connections;
mod timeouts;

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
async fn every_byte_the_command_wrote_before_it_exited_is_recorded() {
    // sshd sends the exit status as soon as the command ends, and what it
    // had not yet read from the command's pipe after it; reading the status
    // ends the multiplexed session, and the master then drops what had not
    // yet arrived. A pipe filled by one write just before the exit straddles
    // the status; a few rounds of a few at once lose the race on the old
    // code.
    const BYTES: usize = 65_536;
    // Room for the restarts at once and an ask beside each.
    let sshd = PrivateSshd::start_with("MaxSessions 32\n");
    let settings = SshSettings {
        // All of it kept, to be counted.
        max_output: 2 * BYTES,
        ..ssh_settings(
            &sshd,
            &[
                "dd",
                "if=/dev/zero",
                &format!("bs={BYTES}"),
                "count=1",
                "status=none",
            ],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    for round in 0..10 {
        // Several at once over the one connection: a busier master.
        let restarts = (0..12).map(|_| restart(&restarter, "cattle-ab12"));
        for restarted in futures::future::join_all(restarts).await {
            let output = restarted.unwrap().output.unwrap();
            // The command's bytes, whatever else a login shell may print.
            let zeros = output.bytes().filter(|&byte| byte == 0).count();
            assert_eq!(
                zeros,
                BYTES,
                "round {round}: {:?}",
                output.trim_matches('\0')
            );
        }
    }
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
