//! The dashboard at `/`: one server-rendered page, no external assets (the
//! machines have no internet), refreshed by the browser every few seconds.

use std::fmt::Write as _;

use crate::domain::Status;
use crate::domain::Timestamp;
use crate::safety::objectives::Judged;
use crate::schedule::Planned;
use crate::stats::StatsSnapshot;
use crate::store::{GroupPause, HistoryEntry, Switch};

/// Seconds between refreshes.
const REFRESH_SECONDS: u32 = 5;
/// Requests listed.
const LATEST: usize = 25;
/// Minutes the chart covers.
const MINUTES: i64 = 60;

/// What the page shows.
pub(crate) struct Page<'a> {
    pub(crate) leashed: bool,
    /// The kill switch, or why it is unknown.
    pub(crate) switch: Result<&'a Switch, &'static str>,
    pub(crate) ready: Result<(), &'static str>,
    pub(crate) stats: &'a StatsSnapshot,
    /// The latest requests, or why they are not shown (the history needs
    /// the token, which a page cannot send; the store did not answer).
    pub(crate) history: Result<&'a [HistoryEntry], &'static str>,
    /// Each `[[schedule]]`'s next restarts (empty without one), or why
    /// they are not shown (a victim is a host name, kept behind the token).
    pub(crate) schedules: Result<&'a [Planned], &'static str>,
    pub(crate) now: Timestamp,
    /// The groups whose restarts are paused.
    pub(crate) group_pauses: &'a [GroupPause],
    /// Each recovery objective, judged.
    pub(crate) recovery: &'a [Judged],
}

/// Text safe inside HTML (also the game-day report's).
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse}td,th{padding:.25em .6em;white-space:nowrap;border-bottom:1px solid #ddd;text-align:left}\
.mode{font-weight:bold;padding:.2em .5em;border-radius:.3em}.leashed{background:#cfe8cf}\
.unleashed{background:#f6c6c6}.counters td:last-child{text-align:right}\
#switch{padding:.5em;margin:.5em 0;border-radius:.3em}.paused{background:#f6c6c6}.running{background:#eee}\
#switch form{display:inline;margin-left:1em}#switch input,#switch button{margin-right:.4em}";

pub(crate) fn render(page: &Page<'_>) -> String {
    let s = page.stats;
    let mode = if page.leashed { "leashed" } else { "unleashed" };
    let ready = match page.ready {
        Ok(()) => "ready".to_owned(),
        Err(why) => format!("not ready: {why}"),
    };
    let mut html = String::new();
    // Writing to a String cannot fail: the results are ignored throughout.
    let _ = write!(
        html,
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <title>mandrill</title><style>{STYLE}</style></head><body>\
         <h1>mandrill <span id=\"mode\" class=\"mode {mode}\">{mode}</span></h1>\
         <p id=\"readiness\">{ready} · in flight <b id=\"in-flight\">{}</b> · store {}</p>",
        s.in_flight,
        if s.store_down == 0 { "up" } else { "down" },
    );
    switch(&mut html, page);
    groups(&mut html, page);
    html.push_str("<table class=\"counters\" id=\"counters\">");
    for (name, value) in [
        ("pulled", s.pulled),
        ("restarted", s.restarted),
        ("restart failures", s.restart_failures),
        ("unrecovered", s.unrecovered),
        ("dry runs", s.dry_runs),
        ("denied", s.denied),
        // A deferral is a guard's "not yet", not a retry of a failure:
        // named apart from the nacks, which count both.
        ("deferrals", s.deferred),
        ("nacked (deferrals and retries)", s.nacked),
        ("dead letters", s.dead_lettered),
        ("rejected", s.rejected),
        ("panics", s.panics),
    ] {
        let _ = write!(html, "<tr><td>{name}</td><td>{value}</td></tr>");
    }
    html.push_str("</table>");
    planned(&mut html, page.schedules);
    match page.history {
        Err(why) => {
            let _ = write!(html, "<p id=\"no-history\">No history: {why}.</p>");
        }
        Ok(history) => {
            html.push_str("<h2>Finished per minute, last hour</h2>");
            html.push_str(&chart(history, page.now));
            latest(&mut html, history);
        }
    }
    html.push_str("</body></html>");
    html
}

/// The paused groups, and each group's recovery against its objective.
fn groups(html: &mut String, page: &Page<'_>) {
    for pause in page.group_pauses {
        let _ = write!(
            html,
            "<div class=\"group-pause paused\">PAUSED: {}</div>",
            escape(&pause.deferred_reason())
        );
    }
    if page.recovery.is_empty() {
        return;
    }
    html.push_str(
        "<table id=\"recovery\"><tr><th>group</th><th>p50</th><th>percentile</th>\
         <th>objective</th><th>restarts</th><th>verdict</th></tr>",
    );
    for judged in page.recovery {
        let show = |r: Option<crate::safety::objectives::Recovery>| {
            r.map_or_else(|| "-".to_owned(), |r| r.to_string())
        };
        let verdict = match judged.met {
            Some(true) => "met",
            Some(false) => "BREACHED",
            None => "no verified restart yet",
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>p{} {}</td><td>{:.1}s</td><td>{}</td><td>{verdict}</td></tr>",
            escape(&judged.group),
            show(judged.p50),
            judged.percentile,
            show(judged.at_percentile),
            judged.max.as_secs_f64(),
            judged.samples,
        );
    }
    html.push_str("</table>");
}

/// The kill switch, and the button that turns it: a plain form POST with
/// a token field (a page cannot send the header), answered with a redirect
/// back here.
fn switch(html: &mut String, page: &Page<'_>) {
    let (class, text, action, label) = match page.switch {
        Err(why) => {
            let _ = write!(
                html,
                "<div id=\"switch\" class=\"running\">kill switch unknown: {why}</div>"
            );
            return;
        }
        Ok(switch) if switch.paused => (
            "paused",
            format!("PAUSED: {}", escape(&switch.paused_reason())),
            "/api/resume",
            "Resume restarts",
        ),
        Ok(_) => (
            "running",
            "restarts running".to_owned(),
            "/api/pause",
            "Pause all restarts",
        ),
    };
    // The switch always needs the token (admin.token or the generated one).
    let token = "<input type=\"password\" name=\"token\" placeholder=\"admin token\" required>";
    let _ = write!(
        html,
        "<div id=\"switch\" class=\"{class}\"><span id=\"switch-state\">{text}</span>\
         <form method=\"post\" action=\"{action}\">\
         <input name=\"reason\" placeholder=\"reason\" maxlength=\"1024\">{token}\
         <button type=\"submit\" id=\"switch-button\">{label}</button></form></div>"
    );
}

/// The next planned restarts of each schedule, with their provisional
/// victims; nothing without a schedule.
fn planned(html: &mut String, schedules: Result<&[Planned], &'static str>) {
    let schedules = match schedules {
        Ok([]) => return,
        Ok(schedules) => schedules,
        Err(why) => {
            let _ = write!(
                html,
                "<p id=\"no-planned\">No planned restarts shown: {why}.</p>"
            );
            return;
        }
    };
    html.push_str(
        "<h2>Next planned restarts</h2><table id=\"planned\"><tr><th>schedule</th>\
         <th>group</th><th>when</th><th>victim (provisional)</th></tr>",
    );
    for schedule in schedules {
        if schedule.next.is_empty() {
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td colspan=\"2\">none within a year</td></tr>",
                escape(&schedule.name),
                escape(&schedule.group)
            );
        }
        for slot in &schedule.next {
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&schedule.name),
                escape(&schedule.group),
                escape(&slot.local),
                slot.victim
                    .as_deref()
                    .map_or_else(|| "(no eligible host now)".to_owned(), escape)
            );
        }
    }
    html.push_str("</table>");
}

fn latest(html: &mut String, history: &[HistoryEntry]) {
    html.push_str(
        "<h2>Latest requests</h2><table id=\"requests\"><tr><th>received</th><th>instance</th>\
         <th>requested by</th><th>status</th><th>attempts</th><th>recovered after</th><th>last error</th></tr>",
    );
    for entry in history.iter().take(LATEST) {
        let instance = escape(entry.instance_name.as_deref().unwrap_or("(malformed)"));
        let instance = match entry.message_id {
            Some(id) => format!("<a href=\"/api/requests/{id}\">{instance}</a>"),
            None => instance,
        };
        let recovered = entry
            .recovered_after
            .map(|after| format!("{:.1}s", after.as_secs_f64()))
            .unwrap_or_default();
        let _ = write!(
            html,
            "<tr class=\"request\"><td>{}</td><td>{instance}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{recovered}</td><td>{}</td></tr>",
            entry.received_at,
            escape(entry.requested_by_shown().as_deref().unwrap_or("")),
            entry.status,
            entry.attempts,
            escape(entry.last_error.as_deref().unwrap_or("")),
        );
    }
    html.push_str("</table>");
}

/// Bars of requests finished per minute, restarted (green) stacked under
/// everything else final (red), as an inline SVG.
fn chart(history: &[HistoryEntry], now: Timestamp) -> String {
    let mut per_minute = [(0u32, 0u32); MINUTES as usize];
    for entry in history {
        let Some(done) = entry.completed_at else {
            continue;
        };
        let ago = (now.as_millis() - done.as_millis()) / 60_000;
        if (0..MINUTES).contains(&ago) {
            // In range, so a valid index counted from the oldest minute.
            let slot = &mut per_minute[(MINUTES - 1 - ago) as usize];
            if matches!(entry.status, Status::Restarted | Status::DryRun) {
                slot.0 += 1;
            } else {
                slot.1 += 1;
            }
        }
    }
    let peak = per_minute
        .iter()
        .map(|(ok, bad)| ok + bad)
        .max()
        .unwrap_or(0)
        .max(1);
    let (width, height) = (8u32, 100u32);
    let mut svg = format!(
        "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" \
         role=\"img\"><title>finished per minute (peak {peak})</title>",
        width * MINUTES as u32,
        height
    );
    for (minute, (ok, bad)) in per_minute.iter().enumerate() {
        let x = minute as u32 * width;
        let ok_height = ok * height / peak;
        let bad_height = bad * height / peak;
        let _ = write!(
            svg,
            "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{ok_height}\" fill=\"#4a4\"/>\
             <rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{bad_height}\" fill=\"#c44\"/>",
            height - ok_height,
            width - 1,
            height - ok_height - bad_height,
            width - 1,
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn page_escapes_names_links_stories_and_hides_history_without_token() {
        let now = Timestamp::from_millis(10 * 3_600_000);
        let just_now = Some(Timestamp::from_millis(now.as_millis() - 1_000));
        let history = [
            entry("<script>x</script>", Status::Restarted, just_now),
            entry("web-1", Status::Failed, just_now),
        ];
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
        let page = Page {
            leashed: true,
            switch: Ok(&paused),
            ready: Ok(()),
            stats: &stats,
            history: Ok(&history),
            schedules: Ok(&[]),
            now,
            group_pauses: &[],
            recovery: &[],
        };
        let html = render(&page);
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
        assert!(html.contains(&format!("href=\"/api/requests/{}\"", uuid::Uuid::nil())));
        assert!(html.contains("<td>restarted</td><td>7</td>"));
        // Deferrals are named deferrals, never counted as retries.
        assert!(html.contains("<td>deferrals</td><td>3</td>"), "{html}");
        assert!(!html.contains("<td>retries</td>"), "{html}");
        assert!(html.contains("class=\"mode leashed\""));
        assert!(
            html.contains("PAUSED: paused by ana (&lt;b&gt;incident"),
            "{html}"
        );
        // The switch needs a token even without admin.token (a generated one).
        assert!(html.contains("action=\"/api/resume\"") && html.contains("name=\"token\""));
        // The last minute's bar: one restarted (half the height), one failed.
        assert!(
            html.contains("<rect x=\"472\" y=\"50\" width=\"7\" height=\"50\" fill=\"#4a4\"/>"),
            "{html}"
        );
        assert!(!html.contains("http-equiv=\"refresh\" content=\"0"));
        assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
        let running = Switch::default();
        let hidden = render(&Page {
            history: Err("admin.token is set"),
            switch: Ok(&running),
            ..page
        });
        assert!(!hidden.contains("web-1") && hidden.contains("admin.token is set"));
        assert!(hidden.contains("action=\"/api/pause\"") && hidden.contains("name=\"token\""));
        assert!(!html.contains("id=\"planned\"") && !html.contains("no-planned"));
    }

    #[test]
    fn page_lists_the_next_planned_restarts_or_why_not() {
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
        let page = Page {
            leashed: false,
            switch: Ok(&running),
            ready: Ok(()),
            stats: &stats,
            history: Err("admin.token is set"),
            schedules: Ok(&planned),
            now: Timestamp::from_millis(0),
            group_pauses: &[],
            recovery: &[],
        };
        let html = render(&page);
        assert!(html.contains(
            "<tr><td>weekly</td><td>web&lt;1&gt;</td><td>2026-11-30 10:15 CET</td><td>web-3</td></tr>"
        ), "{html}");
        assert!(html.contains("<td>2026-11-30 14:00 CET</td><td>(no eligible host now)</td>"));
        let hidden = render(&Page {
            schedules: Err("admin.token is set; send it to see the planned restarts"),
            ..page
        });
        assert!(!hidden.contains("web-3") && hidden.contains("id=\"no-planned\""));
    }

    #[test]
    fn paused_groups_and_each_groups_recovery_against_its_objective_are_shown() {
        use crate::safety::objectives::{RecoveryObjective, judge};
        let objective = RecoveryObjective {
            group: "<web>".into(),
            max: std::time::Duration::from_secs(120),
            ..RecoveryObjective::default()
        };
        let recovery = [judge(
            &objective,
            &[Some(std::time::Duration::from_secs(3)), None],
        )];
        let pauses = [GroupPause {
            group: "<web>".into(),
            by: "recovery-objective".into(),
            reason: "recovery objective breached".into(),
            since: Timestamp::from_millis(0),
        }];
        let stats = StatsSnapshot::default();
        let running = Switch::default();
        let html = render(&Page {
            leashed: false,
            switch: Ok(&running),
            ready: Ok(()),
            stats: &stats,
            history: Ok(&[]),
            schedules: Ok(&[]),
            now: Timestamp::from_millis(0),
            group_pauses: &pauses,
            recovery: &recovery,
        });
        assert!(
            html.contains("PAUSED: restarts of group &lt;web&gt; paused by recovery-objective"),
            "{html}"
        );
        assert!(
            html.contains("<td>&lt;web&gt;</td><td>3.0s</td><td>p95 unrecovered</td><td>120.0s</td><td>2</td><td>BREACHED</td>"),
            "{html}"
        );
    }
}
