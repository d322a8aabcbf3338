//! The page from made-up facts, section by section: one page's tests, so
//! one file a little past 400 lines.

use std::collections::BTreeMap;
use std::time::Duration;

use super::groups::{GroupRow, rows};
use super::page::{Page, content_security_policy, render};
use crate::admin::instances::{Instance, RunningMode};
use crate::campaign::{Standing, Verdict};
use crate::domain::{Status, Timestamp};
use crate::safety::objectives::{RecoveryObjective, judge};
use crate::stats::StatsSnapshot;
use crate::store::{Campaign, CampaignTarget, GroupPause, GroupUsage, HistoryEntry, Switch};

fn entry(instance: &str, status: Status, completed_at: Option<Timestamp>) -> HistoryEntry {
    HistoryEntry {
        message_id: Some(uuid::Uuid::nil()),
        instance_name: Some(instance.into()),
        hostname: None,
        status,
        attempts: 1,
        requested_by: None,
        verified: false,
        reason: None,
        last_error: None,
        output: None,
        recovered_after: None,
        received_at: Timestamp::from_millis(0),
        updated_at: Timestamp::from_millis(0),
        completed_at,
    }
}

fn leashed() -> RunningMode {
    RunningMode {
        leashed: true,
        since: Some("2026-11-28T09:00:00.000Z".into()),
        by: Some("start-up".into()),
        reason: None,
        from: Some("instance".into()),
    }
}

/// A page with nothing in it but what each test sets.
fn page<'a>(stats: &'a StatsSnapshot, switch: &'a Switch) -> Page<'a> {
    Page {
        now: Timestamp::from_millis(10 * 3_600_000),
        own_mode: leashed(),
        instances: &[],
        ready: Ok(()),
        stats,
        switch: Ok(switch),
        groups: Ok(&[]),
        window: Duration::from_secs(3600),
        calendar: None,
        schedules: Ok(&[]),
        campaigns: Ok(&[]),
        campaigns_lookback: Duration::from_secs(48 * 3600),
        history: Ok(&[]),
    }
}

#[test]
fn page_escapes_names_links_stories_and_says_why_history_is_hidden() {
    let stats = StatsSnapshot {
        restarted: 7,
        deferred: 3,
        nacked: 4,
        ..StatsSnapshot::default()
    };
    let paused = Switch {
        paused: true,
        by: Some("ana".into()),
        reason: Some("<b>incident</b>".into()),
        since: None,
        leash: None,
    };
    let now = Timestamp::from_millis(10 * 3_600_000);
    let just_now = Some(Timestamp::from_millis(now.as_millis() - 1_000));
    let history = [
        entry("<script>x</script>", Status::Restarted, just_now),
        entry("web-1", Status::Failed, just_now),
        entry("web-2", Status::DryRun, just_now),
        entry("web-3", Status::DryRun, just_now),
    ];
    let html = render(&Page {
        history: Ok(&history),
        ..page(&stats, &paused)
    });
    assert!(!html.contains("<script>x"), "{html}");
    assert!(html.contains("&lt;script&gt;"));
    assert!(html.contains(&format!("href=\"/api/requests/{}\"", uuid::Uuid::nil())));
    assert!(html.contains("<td>restarted</td><td>7</td>"));
    // Deferrals are named deferrals, never counted as retries.
    assert!(html.contains("<td>deferrals</td><td>3</td>"), "{html}");
    assert!(html.contains("class=\"mode leashed\""));
    assert!(
        html.contains("PAUSED: paused by ana (&lt;b&gt;incident"),
        "{html}"
    );
    assert!(html.contains("data-post=\"/api/resume\">Resume all restarts"));
    // The last minute's bar: one restarted (a quarter of the height),
    // then two dry runs in grey, never counted as restarts, then one failed.
    for bar in [
        "<rect x=\"472\" y=\"75\" width=\"7\" height=\"25\" fill=\"#4a4\"/>",
        "<rect x=\"472\" y=\"25\" width=\"7\" height=\"50\" fill=\"#999\"/>",
        "<rect x=\"472\" y=\"0\" width=\"7\" height=\"25\" fill=\"#c44\"/>",
    ] {
        assert!(html.contains(bar), "{bar}: {html}");
    }
    // Refreshed by the script, or without one by the browser.
    assert!(html.contains("<noscript><meta http-equiv=\"refresh\" content=\"5\">"));
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    let running = Switch::default();
    let hidden = render(&Page {
        history: Err("admin.token is set"),
        ..page(&stats, &running)
    });
    assert!(!hidden.contains("web-1") && hidden.contains("No history: admin.token is set"));
    assert!(hidden.contains("data-post=\"/api/pause\">Pause all restarts"));
}

/// The token field lives outside the part a refresh replaces, so what the
/// operator pasted stays; the page's own script and style are the only
/// ones its Content-Security-Policy lets run.
#[test]
fn the_controls_stay_across_refreshes_and_only_the_pages_own_script_runs() {
    let stats = StatsSnapshot::default();
    let running = Switch::default();
    let html = render(&page(&stats, &running));
    let token = html.find("id=\"token\"").unwrap();
    let live = html.find("id=\"live\"").unwrap();
    assert!(token < live, "{html}");
    assert!(html.contains("type=\"password\""));
    let script = html
        .split("<script>")
        .nth(1)
        .and_then(|rest| rest.split("</script>").next())
        .unwrap();
    let hash = |text: &str| {
        use base64::Engine as _;
        use sha2::Digest as _;
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(text))
    };
    let policy = content_security_policy();
    assert!(
        policy.contains(&format!("script-src 'sha256-{}'", hash(script))),
        "{policy}"
    );
    let style = html
        .split("<style>")
        .nth(1)
        .and_then(|rest| rest.split("</style>").next())
        .unwrap();
    assert!(policy.contains(&format!("style-src 'sha256-{}'", hash(style))));
    assert!(policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"));
    assert_eq!(html.matches("<script").count(), 1, "one script: {html}");
}

#[test]
fn each_instance_is_listed_with_its_own_mode_and_the_mode_says_when_they_differ() {
    let stats = StatsSnapshot::default();
    let running = Switch::default();
    let instance = |port: u16| Instance {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        url: format!("http://127.0.0.1:{port}/"),
        pid: u32::from(port),
    };
    let unleashed = RunningMode {
        leashed: false,
        since: Some("2026-11-28T10:00:00.000Z".into()),
        by: Some("a reload (SIGHUP)".into()),
        reason: None,
        from: Some("instance".into()),
    };
    let instances = [
        (instance(9730), Ok(leashed())),
        (instance(9731), Ok(unleashed)),
        (instance(9732), Err("GET … timed out".to_owned())),
    ];
    let html = render(&Page {
        instances: &instances,
        ..page(&stats, &running)
    });
    assert!(html.contains("class=\"mode unleashed\">mixed<"), "{html}");
    assert!(html.contains(
        "<td>http://127.0.0.1:9731/</td><td>9731</td><td class=\"wrap\">unleashed since \
         2026-11-28T10:00:00.000Z by a reload (SIGHUP)</td>"
    ));
    assert!(html.contains("mode unknown: GET … timed out"), "{html}");
    // None listed (the directory could not be written): this one, leashed.
    let alone = render(&page(&stats, &running));
    assert!(alone.contains("this instance") && alone.contains("class=\"mode leashed\""));
    assert!(alone.contains("leashed (dry run) since 2026-11-28T09:00:00.000Z by start-up"));
}

#[test]
fn every_known_group_is_a_row_with_its_pause_objective_and_use() {
    let objective = RecoveryObjective {
        group: "web".into(),
        max: Duration::from_secs(120),
        ..RecoveryObjective::default()
    };
    let judged = vec![judge(&objective, &[Some(Duration::from_secs(3)), None])];
    let pauses = vec![GroupPause {
        group: "db".into(),
        by: "ana".into(),
        reason: "failover drill".into(),
        since: Timestamp::from_millis(0),
    }];
    let usage = BTreeMap::from([(
        "old".to_owned(),
        GroupUsage {
            restarts: 2,
            disrupted: 1,
        },
    )]);
    let known = BTreeMap::from([("web".to_owned(), Some(4)), ("cattle".to_owned(), None)]);
    let rows = rows(known, pauses, judged, usage, |group| {
        (group == "web").then_some(1)
    });
    let names: Vec<_> = rows.iter().map(|row| row.name.as_str()).collect();
    // Known, paused, judged or restarted lately: each once, by name.
    assert_eq!(names, ["cattle", "db", "old", "web"]);
    let web = &rows[3];
    assert_eq!((web.hosts, web.budget), (Some(4), Some(1)));
    assert!(web.objective.as_ref().is_some_and(|j| j.breached()));
    assert_eq!(rows[1].pause.as_ref().map(|p| p.by.as_str()), Some("ana"));
    assert_eq!(rows[2].usage.restarts, 2);
}

#[test]
fn a_group_shows_who_paused_it_and_why_its_objective_and_its_button() {
    let objective = RecoveryObjective {
        group: "<web>".into(),
        max: Duration::from_secs(120),
        ..RecoveryObjective::default()
    };
    let groups = [
        GroupRow {
            name: "<web>".into(),
            hosts: Some(4),
            pause: Some(GroupPause {
                group: "<web>".into(),
                by: "recovery-objective".into(),
                reason: "recovery objective breached".into(),
                since: Timestamp::from_millis(0),
            }),
            objective: Some(judge(&objective, &[Some(Duration::from_secs(3)), None])),
            usage: GroupUsage {
                restarts: 2,
                disrupted: 1,
            },
            budget: Some(1),
        },
        GroupRow {
            name: "db".into(),
            hosts: None,
            pause: None,
            objective: None,
            usage: GroupUsage::default(),
            budget: None,
        },
    ];
    let stats = StatsSnapshot::default();
    let running = Switch::default();
    let html = render(&Page {
        groups: Ok(&groups),
        ..page(&stats, &running)
    });
    assert!(
        html.contains(
            "<td>&lt;web&gt;</td><td>4</td><td class=\"wrap\">PAUSED by recovery-objective \
             (recovery objective breached) since 1970-01-01T00:00:00.000Z</td><td>2</td>\
             <td>1 of 1</td><td>p50 3.0s, p95 unrecovered over 2 restarts</td>\
             <td>p95 ≤ 120.0s: BREACHED</td>"
        ),
        "{html}"
    );
    assert!(html.contains(
        "<button type=\"button\" data-post=\"/api/resume\" data-group=\"&lt;web&gt;\">Resume"
    ));
    assert!(html.contains("data-post=\"/api/pause\" data-group=\"db\">Pause"));
    assert!(
        html.contains("<th>restarts in the last hour</th>"),
        "{html}"
    );
    let unknown = render(&Page {
        groups: Err("the store did not answer"),
        ..page(&stats, &running)
    });
    assert!(unknown.contains("Groups unknown: the store did not answer."));
}

#[test]
fn the_next_slots_are_shown_against_the_calendar_or_why_not() {
    let stats = StatsSnapshot::default();
    let running = Switch::default();
    let planned = [crate::schedule::Planned {
        name: "weekly".into(),
        group: "web<1>".into(),
        next: vec![
            crate::schedule::PlannedSlot {
                at: "2026-11-30T09:15:00Z".into(),
                local: "2026-11-30 10:15 CET".into(),
                victim: Some("web-3".into()),
                message_id: Some(uuid::Uuid::nil()),
            },
            crate::schedule::PlannedSlot {
                at: "2026-11-30T13:00:00Z".into(),
                local: "2026-11-30 14:00 CET".into(),
                victim: None,
                message_id: Some(uuid::Uuid::nil()),
            },
        ],
    }];
    let calendar = (
        "Mon–Fri 09:00–15:00 Europe/Stockholm".to_owned(),
        "closed; next window opens 2026-11-30 09:00 CET".to_owned(),
    );
    let html = render(&Page {
        schedules: Ok(&planned),
        calendar: Some(calendar),
        ..page(&stats, &running)
    });
    assert!(html.contains(
        "calendar: Mon–Fri 09:00–15:00 Europe/Stockholm: <b>closed; next window opens \
         2026-11-30 09:00 CET</b>"
    ));
    assert!(
        html.contains(
            "<tr><td>weekly</td><td>web&lt;1&gt;</td><td>2026-11-30 10:15 CET</td><td>web-3</td></tr>"
        ),
        "{html}"
    );
    assert!(html.contains("<td>2026-11-30 14:00 CET</td><td>(no eligible host now)</td>"));
    assert!(!html.contains(&uuid::Uuid::nil().to_string()), "no slot id");
    let hidden = render(&Page {
        schedules: Err("admin.token is set; send it to see the planned restarts"),
        ..page(&stats, &running)
    });
    assert!(!hidden.contains("web-3") && hidden.contains("id=\"no-planned\""));
    assert!(hidden.contains("calendar: none (restarts at any time)"));
}

#[test]
fn a_campaign_in_flight_lists_its_targets_standing_and_a_stop_button() {
    let campaign = |id: u128| Campaign {
        id: uuid::Uuid::from_u128(id),
        group: "cattle".into(),
        created_at: Timestamp::from_millis(0),
        requester: Some("chaos".into()),
        targets: Vec::new(),
        stopped: None,
    };
    let target = |name: &str| CampaignTarget {
        instance_name: name.into(),
        message_id: uuid::Uuid::nil(),
        due_at: Timestamp::from_millis(60_000),
    };
    let standing = |state: &str, verdict, detail: &str| Standing {
        state: state.into(),
        verdict,
        detail: detail.into(),
        recovered_after_seconds: None,
    };
    let campaigns = [
        (
            campaign(1),
            vec![
                (
                    target("cattle-01"),
                    standing(
                        "restarted",
                        Verdict::Succeeded,
                        "restarted; recovered after 2s",
                    ),
                ),
                (
                    target("cattle-<2>"),
                    standing(
                        "deferred",
                        Verdict::InProgress,
                        "deferred by not_before: due at 1970-01-01T00:01:00Z",
                    ),
                ),
            ],
            Verdict::InProgress,
        ),
        (campaign(2), Vec::new(), Verdict::Failed),
    ];
    let stats = StatsSnapshot::default();
    let running = Switch::default();
    let html = render(&Page {
        campaigns: Ok(&campaigns),
        ..page(&stats, &running)
    });
    let first = uuid::Uuid::from_u128(1);
    assert!(
        html.contains(&format!(
            "<button type=\"button\" data-post=\"/api/campaigns/{first}/stop\" data-reason-only>Stop"
        )),
        "{html}"
    );
    assert!(html.contains(
        "<tr class=\"target in-progress\"><td>cattle-&lt;2&gt;</td><td>1970-01-01T00:01:00.000Z</td>\
         <td>deferred</td><td class=\"wrap\">deferred by not_before"
    ));
    assert!(html.contains("<td>cattle-01</td>") && html.contains("restarted; recovered after 2s"));
    // A campaign decided has nothing to stop.
    let second = uuid::Uuid::from_u128(2);
    assert!(!html.contains(&format!("/api/campaigns/{second}/stop")));
    assert!(html.contains("<span class=\"failed\">failed</span>"));
    let hidden = render(&Page {
        campaigns: Err("admin.token is set; paste it above to see"),
        ..page(&stats, &running)
    });
    assert!(hidden.contains("Campaigns not shown: admin.token is set"));
    assert!(!hidden.contains("cattle-01"));
}
