//! A restart's way through the worker: issued only once claimed and acked
//! once its outcome is recorded; failures retried with growing delays
//! (or as long as the backend says), then dead-lettered; permanent failures
//! and hosts that do not come back never retried; a panic nacked; blocking
//! backends kept off the runtime's threads.

use super::*;

#[tokio::test(start_paused = true)]
async fn restart_is_issued_only_after_its_claim_is_recorded_and_acked_after_its_outcome() {
    let store = Arc::new(ScriptedStore {
        claim_delay: Duration::from_secs(5),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter {
        delay: Duration::from_secs(2),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    h.publish("cattle-ab12").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    let claimed_at = store.timeline.when("claim Ok(Claimed")[0];
    let started_at = restarter.timeline.when("restart-started")[0];
    let restarted_at = restarter.timeline.when("restarted")[0];
    let recorded_at = store.timeline.when("recorded restarted")[0];
    let acked_at = h.broker.timeline.when("ack")[0];
    // The audit record of the claim comes before anything touches the host.
    assert!(claimed_at <= started_at);
    assert!(restarted_at <= recorded_at && recorded_at <= acked_at);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failed_restart_is_retried_with_growing_delay_then_dead_lettered() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        always_fails: true,
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-dead").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    let events: Vec<String> = h
        .broker
        .timeline
        .events()
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let settlements: Vec<&str> = events
        .iter()
        .map(String::as_str)
        .filter(|e| !e.starts_with("extend"))
        .collect();
    assert_eq!(settlements[..2], ["nack 1000", "nack 2000"]);
    assert!(settlements[2].starts_with("dead-letter restart failed after 3 attempts"));
    // The redeliveries really waited for their delays.
    let starts = restarter.timeline.when("restart-started");
    assert!(starts[1] - starts[0] >= Duration::from_secs(1));
    assert!(starts[2] - starts[1] >= Duration::from_secs(2));
    assert_eq!(restarter.calls("cattle-dead.example.net"), 3);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    assert_eq!(h.broker.inner.dead_letters().len(), 1);
    // Counted by its reason, for `/metrics`.
    let reason = crate::stats::DeadLetterReason::RestartFailed;
    assert_eq!(stats.dead_letter_reasons[reason as usize].get(), 1);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failed_request_whose_dead_letter_failed_is_dead_lettered_on_redelivery() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        always_fails: true,
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    h.broker.failing_dead_letters.store(1, Ordering::Release);
    let id = h.publish("cattle-dead").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    // The failed dead-letter left the delivery leased; its redelivery found
    // the outcome recorded and dead-lettered it without restarting again.
    assert_eq!(h.broker.timeline.count("dead-letter-failed"), 1);
    assert_eq!(restarter.calls("cattle-dead.example.net"), 3);
    assert_eq!(stats.acked.get(), 0);
    assert_eq!(h.broker.inner.dead_letters().len(), 1);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn permanent_restart_failure_is_dead_lettered_at_once_without_retries() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::permanent(
                &request.hostname,
                "host key mismatch",
            ))
        }),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-badkey").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    assert_eq!(restarter.calls("cattle-badkey.example.net"), 1);
    assert_eq!(stats.nacked.get(), 0);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(reason.contains("host key mismatch"), "{reason}");
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_backend_sets_the_redelivery_delay() {
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::Failed {
                host: request.hostname.clone(),
                cause: "503 Service Unavailable".into(),
                retry_after: Some(Duration::from_secs(42)),
            })
        }),
        ..Default::default()
    });
    let h = start(config(), Arc::new(MemoryStore::new()), restarter.clone());
    h.publish("cattle-busy").await;
    let stats = h.stats.clone();
    wait_until("nacked", || stats.nacked.get() == 1).await;
    assert_eq!(h.broker.timeline.count("nack 42000"), 1);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn host_that_does_not_come_back_is_recorded_unrecovered_and_not_restarted_again() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::Unrecovered {
                host: request.hostname.clone(),
                after: Duration::from_secs(300),
                cause: "connection refused".into(),
                output: Some("rebooting".into()),
            })
        }),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-gone").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.unrecovered.get(), 1);
    assert_eq!(restarter.calls("cattle-gone.example.net"), 1);
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Unrecovered);
    assert_eq!(entry.output.as_deref(), Some("rebooting"));
    // The cause is recorded with the error, not only logged.
    let recorded = entry.last_error.unwrap();
    assert!(
        recorded.ends_with("did not recover within 300s: connection refused"),
        "{recorded}"
    );
    h.stop().await.unwrap();
}

/// A backend that cannot confirm that a timed-out restart stopped (an ssh
/// command whose kill went unanswered) records nothing: the claim keeps
/// the host held for its whole hold, so no second restart runs beside the
/// first, and then counts as a used attempt ("issued, outcome unknown").
#[tokio::test(start_paused = true)]
async fn a_restart_that_may_still_be_running_holds_the_host_until_its_claim_expires() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            Err(RestartError::OutcomeUnknown {
                host: request.hostname.clone(),
                cause: "the kill did not finish within 4s".into(),
            })
        }),
        ..Default::default()
    });
    let config = WorkerConfig {
        max_attempts: 2,
        ..config()
    };
    // restart_timeout + 2 × the broker's lease.
    let hold = config.restart_timeout + 2 * ACK_DEADLINE;
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-stuck").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;

    assert_eq!(restarter.calls("cattle-stuck.example.net"), 2);
    let claims = store.timeline.when("claim Ok(Claimed");
    let starts = restarter.timeline.when("restart-started");
    assert!(
        starts[1] - claims[0] >= hold,
        "the second restart waited out the first one's hold"
    );
    assert_eq!(
        store.timeline.count("recorded retrying"),
        0,
        "no outcome recorded for a restart that may still run"
    );
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Failed);
    let error = entry.last_error.unwrap_or_default();
    assert!(error.contains("outcome was never recorded"), "{error}");
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn panic_in_one_handler_nacks_it_and_the_service_goes_on() {
    let restarter = Arc::new(ScriptedRestarter {
        panics_on: Some("cattle-boom"),
        ..Default::default()
    });
    let h = start(config(), Arc::new(MemoryStore::new()), restarter.clone());
    h.publish("cattle-boom").await;
    h.publish("cattle-fine").await;
    let stats = h.stats.clone();
    wait_until("the good one acked and the bad one dead", || {
        stats.acked.get() == 1 && stats.dead_lettered.get() == 1
    })
    .await;
    // Panicked on each of its 3 attempts, each issued with its outcome
    // unknown: nacked until each claim's hold ended, then given up.
    assert_eq!(stats.panics.get(), 3);
    assert_eq!(stats.nacked.get(), 3);
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(reason.contains("panicked"), "{reason}");
    // Still serving.
    h.publish("cattle-after").await;
    wait_until("later message acked", || stats.acked.get() == 2).await;
    h.stop().await.unwrap();
}

/// Blocks its thread for hosts named `cattle-blk*` until released.
struct BlockingTestRestarter {
    release: Mutex<std::sync::mpsc::Receiver<()>>,
    blocked: AtomicU32,
}

impl crate::restarter::BlockingRestart for BlockingTestRestarter {
    fn restart_blocking(&self, request: &RestartRequest) -> Result<Restarted, RestartError> {
        if request.hostname.as_str().starts_with("cattle-blk") {
            self.blocked.fetch_add(1, Ordering::AcqRel);
            // Wait for the test to release one blocked restart.
            self.release.lock().unwrap().recv().unwrap();
        }
        Ok(Restarted::default())
    }
}

/// Real time and the single-threaded runtime: if the blocking restarts ran on
/// the runtime's thread, nothing else could progress and this would time out.
#[tokio::test]
async fn blocking_restarts_do_not_stall_pulling_or_other_messages() {
    let (release, released) = std::sync::mpsc::channel();
    let blocking = Arc::new(crate::restarter::Blocking::new(
        BlockingTestRestarter {
            release: Mutex::new(released),
            blocked: AtomicU32::new(0),
        },
        4,
    ));
    let store = Arc::new(MemoryStore::new());
    let h = start(config(), store, blocking.clone());
    h.publish("cattle-blk1").await;
    h.publish("cattle-blk2").await;
    for n in 0..5 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    let stats = h.stats.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stats.acked.get() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "other messages stalled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Both blocking restarts are still in progress while the others finished.
    assert_eq!(stats.in_flight.get(), 2);
    release.send(()).unwrap();
    release.send(()).unwrap();
    while stats.acked.get() < 7 {
        assert!(
            std::time::Instant::now() < deadline,
            "released restarts never finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.stop().await.unwrap();
}

/// A panic after the restart was issued: the restart may have run, so the
/// attempt is issued with its outcome unknown, as after a crash. Its claim
/// is left to hold: no other delivery restarts the host before the hold
/// ends (the restart would have timed out by then), and then the attempt
/// counts as used, so with `max_attempts = 1` the host is never restarted
/// again. Recorded as `retrying`, the attempt would lift the hold and let
/// the redelivery restart the host a second later, perhaps beside a
/// restart still running; recorded as `failed`, the history would say the
/// restart did not happen.
#[tokio::test(start_paused = true)]
async fn a_panic_after_the_restart_was_issued_counts_as_issued_with_its_outcome_unknown() {
    let hold = config().restart_timeout + 2 * ACK_DEADLINE;
    for max_attempts in [1, 2] {
        let store = Arc::new(ScriptedStore::default());
        let restarter = Arc::new(ScriptedRestarter {
            panics_once_issued: AtomicU32::new(1),
            ..Default::default()
        });
        let worker_config = WorkerConfig {
            max_attempts,
            ..config()
        };
        let h = start(worker_config, store.clone(), restarter.clone());
        let id = h.publish("cattle-boom").await;
        let stats = h.stats.clone();
        wait_until("settled for good", || {
            stats.acked.get() + stats.dead_lettered.get() == 1
        })
        .await;
        assert_eq!(stats.panics.get(), 1);
        assert_eq!(store.timeline.count("recorded retrying"), 0);
        // Nacked until the claim's hold ends, not settled at once.
        let first_settlement = h
            .broker
            .timeline
            .events()
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| !e.starts_with("extend"));
        assert_eq!(
            first_settlement,
            Some(format!("nack {}", hold.as_millis())),
            "max_attempts = {max_attempts}"
        );
        let starts = restarter.timeline.when("restart-started");
        let claims = store.timeline.when("claim ");
        let entry = store.entry(id);
        if max_attempts == 1 {
            // Its one attempt is used: never restarted again, and the
            // history says why.
            assert_eq!(starts.len(), 1);
            assert_eq!((entry.status, entry.attempts), (Status::Failed, 1));
            let error = entry.last_error.unwrap();
            assert!(error.contains("outcome was never recorded"), "{error}");
            assert!(
                claims[1] - starts[0] >= hold,
                "given up before the hold ended"
            );
        } else {
            // The second attempt, only once the first one's hold is over.
            assert_eq!(starts.len(), 2);
            assert!(
                starts[1] - starts[0] >= hold,
                "restarted again within the hold"
            );
            assert_eq!((entry.status, entry.attempts), (Status::Restarted, 2));
        }
        h.stop().await.unwrap();
    }
}

/// A panic after the restart was issued, on a delivery past
/// `max_deliveries` only because a guard deferred the earlier ones (a
/// request waiting overnight for the calendar): those do not count, as the
/// claim's check does not count them, so the delivery is nacked until the
/// claim's hold ends. It was given up: recorded failed after one attempt,
/// its hold lifted while the restart may still run.
#[tokio::test(start_paused = true)]
async fn a_panic_after_the_restart_on_a_delivery_deferred_before_is_not_its_last() {
    let hold = config().restart_timeout + 2 * ACK_DEADLINE;
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        panics_once_issued: AtomicU32::new(1),
        ..Default::default()
    });
    let (id, body) = payload("cattle-late");
    let mut waited = crate::domain::testing::request("cattle-late");
    waited.message_id = id;
    let deferred = crate::store::Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "deferred by calendar: closed",
    };
    store
        .inner
        .record_decision(&waited, 0, deferred)
        .await
        .unwrap();
    let worker_config = WorkerConfig {
        max_deliveries: 1,
        ..config()
    };
    let h = start(worker_config, store.clone(), restarter.clone());
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("the panic", || stats.panics.get() == 1).await;
    wait_until("settled", || {
        h.broker
            .timeline
            .events()
            .iter()
            .any(|(_, e)| !e.starts_with("extend"))
    })
    .await;
    let first_settlement = h
        .broker
        .timeline
        .events()
        .into_iter()
        .map(|(_, e)| e)
        .find(|e| !e.starts_with("extend"));
    assert_eq!(first_settlement, Some(format!("nack {}", hold.as_millis())));
    assert!(!store.entry(id).status.is_final(), "{:?}", store.entry(id));
    h.stop().await.unwrap();
}
