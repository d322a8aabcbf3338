//! A schedule through the worker, with paused time: the companion
//! publishes each slot, and the worker with every guard decides it, as for
//! any request. The guards' clock, the store's and the planner's all follow
//! tokio's, so a simulated month passes in seconds.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::inventory::{Inventory, InventoryHandle, InventorySettings, Keys, Source};
use crate::safety::{BudgetSettings, Calendar, Clock, Counting, Guards, RateSettings};
use crate::schedule::{DEFAULT_MAX_LATENESS, Plan, ScheduleSettings, Scheduled};

/// Sunday 2026-03-01 00:00 UTC: the month starts with the calendar closed.
const MONTH_START: &str = "2026-03-01T00:00:00Z";
const MONTH: Duration = Duration::from_secs(31 * 24 * 3600);
const RATE_WINDOW: Duration = Duration::from_secs(3600);

fn cattle() -> InventoryHandle {
    let hosts: String = (1..=4)
        .map(|n| format!("[[hosts]]\nname = \"cattle-a{n}\"\ngroup = \"cattle\"\n"))
        .collect();
    InventoryHandle::new(
        Inventory::parse(&hosts, true, &Keys::default()).unwrap(),
        &Source::File("hosts.toml".into()),
        // No refresh task runs here: the copy stays good for the month.
        &InventorySettings {
            max_age: MONTH * 2,
            ..InventorySettings::default()
        },
    )
}

/// A month (March 2026) of a schedule with a mean of 90 minutes of open
/// time, over Chaos Monkey's calendar (Mon–Fri 09:00–15:00 UTC), with a
/// rate limit of one restart of the group per hour: the month holds the
/// number of slots a Poisson process of that mean gives (within 4 sigma of
/// 22 days × 6 h / 1.5 h); no slot is restarted twice and most are
/// restarted, every restart inside the calendar; no two restarts of the
/// group are closer than the hour the limit allows (a slot that comes
/// sooner is deferred until the window lets it through); and a slot not
/// restarted was decided by a guard or had no free victim.
#[tokio::test(start_paused = true)]
async fn a_month_of_a_schedule_restarts_each_slot_once_inside_the_calendar_and_the_rate_limit() {
    let origin: Timestamp = MONTH_START.parse().unwrap();
    let calendar = Calendar::chaos_monkey();
    let clock = Clock::following_tokio(origin);
    let started = Instant::now();
    let counting = Counting::new(
        &BTreeMap::new(),
        &RateSettings {
            group_max: Some(1),
            window: RATE_WINDOW,
            ..RateSettings::default()
        },
        &BudgetSettings::default(),
        false,
    )
    .unwrap();
    let policy = Policy {
        eligibility: Eligibility::everyone(),
        inventory: Some(cattle()),
        guards: Guards {
            counting,
            calendar: Some(calendar.clone()),
            max_defer: Duration::from_secs(24 * 3600),
            recheck: crate::safety::guards::DEFAULT_RECHECK,
            clock: clock.clone(),
        },
        ..Policy::default()
    };
    let config = WorkerConfig {
        switch_poll_interval: Duration::from_secs(60),
        ..with_policy(policy)
    };
    let handle = config.policy.clone();
    let store = Arc::new(MemoryStore::with_clock_at(origin.as_millisecond()));
    let restarter = Arc::new(ScriptedRestarter::default());
    let h = start_polling(
        config,
        store.clone(),
        restarter.clone(),
        0,
        Duration::from_secs(3600),
    );
    let plan = Plan::new(
        &ScheduleSettings {
            name: "drip".into(),
            group: "cattle".into(),
            mean_time_between: Duration::from_secs(90 * 60),
            requester: None,
            key_file: None,
            max_lateness: DEFAULT_MAX_LATENESS,
        },
        b"seed",
    );
    let stop = CancellationToken::new();
    let companion = tokio::spawn(crate::schedule::run(
        Scheduled {
            plan: plan.clone(),
            signer: None,
        },
        handle,
        h.broker.clone(),
        store.clone(),
        clock,
        Domain::default(),
        stop.clone(),
    ));
    tokio::time::sleep(MONTH).await;
    stop.cancel();
    companion.await.unwrap();
    // The last slots' deferrals run into the next opening.
    tokio::time::sleep(Duration::from_secs(4 * 24 * 3600)).await;

    let month_end = origin + SignedDuration::try_from(MONTH).unwrap();
    let slots = plan.slots(Some(&calendar), origin, month_end);
    let open_hours = 22.0 * 6.0;
    let expected = open_hours / 1.5;
    assert!(
        (slots.len() as f64 - expected).abs() <= 4.0 * expected.sqrt(),
        "{} slots for an expected {expected}",
        slots.len()
    );
    // Each slot ends one of three ways, each by a guard or by design:
    // restarted once; expired, when the rate limit deferred it past the
    // day's close and the next opening lies beyond `max_defer` (a Friday
    // afternoon); or never published, when every host of the group already
    // had an open request (the draw passes over busy hosts).
    let mut entries = Vec::new();
    for slot in &slots {
        let status = store.lookup(slot.message_id).await.unwrap();
        let story = store.story(slot.message_id).await.unwrap();
        entries.push((slot, status, story));
    }
    let open_at = |at: Timestamp| {
        let at = at.as_millisecond();
        entries
            .iter()
            .filter_map(|(_, _, story)| story.as_ref())
            .filter(|story| {
                story.entry.received_at.as_millis() <= at
                    && story
                        .entry
                        .completed_at
                        .is_none_or(|done| done.as_millis() > at)
            })
            .count()
    };
    let mut restarted = 0;
    for (slot, status, story) in &entries {
        match status {
            Some(Status::Restarted) => restarted += 1,
            Some(Status::Expired) => {
                let last = story.as_ref().unwrap().decisions.last().unwrap();
                assert_eq!(
                    (last.verdict.as_str(), last.guard.as_str()),
                    ("expired", "calendar"),
                    "slot at {}: {last:?}",
                    slot.at
                );
            }
            None => assert!(
                open_at(slot.at) >= 4,
                "slot at {} never published though a host was free",
                slot.at
            ),
            other => panic!("slot at {}: {other:?} {story:?}", slot.at),
        }
    }
    assert!(
        restarted * 10 >= slots.len() * 8,
        "only {restarted} of {} slots restarted",
        slots.len()
    );
    let restarts: Vec<Timestamp> = restarter
        .timeline
        .when("restart-started")
        .into_iter()
        .map(|at| origin + SignedDuration::try_from(at - started).unwrap())
        .collect();
    assert_eq!(restarts.len(), restarted, "each slot restarted once");
    for at in &restarts {
        assert!(calendar.allows(*at), "restarted at {at}, calendar closed");
    }
    let window = SignedDuration::try_from(RATE_WINDOW).unwrap();
    for pair in restarts.windows(2) {
        assert!(
            pair[1].duration_since(pair[0]) >= window,
            "two restarts of the group within the rate window: {} and {}",
            pair[0],
            pair[1]
        );
    }
    let deferred_slots = slots
        .windows(2)
        .filter(|pair| pair[1].at.duration_since(pair[0].at) < window)
        .count();
    assert!(
        deferred_slots > 0 && h.stats.deferred.get() > 0,
        "the month had no slot the rate limit deferred: the test proves nothing"
    );
    h.stop().await.unwrap();
}
