//! The plan's tests (slots, draws, victims) and the task's: one file past
//! 400 lines, since they share the fixtures above every test.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::*;
use crate::broker::Consumer as _;
use crate::domain::Domain;
use crate::inventory::{Inventory, InventoryHandle, InventorySettings, Keys, Source};
use crate::safety::{CalendarSettings, Eligibility, Policy};

fn settings(name: &str, mean: Duration) -> ScheduleSettings {
    ScheduleSettings {
        name: name.into(),
        group: "cattle".into(),
        mean_time_between: mean,
        requester: None,
        key_file: None,
        max_lateness: DEFAULT_MAX_LATENESS,
    }
}

fn at(rfc3339: &str) -> Timestamp {
    rfc3339.parse().unwrap()
}

fn workdays() -> Calendar {
    Calendar::new(&CalendarSettings {
        timezone: Some("Europe/Stockholm".into()),
        ..CalendarSettings::default()
    })
    .unwrap()
}

fn always() -> Calendar {
    Calendar::new(&CalendarSettings {
        weekdays: Some(
            ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
                .map(String::from)
                .to_vec(),
        ),
        hours: Some(vec!["00:00-24:00".into()]),
        ..CalendarSettings::default()
    })
    .unwrap()
}

/// Within `sigmas` standard deviations of a Poisson count's expectation.
fn within(count: usize, expected: f64, sigmas: f64) -> bool {
    (count as f64 - expected).abs() <= sigmas * expected.sqrt()
}

/// A simulated month (March 2026, across the spring DST jump) of a
/// schedule with a mean of 10 minutes of open time over Mon–Fri
/// 09:00–15:00 Europe/Stockholm: every slot is inside the calendar; the
/// count is within 4 sigma of the Poisson expectation (open hours × 6) for
/// each of 20 fixed seeds; and slots do not clump at the window's opening:
/// each hour of the window gets its share, within 4 sigma, over all seeds.
#[test]
fn a_month_of_slots_falls_inside_the_calendar_at_the_configured_mean() {
    let calendar = workdays();
    let (from, until) = (at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z"));
    let open_hours: f64 = calendar
        .open_spans(from, until)
        .iter()
        .map(|&(a, b)| b.duration_since(a).as_secs_f64() / 3600.0)
        .sum();
    assert_eq!(open_hours, 22.0 * 6.0, "22 working days of 6 hours");
    let expected = open_hours * 6.0;
    let mut by_hour = [0usize; 6];
    let mut total = 0;
    for seed in 0u8..20 {
        let plan = Plan::new(&settings("mornings", Duration::from_secs(600)), &[seed]);
        let slots = plan.slots(Some(&calendar), from, until);
        assert!(
            within(slots.len(), expected, 4.0),
            "seed {seed}: {} slots, expected {expected} ± 4 sigma",
            slots.len()
        );
        for slot in &slots {
            assert!(
                calendar.allows(slot.at),
                "{} is outside the calendar",
                slot.at
            );
            let local = slot
                .at
                .to_zoned(jiff::tz::TimeZone::get("Europe/Stockholm").unwrap());
            by_hour[usize::try_from(local.hour() - 9).unwrap()] += 1;
        }
        assert!(slots.windows(2).all(|pair| pair[0].at < pair[1].at));
        total += slots.len();
    }
    for (hour, &count) in by_hour.iter().enumerate() {
        assert!(
            within(count, total as f64 / 6.0, 4.0),
            "hour {hour} of the window has {count} of {total} slots: {by_hour:?}"
        );
    }
}

/// Two planners built separately (two instances) compute the same slots,
/// message ids and victims; another seed plans otherwise; `next_after`
/// walks the same slots as `slots`.
#[test]
fn two_planners_built_separately_agree_on_every_slot() {
    let calendar = workdays();
    let one = Plan::new(
        &settings("daily", Duration::from_secs(3 * 3600)),
        b"shared key",
    );
    let two = Plan::new(
        &settings("daily", Duration::from_secs(3 * 3600)),
        b"shared key",
    );
    let (from, until) = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
    let slots = one.slots(Some(&calendar), from, until);
    assert!(slots.len() > 20, "{}", slots.len());
    assert_eq!(slots, two.slots(Some(&calendar), from, until));
    let hosts = ["cattle-a", "cattle-b", "cattle-c", "cattle-d"];
    for slot in &slots {
        assert_eq!(
            one.victim(slot, hosts, |_| true),
            two.victim(slot, hosts, |_| true)
        );
        assert_eq!(slot.message_id.get_version_num(), 5);
    }
    let ids: HashSet<_> = slots.iter().map(|s| s.message_id).collect();
    assert_eq!(ids.len(), slots.len(), "one id per slot");
    let mut walked = Vec::new();
    let mut after = from;
    while let Some(slot) = one.next_after(Some(&calendar), after) {
        if slot.at >= until {
            break;
        }
        after = slot.at;
        walked.push(slot);
    }
    assert_eq!(walked, slots);
    let other = Plan::new(
        &settings("daily", Duration::from_secs(3 * 3600)),
        b"another key",
    );
    assert_ne!(other.slots(Some(&calendar), from, until), slots);
    let renamed = Plan::new(
        &settings("nightly", Duration::from_secs(3 * 3600)),
        b"shared key",
    );
    assert_ne!(renamed.slots(Some(&calendar), from, until), slots);
}

/// Victims are spread evenly over the group (each host within 4 sigma of
/// its share over 6000 slots), and a host joining the group does not
/// reorder the others: a slot's victim either stays or becomes the new host.
#[test]
fn victims_are_drawn_evenly_and_a_new_host_moves_only_slots_to_itself() {
    let plan = Plan::new(&settings("spread", Duration::from_secs(60)), b"k");
    let calendar = always();
    let slots = plan.slots(
        Some(&calendar),
        at("2026-11-01T00:00:00Z"),
        at("2026-11-05T04:00:00Z"),
    );
    assert!(slots.len() > 5000, "{}", slots.len());
    let hosts = ["cattle-a", "cattle-b", "cattle-c", "cattle-d", "cattle-e"];
    let mut counts = BTreeMap::<String, usize>::new();
    for slot in &slots {
        let victim = plan.victim(slot, hosts, |_| true).unwrap();
        let grown = plan
            .victim(slot, hosts.iter().copied().chain(["cattle-f"]), |_| true)
            .unwrap();
        assert!(grown == victim || grown == "cattle-f");
        *counts.entry(victim).or_default() += 1;
    }
    for (host, &count) in &counts {
        assert!(
            within(count, slots.len() as f64 / 5.0, 4.0),
            "{host}: {counts:?}"
        );
    }
}

/// `cattle-a1..a4` in group cattle, `pet-01` in group pets.
fn policy_with_hosts(eligibility: Eligibility) -> Policy {
    let mut hosts = String::new();
    for name in ["cattle-a1", "cattle-a2", "cattle-a3", "cattle-a4"] {
        hosts.push_str(&format!(
            "[[hosts]]\nname = \"{name}\"\ngroup = \"cattle\"\n"
        ));
    }
    hosts.push_str("[[hosts]]\nname = \"pet-01\"\ngroup = \"pets\"\n");
    let inventory = Inventory::parse(&hosts, true, &Keys::default()).unwrap();
    Policy {
        eligibility,
        inventory: Some(InventoryHandle::new(
            inventory,
            &Source::File("hosts.toml".into()),
            // No refresh task runs here: the copy stays good for the test.
            &InventorySettings {
                max_age: Duration::from_secs(30 * 24 * 3600),
                ..InventorySettings::default()
            },
        )),
        ..Policy::default()
    }
}

/// A host whose address `safety.deny` matches is never drawn, as the
/// worker would deny it: the slot goes to a host the worker restarts.
#[test]
fn a_host_denied_by_its_address_is_never_drawn() {
    let mut hosts = String::new();
    for n in 1..=3 {
        hosts.push_str(&format!(
            "[[hosts]]\nname = \"cattle-a{n}\"\ngroup = \"cattle\"\naddress = \"db-{n}.internal\"\n"
        ));
    }
    hosts.push_str("[[hosts]]\nname = \"cattle-a4\"\ngroup = \"cattle\"\naddress = \"10.0.0.4\"\n");
    let policy = Policy {
        eligibility: Eligibility::new(&[], &["db-*".into()], false).unwrap(),
        inventory: Some(InventoryHandle::new(
            Inventory::parse(&hosts, true, &Keys::default()).unwrap(),
            &Source::File("hosts.toml".into()),
            &InventorySettings {
                max_age: Duration::from_secs(30 * 24 * 3600),
                ..InventorySettings::default()
            },
        )),
        ..Policy::default()
    };
    let scheduled = Scheduled {
        plan: Plan::new(&settings("daily", Duration::from_secs(3600)), b"k"),
        signer: None,
    };
    let none = HashSet::new();
    for hour in 0..20 {
        let slot = scheduled
            .plan
            .slot(at("2026-11-23T00:00:00Z") + jiff::SignedDuration::from_hours(hour));
        let drawn = scheduled
            .victim(&policy, &slot, &none, &Domain::default())
            .unwrap();
        assert_eq!(drawn.instance_name.as_str(), "cattle-a4");
    }
}

/// A victim that turns ineligible between the preview and its slot (a
/// deny added, or a restart of it already open) is not the one published:
/// the slot's draw passes over it to the next eligible host of the group,
/// never outside the group, and with none eligible the slot has no victim.
#[test]
fn a_victim_that_turns_ineligible_after_the_preview_is_passed_over() {
    let scheduled = Scheduled {
        plan: Plan::new(&settings("daily", Duration::from_secs(3600)), b"k"),
        signer: None,
    };
    let slot = scheduled.plan.slot(at("2026-11-23T10:00:00Z"));
    let domain = Domain::default();
    let none = HashSet::new();
    let previewed = scheduled
        .victim(
            &policy_with_hosts(Eligibility::everyone()),
            &slot,
            &none,
            &domain,
        )
        .unwrap();
    let victim = previewed.instance_name.as_str().to_owned();
    assert!(victim.starts_with("cattle-a"), "{victim}");
    assert_eq!(previewed.message_id, slot.message_id);
    assert_eq!(previewed.reason.as_deref(), Some(slot.reason().as_str()));
    assert!(
        slot.reason()
            .contains("[[schedule]] daily, slot 2026-11-23T10:00:00Z")
    );
    // Denied by a reload after the preview.
    let denied =
        policy_with_hosts(Eligibility::new(&[], std::slice::from_ref(&victim), false).unwrap());
    let drawn = scheduled.victim(&denied, &slot, &none, &domain).unwrap();
    assert_ne!(drawn.instance_name.as_str(), victim);
    assert!(drawn.instance_name.as_str().starts_with("cattle-a"));
    // Being restarted already.
    let busy: HashSet<String> = [victim.clone()].into();
    let drawn = scheduled
        .victim(
            &policy_with_hosts(Eligibility::everyone()),
            &slot,
            &busy,
            &domain,
        )
        .unwrap();
    assert_ne!(drawn.instance_name.as_str(), victim);
    // Nobody eligible: no victim, and why.
    let nobody = policy_with_hosts(Eligibility::new(&[], &["cattle-*".into()], false).unwrap());
    let why = scheduled
        .victim(&nobody, &slot, &none, &domain)
        .unwrap_err();
    assert!(why.contains("none of the 4 hosts of group cattle"), "{why}");
}

#[test]
fn entries_are_refused_naming_the_key() {
    let good = settings("daily", Duration::from_secs(3600));
    assert_eq!(validate(std::slice::from_ref(&good)), Ok(()));
    let key = |entries: &[ScheduleSettings]| validate(entries).unwrap_err().0;
    assert_eq!(key(&[good.clone(), good.clone()]), "schedule[1].name");
    assert_eq!(
        key(&[ScheduleSettings {
            mean_time_between: Duration::ZERO,
            ..good.clone()
        }]),
        "schedule[0].mean_time_between"
    );
    assert_eq!(
        key(&[ScheduleSettings {
            name: "no spaces".into(),
            ..good.clone()
        }]),
        "schedule[0].name"
    );
    assert_eq!(
        key(&[ScheduleSettings {
            requester: Some("bot".into()),
            ..good.clone()
        }]),
        "schedule[0].key_file"
    );
    assert_eq!(
        key(&[ScheduleSettings {
            max_lateness: Duration::from_secs(2 * 24 * 3600),
            ..good.clone()
        }]),
        "schedule[0].max_lateness"
    );
    assert_eq!(
        key(&[ScheduleSettings {
            group: String::new(),
            ..good
        }]),
        "schedule[0].group"
    );
}

/// A schedule's companion task, running in paused time from `origin` on
/// the in-memory broker and store, with what a test looks at.
struct Companion {
    task: tokio::task::JoinHandle<()>,
    stop: tokio_util::sync::CancellationToken,
    broker: Arc<crate::broker::MemoryBroker>,
    store: Arc<crate::store::MemoryStore>,
    /// The guards' clock, which the task reads: a test may jump it.
    clock: crate::safety::Clock,
}

fn companion(plan: &Plan, calendar: &Calendar, origin: Timestamp) -> Companion {
    use crate::safety::{Clock, Guards, PolicyHandle};

    let policy = Policy {
        guards: Guards {
            calendar: Some(calendar.clone()),
            clock: Clock::following_tokio(origin),
            ..Guards::default()
        },
        ..policy_with_hosts(Eligibility::everyone())
    };
    let clock = policy.guards.clock.clone();
    let broker = Arc::new(crate::broker::MemoryBroker::new(
        Duration::from_secs(30),
        Duration::from_millis(10),
    ));
    let store = Arc::new(crate::store::MemoryStore::new());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        Scheduled {
            plan: plan.clone(),
            signer: None,
        },
        PolicyHandle::new(policy),
        broker.clone(),
        store.clone(),
        clock.clone(),
        Domain::default(),
        stop.clone(),
    ));
    Companion {
        task,
        stop,
        broker,
        store,
        clock,
    }
}

/// The companion in paused time, on the in-memory broker and store: over
/// six simulated hours with a mean of 10 minutes it publishes exactly the
/// plan's slots, each once, with the slot's id, reason and a drawn victim.
/// A slot that fell before start-up by more than `max_lateness` is not
/// published (recorded missed); one within it is.
#[tokio::test(start_paused = true)]
async fn the_companion_publishes_each_slot_once_and_never_a_slot_missed_while_down() {
    let plan = Plan::new(&settings("drip", Duration::from_secs(600)), b"k");
    let calendar = always();
    let origin = at("2026-11-23T10:00:00Z");
    let Companion {
        task, stop, broker, ..
    } = companion(&plan, &calendar, origin);
    let hours = SignedDuration::from_hours(6);
    tokio::time::sleep(hours.unsigned_abs() + Duration::from_secs(1)).await;
    stop.cancel();
    task.await.unwrap();
    let lateness = SignedDuration::try_from(DEFAULT_MAX_LATENESS).unwrap();
    let expected = plan.slots(Some(&calendar), origin - lateness, origin + hours);
    let missed = plan.slots(
        Some(&calendar),
        origin - SignedDuration::from_hours(2),
        origin - lateness,
    );
    assert!(
        !missed.is_empty() && expected.len() > 20,
        "{} {}",
        missed.len(),
        expected.len()
    );
    let mut published = Vec::new();
    loop {
        let batch = broker.pull(1000).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for delivery in batch {
            let request = crate::domain::RestartRequest::parse(
                &delivery.payload,
                &crate::domain::ParseRules {
                    domain: Domain::default(),
                    max_payload_bytes: 64 * 1024,
                },
            )
            .unwrap();
            assert!(request.instance_name.as_str().starts_with("cattle-a"));
            assert_eq!(request.requested_by.as_deref(), Some("schedule:drip"));
            published.push((request.message_id, request.reason.unwrap()));
            broker.ack(&delivery.tag).await.unwrap();
        }
    }
    let planned: Vec<_> = expected
        .iter()
        .map(|s| (s.message_id, s.reason()))
        .collect();
    assert_eq!(
        published, planned,
        "each slot once, in order, none missed while down"
    );
}

/// A slot this instance reaches past its `max_lateness` (its machine was
/// suspended: the wall clock jumped, tokio's did not) counts in
/// `mandrill_schedule_missed_total` only if no instance published it: the
/// late slots another instance published (their requests are in the
/// store) are not counted, the one nobody published is.
#[tokio::test(start_paused = true)]
async fn a_late_slot_counts_as_missed_only_if_no_instance_published_it() {
    use crate::safety::Limits;
    use crate::store::{ClaimTerms, ClaimToken, Store};

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    // The test's runtime is this thread's: the task's counters land here.
    let _recording = metrics::set_default_local_recorder(&recorder);
    let missed_so_far = || {
        metrics
            .render()
            .lines()
            .find_map(|line| {
                line.strip_prefix("mandrill_schedule_missed_total{schedule=\"drip\"} ")
            })
            .map_or(0, |count| count.parse::<u64>().unwrap())
    };
    let plan = Plan::new(&settings("drip", Duration::from_secs(60)), b"k");
    let calendar = always();
    let origin = at("2026-11-23T10:00:00Z");
    let Companion {
        task,
        stop,
        store,
        clock,
        ..
    } = companion(&plan, &calendar, origin);
    // Start-up's look back counts the slots missed while nothing ran.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = missed_so_far();
    // The next half hour's slots, as another instance published them on
    // time, but for the first: nobody did.
    let jump = SignedDuration::from_mins(30);
    let start = origin + SignedDuration::from_secs(10);
    let coming = plan.slots(
        Some(&calendar),
        start,
        start + jump + SignedDuration::from_mins(2),
    );
    let unpublished = coming.first().unwrap();
    assert!(
        unpublished.at
            < start + jump
                - SignedDuration::try_from(DEFAULT_MAX_LATENESS).unwrap()
                - SignedDuration::from_mins(1)
            && coming.len() > 10,
        "the first slot is late by far after the jump, and many are: {unpublished:?}, {}",
        coming.len()
    );
    let terms = ClaimTerms {
        max_attempts: 1,
        hold: Duration::from_secs(60),
        limits: Limits::NONE,
    };
    for slot in &coming[1..] {
        let request = crate::domain::RestartRequest {
            message_id: slot.message_id,
            ..crate::domain::testing::request("cattle-a1")
        };
        store
            .claim_restart(&request, terms, ClaimToken::new())
            .await
            .unwrap();
    }
    clock.jump(jump);
    tokio::time::sleep(Duration::from_secs(40)).await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(
        missed_so_far() - before,
        1,
        "of the late slots, only the one no instance published is missed"
    );
}

#[test]
fn a_slots_reason_names_it_and_only_its_own_id_proves_it() {
    let plan = Plan::new(&settings("drip", Duration::from_secs(60)), b"seed");
    let slot = plan.slot(at("2026-11-26T10:15:00.250Z"));
    let reason = slot.reason();
    let (schedule, slot_at) = Slot::named_in(&reason).unwrap();
    assert_eq!((schedule, slot_at), ("drip", slot.at));
    assert!(plan.is_slot(slot_at, slot.message_id));
    // A reason anyone can write; an id only the seed's holder can mint.
    assert!(!plan.is_slot(slot_at, uuid::Uuid::new_v4()));
    let other_seed = Plan::new(&settings("drip", Duration::from_secs(60)), b"other");
    assert!(!other_seed.is_slot(slot_at, slot.message_id));
    assert_eq!(Slot::named_in("leaking memory"), None);
    assert_eq!(
        Slot::named_in("scheduled by [[schedule]] drip, slot soon"),
        None
    );
}

/// The draw is the lowest-scored eligible host, as a sort of every score
/// would find it, whether the lowest is eligible or the heap goes on.
#[test]
fn a_victim_is_the_lowest_scored_eligible_host() {
    let plan = Plan::new(&settings("drip", Duration::from_secs(600)), b"k");
    let hosts: Vec<String> = (0..500).map(|i| format!("cattle-{i:03}")).collect();
    let keyed: Vec<(u64, &str)> = hosts.iter().map(|h| (plan.key(h), h.as_str())).collect();
    for minute in 0..50 {
        let slot = plan.slot(Timestamp::from_second(1_800_000_000 + 60 * minute).unwrap());
        let mut sorted: Vec<(u64, &str)> = keyed
            .iter()
            .map(|(key, host)| (fmix64(key ^ plan.slot_key(&slot)), *host))
            .collect();
        sorted.sort_unstable();
        // Every third host of the sorted order refused: the first is, so
        // the heap decides.
        let refused: HashSet<&str> = sorted.iter().step_by(3).map(|(_, h)| *h).collect();
        let eligible = |host: &str| !refused.contains(host);
        let expected = sorted.iter().map(|(_, h)| *h).find(|h| eligible(h));
        let drawn = plan.victim_among(&slot, &keyed, |host| host, eligible);
        assert_eq!(drawn.copied(), expected);
        let first = plan.victim_among(&slot, &keyed, |host| host, |_| true);
        assert_eq!(first.copied(), Some(sorted[0].1));
    }
    assert_eq!(
        plan.victim_among(
            &plan.slot(at("2026-11-23T10:00:00Z")),
            &keyed,
            |h| h,
            |_| false
        ),
        None
    );
}

/// Equal scores (a 64-bit collision, or one host listed twice) are ordered
/// by name, then by position, as every instance orders them: the first of
/// the lowest names is drawn, whether the draw's one pass or its heap
/// decides.
#[test]
fn tied_scores_are_ordered_by_name_then_position() {
    let plan = Plan::new(&settings("drip", Duration::from_secs(600)), b"k");
    let slot = plan.slot(at("2026-11-23T10:00:00Z"));
    let keyed = [
        (7, ("web-2", 0)),
        (7, ("web-1", 1)),
        (7, ("web-1", 2)),
        (7, ("web-3", 3)),
    ];
    let drawn = plan.victim_among(&slot, &keyed, |host| host.0, |_| true);
    assert_eq!(drawn, Some(&("web-1", 1)));
    let drawn = plan.victim_among(&slot, &keyed, |host| host.0, |name| name != "web-1");
    assert_eq!(drawn, Some(&("web-2", 0)));
}

/// The draw's scheme, pinned: a host's key and a slot's victim for a fixed
/// seed. Every instance of a fleet must draw alike; a change here changes
/// the victims of every running schedule, and belongs in
/// docs/scheduling.md ("How instances agree") with the version it ships in.
#[test]
fn the_victim_draw_is_pinned() {
    let plan = Plan::new(&settings("drip", Duration::from_secs(600)), b"pinned seed");
    assert_eq!(plan.key("cattle-a1"), 10_250_671_877_658_878_831);
    let hosts = [
        "cattle-a1",
        "cattle-a2",
        "cattle-a3",
        "cattle-a4",
        "cattle-a5",
    ];
    let victims: Vec<String> = [
        "2026-11-23T10:00:00Z",
        "2026-11-23T11:00:00Z",
        "2026-11-23T12:00:00Z",
    ]
    .iter()
    .map(|t| plan.victim(&plan.slot(at(t)), hosts, |_| true).unwrap())
    .collect();
    assert_eq!(victims, ["cattle-a1", "cattle-a4", "cattle-a3"]);
}
