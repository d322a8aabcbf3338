//! The command backend against real processes.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use super::*;
use crate::restarter::process::testing::{
    KillOnDrop, alive, every_host_at, read_pid, request, script, wait_gone,
};

fn settings(argv: &[&str]) -> CommandSettings {
    CommandSettings {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        timeout: Duration::from_secs(10),
        ..CommandSettings::default()
    }
}

fn restarter(settings: &CommandSettings) -> CommandRestarter {
    settings.validate().unwrap();
    CommandRestarter::new(settings, HostMap::default()).unwrap()
}

async fn restart(restarter: &CommandRestarter) -> Result<Restarted, RestartError> {
    restarter
        .restart(&request("cattle-ab12"), Reservation::unlimited())
        .await
}

/// Kills whatever PID the file names at the end of the test.
struct KillPidFile<'a>(&'a Path);

impl Drop for KillPidFile<'_> {
    fn drop(&mut self) {
        if let Ok(text) = std::fs::read_to_string(self.0)
            && let Ok(pid) = text.trim().parse()
        {
            drop(KillOnDrop(vec![pid]));
        }
    }
}

#[tokio::test]
async fn restart_script_replaces_a_running_process_and_its_pid_changes() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("app.pid");
    let _cleanup = KillPidFile(&pidfile);
    // The "app": records its PID atomically, then runs until killed.
    let app = script(
        dir.path(),
        "app.sh",
        "echo $$ > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"\nexec sleep 1000\n",
    );
    // The restart: stop the running app if any, start a new one detached
    // (output redirected, so it does not hold the runner's pipes), and wait
    // until it has recorded its PID.
    let restart_script = script(
        dir.path(),
        "restart.sh",
        r#"app="$1"; pidfile="$2"
old=$(cat "$pidfile" 2>/dev/null || echo none)
[ "$old" != none ] && kill "$old"
setsid sh "$app" "$pidfile" >/dev/null 2>&1 < /dev/null &
while [ "$(cat "$pidfile" 2>/dev/null || echo none)" = "$old" ]; do sleep 0.01; done
echo "restarted: $old -> $(cat "$pidfile")"
"#,
    );
    let restarter = restarter(&settings(&[
        "sh",
        restart_script.to_str().unwrap(),
        app.to_str().unwrap(),
        pidfile.to_str().unwrap(),
    ]));

    let started = restart(&restarter).await.unwrap();
    let first = read_pid(&pidfile);
    assert!(alive(first), "the app runs after the first restart");
    assert!(started.output.unwrap().starts_with("restarted: none -> "));

    let restarted = restart(&restarter).await.unwrap();
    let second = read_pid(&pidfile);
    assert_ne!(first, second, "the restart replaced the process");
    assert!(alive(second), "the new app runs");
    wait_gone(first).await;
    assert_eq!(
        restarted.output.as_deref(),
        Some(format!("restarted: {first} -> {second}\n").as_str())
    );
}

#[tokio::test]
async fn host_address_full_of_shell_metacharacters_arrives_as_one_literal_argument() {
    let dir = tempfile::tempdir().unwrap();
    let print_args = script(
        dir.path(),
        "args.sh",
        "printf '%s\\n' \"$#\"\nfor arg; do printf '[%s]\\n' \"$arg\"; done\n",
    );
    // The host map refuses whitespace, so `${IFS}` stands in for spaces.
    let address = r#"a;rm${IFS}-rf${IFS}/;$(id)`id`|id&&id>x<y'"*?~\"#;
    let restarter = CommandRestarter::new(
        &settings(&[
            "sh",
            print_args.to_str().unwrap(),
            "{host}",
            "--name={instance_name}",
        ]),
        every_host_at(address),
    )
    .unwrap();
    let output = restart(&restarter).await.unwrap().output.unwrap();
    assert_eq!(output, format!("2\n[{address}]\n[--name=cattle-ab12]\n"));
    assert!(!dir.path().join("x").exists(), "nothing was redirected");
}

#[tokio::test]
async fn instance_names_with_shell_metacharacters_are_dead_lettered_at_parse_and_never_run() {
    use crate::broker::{MemoryBroker, Publisher};
    use crate::domain::{Domain, ParseRules};
    use crate::stats::Stats;
    use crate::store::MemoryStore;
    use crate::worker::{Shutdown, Worker, WorkerConfig};

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let record = script(dir.path(), "record.sh", "echo \"$1\" >> \"$2\"\n");
    let restarter = Arc::new(restarter(&settings(&[
        "sh",
        record.to_str().unwrap(),
        "{instance_name}",
        log.to_str().unwrap(),
    ])));
    let broker = Arc::new(MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(100),
    ));
    let hostile = ["a;rm -rf", "$(id)", "`id`", "a|b", "x\\ny"];
    for name in hostile.iter().copied().chain(["cattle-ok"]) {
        let payload = serde_json::json!({
            "message_id": uuid::Uuid::new_v4().to_string(),
            "instance_name": name,
        });
        broker
            .publish(Bytes::from(payload.to_string()))
            .await
            .unwrap();
    }
    let config = WorkerConfig {
        max_in_flight: 10,
        pull_batch: 10,
        max_attempts: 1,
        max_deliveries: 3,
        retry_backoff: crate::backoff::Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(1),
        },
        record_attempts: 3,
        record_backoff: crate::backoff::Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(10),
        },
        restart_timeout: Duration::from_secs(30),
        shutdown_grace: Duration::from_secs(5),
        lease_extension_interval: None,
        max_pull_failures: 5,
        pull_backoff: crate::backoff::Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        },
        parse: ParseRules {
            domain: Domain::default(),
            max_payload_bytes: 1024,
        },
        switch_poll_interval: Duration::from_secs(1),
        store_timeout: crate::store::DEFAULT_TIMEOUT,
        policy: crate::safety::PolicyHandle::default(),
    };
    let stats = Arc::new(Stats::default());
    let shutdown = Shutdown::new();
    let worker = Worker::new(
        config,
        broker.clone(),
        Arc::new(MemoryStore::new()),
        restarter,
        stats.clone(),
    );
    let worker = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(stats.dead_lettered.get() == 5 && stats.acked.get() == 1) {
        assert!(Instant::now() < deadline, "not settled: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.request();
    worker.await.unwrap().unwrap();

    assert_eq!(std::fs::read_to_string(&log).unwrap(), "cattle-ok\n");
    let reasons: Vec<String> = broker
        .dead_letters()
        .into_iter()
        .map(|d| d.reason)
        .collect();
    for name in hostile {
        let quoted = format!("{name:?}");
        assert!(
            reasons.iter().any(|r| r.contains(&quoted)),
            "{quoted} in {reasons:?}"
        );
    }
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group_and_no_grandchild_survives() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let mut settings = settings(&[
        "sh",
        "-c",
        "echo $$ > \"$0.sh\"; sleep 1000 & echo $! > \"$0\"; echo started; wait",
        pids.to_str().unwrap(),
    ]);
    settings.timeout = Duration::from_secs(2);
    let restarter = restarter(&settings);

    let error = restart(&restarter).await.unwrap_err();
    let shell = read_pid(&dir.path().join("pids.sh"));
    let grandchild = read_pid(&pids);
    let _cleanup = KillOnDrop(vec![shell, grandchild]);
    assert!(error.is_retryable(), "{error}");
    let text = error.with_causes().to_string();
    assert!(text.contains("process group was killed"), "{text}");
    assert!(text.contains("output: started"), "{text}");
    wait_gone(shell).await;
    wait_gone(grandchild).await;
}

#[tokio::test]
async fn cancelled_run_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let runner = ProcessRunner::new(None, &[], &[], Duration::from_secs(600), 100);
    let argv = [
        "sh",
        "-c",
        "sleep 1000 & echo $! > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; wait",
        pids.to_str().unwrap(),
    ]
    .map(String::from);
    // Boxed, so that dropping it drops the future itself.
    let mut run = Box::pin(runner.run(&argv));
    // Run it until the grandchild exists, then drop the future.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids.exists() {
        assert!(Instant::now() < deadline, "the script never started");
        tokio::select! {
            _ = &mut run => panic!("the script ended"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    drop(run);
    let grandchild = read_pid(&pids);
    let _cleanup = KillOnDrop(vec![grandchild]);
    wait_gone(grandchild).await;
}

#[tokio::test]
async fn configured_exit_code_is_a_permanent_failure_and_others_are_retried() {
    let mut settings = settings(&[
        "sh",
        "-c",
        "echo \"no such host: $1\" >&2; exit \"$2\"",
        "sh",
        "{host}",
        "3",
    ]);
    settings.permanent_exit_codes = vec![3, 64];
    let error = restart(&restarter(&settings)).await.unwrap_err();
    let RestartError::Permanent { .. } = &error else {
        panic!("{error:?}");
    };
    let reason = error.with_causes().to_string();
    assert!(reason.contains("exited with code 3"), "{reason}");
    assert!(
        reason.contains("[stderr]\nno such host: cattle-ab12.example.net"),
        "{reason}"
    );

    settings.argv[5] = "4".into();
    let error = restart(&restarter(&settings)).await.unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    let reason = error.with_causes().to_string();
    assert!(reason.contains("exited with code 4"), "{reason}");
}

#[tokio::test]
async fn missing_program_is_a_permanent_failure() {
    let error = restart(&restarter(&settings(&["/nonexistent/restart-tool"])))
        .await
        .unwrap_err();
    assert!(!error.is_retryable(), "{error:?}");
    // The program is named once, with the reason it could not start.
    let text = error.with_causes().to_string();
    assert_eq!(
        text.matches("/nonexistent/restart-tool").count(),
        1,
        "{text}"
    );
    assert!(
        text.ends_with("No such file or directory (os error 2)"),
        "{text}"
    );
}

#[tokio::test]
async fn output_is_truncated_at_the_limit_while_the_rest_is_read_and_discarded() {
    // A megabyte on each stream: far more than a pipe holds, so a runner
    // that stopped reading would leave the program blocked until the timeout.
    let mut settings = settings(&[
        "sh",
        "-c",
        "head -c 1000000 /dev/zero | tr '\\0' o; head -c 1000000 /dev/zero | tr '\\0' e >&2",
    ]);
    settings.max_output = 100;
    let output = restart(&restarter(&settings))
        .await
        .unwrap()
        .output
        .unwrap();
    let expected = format!(
        "{}[… 999900 more bytes not kept]\n[stderr]\n{}[… 999900 more bytes not kept]",
        "o".repeat(100),
        "e".repeat(100)
    );
    assert_eq!(output, expected);
}

#[tokio::test]
async fn environment_is_cleared_except_the_allow_list_and_fixed_variables() {
    assert!(
        std::env::vars_os().any(|(name, _)| name != "PATH"),
        "the test needs a variable to clear"
    );
    let mut settings = settings(&["env"]);
    settings.env_allow = vec!["PATH".into(), "MANDRILL_SURELY_UNSET".into()];
    settings.env = BTreeMap::from([("RESTART_REASON".into(), "chaos".into())]);
    let output = restart(&restarter(&settings))
        .await
        .unwrap()
        .output
        .unwrap();
    let mut lines: Vec<&str> = output.lines().collect();
    lines.sort();
    let path = std::env::var("PATH").unwrap();
    assert_eq!(
        lines,
        [format!("PATH={path}"), "RESTART_REASON=chaos".into()]
    );
}

#[tokio::test]
async fn command_runs_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings(&["pwd"]);
    settings.working_dir = Some(dir.path().to_owned());
    let output = restart(&restarter(&settings))
        .await
        .unwrap()
        .output
        .unwrap();
    assert_eq!(
        Path::new(output.trim()).canonicalize().unwrap(),
        dir.path().canonicalize().unwrap()
    );
    settings.working_dir = Some(dir.path().join("missing"));
    let error = CommandRestarter::new(&settings, HostMap::default()).unwrap_err();
    assert_eq!(error.key, "restarter.command.working_dir", "{error}");
}

#[test]
fn settings_load_from_toml_and_bad_ones_name_their_key() {
    let loaded: CommandSettings = toml::from_str(
        r#"
        argv = ["kubectl", "delete", "pod", "{instance_name}"]
        timeout = "45s"
        env_allow = ["PATH", "KUBECONFIG"]
        env = { RESTARTED_BY = "mandrill" }
        max_output = 8192
        permanent_exit_codes = [2]
        "#,
    )
    .unwrap();
    loaded.validate().unwrap();
    assert_eq!(loaded.timeout, Duration::from_secs(45));
    assert_eq!(loaded.max_output, 8192);
    let round_trip: CommandSettings = toml::from_str(&toml::to_string(&loaded).unwrap()).unwrap();
    assert_eq!(round_trip, loaded);

    let key = |settings: CommandSettings| settings.validate().unwrap_err().0;
    assert_eq!(key(CommandSettings::default()), "argv");
    assert_eq!(key(settings(&["{host}"])), "argv");
    assert_eq!(key(settings(&["ssh", "{hostname}"])), "argv");
    let mut bad = settings(&["true"]);
    bad.permanent_exit_codes = vec![0];
    assert_eq!(key(bad), "permanent_exit_codes");
    let mut bad = settings(&["true"]);
    bad.env_allow = vec!["A=B".into()];
    assert_eq!(key(bad), "env_allow");
    let mut bad = settings(&["true"]);
    bad.timeout = Duration::ZERO;
    assert_eq!(key(bad), "timeout");
    let error = toml::from_str::<CommandSettings>("argv = [\"true\"]\nshell = true")
        .unwrap_err()
        .to_string();
    assert!(error.contains("shell"), "{error}");
}

#[tokio::test]
async fn process_left_behind_holding_the_output_neither_stalls_a_success_nor_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pid = dir.path().join("daemon.pid");
    // The background sleep inherits stdout and keeps the pipe open.
    let mut settings = settings(&[
        "sh",
        "-c",
        "sleep 1000 & echo $! > \"$0\"; echo started",
        pid.to_str().unwrap(),
    ]);
    settings.timeout = Duration::from_secs(600);
    let restarted = restart(&restarter(&settings)).await.unwrap();
    let daemon = read_pid(&pid);
    let _cleanup = KillOnDrop(vec![daemon]);
    assert_eq!(restarted.output.as_deref(), Some("started\n"));
    assert!(alive(daemon), "a successful run kills nothing it started");
}
