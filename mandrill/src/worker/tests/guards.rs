//! The deferring guards in the worker, with paused time: the guards' clock
//! follows tokio's, so a test moves the calendar by letting time pass. One
//! concern, the deferring guards, so one file past 400 lines.

use super::*;
use crate::safety::{
    Calendar, CalendarSettings, Clock, Guards, Policy, StopConditionSettings, StopConditions,
};

/// Sunday 2026-11-22 20:00 UTC: 13 hours before Chaos Monkey's calendar
/// (Mon–Fri 09:00–15:00 UTC) opens.
const SUNDAY_EVENING: &str = "2026-11-22T20:00:00Z";
const UNTIL_MONDAY: Duration = Duration::from_secs(13 * 3600);

fn guards(max_defer: Duration) -> Guards {
    Guards {
        counting: crate::safety::Counting::none(),
        calendar: Some(Calendar::new(&CalendarSettings::default()).unwrap()),
        max_defer,
        recheck: crate::safety::guards::DEFAULT_RECHECK,
        clock: Clock::following_tokio(SUNDAY_EVENING.parse().unwrap()),
    }
}

fn guarded(max_defer: Duration) -> WorkerConfig {
    with_policy(Policy {
        guards: guards(max_defer),
        ..Policy::default()
    })
}

/// Like `wait_until`, in coarser steps: these waits span hours.
async fn wait_hours(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(96 * 3600);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_closed_calendar_defers_without_a_slot_or_claim_and_restarts_at_the_opening() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = WorkerConfig {
        max_in_flight: 1,
        ..guarded(Duration::from_secs(24 * 3600))
    };
    let started = Instant::now();
    let h = start(config, store.clone(), restarter.clone());
    let first = h.publish("cattle-one").await;
    h.publish("cattle-two").await;
    let stats = h.stats.clone();
    // Both deferred at once with one slot: a deferred delivery holds none.
    wait_until("both deferred", || stats.deferred.get() == 2).await;
    assert!(Instant::now() - started < Duration::from_secs(1));
    assert_eq!(stats.nacked.get(), 2);
    assert_eq!(store.timeline.count("claim"), 0, "deferral claims nothing");
    assert_eq!(restarter.timeline.count("restart-started"), 0);

    wait_hours("both restarted", || stats.acked.get() == 2).await;
    let restarts = restarter.timeline.when("restart-started");
    assert_eq!(restarts.len(), 2);
    for at in restarts {
        assert!(at - started >= UNTIL_MONDAY, "restarted before the opening");
        assert!(at - started < UNTIL_MONDAY + Duration::from_secs(5));
    }
    // Looked at again every `safety.recheck` (5 min) until the opening,
    // whatever the calendar says: so a reload meanwhile is seen.
    let looks = UNTIL_MONDAY.as_secs() / crate::safety::guards::DEFAULT_RECHECK.as_secs();
    assert_eq!(stats.deferred.get(), 2 * looks, "deferred at each look");
    assert_eq!(stats.pulled.get(), 2 * looks + 2);
    assert_eq!(
        store.inner.lookup(first).await.unwrap(),
        Some(Status::Restarted)
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_request_deferred_past_max_defer_is_recorded_expired_and_acked() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    // Published the Monday before at 09:00: the calendar was open 24 hours
    // by Thursday's close, so with max_defer 24h it is expired now, not
    // deferred (closed time does not count, open time does).
    let h = start(
        guarded(Duration::from_secs(24 * 3600)),
        store.clone(),
        restarter.clone(),
    );
    let id = Uuid::new_v4();
    let body = format!(
        r#"{{"message_id":"{id}","instance_name":"cattle-old","published_at":"2026-11-16T09:00:00Z"}}"#
    );
    h.broker.publish(Bytes::from(body)).await.unwrap();
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.expired.get(), 1);
    assert_eq!(stats.deferred.get(), 0);
    assert_eq!(store.timeline.count("claim"), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Expired);
    let reason = entry.last_error.unwrap();
    assert!(
        reason.starts_with("expired: deferred by calendar: outside Mon–Fri 09:00–15:00 UTC"),
        "{reason}"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_opening_comes_within_max_defer_is_deferred_not_expired() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    // Published now with max_defer 14h: the opening, 13 h away, comes
    // before it expires, so it is deferred and restarted there.
    let h = start(
        guarded(Duration::from_secs(14 * 3600)),
        store.clone(),
        restarter.clone(),
    );
    let id = Uuid::new_v4();
    let body = format!(
        r#"{{"message_id":"{id}","instance_name":"cattle-new","published_at":"{SUNDAY_EVENING}"}}"#
    );
    h.broker.publish(Bytes::from(body)).await.unwrap();
    let stats = h.stats.clone();
    wait_hours("acked", || stats.acked.get() == 1).await;
    let looks = UNTIL_MONDAY.as_secs() / crate::safety::guards::DEFAULT_RECHECK.as_secs();
    assert_eq!(stats.deferred.get(), looks, "deferred at each recheck");
    assert_eq!(stats.expired.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    assert_eq!(
        store.inner.lookup(id).await.unwrap(),
        Some(Status::Restarted)
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_calendar_that_closes_during_the_claim_gives_the_attempt_back_and_defers() {
    // Friday 2026-11-20 14:59 UTC, and each claim takes two minutes: the
    // calendar is open before the claim and closed (15:01) after it.
    let store = Arc::new(ScriptedStore {
        claim_delay: Duration::from_secs(120),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy {
        guards: Guards {
            clock: Clock::following_tokio("2026-11-20T14:59:00Z".parse().unwrap()),
            ..guards(Duration::from_secs(7 * 24 * 3600))
        },
        ..Policy::default()
    });
    let started = Instant::now();
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-late").await;
    let stats = h.stats.clone();
    wait_until("deferred", || stats.deferred.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);

    wait_hours("restarted", || stats.acked.get() == 1).await;
    // Monday 09:00 UTC is 66 h 1 min after the start; the claim takes 2 min.
    let restarted = restarter.timeline.when("restart-started");
    assert_eq!(restarted.len(), 1);
    assert!(restarted[0] - started >= Duration::from_secs(66 * 3600 + 60));
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Restarted);
    assert_eq!(
        entry.attempts, 1,
        "the given-back claim was not a used attempt"
    );
    h.stop().await.unwrap();
}

/// Publishes `instance` under the default policy, puts `reloaded` in force
/// while its claim waits, then lets the claim through.
async fn reload_during_the_claim(
    instance: &str,
    reloaded: Policy,
) -> (Harness, Arc<ScriptedStore>, Arc<ScriptedRestarter>, Uuid) {
    let store = Arc::new(ScriptedStore {
        claim_gate: Some(Semaphore::new(0)),
        ..Default::default()
    });
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy::default());
    let reload = config.policy.clone();
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish(instance).await;
    wait_until("claiming", || store.timeline.count("claim-waiting") == 1).await;
    reload.replace(reloaded);
    store.claim_gate.as_ref().unwrap().add_permits(1);
    (h, store, restarter, id)
}

#[tokio::test(start_paused = true)]
async fn a_reload_during_the_claim_is_honoured_by_the_check_after_it() {
    // Decided unleashed before the claim; leashed by a reload while the
    // claim waits.
    let leashed = Policy {
        dry_run: true,
        ..Policy::default()
    };
    let (h, store, restarter, id) = reload_during_the_claim("cattle-reloaded", leashed).await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(stats.dry_runs.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.inner.lookup(id).await.unwrap(), Some(Status::DryRun));
    h.stop().await.unwrap();
}

/// The counting guards with one restart per group per day.
fn one_restart_per_group() -> crate::safety::Counting {
    crate::safety::Counting::new(
        &std::collections::BTreeMap::new(),
        &crate::safety::RateSettings {
            group_max: Some(1),
            ..crate::safety::RateSettings::default()
        },
        &crate::safety::BudgetSettings::default(),
        false,
    )
    .unwrap()
}

/// A delivery a counting guard deferred counts once toward
/// `broker.max_deliveries`' allowance: the claim records the deferral, and
/// the worker must not count it again (it did, so a poison message got an
/// extra delivery for every deferral).
#[tokio::test(start_paused = true)]
async fn a_deferral_by_a_counting_guard_is_counted_once() {
    let counting = one_restart_per_group();
    let config = with_policy(Policy {
        guards: Guards {
            counting,
            max_defer: Duration::from_secs(7 * 24 * 3600),
            ..Guards::default()
        },
        ..Policy::default()
    });
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config, store.clone(), restarter.clone());
    h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("restarted", || stats.restarted.get() == 1).await;
    let second = h.publish("cattle-0002").await;
    wait_until("deferred", || stats.deferred.get() == 1).await;
    let story = store.story(second).await.unwrap().unwrap();
    assert_eq!(story.decisions.len(), 1, "{:?}", story.decisions);
    assert_eq!(story.decisions[0].guard, "rate limit");
    assert_eq!(store.deferrals(second).await.unwrap(), 1);
    h.stop().await.unwrap();
}

/// A rate limit a reload set while a request waited for restart capacity
/// decides its claim, not the limits of the policy read when its batch was
/// pulled, which would restart the group again.
#[tokio::test(start_paused = true)]
async fn a_limit_set_by_a_reload_while_reserving_decides_the_claim() {
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(ScriptedRestarter {
        reserve_gate: Some(Semaphore::new(1)),
        ..Default::default()
    });
    let config = with_policy(Policy::default());
    let reload = config.policy.clone();
    let h = start(config, store.clone(), restarter.clone());
    h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("restarted", || stats.restarted.get() == 1).await;
    h.publish("cattle-0002").await;
    wait_until("reserving", || {
        restarter.timeline.count("reserve-waiting") == 2
    })
    .await;
    let counting = one_restart_per_group();
    reload.replace(Policy {
        guards: Guards {
            counting,
            max_defer: Duration::from_secs(7 * 24 * 3600),
            ..Guards::default()
        },
        ..Policy::default()
    });
    restarter.reserve_gate.as_ref().unwrap().add_permits(1);
    wait_until("deferred", || stats.deferred.get() == 1).await;
    assert_eq!(stats.restarted.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    h.stop().await.unwrap();
}

/// A rate limit a reload set while the store kept a claim failing decides
/// the request (its delivery is decided again), not the limits the claim
/// was first sent with, which would restart the group again.
#[tokio::test(start_paused = true)]
async fn a_limit_set_by_a_reload_during_a_store_outage_decides_the_retried_claim() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let config = with_policy(Policy::default());
    let reload = config.policy.clone();
    let h = start(config, store.clone(), restarter.clone());
    h.publish("cattle-0001").await;
    let stats = h.stats.clone();
    wait_until("restarted", || stats.restarted.get() == 1).await;
    store.down.store(true, Ordering::Release);
    let second = h.publish("cattle-0002").await;
    wait_until("a claim failed", || {
        store.timeline.count("claim-unreachable") >= 1
    })
    .await;
    reload.replace(Policy {
        guards: Guards {
            counting: one_restart_per_group(),
            max_defer: Duration::from_secs(7 * 24 * 3600),
            ..Guards::default()
        },
        ..Policy::default()
    });
    store.down.store(false, Ordering::Release);
    // Nacked for the reload, then deferred by the new limit on redelivery.
    wait_until("deferred by the new limit", || stats.deferred.get() == 2).await;
    let story = store.inner.story(second).await.unwrap().unwrap();
    assert!(
        story.decisions.iter().any(|d| d.guard == "rate limit"),
        "{story:?}"
    );
    assert!(story.attempts.is_empty(), "{story:?}");
    assert_eq!(stats.restarted.get(), 1);
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    h.stop().await.unwrap();
}

/// A deny pattern added by a reload while the claim waited is honoured
/// before the restart, with the calendar and the leash: the now-denied host
/// is not restarted.
#[tokio::test(start_paused = true)]
async fn a_deny_added_by_a_reload_during_the_claim_stops_the_restart() {
    let denying = Policy {
        eligibility: Eligibility::new(&[], &["cattle-db*".into()], false).unwrap(),
        ..Policy::default()
    };
    let (h, store, restarter, id) = reload_during_the_claim("cattle-db01", denying).await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.denied.get(), 1);
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Denied);
    assert!(
        entry
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("cattle-db*"),
        "{entry:?}"
    );
    h.stop().await.unwrap();
}

/// `safety.require_signed` turned on by a reload while the claim waited
/// denies an unsigned request parsed before it.
#[tokio::test(start_paused = true)]
async fn signatures_required_by_a_reload_during_the_claim_deny_an_unsigned_request() {
    let requiring = Policy {
        requesters: Arc::new(crate::safety::Requesters::refuse_unsigned()),
        ..Policy::default()
    };
    let (h, store, restarter, id) = reload_during_the_claim("cattle-unsigned", requiring).await;
    let stats = h.stats.clone();
    wait_until("acked", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(stats.denied.get(), 1);
    let entry = store.entry(id);
    assert_eq!((entry.status, entry.attempts), (Status::Denied, 1));
    let reason = entry.last_error.unwrap_or_default();
    assert!(reason.contains("safety.require_signed"), "{reason}");
    h.stop().await.unwrap();
}

/// The stop conditions run between the claim and the restart, so the
/// claim's hold lasts through them: another delivery of the request must
/// find it held until the restart could have timed out after the slowest
/// checks.
#[tokio::test(start_paused = true)]
async fn the_claims_hold_covers_the_stop_conditions() {
    let slow = StopConditionSettings {
        name: "slow".into(),
        http: None,
        expect_status: None,
        expect_empty_json_array: false,
        command: Some(vec!["true".into()]),
        timeout: Duration::from_secs(600),
    };
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter {
        gate: Some(Arc::new(Semaphore::new(0))),
        ..Default::default()
    });
    let config = with_policy(Policy {
        stop_conditions: StopConditions::new(&[slow.clone(), slow]).unwrap(),
        ..Policy::default()
    });
    let restart_timeout = config.restart_timeout;
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-held").await;
    wait_until("restarting", || {
        restarter.timeline.count("restart-started") == 1
    })
    .await;
    // Another delivery of the same request (a duplicate publish).
    let payload = format!(r#"{{"message_id":"{id}","instance_name":"cattle-held"}}"#);
    let rules = crate::domain::ParseRules {
        domain: crate::domain::Domain::default(),
        max_payload_bytes: 1024,
    };
    let duplicate = RestartRequest::parse(payload.as_bytes(), &rules).unwrap();
    let terms = crate::store::ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(1),
        limits: crate::safety::Limits::NONE,
    };
    let claim = store
        .inner
        .claim_restart(&duplicate, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    let Claim::InFlight { wait, .. } = claim else {
        panic!("the first claim must hold: {claim:?}");
    };
    assert!(
        wait >= restart_timeout + Duration::from_secs(1200) - Duration::from_secs(5),
        "held for {wait:?} only"
    );
    h.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stop_condition_under_way_when_the_grace_period_ends_gives_the_claim_back() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let hung = StopConditionSettings {
        name: "hung".into(),
        http: None,
        expect_status: None,
        expect_empty_json_array: false,
        command: Some(vec!["sleep".into(), "600".into()]),
        timeout: Duration::from_secs(600),
    };
    let config = with_policy(Policy {
        stop_conditions: StopConditions::new(&[hung]).unwrap(),
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-checked").await;
    wait_until("claimed", || store.timeline.count("claim ") == 1).await;
    let stats = h.stats.clone();
    // The grace period (5 s) ends long before the check's timeout.
    h.stop().await.unwrap();
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    assert_eq!(store.timeline.count("released 1"), 1);
    assert_eq!(stats.nacked.get(), 1);
    assert_eq!(
        store.inner.lookup(id).await.unwrap(),
        Some(Status::Received)
    );
}

/// A store whose clock reads what the guards' does: Sunday evening, then
/// tokio's time.
fn store_on_sundays_clock() -> Arc<ScriptedStore> {
    let sunday: jiff::Timestamp = SUNDAY_EVENING.parse().unwrap();
    Arc::new(ScriptedStore {
        inner: Arc::new(MemoryStore::with_clock_at(sunday.as_millisecond())),
        ..Default::default()
    })
}

/// A request its `published_at` cannot date, missing or far ahead of the
/// clock, expires `safety.max_defer` after the store first received it
/// (neither no time nor the publisher's clock decides).
#[tokio::test(start_paused = true)]
async fn a_request_its_published_at_cannot_date_expires_max_defer_after_its_first_receipt() {
    let store = store_on_sundays_clock();
    let restarter = Arc::new(ScriptedRestarter::default());
    // No calendar (all time open); each asks for nothing before 3 hours
    // from now, more than max_defer after its first receipt.
    let config = with_policy(Policy {
        guards: Guards {
            calendar: None,
            ..guards(Duration::from_secs(3600))
        },
        ..Policy::default()
    });
    let h = start(config, store.clone(), restarter.clone());
    let later = r#""not_before":"2026-11-22T23:00:00Z""#;
    let undated = Uuid::new_v4();
    let body = format!(r#"{{"message_id":"{undated}","instance_name":"cattle-undated",{later}}}"#);
    h.broker.publish(Bytes::from(body)).await.unwrap();
    let ahead = Uuid::new_v4();
    let body = format!(
        r#"{{"message_id":"{ahead}","instance_name":"cattle-ahead","published_at":"2099-01-01T00:00:00Z",{later}}}"#
    );
    h.broker.publish(Bytes::from(body)).await.unwrap();
    let stats = h.stats.clone();
    wait_until("both acked", || stats.acked.get() == 2).await;
    assert_eq!(stats.expired.get(), 2);
    assert_eq!(stats.deferred.get(), 0);
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    for id in [undated, ahead] {
        let entry = store.entry(id);
        assert_eq!(entry.status, Status::Expired);
        let reason = entry.last_error.unwrap();
        assert!(
            reason.contains("safety.max_defer (1h) after it was first received at 2026-11-22"),
            "{reason}"
        );
    }
    h.stop().await.unwrap();
}

/// The first receipt is kept: a request deferred again and again (here by
/// a failing stop condition, every `stop_retry`) expires `max_defer` after
/// its first delivery, not after each.
#[tokio::test(start_paused = true)]
async fn an_undated_request_deferred_again_and_again_expires_counting_from_its_first_receipt() {
    use crate::safety::{StopConditionSettings, StopConditions};
    let store = store_on_sundays_clock();
    let restarter = Arc::new(ScriptedRestarter::default());
    let failing = StopConditionSettings {
        name: "alerts".into(),
        http: None,
        expect_status: None,
        command: Some(vec!["false".into()]),
        timeout: Duration::from_secs(600),
        expect_empty_json_array: false,
    };
    let config = with_policy(Policy {
        guards: Guards {
            calendar: None,
            // Looked at again at each `stop_retry`, no sooner.
            recheck: Duration::from_secs(3600),
            ..guards(Duration::from_secs(3 * 3600 + 1800))
        },
        stop_conditions: StopConditions::new(&[failing]).unwrap(),
        stop_retry: Duration::from_secs(3600),
        ..Policy::default()
    });
    let started = Instant::now();
    let h = start(config, store.clone(), restarter.clone());
    let id = h.publish("cattle-undated").await;
    let stats = h.stats.clone();
    wait_hours("acked", || stats.acked.get() == 1).await;
    // Deferred at 0 h, 1 h and 2 h (each back within 3.5 h of the first
    // receipt); at 3 h it would come back past them: expired.
    assert_eq!(stats.deferred.get(), 3);
    assert_eq!(stats.expired.get(), 1);
    assert!(Instant::now() - started < Duration::from_secs(4 * 3600));
    assert_eq!(restarter.timeline.count("restart-started"), 0);
    let entry = store.entry(id);
    assert_eq!(entry.status, Status::Expired);
    h.stop().await.unwrap();
}

/// Five requests for `cattle-a1` … `cattle-a5`, which the operator puts
/// in group `g1` (`safety.groups.g1 = ["cattle-*"]`), naming groups `g1` …
/// `g5`, with one restart per group per day: a message's `group` never
/// picks the group it is counted in. Each counted in the group it named,
/// all five were restarted; now the one naming `g1` is restarted and the
/// four others are denied for the mismatch (recorded with both names,
/// acked, nothing claimed). Requests that name `g1`, or no group, are then
/// deferred by the limit like any other.
#[tokio::test(start_paused = true)]
async fn a_message_naming_its_own_group_neither_escapes_the_limit_nor_is_restarted() {
    let counting = crate::safety::Counting::new(
        &[("g1".to_owned(), vec!["cattle-*".to_owned()])].into(),
        &crate::safety::RateSettings {
            group_max: Some(1),
            ..crate::safety::RateSettings::default()
        },
        &crate::safety::BudgetSettings::default(),
        false,
    )
    .unwrap();
    let config = with_policy(Policy {
        guards: Guards {
            counting,
            max_defer: Duration::from_secs(7 * 24 * 3600),
            ..Guards::default()
        },
        ..Policy::default()
    });
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(config, store.clone(), restarter.clone());
    let stats = h.stats.clone();
    let request = |instance: &str, group: Option<&str>| {
        let id = Uuid::new_v4();
        let group = group.map_or_else(String::new, |g| format!(r#","group":"{g}""#));
        let body = format!(r#"{{"message_id":"{id}","instance_name":"{instance}"{group}}}"#);
        (id, Bytes::from(body))
    };
    let mut ids = Vec::new();
    for n in 1..=5 {
        let (id, body) = request(&format!("cattle-a{n}"), Some(&format!("g{n}")));
        h.broker.publish(body).await.unwrap();
        ids.push(id);
    }
    wait_until("all five decided", || {
        stats.restarted.get() + stats.denied.get() == 5
    })
    .await;
    assert_eq!(
        restarter.timeline.count("restart-started"),
        1,
        "one restart, not five"
    );
    assert_eq!(stats.denied.get(), 4);
    assert_eq!(store.lookup(ids[0]).await.unwrap(), Some(Status::Restarted));
    let story = store.story(ids[0]).await.unwrap().unwrap();
    assert_eq!(
        story.attempts[0].group, "g1",
        "counted in the operator's group"
    );
    for (n, id) in ids.iter().enumerate().skip(1) {
        assert_eq!(store.lookup(*id).await.unwrap(), Some(Status::Denied));
        let story = store.story(*id).await.unwrap().unwrap();
        let decision = &story.decisions[0];
        assert_eq!(decision.guard, "group");
        let named = format!("names group g{}", n + 1);
        assert!(
            decision.reason.contains("group mismatch")
                && decision.reason.contains(&named)
                && decision.reason.contains("in group g1"),
            "both names: {}",
            decision.reason
        );
        assert!(story.attempts.is_empty(), "nothing claimed");
    }
    for (instance, group) in [("cattle-a6", Some("g1")), ("cattle-a7", None)] {
        let (id, body) = request(instance, group);
        h.broker.publish(body).await.unwrap();
        let before = stats.deferred.get();
        wait_until("deferred", || stats.deferred.get() > before).await;
        let story = store.story(id).await.unwrap().unwrap();
        assert_eq!(story.decisions[0].guard, "rate limit", "{story:?}");
    }
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    h.stop().await.unwrap();
}

/// With an inventory: a listed host is counted in the inventory's group
/// (and a percentage budget counts the group's size there); a name the
/// inventory does not list is denied; once the copy is older than
/// `inventory.max_age` (no refresh here), every request is deferred,
/// naming the inventory, and nothing is claimed.
#[tokio::test(start_paused = true)]
async fn the_inventory_decides_group_membership_and_fails_closed_when_too_old() {
    use crate::inventory::{Inventory, InventoryHandle, InventorySettings, Keys, Source};
    let inventory = Inventory::parse(
        "[[hosts]]\nname = \"cattle-a1\"\ngroup = \"herd\"\nzone = \"eu-1\"\n\
         [[hosts]]\nname = \"cattle-a2\"\ngroup = \"herd\"\n\
         [[hosts]]\nname = \"cattle-a3\"\ngroup = \"herd\"\n\
         [[hosts]]\nname = \"cattle-a4\"\ngroup = \"herd\"\n",
        true,
        &Keys::default(),
    )
    .unwrap();
    let settings = InventorySettings::default();
    let handle = InventoryHandle::new(inventory, &Source::File("hosts.toml".into()), &settings);
    let counting = crate::safety::Counting::new(
        &std::collections::BTreeMap::new(),
        &crate::safety::RateSettings::default(),
        &crate::safety::BudgetSettings {
            max_disrupted_percent: Some(50),
            ..crate::safety::BudgetSettings::default()
        },
        false,
    )
    .unwrap();
    let policy = Policy {
        guards: Guards {
            counting,
            max_defer: Duration::from_secs(7 * 24 * 3600),
            ..Guards::default()
        },
        inventory: Some(handle),
        ..Policy::default()
    };
    assert_eq!(
        policy.limits("herd").unwrap().budget,
        Some(2),
        "50% of the inventory's 4, with no safety.budget.group_sizes"
    );
    let store = Arc::new(MemoryStore::new());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(with_policy(policy), store.clone(), restarter.clone());
    let stats = h.stats.clone();
    let listed = h.publish("cattle-a1").await;
    wait_until("restarted", || stats.restarted.get() == 1).await;
    let story = store.story(listed).await.unwrap().unwrap();
    assert_eq!(story.attempts[0].group, "herd", "the inventory's group");

    // The counters move before the decision is written: wait for it.
    let decided = |id: Uuid| {
        let store = store.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(600);
            loop {
                if let Some(story) = store.story(id).await.unwrap()
                    && !story.decisions.is_empty()
                {
                    return story;
                }
                assert!(Instant::now() < deadline, "{id} never decided");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let unknown = h.publish("cattle-zz").await;
    let story = decided(unknown).await;
    assert_eq!(story.decisions[0].guard, "inventory");
    assert!(
        story.decisions[0].reason.contains("not in the inventory"),
        "{}",
        story.decisions[0].reason
    );

    // An hour and a second later, with no refresh: too old to decide with.
    tokio::time::sleep(settings.max_age + Duration::from_secs(1)).await;
    // (The memory store keeps no story of a request deferred before any
    // claim: its deferral is counted; tests/inventory.rs reads the reason.)
    let stale = h.publish("cattle-a2").await;
    wait_until("deferred", || stats.deferred.get() >= 1).await;
    assert!(store.deferrals(stale).await.unwrap() >= 1);
    // Its first receipt may be kept (`max_defer` counts from it when the
    // message is undated), but nothing is claimed.
    assert!(
        matches!(
            store.lookup(stale).await.unwrap(),
            None | Some(Status::Received)
        ),
        "nothing claimed"
    );
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    h.stop().await.unwrap();
}

/// A request waiting for the calendar has its record (who asked, for
/// which host, why) from its first deferral: another payload under its
/// `message_id`, deferred too, is refused at its own deferral, recorded
/// apart and dead-lettered, and the first request runs at the opening.
#[tokio::test(start_paused = true)]
async fn a_payload_deferred_under_another_requests_id_is_refused_at_once() {
    let store = Arc::new(ScriptedStore::default());
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start(
        guarded(Duration::from_secs(24 * 3600)),
        store.clone(),
        restarter.clone(),
    );
    let id = Uuid::new_v4();
    let asked = |instance: &str, by: &str| {
        Bytes::from(format!(
            r#"{{"message_id":"{id}","instance_name":"{instance}","requested_by":"{by}","reason":"drill"}}"#
        ))
    };
    let stats = h.stats.clone();
    h.broker.publish(asked("cattle-one", "v")).await.unwrap();
    wait_until("the first deferred", || stats.deferred.get() == 1).await;
    h.broker.publish(asked("cattle-two", "m")).await.unwrap();
    wait_until("the second dead-lettered", || {
        stats.dead_lettered.get() == 1
    })
    .await;
    assert_eq!(stats.deferred.get(), 2, "both met the closed calendar");
    let history = store.history(10).await.unwrap();
    let refused = history
        .iter()
        .find(|entry| entry.status == crate::domain::Status::Rejected)
        .unwrap_or_else(|| panic!("recorded apart: {history:?}"));
    assert_eq!(
        (
            refused.instance_name.as_deref(),
            refused.requested_by.as_deref(),
            refused.message_id
        ),
        (Some("cattle-two"), Some("m"), Some(id))
    );
    assert!(
        refused
            .last_error
            .as_deref()
            .is_some_and(|why| why.contains("instance cattle-one (this payload: cattle-two)")),
        "{refused:?}"
    );
    // The first request's decisions are its own.
    let decisions = store.inner.decisions(id).await.unwrap();
    assert_eq!(decisions.len(), 1, "{decisions:?}");

    wait_hours("the first restarted", || stats.acked.get() == 1).await;
    assert_eq!(restarter.timeline.count("restart-started"), 1);
    let story = store.story(id).await.unwrap().unwrap();
    assert_eq!(
        (
            story.entry.instance_name.as_deref(),
            story.entry.requested_by.as_deref()
        ),
        (Some("cattle-one"), Some("v"))
    );
    h.stop().await.unwrap();
}
