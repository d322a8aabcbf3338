//! The policy: a leashed worker restarts nothing, an ineligible instance is
//! denied, and the kill switch (set by an operator, or by a host that did
//! not come back) defers every restart.

use super::*;

#[tokio::test(start_paused = true)]
async fn leashed_worker_records_the_would_be_action_and_restarts_nothing() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy {
        dry_run: true,
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-leash").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.dry_runs.get(), 1);
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::DryRun);
    // The claim was made (the decision is audited like a real restart) and
    // the exact action is recorded.
    assert_eq!(entry.attempts, 1);
    assert_eq!(
        entry.output.as_deref(),
        Some("restart cattle-leash.example.net (simulated)")
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ineligible_instance_is_denied_recorded_and_acked_without_a_claim() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy {
        eligibility: Eligibility::new(&["cattle-*".into()], &["cattle-db*".into()], true).unwrap(),
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let db = h.publish("cattle-db01").await;
    let pet = h.publish("pet-01").await;
    h.publish("cattle-ok").await;
    let stats = h.stats.clone();
    wait_until("all acked", || stats.acked.get() == 3).await;
    assert_eq!(stats.denied.get(), 2);
    assert_eq!(restarter.calls("cattle-ok.example.net"), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    assert_eq!(
        store.timeline.count("claim"),
        1,
        "denied requests claim nothing"
    );
    for (id, why) in [(db, "safety.deny"), (pet, "no safety.allow")] {
        let entry = store.entry(id);
        assert_eq!(entry.status, Status::Denied);
        assert!(entry.last_error.unwrap().contains(why));
    }
    h.stop().await.unwrap();
}

/// `safety.deny` matches the address the `[[hosts]]` map reaches a host
/// at, as it matches the inventory's: `deny = ["db-*"]` stops `cattle-a9`
/// when the map sends it to `DB-Primary.internal`.
#[tokio::test(start_paused = true)]
async fn deny_matches_the_address_the_hosts_map_gives() {
    use crate::restarter::hosts::{HostEntry, HostMap};
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let entry = |pattern: &str, address: &str| HostEntry {
        pattern: pattern.into(),
        address: Some(address.into()),
        port: None,
        user: None,
    };
    let hosts = HostMap::new(&[
        entry("cattle-*", "10.0.0.1"),
        entry("cattle-a9", "DB-Primary.internal"),
    ])
    .unwrap();
    let config = with_policy(Policy {
        eligibility: Eligibility::new(&["cattle-*".into()], &["db-*".into()], true).unwrap(),
        hosts: Arc::new(hosts),
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let db = h.publish("cattle-a9").await;
    h.publish("cattle-a1").await;
    let stats = h.stats.clone();
    wait_until("both acked", || stats.acked.get() == 2).await;
    assert_eq!(stats.denied.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let entry = store.entry(db);
    assert_eq!(entry.status, Status::Denied);
    let why = entry.last_error.unwrap();
    assert!(
        why.contains("safety.deny") && why.contains("DB-Primary.internal"),
        "{why}"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn paused_store_defers_every_restart_until_resumed() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    store.set_switch(true, "sre", "incident 42").await.unwrap();
    let h = start(config(), store.clone(), restarter.clone());
    for n in 0..5 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    let stats = h.stats.clone();
    // Ten minutes paused: nothing is even pulled, so the messages wait in
    // the broker and spend no delivery (a paused backlog is never given up).
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(stats.pulled.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(h.broker.inner.depth().ready, 5);
    store.set_switch(false, "sre", "resolved").await.unwrap();
    wait_until("all acked", || stats.acked.get() == 5).await;
    assert_eq!(restarter.timeline.count("restart-started"), 5);
    assert_eq!(stats.pulled.get(), 5, "each delivered once");
    // Deferrals used no attempt.
    assert!(
        store
            .inner
            .entries()
            .iter()
            .all(|e| e.status == Status::Restarted && e.attempts == 1)
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_host_that_does_not_come_back_pauses_every_restart() {
    a_host_that_does_not_come_back_pauses_every_restart_with(ScriptedStore::default()).await;
}

/// The pause fails closed: a store blip while setting the switch is retried,
/// not logged and passed over while restarts go on.
#[tokio::test(start_paused = true)]
async fn the_pause_after_an_unrecovered_host_survives_a_store_blip() {
    let store = ScriptedStore {
        failing_switch_sets: AtomicU32::new(2),
        ..ScriptedStore::default()
    };
    let timeline = a_host_that_does_not_come_back_pauses_every_restart_with(store).await;
    assert_eq!(timeline.count("switch-failed"), 2);
    assert_eq!(timeline.count("switch true"), 1);
}

async fn a_host_that_does_not_come_back_pauses_every_restart_with(
    store: ScriptedStore,
) -> Timeline {
    let store = Arc::new(store);
    let restarter = Arc::new(ScriptedRestarter {
        script: Some(|request| {
            if request.instance_name.as_str() == "cattle-gone" {
                return Err(RestartError::Unrecovered {
                    host: request.hostname.clone(),
                    after: Duration::from_secs(300),
                    cause: "connection refused".into(),
                    output: None,
                });
            }
            Ok(Restarted::default())
        }),
        ..Default::default()
    });
    let config = with_policy(Policy {
        pause_on_unrecovered: true,
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    h.publish("cattle-gone").await;
    let stats = h.stats.clone();
    wait_until("unrecovered", || stats.unrecovered.get() == 1).await;
    // Set before the outcome is recorded, after any retries.
    let timeline = store.timeline.clone();
    wait_until("paused", || timeline.count("switch true") == 1).await;
    let switch = store.switch().await.unwrap();
    assert!(switch.paused);
    assert!(
        switch
            .reason
            .unwrap()
            .contains("cattle-gone.example.net did not recover")
    );
    h.publish("cattle-next").await;
    wait_until("deferred", || stats.deferred.get() >= 1).await;
    assert_eq!(restarter.calls("cattle-next.example.net"), 0);
    h.stop().await.unwrap();
    store.timeline.clone()
}

/// Serves a stop condition's HTTP probe, always healthy; the first probe
/// turns the kill switch on before it answers, as `mandrill pause` landing
/// while the stop conditions run.
async fn probe_that_pauses(store: Arc<MemoryStore>) -> (String, JoinHandle<()>) {
    probe_that_pauses_group(store, None).await
}

/// As [`probe_that_pauses`]; with `group`, it pauses that group alone.
async fn probe_that_pauses_group(
    store: Arc<MemoryStore>,
    group: Option<&'static str>,
) -> (String, JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/healthy", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        for probe in 0.. {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_http_request(&mut socket).await;
            if probe == 0 {
                match group {
                    None => store
                        .set_switch(true, "alice", "incident 42")
                        .await
                        .unwrap(),
                    Some(group) => {
                        store
                            .set_group_pause(group, Some(("alice", "incident 42")))
                            .await
                            .unwrap();
                    }
                }
            }
            let healthy = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            socket.write_all(healthy).await.unwrap();
        }
    });
    (url, server)
}

/// A `pause` after the claim's transaction, while the stop conditions run,
/// stops the restart: the switch is read once more right before it is
/// issued, not only by the claim.
/// The claim is given back, so the resumed redelivery uses attempt 1.
#[tokio::test(start_paused = true)]
async fn a_pause_while_the_stop_conditions_run_stops_the_restart_and_gives_the_claim_back() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let (url, server) = probe_that_pauses(store.inner.clone()).await;
    let alerts = http_stop_condition(url);
    let config = with_policy(Policy {
        stop_conditions: alerts,
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-paused").await;
    let stats = h.stats.clone();
    wait_until("deferred", || stats.deferred.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    assert_eq!(stats.nacked.get(), 1);
    let entry = store.entry(id);
    assert_eq!(
        entry.attempts, 0,
        "a given-back claim is not a used attempt"
    );
    let story = store.inner.story(id).await.unwrap().unwrap();
    let decision = story.decisions.last().unwrap();
    assert_eq!(
        (decision.verdict.as_str(), decision.guard.as_str()),
        ("deferred", "kill switch")
    );
    assert!(
        decision.reason.contains("paused by alice (incident 42)"),
        "{}",
        decision.reason
    );

    store
        .inner
        .set_switch(false, "alice", "resolved")
        .await
        .unwrap();
    wait_until("restarted", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    server.abort();
    h.stop().await.unwrap();
}

/// A group pause that lands while the stop conditions run (a recovery
/// objective breached meanwhile) stops the restart as the kill switch
/// does: the pauses are read once more right before it is issued, the
/// claim is given back, and the restart goes on once the group resumes.
#[tokio::test(start_paused = true)]
async fn a_group_pause_while_the_stop_conditions_run_stops_the_restart_and_gives_the_claim_back() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let (url, server) = probe_that_pauses_group(store.inner.clone(), Some("cattle")).await;
    let alerts = http_stop_condition(url);
    let config = with_policy(Policy {
        stop_conditions: alerts,
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-paused").await;
    let stats = h.stats.clone();
    wait_until("deferred", || stats.deferred.get() >= 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    assert_eq!(
        store.entry(id).attempts,
        0,
        "a given-back claim is not a used attempt"
    );
    let story = store.inner.story(id).await.unwrap().unwrap();
    // The stop conditions passed (their result recorded), then the pause
    // held it.
    let verdicts: Vec<(&str, &str)> = story
        .decisions
        .iter()
        .map(|d| (d.verdict.as_str(), d.guard.as_str()))
        .collect();
    assert_eq!(
        verdicts,
        [("checked", "stop conditions"), ("deferred", "group pause")]
    );
    let decision = &story.decisions[1];
    assert!(
        decision
            .reason
            .contains("group cattle paused by alice (incident 42)"),
        "{}",
        decision.reason
    );

    store.inner.set_group_pause("cattle", None).await.unwrap();
    wait_until("restarted", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    server.abort();
    h.stop().await.unwrap();
}

/// A switch that cannot be read right before the restart counts as on.
#[tokio::test(start_paused = true)]
async fn a_switch_unreadable_right_before_the_restart_stops_it() {
    let store = Arc::new(ScriptedStore {
        claim_gate: Some(Semaphore::new(0)),
        ..ScriptedStore::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    // The switch is read again after stop conditions, which may take long.
    let healthy = crate::safety::StopConditionSettings {
        name: "healthy".into(),
        http: None,
        expect_status: None,
        command: Some(vec!["true".into()]),
        timeout: Duration::from_secs(600),
        expect_empty_json_array: false,
    };
    let config = with_policy(Policy {
        stop_conditions: crate::safety::StopConditions::new(&[healthy]).unwrap(),
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-unread").await;
    wait_until("claiming", || store.timeline.count("claim-waiting") == 1).await;
    store.switch_unreachable.store(true, Ordering::Release);
    store.claim_gate.as_ref().unwrap().add_permits(1);
    let stats = h.stats.clone();
    wait_until("deferred", || stats.deferred.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    assert_eq!(store.entry(id).attempts, 0);
    h.stop().await.unwrap();
}
