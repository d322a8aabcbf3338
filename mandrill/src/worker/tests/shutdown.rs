//! Shutdown: what has not started is nacked after the grace period, a
//! claim already sent is given back, a claim whose grace period ended
//! before its restart issues nothing, an issued restart is still recorded,
//! and a second signal skips the wait.

use super::*;

#[tokio::test(start_paused = true)]
async fn shutdown_nacks_what_has_not_started_after_the_grace_period() {
    let store = Arc::new(ScriptedStore {
        claim_gate: Some(Semaphore::new(0)),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    for n in 0..4 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    wait_until("four claims stuck", || {
        store.timeline.count("claim-waiting") == 4
    })
    .await;
    let began = Instant::now();
    let stats = h.stats.clone();
    let broker = h.broker.clone();
    h.stop().await.unwrap();
    assert!(began.elapsed() >= config().shutdown_grace);
    assert_eq!(stats.nacked.get(), 4);
    assert_eq!(stats.acked.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    // Nacked without delay: visible again for the next consumer.
    assert_eq!(broker.inner.depth().ready, 4);
}

#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_the_grace_period_is_given_back() {
    // Committed half a second after the grace period ends, as a writer
    // that had queued it would: the handler must not drop it unanswered.
    let store = Arc::new(ScriptedStore {
        queued_claims: true,
        claim_delay: config().shutdown_grace + Duration::from_millis(500),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    h.publish("cattle-0001").await;
    wait_until("the claim queued", || {
        store.timeline.count("claim-queued") == 1
    })
    .await;
    let stats = h.stats.clone();
    h.stop().await.unwrap();
    // Whatever the handler did, the queued claim has committed by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.nacked.get(), 1);
    // Given back: no attempt used by a restart never issued.
    let entry = store.inner.history(1).await.unwrap().remove(0);
    assert_eq!(entry.attempts, 0, "{entry:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_nacks_messages_still_waiting_for_restart_capacity() {
    let restarter = Arc::new(ScriptedRestarter {
        reserve_gate: Some(Semaphore::new(0)),
        ..Default::default()
    });
    let store = Arc::new(ScriptedStore::default());
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-0001").await;
    wait_until("waiting for capacity", || {
        restarter.timeline.count("reserve-waiting") == 1
    })
    .await;
    let stats = h.stats.clone();
    h.stop().await.unwrap();
    assert_eq!(stats.nacked.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    // Nothing was saved: the request was never begun.
    assert_eq!(store.inner.lookup(id).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn second_signal_skips_the_grace_period() {
    let store = Arc::new(ScriptedStore {
        claim_gate: Some(Semaphore::new(0)),
        ..Default::default()
    });
    let config = WorkerConfig {
        shutdown_grace: Duration::from_secs(3600),
        ..config()
    };
    let h = start(
        config,
        store.clone(),
        Arc::new(ScriptedRestarter::default()),
    );
    h.publish("cattle-0001").await;
    wait_until("claim stuck", || store.timeline.count("claim-waiting") == 1).await;
    let began = Instant::now();
    h.shutdown.request();
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.shutdown.hurry();
    let stats = h.stats.clone();
    h.worker.await.unwrap().unwrap();
    assert!(began.elapsed() < Duration::from_secs(60));
    assert_eq!(stats.nacked.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn issued_restart_is_recorded_and_acked_even_after_the_grace_period() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        delay: Duration::from_secs(30),
        ..Default::default()
    });
    let h = start(config(), store.clone(), restarter.clone());
    let first = h.publish("cattle-0001").await;
    let second = h.publish("cattle-0002").await;
    wait_until("both restarts issued", || {
        restarter.timeline.count("restart-started") == 2
    })
    .await;
    let began = Instant::now();
    let stats = h.stats.clone();
    h.stop().await.unwrap();
    // The grace period (5 s) ended long before the restarts (30 s) did, yet
    // shutdown waited for them to be recorded and acked.
    assert!(began.elapsed() >= Duration::from_secs(29));
    assert_eq!(stats.acked.get(), 2);
    assert_eq!(stats.nacked.get(), 0);
    for id in [first, second] {
        assert_eq!(
            store.inner.lookup(id).await.unwrap(),
            Some(Status::Restarted)
        );
    }
}

/// Leashed, the grace period ends while the dry run's outcome cannot be
/// recorded (the store fails): nothing was issued, so the claim is given
/// back, so that the next delivery does not count an attempt "issued,
/// outcome unknown" that never was.
#[tokio::test(start_paused = true)]
async fn a_dry_run_unrecorded_when_the_grace_period_ends_gives_the_claim_back() {
    let store = Arc::new(ScriptedStore {
        outcome_fails: AtomicBool::new(true),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(crate::safety::Policy {
        dry_run: true,
        ..crate::safety::Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-leashed").await;
    wait_until("recording fails", || {
        store.timeline.count("record-failed") >= 1
    })
    .await;
    let stats = h.stats.clone();
    h.stop().await.unwrap();
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.nacked.get(), 1);
    assert_eq!(store.timeline.count("released 1"), 1);
    let story = store.inner.story(id).await.unwrap().unwrap();
    assert_eq!(story.entry.attempts, 0, "{:?}", story.entry);
    assert!(story.attempts.is_empty(), "{:?}", story.attempts);
}

/// The grace period ending after the stop conditions passed, while the
/// switch is read once more before the restart: nothing is issued, and the
/// claim is given back (it was issued, and then its outcome recorded past
/// the deadline, which made the redelivery restart the host again). The
/// same with the fleet paused meanwhile (pause, then stop, is how a game
/// day ends): the claim was left held, then counted as an attempt issued
/// with its outcome unknown, which failed a request with one attempt that
/// never restarted anything.
#[tokio::test(start_paused = true)]
async fn a_grace_period_ending_after_the_stop_conditions_issues_nothing() {
    for paused in [false, true] {
        let (stop_conditions, server) = super::late_checks::probe_that_first(|| {}).await;
        let store = Arc::new(ScriptedStore {
            // The worker's read at start passes; the one before the restart waits.
            switch_gate: Some(Semaphore::new(1)),
            ..Default::default()
        });
        let restarter = Arc::new(ScriptedRestarter::default());
        let config = WorkerConfig {
            policy: PolicyHandle::new(Policy {
                stop_conditions,
                ..Policy::default()
            }),
            // Only the read before the restart waits at the gate.
            switch_poll_interval: Duration::ZERO,
            ..config()
        };
        let h = start(config, store.clone(), restarter.clone());
        let id = h.publish("cattle-0001").await;
        wait_until("the switch read before the restart", || {
            store.timeline.count("switch-waiting") == 2
        })
        .await;
        if paused {
            store
                .inner
                .set_switch(true, "ana", "game day over")
                .await
                .unwrap();
        }
        h.shutdown.request();
        h.shutdown.hurry();
        store.switch_gate.as_ref().unwrap().add_permits(1);
        let stats = h.stats.clone();
        h.worker.await.unwrap().unwrap();
        server.abort();
        assert_eq!(restarter.timeline.count("restart-started"), 0);
        assert_eq!(stats.nacked.get(), 1, "paused: {paused}");
        assert_eq!(
            store.entry(id).attempts,
            0,
            "the claim is given back (paused: {paused})"
        );
    }
}
