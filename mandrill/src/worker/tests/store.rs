//! The store's part: an outcome not recorded yet is retried in place (and
//! pauses pulling), one refused for good is dead-lettered after the one
//! restart; claims held by another delivery, or never followed by an
//! outcome, limit the restarts; a recorded request is not restarted again.

use super::*;

#[tokio::test(start_paused = true)]
async fn outcome_that_cannot_be_recorded_yet_is_retried_in_place_never_acked_never_restarted_again()
{
    let store = Arc::new(ScriptedStore::default());
    store.outcome_fails.store(true, Ordering::Release);
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-nodisk").await;
    let stats = h.stats.clone();
    wait_until("many failed tries", || {
        store.timeline.count("record-failed") >= 20
    })
    .await;
    // Minutes of failure: never acked, never nacked (a nack would cost a
    // delivery and, on redelivery, maybe a restart), lease kept meanwhile.
    assert_eq!(stats.acked.get() + stats.nacked.get(), 0);
    assert_eq!(stats.store_down.get(), 1);
    assert!(h.broker.timeline.count("extend") > 0);
    // The store recovers: the same delivery records, then acks.
    store.outcome_fails.store(false, Ordering::Release);
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(
        store.inner.lookup(id).await.unwrap(),
        Some(Status::Restarted)
    );
    assert_eq!(restarter.calls("cattle-nodisk.example.net"), 1);
    assert_eq!(stats.pulled.get(), 1);
    assert_eq!(stats.store_down.get(), 0);
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn outcome_the_store_refuses_for_good_is_dead_lettered_after_one_restart() {
    let store = Arc::new(ScriptedStore::default());
    store.outcome_refused.store(true, Ordering::Release);
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    h.publish("cattle-nul").await;
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    // Seen before: nacked, and every redelivery restarted the host again.
    assert_eq!(restarter.calls("cattle-nul.example.net"), 1);
    assert_eq!(store.timeline.count("record-refused"), 1);
    assert_eq!(stats.nacked.get(), 0);
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(
        reason.contains("could not be recorded") && reason.contains("0x00"),
        "{reason}"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn store_outage_pauses_pulling_and_costs_no_delivery_or_attempt() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    store.down.store(true, Ordering::Release);
    let first = h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("store found down", || stats.store_down.get() == 1).await;
    for n in 2..=20 {
        h.publish(&format!("cattle-{n:04}")).await;
    }
    // Four minutes of outage (it dead-lettered a whole backlog before).
    tokio::time::sleep(Duration::from_secs(240)).await;
    assert_eq!(stats.pulled.get(), 1, "no new work while the store is down");
    assert_eq!(stats.nacked.get() + stats.dead_lettered.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(h.broker.inner.depth().ready, 19);
    store.down.store(false, Ordering::Release);
    wait_until("all acked", || stats.acked.get() == 20).await;
    assert_eq!(stats.store_outages.get(), 1);
    assert_eq!(stats.pulled.get(), 20, "each delivered once");
    let entry = store
        .inner
        .entries()
        .into_iter()
        .find(|e| e.message_id == Some(first))
        .unwrap();
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn redelivery_while_another_claim_holds_is_deferred_and_the_last_delivery_given_up() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = WorkerConfig {
        max_deliveries: 1,
        ..config()
    };
    let h = start(config.clone(), store.clone(), restarter.clone());
    let (id, body) = payload("cattle-held");
    let request = RestartRequest::parse(&body, &config.parse).unwrap();
    // Another consumer claimed the restart and may still be issuing it.
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(600),
        limits: crate::safety::Limits::NONE,
    };
    store
        .inner
        .claim_restart(&request, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    assert_eq!(stats.deferred.get(), 1);
    assert_eq!(stats.given_up.get(), 1);
    assert_eq!(restarter.calls("cattle-held.example.net"), 0);
    // The give-up is in the history, not only on the broker.
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Failed);
    assert!(
        entry
            .last_error
            .as_deref()
            .unwrap()
            .contains("delivered 2 times without being settled"),
        "{entry:?}"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn claims_whose_outcome_was_never_recorded_use_up_attempts_so_crashes_never_add_restarts() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let (id, body) = payload("cattle-crashy");
    let request = RestartRequest::parse(&body, &config().parse).unwrap();
    // Three deliveries claimed and (maybe) issued a restart, then died.
    let expired = ClaimTerms {
        max_attempts: 3,
        hold: Duration::ZERO,
        limits: crate::safety::Limits::NONE,
    };
    for _ in 0..3 {
        store
            .inner
            .claim_restart(&request, expired, crate::store::ClaimToken::new())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("dead-lettered", || stats.dead_lettered.get() == 1).await;
    assert_eq!(restarter.calls("cattle-crashy.example.net"), 0);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::Failed));
    let reason = &h.broker.inner.dead_letters()[0].reason;
    assert!(reason.contains("never recorded"), "{reason}");
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn redelivered_message_already_recorded_is_acked_without_restarting() {
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let (id, body) = payload("cattle-done");
    let request = RestartRequest::parse(&body, &config().parse).unwrap();
    store
        .record_outcome(&request, 1, &Outcome::restarted())
        .await
        .unwrap();
    h.broker.publish(body).await.unwrap();
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.duplicates.get(), 1);
    assert_eq!(restarter.calls("cattle-done.example.net"), 0);
    assert_eq!(store.lookup(id).await.unwrap(), Some(Status::Restarted));
    h.stop().await.unwrap();
}

/// With no message flowing, the kill switch's poll is the only store read:
/// an outage then still marks the store down (the pull loop pauses, and
/// /readyz turns), and its end is seen by the pull loop's probe: /readyz
/// never says "ready" with the store down.
#[tokio::test(start_paused = true)]
async fn an_outage_with_no_message_flowing_is_still_seen() {
    let store = Arc::new(ScriptedStore::default());
    let h = start(
        config(),
        store.clone(),
        Arc::new(ScriptedRestarter::default()),
    );
    let stats = h.stats.clone();
    // The whole database unreachable: the switch's reads and the probe's.
    store.switch_unreachable.store(true, Ordering::Release);
    store.down.store(true, Ordering::Release);
    wait_until("the store marked down", || stats.store_down.get() == 1).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(stats.store_down.get(), 1, "still down");
    store.switch_unreachable.store(false, Ordering::Release);
    store.down.store(false, Ordering::Release);
    wait_until("the store marked up", || stats.store_down.get() == 0).await;
    assert_eq!(stats.store_outages.get(), 1);
    h.stop().await.unwrap();
}

/// A read of the switch that fails while it is on marks the store down;
/// once the switch is off and the store answers again, pulling resumes
/// (the pull loop waited on shutdown alone: this instance never pulled
/// again).
#[tokio::test(start_paused = true)]
async fn a_store_blip_during_a_pause_does_not_stop_pulling_after_the_resume() {
    let store = Arc::new(ScriptedStore::default());
    store.set_switch(true, "sre", "incident 42").await.unwrap();
    let h = start(
        config(),
        store.clone(),
        Arc::new(ScriptedRestarter::default()),
    );
    let stats = h.stats.clone();
    h.publish("cattle-0001").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    store.switch_unreachable.store(true, Ordering::Release);
    wait_until("the store marked down", || stats.store_down.get() == 1).await;
    store.switch_unreachable.store(false, Ordering::Release);
    store.set_switch(false, "sre", "resolved").await.unwrap();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.store_down.get(), 0);
    assert_eq!(stats.pulled.get(), 1);
    h.stop().await.unwrap();
}

/// A claim committed whose answer was lost (the call timed out) is
/// answered again by the retry (the same token), with the time and guards
/// of the lost try. Answered long after (here 20 s, past half the hold's
/// 20 s margin), it is given back, not used, and the redelivery claims
/// afresh: one restart, on the attempt claimed afresh.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_long_after_a_timed_out_try_is_given_back_and_claimed_afresh() {
    let store = Arc::new(ScriptedStore {
        lost_claim_answers: AtomicU32::new(1),
        claim_delay: Duration::from_secs(20),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(store.timeline.count("claim-answer-lost"), 1);
    assert_eq!(store.timeline.count("released 1"), 1, "given back");
    assert_eq!(stats.deferred.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let story = store.inner.story(id).await.unwrap().unwrap();
    assert!(
        story
            .decisions
            .iter()
            .any(|d| d.reason.contains("answered after a try that timed out")),
        "{story:?}"
    );
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    h.stop().await.unwrap();
}

/// Answered soon after the timed-out try, the claim is used: its hold is
/// still long enough for the restart, and nothing is redelivered.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_soon_after_a_timed_out_try_is_used() {
    let store = Arc::new(ScriptedStore {
        lost_claim_answers: AtomicU32::new(1),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config(), store.clone(), restarter.clone());
    let id = h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(store.timeline.count("claim-answer-lost"), 1);
    assert_eq!(store.timeline.count("released 1"), 0);
    assert_eq!(stats.pulled.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    h.stop().await.unwrap();
}

/// A reload between a try that timed out and the retry: the retry is still
/// sent (only its answer names the attempt that try may have claimed), and
/// the answer is given back, to be decided afresh under the new policy.
#[tokio::test(start_paused = true)]
async fn a_reload_after_a_timed_out_claim_try_gives_the_answer_back() {
    let store = Arc::new(ScriptedStore {
        lost_claim_answers: AtomicU32::new(1),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = config();
    let reload = config.policy.clone();
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-0001").await;
    wait_until("the answer lost", || {
        store.timeline.count("claim-answer-lost") == 1
    })
    .await;
    reload.replace(Policy::default());
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(store.timeline.count("released 1"), 1, "given back");
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Restarted, 1));
    h.stop().await.unwrap();
}
