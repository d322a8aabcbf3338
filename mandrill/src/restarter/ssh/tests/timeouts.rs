//! Commands that fail, run too long or hold their output: the exit status
//! decides, a timed-out command is killed on the host before the restart
//! returns, and one whose kill cannot be confirmed is never retried beside it.

use super::*;

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
async fn an_end_near_the_timeout_with_a_process_left_on_the_output_is_not_a_time_out() {
    // The host is asked whether the command is gone at growing intervals;
    // an end between the last ask and the time-out must still be read as
    // one, not killed as a time-out (a retry would restart the host again).
    let sshd = PrivateSshd::start();
    let pidfile = sshd.path("daemon.pid");
    let _daemon = KillOnDrop(pidfile.clone());
    let settings = SshSettings {
        timeout: Duration::from_secs(4),
        ..ssh_settings(
            &sshd,
            &[
                "sh",
                "-c",
                "sleep 600 & echo $! > \"$1\"; sleep 3.2",
                "sh",
                pidfile.to_str().unwrap(),
            ],
        )
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    let restarted = restart(&restarter, "cattle-ab12").await.unwrap();

    // (Silent: in the last stretch the status is read beside the output,
    // whose tail may be lost.)
    assert_eq!(restarted.output, None);
    let daemon = pid_in(&pidfile).await;
    assert!(alive(daemon), "what the command left running is left alone");
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
