use super::*;
use crate::domain::testing::request;
use crate::safety::Counting;

const HOUR: i64 = 3_600_000;

fn limits() -> Limits {
    Limits {
        group_max: Some(2),
        global_max: Some(3),
        window: Duration::from_secs(3600),
        host_cooldown: Some(Duration::from_secs(600)),
        budget: Some(1),
        forget_after: Duration::from_secs(3600),
        budget_retry: BUDGET_RETRY,
        ..Limits::NONE
    }
}

#[test]
fn each_counting_guard_defers_until_it_could_pass() {
    let now = 10 * HOUR;
    let free = Usage::default();
    let allowed = check(&limits(), subject("cattle", "cattle-1"), &free, now).unwrap();
    assert!(allowed.contains("restart 1 of 2"), "{allowed}");
    assert!(allowed.contains("budget: 1 of 1"), "{allowed}");

    let cooling = Usage {
        host_last: Some(now - 60_000),
        ..free
    };
    let refused = check(&limits(), subject("cattle", "cattle-1"), &cooling, now).unwrap_err();
    assert_eq!(refused.guard, "host cooldown");
    assert_eq!(refused.wait, Duration::from_secs(540));

    let full = Usage {
        group_claims: 2,
        group_oldest: Some(now - HOUR + 5_000),
        ..free
    };
    let refused = check(&limits(), subject("cattle", "cattle-1"), &full, now).unwrap_err();
    assert_eq!(refused.guard, "rate limit");
    assert_eq!(refused.wait, Duration::from_secs(5));
    assert!(
        refused.reason.contains("group cattle had 2 of its 2"),
        "{}",
        refused.reason
    );

    let busy = Usage {
        global_claims: 3,
        global_oldest: Some(now - 1_000),
        ..free
    };
    assert_eq!(
        check(&limits(), subject("cattle", "cattle-1"), &busy, now)
            .unwrap_err()
            .guard,
        "global rate limit"
    );

    let disrupted = Usage {
        disrupted: 1,
        ..free
    };
    let refused = check(&limits(), subject("cattle", "cattle-1"), &disrupted, now).unwrap_err();
    assert_eq!(refused.guard, "disruption budget");
    assert_eq!(refused.wait, BUDGET_RETRY);

    assert_eq!(
        check(&Limits::NONE, subject("g", "h"), &busy, now).unwrap(),
        "allowed"
    );
    assert!(!Limits::NONE.is_active() && limits().is_active());
}

#[test]
fn a_requesters_quota_and_a_zones_budget_count_only_what_the_operator_assigned() {
    let now = 10 * HOUR;
    let limits = Limits {
        zone_budget: Some(1),
        requester_max: Some(2),
        requester_window: Duration::from_secs(3600),
        ..Limits::NONE
    };
    assert!(limits.is_active());
    let signed = Subject {
        group: "cattle",
        instance: "cattle-1",
        zone: Some("eu-1a"),
        requester: Some("ci"),
    };
    let allowed = check(&limits, signed, &Usage::default(), now).unwrap();
    assert!(
        allowed.contains("requester ci: restart 1 of 2"),
        "{allowed}"
    );
    assert!(allowed.contains("1 of 1 host of zone eu-1a"), "{allowed}");

    let spent = Usage {
        requester_claims: 2,
        requester_oldest: Some(now - HOUR + 7_000),
        ..Usage::default()
    };
    let refused = check(&limits, signed, &spent, now).unwrap_err();
    assert_eq!(refused.guard, "requester quota");
    assert_eq!(refused.wait, Duration::from_secs(7));
    assert!(
        refused.reason.contains("requester ci had 2 of its 2"),
        "{}",
        refused.reason
    );

    let zone_busy = Usage {
        zone_disrupted: 1,
        ..Usage::default()
    };
    let refused = check(&limits, signed, &zone_busy, now).unwrap_err();
    assert_eq!(refused.guard, "zone budget");
    assert!(refused.reason.contains("zone eu-1a"), "{}", refused.reason);

    // Unsigned, and outside any zone: neither guard has anything to count.
    let anonymous = subject("cattle", "cattle-1");
    let both = Usage {
        zone_disrupted: 5,
        requester_claims: 5,
        ..Usage::default()
    };
    assert_eq!(check(&limits, anonymous, &both, now).unwrap(), "allowed");
}

#[test]
fn groups_defaults_and_budgets_resolve_fail_closed() {
    let mut groups = BTreeMap::new();
    groups.insert("web".to_owned(), vec!["frontend-*".to_owned()]);
    let budget = BudgetSettings {
        max_disrupted_percent: Some(20),
        group_sizes: [("web".to_owned(), 10)].into(),
        ..BudgetSettings::default()
    };
    let counting = Counting::new(&groups, &RateSettings::default(), &budget, true).unwrap();
    assert_eq!(counting.group_of("frontend-7"), "web");
    assert_eq!(counting.group_of("cattle-ab12"), "cattle");

    let web = counting.limits("web").unwrap();
    assert_eq!(web.budget, Some(2), "20% of 10");
    assert_eq!(
        web.group_max,
        Some(1),
        "Chaos Monkey's default with a real backend"
    );
    let unknown = counting.limits("cattle").unwrap_err();
    assert!(unknown.contains("group_sizes.cattle"), "{unknown}");

    let simulated = Counting::new(
        &BTreeMap::new(),
        &RateSettings::default(),
        &BudgetSettings::default(),
        false,
    )
    .unwrap();
    assert!(!simulated.limits("cattle").unwrap().is_active());
    let real = Counting::new(
        &BTreeMap::new(),
        &RateSettings {
            group_max: Some(0),
            ..RateSettings::default()
        },
        &BudgetSettings::default(),
        true,
    )
    .unwrap();
    let limits = real.limits("cattle").unwrap();
    assert_eq!((limits.group_max, limits.budget), (None, Some(1)));

    let (key, _) = Counting::new(
        &BTreeMap::new(),
        &RateSettings::default(),
        &BudgetSettings {
            max_disrupted_percent: Some(0),
            ..BudgetSettings::default()
        },
        true,
    )
    .unwrap_err();
    assert_eq!(key, "safety.budget.max_disrupted_percent");
}

#[test]
fn the_lookback_is_the_longest_reach_of_the_guards_that_are_on() {
    let counting = |rate: RateSettings, budget: BudgetSettings| {
        Counting::new(&BTreeMap::new(), &rate, &budget, false)
            .unwrap()
            .lookback()
    };
    let hours = |n: u64| Duration::from_secs(n * 3600);
    // Simulated defaults: no guard on, nothing to keep.
    assert_eq!(
        counting(RateSettings::default(), BudgetSettings::default()),
        Duration::ZERO
    );
    let rate = RateSettings {
        group_max: Some(1),
        window: hours(24),
        host_cooldown: hours(30),
        ..RateSettings::default()
    };
    assert_eq!(counting(rate.clone(), BudgetSettings::default()), hours(30));
    let budget = BudgetSettings {
        max_disrupted: Some(1),
        forget_after: hours(48),
        ..BudgetSettings::default()
    };
    assert_eq!(counting(rate, budget), hours(48));
    // With a real backend the strict defaults are on: a day's window.
    let real = Counting::new(
        &BTreeMap::new(),
        &RateSettings::default(),
        &BudgetSettings::default(),
        true,
    )
    .unwrap();
    assert_eq!(real.lookback(), hours(24));
}

/// Without a probe a restart counts as a disruption for the settle (5
/// minutes by default); with one, not at all. The zone budget is off
/// unless set, 0 unlimited; the settle and the zone budget keep their rows
/// from pruning.
#[test]
fn the_settle_applies_without_a_probe_and_the_zone_budget_when_set() {
    let counting = |budget: &BudgetSettings| {
        Counting::new(&BTreeMap::new(), &RateSettings::default(), budget, false).unwrap()
    };
    let defaults = counting(&BudgetSettings::default());
    let unverified = defaults.limits("cattle").unwrap();
    assert_eq!(unverified.settle, Duration::from_secs(300));
    assert_eq!(unverified.zone_budget, None);
    let verified = defaults.clone().verified_by_probe(true);
    assert_eq!(verified.limits("cattle").unwrap().settle, Duration::ZERO);
    assert_eq!(
        defaults
            .clone()
            .verified_by_probe(false)
            .limits("cattle")
            .unwrap()
            .settle,
        Duration::from_secs(300)
    );

    let zoned = counting(&BudgetSettings {
        max_disrupted_per_zone: Some(2),
        settle: Duration::from_secs(2 * 3600),
        ..BudgetSettings::default()
    });
    let limits = zoned.limits("cattle").unwrap();
    assert_eq!(limits.zone_budget, Some(2));
    assert!(limits.is_active());
    assert!(!limits.is_active_for(subject("cattle", "cattle-1")));
    let in_zone = Subject {
        zone: Some("eu-1a"),
        ..subject("cattle", "cattle-1")
    };
    assert!(limits.is_active_for(in_zone));
    assert_eq!(zoned.lookback(), Duration::from_secs(2 * 3600));
    assert!(zoned.describe().contains("hosts disrupted per zone: 2"));
    assert!(zoned.describe().contains("counts as disrupted for 2h"));
    let unlimited = counting(&BudgetSettings {
        max_disrupted_per_zone: Some(0),
        ..BudgetSettings::default()
    });
    assert_eq!(unlimited.limits("cattle").unwrap().zone_budget, None);
    assert_eq!(unlimited.lookback(), Duration::ZERO);
}

fn subject<'a>(group: &'a str, instance: &'a str) -> Subject<'a> {
    Subject {
        group,
        instance,
        zone: None,
        requester: None,
    }
}

#[test]
fn the_operator_assigns_the_group_and_a_message_naming_another_is_denied() {
    let groups = [("web".to_owned(), vec!["frontend-*".to_owned()])].into();
    let counting = Counting::new(
        &groups,
        &RateSettings::default(),
        &BudgetSettings::default(),
        false,
    )
    .unwrap();
    let mut plain = request("frontend-7");
    counting.assign(&mut plain).unwrap();
    assert_eq!(plain.group(), "web");

    let mut agreeing = request("cattle-a1");
    agreeing.requested_group = Some("cattle".into());
    counting.assign(&mut agreeing).unwrap();
    assert_eq!(agreeing.group(), "cattle");

    let mut hostile = request("frontend-7");
    hostile.requested_group = Some("canary".into());
    let reason = counting.assign(&mut hostile).unwrap_err();
    assert_eq!(hostile.group(), "web", "counted in the operator's group");
    assert!(
        reason.contains("names group canary") && reason.contains("in group web"),
        "{reason}"
    );
}
