use std::time::Duration;

use uuid::Uuid;

use super::*;
use crate::store::{ReportAttempt, ReportDecision};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_millis(1_800_000_000_000 + seconds * 1000)
}

fn attempt(
    host: &str,
    group: &str,
    outcome: Option<Status>,
    recovered_ms: Option<u64>,
) -> ReportAttempt {
    ReportAttempt {
        message_id: Uuid::new_v4(),
        attempt: 1,
        instance_name: host.to_owned(),
        group: group.to_owned(),
        requester: None,
        claimed_at: at(10),
        outcome,
        settled_at: outcome.map(|_| at(20)),
        recovered_after: recovered_ms.map(Duration::from_millis),
        last_error: None,
        lost: false,
    }
}

fn decision(
    id: Uuid,
    verdict: &str,
    guard: &str,
    host: Option<&str>,
    group: Option<&str>,
    by: Option<&str>,
) -> ReportDecision {
    ReportDecision {
        message_id: id,
        at: at(5),
        verdict: verdict.to_owned(),
        guard: guard.to_owned(),
        reason: "because".to_owned(),
        instance_name: host.map(str::to_owned),
        group: group.map(str::to_owned),
        requested_by: by.map(str::to_owned),
    }
}

fn build(data: &ReportData, objectives: &[ObjectiveView]) -> Report {
    Report::build(data, at(0), at(3600), objectives, &|_| None)
}

fn objective(group: &str, percentile: f64, max_ms: u64) -> ObjectiveView {
    ObjectiveView {
        group: group.to_owned(),
        percentile,
        max: Duration::from_millis(max_ms),
    }
}

#[test]
fn nearest_rank_takes_the_value_at_rank_ceil_p_n() {
    let one_to_twenty: Vec<u32> = (1..=20).collect();
    assert_eq!(nearest_rank(&one_to_twenty, 95.0), Some(19));
    assert_eq!(nearest_rank(&one_to_twenty, 50.0), Some(10));
    assert_eq!(nearest_rank(&one_to_twenty, 100.0), Some(20));
    assert_eq!(nearest_rank(&one_to_twenty, 0.1), Some(1));
    assert_eq!(nearest_rank(&[1, 2, 3, 4], 50.0), Some(2));
    assert_eq!(nearest_rank(&[1, 2, 3, 4], 51.0), Some(3));
    assert_eq!(nearest_rank(&[7], 95.0), Some(7));
    assert_eq!(nearest_rank::<u32>(&[], 50.0), None);
    // 99.9 of 10: rank 10.
    let ten: Vec<u32> = (1..=10).collect();
    assert_eq!(nearest_rank(&ten, 99.9), Some(10));
}

#[test]
fn an_empty_period_has_no_group_and_zero_totals() {
    let report = build(&ReportData::default(), &[objective("web", 95.0, 1000)]);
    assert!(report.groups.is_empty());
    assert_eq!(report.fleet, Totals::default());
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["groups"], serde_json::json!([]));
    assert!(html(&report).contains("Nothing was restarted"));
    assert!(markdown(&report).contains("Nothing was restarted"));
}

#[test]
fn restarts_are_counted_by_outcome_and_recoveries_judged_against_the_objective() {
    let mut attempts: Vec<ReportAttempt> = [400, 900, 1_200, 2_500]
        .into_iter()
        .enumerate()
        .map(|(i, ms)| {
            attempt(
                &format!("web-{i}"),
                "web",
                Some(Status::Restarted),
                Some(ms),
            )
        })
        .collect();
    // Restarted without verification: a restart, no recovery time.
    attempts.push(attempt("web-8", "web", Some(Status::Restarted), None));
    // Issued nothing: counted by outcome, not as a restart.
    attempts.push(attempt("web-9", "web", Some(Status::DryRun), None));
    attempts.push(attempt("web-7", "web", None, None));
    // An outcome lost: the restart may have run, and it is not running.
    attempts.push(ReportAttempt {
        lost: true,
        ..attempt("web-6", "web", None, None)
    });
    let data = ReportData {
        attempts,
        decisions: Vec::new(),
        ..ReportData::default()
    };
    let report = build(
        &data,
        &[objective("web", 50.0, 1_000), objective("db", 95.0, 1)],
    );
    let [web] = &report.groups[..] else {
        panic!("{:?}", report.groups)
    };
    assert_eq!(web.restarts, 7);
    assert_eq!(
        web.outcomes,
        BTreeMap::from([
            ("restarted", 5),
            ("dry-run", 1),
            ("in-flight", 1),
            ("unknown", 1)
        ])
    );
    let recovery = &web.recovery;
    assert_eq!((recovery.recovered, recovery.unrecovered), (4, 0));
    assert_eq!(
        recovery.p50,
        Some(Recovery::After(Duration::from_millis(900)))
    );
    assert_eq!(
        recovery.p95,
        Some(Recovery::After(Duration::from_millis(2_500)))
    );
    assert_eq!(recovery.recovered_seconds, [0.4, 0.9, 1.2, 2.5]);
    // 2.5s fits 500ms buckets: 0–0.5, 0.5–1, 1–1.5, 1.5–2, 2–2.5, 2.5–3.
    let counts: Vec<u32> = recovery.buckets.iter().map(|b| b.count).collect();
    assert_eq!(counts, [1, 1, 1, 0, 0, 1]);
    assert_eq!(recovery.buckets[5].from, Duration::from_millis(2_500));
    let objective = web.objective.as_ref().unwrap();
    assert_eq!(
        objective.observed,
        Some(Recovery::After(Duration::from_millis(900)))
    );
    assert_eq!(objective.met, Some(true));
    assert_eq!(report.fleet.restarts, 7);
    assert_eq!(report.fleet.recovered, 4);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["groups"][0]["recovery"]["p95"], serde_json::json!(2.5));
    assert_eq!(
        json["groups"][0]["objective"]["met"],
        serde_json::json!(true)
    );
    assert_eq!(
        json["groups"][0]["objective"]["max_seconds"],
        serde_json::json!(1.0)
    );
}

#[test]
fn a_group_whose_restarts_all_ended_unrecovered_breaches_its_objective() {
    let data = ReportData {
        attempts: vec![
            attempt("db-2", "db", Some(Status::Unrecovered), None),
            attempt("db-1", "db", Some(Status::Unrecovered), None),
            attempt("db-1", "db", Some(Status::Unrecovered), None),
        ],
        decisions: Vec::new(),
        ..ReportData::default()
    };
    let report = build(&data, &[objective("db", 95.0, 120_000)]);
    let db = &report.groups[0];
    assert_eq!(db.restarts, 3);
    assert_eq!((db.recovery.recovered, db.recovery.unrecovered), (0, 3));
    assert_eq!(db.recovery.p50, Some(Recovery::Never));
    assert_eq!(db.recovery.p95, Some(Recovery::Never));
    assert!(db.recovery.buckets.is_empty());
    assert_eq!(db.unrecovered_hosts, ["db-1", "db-2"]);
    let objective = db.objective.as_ref().unwrap();
    assert_eq!(
        (objective.observed, objective.met),
        (Some(Recovery::Never), Some(false))
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["groups"][0]["recovery"]["p50"], "unrecovered");
    let page = html(&report);
    assert!(
        page.contains("class=\"bar never\" data-count=\"3\""),
        "{page}"
    );
    assert!(page.contains("data-k=\"objective\">breached<"), "{page}");
    assert!(markdown(&report).contains("| never | 3 |"));
}

#[test]
fn one_unrecovered_restart_in_twenty_is_the_p95_of_nineteen_recovered() {
    let mut attempts: Vec<ReportAttempt> = (1..=19)
        .map(|s| attempt("app-1", "app", Some(Status::Restarted), Some(s * 1_000)))
        .collect();
    attempts.push(attempt("app-2", "app", Some(Status::Unrecovered), None));
    let report = build(
        &ReportData {
            attempts,
            decisions: Vec::new(),
            ..ReportData::default()
        },
        &[],
    );
    let app = &report.groups[0];
    // Rank 19 of 20: the slowest recovered; p96 would be the unrecovered.
    assert_eq!(
        app.recovery.p95,
        Some(Recovery::After(Duration::from_secs(19)))
    );
    assert_eq!(
        app.recovery.p50,
        Some(Recovery::After(Duration::from_secs(10)))
    );
    assert!(app.objective.is_none());
}

#[test]
fn a_group_with_no_verified_restart_has_no_percentile_and_no_verdict() {
    let data = ReportData {
        attempts: vec![attempt("batch-1", "batch", Some(Status::Restarted), None)],
        decisions: Vec::new(),
        ..ReportData::default()
    };
    let report = build(&data, &[objective("batch", 95.0, 1_000)]);
    let batch = &report.groups[0];
    assert_eq!(batch.recovery.p50, None);
    assert_eq!(batch.objective.as_ref().unwrap().met, None);
    let page = html(&report);
    assert!(page.contains("No verified recovery in this period"));
    assert!(!page.contains("<svg"), "no empty chart");
    assert!(page.contains("no data"));
}

#[test]
fn deferrals_count_requests_by_guard_and_denials_by_requester_in_the_operator_s_group() {
    let (a, b, c, d) = (
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    );
    let data = ReportData {
        attempts: Vec::new(),
        decisions: vec![
            // The same request deferred twice by the calendar counts once.
            decision(
                a,
                "deferred",
                "calendar",
                Some("web-1"),
                Some("frontend"),
                None,
            ),
            decision(
                a,
                "deferred",
                "calendar",
                Some("web-1"),
                Some("frontend"),
                None,
            ),
            decision(a, "deferred", "rate", Some("web-1"), Some("frontend"), None),
            decision(
                b,
                "deferred",
                "calendar",
                Some("web-2"),
                Some("frontend"),
                None,
            ),
            // Never claimed: the operator's group for its host, or none.
            decision(
                c,
                "denied",
                "eligibility",
                Some("db-1"),
                None,
                Some("mallory"),
            ),
            decision(d, "denied", "requesters", Some("db-2"), None, None),
            // Nothing known of it.
            decision(Uuid::new_v4(), "deferred", "calendar", None, None, None),
            // Not a deferral or a denial.
            decision(Uuid::new_v4(), "dry-run", "leash", Some("db-3"), None, None),
        ],
        ..ReportData::default()
    };
    // The operator places db-1 (its inventory, say), not db-2: no group
    // is made up from db-2's name.
    let place = |host: &str| (host == "db-1").then(|| "databases".to_owned());
    let report = Report::build(&data, at(0), at(3600), &[], &place);
    let names: Vec<&str> = report.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["(unplaced)", "databases", "frontend"]);
    let frontend = &report.groups[2];
    assert_eq!(
        frontend.deferrals_by_guard,
        BTreeMap::from([("calendar".to_owned(), 2), ("rate".to_owned(), 1)])
    );
    let databases = &report.groups[1];
    assert_eq!(
        databases.denials_by_requester,
        BTreeMap::from([("mallory".to_owned(), 1)])
    );
    assert_eq!(databases.restarts, 0);
    let unplaced = &report.groups[0];
    assert_eq!(
        unplaced.denials_by_requester,
        BTreeMap::from([("(anonymous)".to_owned(), 1)])
    );
    assert_eq!(
        unplaced.deferrals_by_guard,
        BTreeMap::from([("calendar".to_owned(), 1)])
    );
    let latest: Vec<(&str, &str)> = unplaced
        .latest_denials
        .iter()
        .map(|d| (d.requester.as_str(), d.guard.as_str()))
        .collect();
    assert_eq!(latest, [("(anonymous)", "requesters")]);
    assert_eq!(report.fleet.deferred_requests, 3);
    assert_eq!(report.fleet.denied_requests, 2);
}

/// Two requests restarted and two recorded as dry runs: two restarts, two
/// dry runs, in the group, the fleet and both renderings; and expiries,
/// before a claim (a decision) and after one (the attempt's outcome), are
/// counted once each.
#[test]
fn dry_runs_are_kept_apart_from_restarts_and_expired_requests_are_counted() {
    let expired_before_a_claim = Uuid::new_v4();
    let mut expired_after_a_claim = attempt("web-5", "web", Some(Status::Expired), None);
    expired_after_a_claim.message_id = Uuid::new_v4();
    let data = ReportData {
        attempts: vec![
            attempt("web-1", "web", Some(Status::Restarted), None),
            attempt("web-2", "web", Some(Status::Restarted), None),
            attempt("web-3", "web", Some(Status::DryRun), None),
            attempt("web-4", "web", Some(Status::DryRun), None),
            expired_after_a_claim,
        ],
        decisions: vec![
            decision(
                expired_before_a_claim,
                "deferred",
                "calendar",
                Some("web-6"),
                None,
                None,
            ),
            decision(
                expired_before_a_claim,
                "expired",
                "calendar",
                Some("web-6"),
                None,
                None,
            ),
        ],
        ..ReportData::default()
    };
    let place = |_: &str| Some("web".to_owned());
    let report = Report::build(&data, at(0), at(3600), &[], &place);
    let [web] = &report.groups[..] else {
        panic!("{:?}", report.groups)
    };
    assert_eq!((web.restarts, web.dry_runs), (2, 2));
    assert_eq!(web.expired_requests, 2);
    assert_eq!((report.fleet.restarts, report.fleet.dry_runs), (2, 2));
    assert_eq!(report.fleet.expired_requests, 2);
    let markdown = markdown(&report);
    assert!(
        markdown.contains("Restarts issued: 2; dry runs (nothing issued): 2; requests expired: 2"),
        "{markdown}"
    );
    assert!(
        markdown.contains("| 2 | 2 | 0 | 0 | 1 | 0 | 2 |"),
        "{markdown}"
    );
    let html = html(&report);
    assert!(html.contains("data-k=\"dry_runs\">2<"), "{html}");
    assert!(html.contains("data-k=\"expired_requests\">2<"), "{html}");
}

#[test]
fn every_untrusted_name_is_escaped_in_html_and_markdown() {
    let hostile = "<script>alert(1)</script>";
    let mut unrecovered = attempt("web-1", "web", Some(Status::Unrecovered), None);
    unrecovered.instance_name = format!("web-{hostile}");
    unrecovered.group = format!("g\"><img src=x onerror=alert(1)>{hostile}");
    let id = Uuid::new_v4();
    let data = ReportData {
        attempts: vec![unrecovered],
        decisions: vec![
            decision(id, "deferred", hostile, Some("web-1"), Some(hostile), None),
            decision(
                id,
                "denied",
                "eligibility",
                Some("web-1"),
                Some(hostile),
                Some(hostile),
            ),
        ],
        ..ReportData::default()
    };
    let mut data = data;
    data.decisions[1].reason = format!("not allowed: {hostile}");
    let report = build(&data, &[objective(hostile, 95.0, 1_000)]);
    let page = html(&report);
    assert!(!page.contains("<script"), "{page}");
    assert!(!page.contains("<img"), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(page.contains("web-&lt;script&gt;"));
    assert!(page.contains("<td>not allowed: &lt;script&gt;alert(1)&lt;/script&gt;</td>"));
    // The page runs nothing, whatever it holds.
    assert!(page.contains("default-src 'none'"));
    let text = markdown(&report);
    let bare = text
        .match_indices('<')
        .filter(|(at, _)| !text[..*at].ends_with('\\'));
    assert_eq!(bare.count(), 0, "{text}");
    assert!(text.contains("\\<script\\>"));
    // JSON carries them as strings, unchanged.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["groups"][0]["denials_by_requester"][hostile], 1);
}

#[test]
fn the_html_chart_has_a_bar_per_bucket_and_lines_at_the_percentiles_and_the_objective() {
    let attempts: Vec<ReportAttempt> = [3_000, 7_000, 8_000, 65_000]
        .into_iter()
        .map(|ms| attempt("app-1", "app", Some(Status::Restarted), Some(ms)))
        .collect();
    let report = build(
        &ReportData {
            attempts,
            decisions: Vec::new(),
            ..ReportData::default()
        },
        &[objective("app", 95.0, 120_000)],
    );
    let page = html(&report);
    let bars = report.groups[0].recovery.buckets.len();
    // Up to 120s (the objective) in 15s buckets (10s would need 13).
    assert_eq!(bars, 9);
    assert_eq!(page.matches("<rect class=\"bar\"").count(), bars);
    for key in ["p50", "p95", "objective"] {
        assert!(
            page.contains(&format!("class=\"mark\" data-k=\"{key}\"")),
            "{key}"
        );
    }
    assert!(page.contains("<svg class=\"chart\""));
    assert!(page.contains("data-k=\"objective\">met<"));
}

#[test]
fn durations_read_as_people_say_them() {
    assert_eq!(human(Duration::from_millis(850)), "850ms");
    assert_eq!(human(Duration::from_millis(4_250)), "4.2s");
    assert_eq!(human(Duration::from_secs(125)), "2m 05s");
    assert_eq!(human(Duration::from_secs(3_720)), "1h 02m");
}
