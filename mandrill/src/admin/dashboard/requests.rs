//! The requests: the counters, those finished per minute over the last
//! hour (an inline SVG), and the latest with their verdicts, each linking
//! to its story.

use std::fmt::Write as _;

use super::page::escape;
use crate::domain::{Status, Timestamp};
use crate::stats::StatsSnapshot;
use crate::store::HistoryEntry;

/// Requests listed.
const LATEST: usize = 25;
/// Minutes the chart covers.
const MINUTES: i64 = 60;

pub(super) fn render(
    html: &mut String,
    stats: &StatsSnapshot,
    history: Result<&[HistoryEntry], &'static str>,
    now: Timestamp,
) {
    html.push_str("<h2>Requests</h2><table class=\"counters\" id=\"counters\">");
    for (name, value) in [
        ("pulled", stats.pulled),
        ("restarted", stats.restarted),
        ("restart failures", stats.restart_failures),
        ("unrecovered", stats.unrecovered),
        ("dry runs", stats.dry_runs),
        ("denied", stats.denied),
        // A deferral is a guard's "not yet", not a retry of a failure:
        // named apart from the nacks, which count both.
        ("deferrals", stats.deferred),
        ("nacked (deferrals and retries)", stats.nacked),
        ("dead letters", stats.dead_lettered),
        ("rejected", stats.rejected),
        ("panics", stats.panics),
    ] {
        let _ = write!(html, "<tr><td>{name}</td><td>{value}</td></tr>");
    }
    html.push_str("</table>");
    match history {
        Err(why) => {
            let _ = write!(html, "<p id=\"no-history\">No history: {why}.</p>");
        }
        Ok(history) => {
            html.push_str("<h3>Finished per minute, last hour</h3>");
            html.push_str(&chart(history, now));
            latest(html, history);
        }
    }
}

fn latest(html: &mut String, history: &[HistoryEntry]) {
    html.push_str(
        "<h3>Latest requests</h3><table id=\"requests\"><tr><th>received</th><th>instance</th>\
         <th>requested by</th><th>verdict</th><th>attempts</th><th>recovered after</th><th>last error</th></tr>",
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

/// Bars of requests finished per minute, restarted (green) under dry runs
/// (grey: decided, never issued) under everything else final (red), as an
/// inline SVG.
fn chart(history: &[HistoryEntry], now: Timestamp) -> String {
    let mut per_minute = [[0u32; 3]; MINUTES as usize];
    for entry in history {
        let Some(done) = entry.completed_at else {
            continue;
        };
        let ago = (now.as_millis() - done.as_millis()) / 60_000;
        if (0..MINUTES).contains(&ago) {
            // In range, so a valid index counted from the oldest minute.
            let slot = &mut per_minute[(MINUTES - 1 - ago) as usize];
            let kind = match entry.status {
                Status::Restarted => 0,
                Status::DryRun => 1,
                _ => 2,
            };
            slot[kind] += 1;
        }
    }
    let peak = per_minute
        .iter()
        .map(|counts| counts.iter().sum::<u32>())
        .max()
        .unwrap_or(0)
        .max(1);
    let (width, height) = (8u32, 100u32);
    let mut svg = format!(
        "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" \
         role=\"img\"><title>finished per minute (peak {peak}): restarted, dry runs, the \
         rest</title>",
        width * MINUTES as u32,
        height
    );
    for (minute, counts) in per_minute.iter().enumerate() {
        let x = minute as u32 * width;
        let mut top = height;
        for (count, fill) in counts.iter().zip(["#4a4", "#999", "#c44"]) {
            let bar = count * height / peak;
            top -= bar;
            let _ = write!(
                svg,
                "<rect x=\"{x}\" y=\"{top}\" width=\"{}\" height=\"{bar}\" fill=\"{fill}\"/>",
                width - 1,
            );
        }
    }
    svg.push_str("</svg>");
    svg
}
