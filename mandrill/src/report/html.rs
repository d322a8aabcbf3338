//! The report as one self-contained HTML page: inline CSS, the charts as
//! hand-written inline SVG, no script (its Content-Security-Policy allows
//! none), readable on screen and on paper. Every name and reason came from
//! a message or a guard and is escaped; numbers carry a `data-k` attribute
//! so that a test (or a scraper) finds them without reading prose.
//!
//! One page's markup and its charts, so one file past 400 lines.

use std::fmt::Write as _;
use std::time::Duration;

use super::{Bucket, GroupReport, Recovery, Report, human, human_recovery, verdict_word};
use crate::admin::escape;

/// The chart's size and the plot area inside it, in SVG units.
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = WIDTH - 12.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = HEIGHT - 40.0;
/// The widest a bar's slot may be.
const MAX_SLOT: f64 = 56.0;

const STYLE: &str = "
:root { color-scheme: light; }
body { font: 15px/1.45 system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; color: #1d2430;
  margin: 2rem auto; max-width: 60rem; padding: 0 1.25rem; background: #fff; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; }
h2 { font-size: 1.25rem; margin: 0 0 .75rem; border-bottom: 2px solid #e3e7ee; padding-bottom: .3rem; }
h3 { font-size: 1rem; margin: 1rem 0 .4rem; color: #404b5c; }
.period { color: #5b6678; margin: 0 0 1.25rem; }
.cards { display: flex; flex-wrap: wrap; gap: .75rem; margin: 0 0 1.5rem; }
.card { border: 1px solid #e3e7ee; border-radius: 8px; padding: .6rem .9rem; min-width: 7.5rem; }
.card .n { display: block; font-size: 1.6rem; font-weight: 600; }
.card .l { color: #5b6678; font-size: .85rem; }
.card.bad .n { color: #c62828; }
section.group { border: 1px solid #e3e7ee; border-radius: 10px; padding: 1rem 1.25rem; margin: 0 0 1.5rem; }
.cols { display: flex; flex-wrap: wrap; gap: 1.5rem; }
.cols > div { flex: 1 1 14rem; }
table { border-collapse: collapse; font-size: .9rem; }
th, td { text-align: left; padding: .2rem .8rem .2rem 0; border-bottom: 1px solid #eef1f5; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.met { color: #2e7d32; font-weight: 600; }
.breached { color: #c62828; font-weight: 600; }
.hosts { margin: 0; padding-left: 1.2rem; }
.hosts li { color: #c62828; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
.none { color: #7a8496; }
figure { margin: .5rem 0; }
figcaption { color: #5b6678; font-size: .85rem; }
svg { max-width: 100%; height: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #404b5c; }
.key { display: inline-block; width: .8rem; height: .2rem; vertical-align: middle; margin: 0 .25rem 0 .6rem; }
footer { color: #7a8496; font-size: .8rem; margin-top: 2rem; }
@media print {
  body { margin: 0; max-width: none; font-size: 12px; }
  section.group { break-inside: avoid; border-color: #ccc; }
  .card { border-color: #ccc; }
}
@page { margin: 1.5cm; }
.verdict.failed { color: #b42318; } .verdict.succeeded { color: #067647; }
";

/// The report as an HTML page.
pub(crate) fn html(report: &Report) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let since = report.since.to_string();
    let until = report.until.to_string();
    // Writing into a String cannot fail.
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>Game-day report since {since}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>Game-day report</h1>\n\
         <p class=\"period\">From <time data-k=\"since\">{since}</time> to <time data-k=\"until\">{until}</time>.</p>\n",
        since = escape(&since),
        until = escape(&until),
    );
    let fleet = &report.fleet;
    out.push_str("<div class=\"cards\" id=\"fleet\">\n");
    card(
        &mut out,
        "restarts",
        fleet.restarts,
        "restarts issued",
        false,
    );
    card(
        &mut out,
        "dry_runs",
        fleet.dry_runs,
        "dry runs (nothing issued)",
        false,
    );
    card(&mut out, "recovered", fleet.recovered, "recovered", false);
    let unrecovered = fleet.unrecovered;
    card(
        &mut out,
        "unrecovered",
        unrecovered,
        "unrecovered",
        unrecovered > 0,
    );
    card(
        &mut out,
        "deferred_requests",
        fleet.deferred_requests,
        "requests deferred",
        false,
    );
    card(
        &mut out,
        "denied_requests",
        fleet.denied_requests,
        "requests denied",
        false,
    );
    card(
        &mut out,
        "expired_requests",
        fleet.expired_requests,
        "requests expired",
        false,
    );
    out.push_str("</div>\n");
    if report.groups.is_empty() {
        out.push_str(
            "<p class=\"none\">Nothing was restarted, deferred or denied in this period.</p>\n",
        );
    }
    for group in &report.groups {
        group_section(&mut out, group);
    }
    for campaign in &report.campaigns {
        campaign_section(&mut out, campaign);
    }
    let _ = write!(
        out,
        "<footer>Percentiles: {}. Made by <code>mandrill report</code>.</footer>\n</body>\n</html>\n",
        escape(report.percentile_method)
    );
    out
}

fn campaign_section(out: &mut String, campaign: &super::CampaignReport) {
    let verdict = campaign.verdict.as_str();
    let _ = writeln!(
        out,
        "<section class=\"campaign\"><h2>Campaign <code>{}</code> over {}: <span class=\"verdict {verdict}\">{verdict}</span></h2>",
        campaign.id,
        escape(&campaign.group)
    );
    let _ = writeln!(
        out,
        "<p>Started {}{}.</p>",
        campaign.started_at,
        campaign
            .requester
            .as_deref()
            .map(|r| format!(" by {}", escape(r)))
            .unwrap_or_default()
    );
    out.push_str(
        "<table><thead><tr><th>host</th><th>state</th><th>recovered after</th><th>why</th></tr></thead><tbody>\n",
    );
    for target in &campaign.targets {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&target.host),
            escape(&target.standing.state),
            target
                .standing
                .recovered_after_seconds
                .map_or("–".to_owned(), |s| format!("{s:.1} s")),
            escape(&target.standing.detail)
        );
    }
    out.push_str("</tbody></table></section>\n");
}

fn card(out: &mut String, key: &str, n: u32, label: &str, bad: bool) {
    let class = if bad { "card bad" } else { "card" };
    let _ = writeln!(
        out,
        "<div class=\"{class}\"><span class=\"n\" data-k=\"{key}\">{n}</span><span class=\"l\">{label}</span></div>"
    );
}

fn group_section(out: &mut String, group: &GroupReport) {
    let name = escape(&group.group);
    let recovery = &group.recovery;
    let _ = writeln!(
        out,
        "<section class=\"group\" data-group=\"{name}\">\n<h2>Group {name}</h2>\n<div class=\"cols\">\n<div>"
    );
    // Restarts, by outcome.
    let _ = writeln!(
        out,
        "<h3>Restarts issued: <span data-k=\"restarts\">{}</span></h3>\n\
         <p>Dry runs (nothing issued): <span data-k=\"dry_runs\">{}</span>; requests \
         expired: <span data-k=\"expired_requests\">{}</span></p>",
        group.restarts, group.dry_runs, group.expired_requests
    );
    if group.outcomes.is_empty() {
        out.push_str("<p class=\"none\">No attempt was claimed.</p>\n");
    } else {
        out.push_str("<table>\n<tr><th>outcome</th><th class=\"num\">attempts claimed</th></tr>\n");
        for (outcome, n) in &group.outcomes {
            let _ = writeln!(
                out,
                "<tr><td>{outcome}</td><td class=\"num\" data-k=\"outcome-{outcome}\">{n}</td></tr>"
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("</div>\n<div>\n");
    // Recovery against the objective.
    out.push_str("<h3>Recovery</h3>\n<table>\n");
    let _ = writeln!(
        out,
        "<tr><th>recovered</th><td class=\"num\" data-k=\"recovered\">{}</td></tr>\n\
         <tr><th>unrecovered</th><td class=\"num\" data-k=\"unrecovered\">{}</td></tr>",
        recovery.recovered, recovery.unrecovered
    );
    for (key, value) in [("p50", recovery.p50), ("p95", recovery.p95)] {
        let _ = writeln!(
            out,
            "<tr><th>{key}</th><td class=\"num\" data-k=\"{key}\"{}>{}</td></tr>",
            seconds_attribute(value),
            escape(&human_recovery(value))
        );
    }
    if let Some(objective) = &group.objective {
        let label = format!(
            "objective p{} ≤ {}",
            objective.percentile,
            human(objective.max)
        );
        let word = verdict_word(objective.met);
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td class=\"num\"><span data-k=\"objective_observed\"{}>{}</span> <span class=\"{word}\" data-k=\"objective\">{word}</span></td></tr>",
            escape(&label),
            seconds_attribute(objective.observed),
            escape(&human_recovery(objective.observed))
        );
    }
    out.push_str("</table>\n</div>\n</div>\n");
    chart(out, group);
    out.push_str("<div class=\"cols\">\n<div>\n<h3>Unrecovered hosts</h3>\n");
    if group.unrecovered_hosts.is_empty() {
        out.push_str("<p class=\"none\">None.</p>\n");
    } else {
        out.push_str("<ul class=\"hosts\" data-k=\"unrecovered_hosts\">\n");
        for host in &group.unrecovered_hosts {
            let _ = writeln!(out, "<li>{}</li>", escape(host));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</div>\n<div>\n<h3>Deferrals by guard</h3>\n");
    counts_table(
        out,
        "guard",
        "requests",
        "deferred",
        &group.deferrals_by_guard,
    );
    out.push_str("</div>\n<div>\n<h3>Denials by requester</h3>\n");
    counts_table(
        out,
        "requester",
        "requests",
        "denied",
        &group.denials_by_requester,
    );
    out.push_str("</div>\n</div>\n");
    if !group.latest_denials.is_empty() {
        out.push_str("<h3>Latest denials</h3>\n<table class=\"denials\">\n<tr><th>at</th><th>host</th><th>requester</th><th>guard</th><th>reason</th></tr>\n");
        for denial in &group.latest_denials {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&denial.at.to_string()),
                escape(denial.host.as_deref().unwrap_or("–")),
                escape(&denial.requester),
                escape(&denial.guard),
                escape(&denial.reason)
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("</section>\n");
}

/// A recovery as the JSON has it, in a `data-seconds` attribute: what a
/// reader of the page compares with the JSON report.
fn seconds_attribute(recovery: Option<Recovery>) -> String {
    match recovery {
        Some(Recovery::After(after)) => format!(" data-seconds=\"{}\"", after.as_secs_f64()),
        Some(Recovery::Never) => " data-seconds=\"unrecovered\"".to_owned(),
        None => String::new(),
    }
}

fn counts_table(
    out: &mut String,
    key_label: &str,
    count_label: &str,
    prefix: &str,
    counts: &std::collections::BTreeMap<String, u32>,
) {
    if counts.is_empty() {
        out.push_str("<p class=\"none\">None.</p>\n");
        return;
    }
    let _ = writeln!(
        out,
        "<table>\n<tr><th>{key_label}</th><th class=\"num\">{count_label}</th></tr>"
    );
    for (key, n) in counts {
        // The name as text only: untrusted, it goes in no attribute.
        let _ = writeln!(
            out,
            "<tr><td data-k=\"{prefix}\">{}</td><td class=\"num\" data-k=\"{prefix}-count\">{n}</td></tr>",
            escape(key)
        );
    }
    out.push_str("</table>\n");
}

/// The recovery-time histogram of a group: a bar per bucket, a red bar for
/// the unrecovered, lines at p50, p95 and the objective's bound.
fn chart(out: &mut String, group: &GroupReport) {
    let recovery = &group.recovery;
    let name = escape(&group.group);
    if recovery.buckets.is_empty() && recovery.unrecovered == 0 {
        out.push_str(
            "<p class=\"none\">No verified recovery in this period: nothing to chart.</p>\n",
        );
        return;
    }
    let _ = write!(
        out,
        "<figure>\n<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" aria-label=\"Recovery times of group {name}\">\n"
    );
    let buckets = &recovery.buckets;
    let never = recovery.unrecovered;
    // The unrecovered bar sits apart, half a slot to the right.
    let slots = buckets.len() as f64 + if never > 0 { 1.5 } else { 0.0 };
    // A few bars stay bars, not slabs; the axes end with the last.
    let slot = ((RIGHT - LEFT) / slots).min(MAX_SLOT);
    let right = LEFT + slot * slots;
    let highest = buckets
        .iter()
        .map(|b| b.count)
        .chain([never, 1])
        .max()
        .unwrap_or(1);
    let y = |n: f64| BOTTOM - (BOTTOM - TOP) * n / f64::from(highest);
    // Axes and the count gridlines.
    let mut ticks = vec![0, highest];
    if highest >= 4 {
        ticks.insert(1, highest / 2);
    }
    for tick in ticks {
        let at = y(f64::from(tick));
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{right:.1}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#e3e7ee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{tick}</text>",
            LEFT - 6.0,
            at + 3.5
        );
    }
    for (i, bucket) in buckets.iter().enumerate() {
        bar(out, LEFT + slot * i as f64, slot, y, bucket);
    }
    // Edge labels: every one when few, else every other.
    let every = if buckets.len() > 8 { 2 } else { 1 };
    for (i, bucket) in buckets.iter().enumerate().step_by(every) {
        label(out, LEFT + slot * i as f64, &human(bucket.from));
    }
    if let Some(last) = buckets.last()
        && buckets.len().is_multiple_of(every)
    {
        label(out, LEFT + slot * buckets.len() as f64, &human(last.to));
    }
    let never_x = LEFT + slot * (buckets.len() as f64 + 0.5);
    if never > 0 {
        let top = y(f64::from(never));
        let _ = writeln!(
            out,
            "<rect class=\"bar never\" data-count=\"{never}\" x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#c62828\"><title>{never} unrecovered</title></rect>\n<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">never</text>",
            never_x + 1.0,
            (slot - 2.0).max(1.0),
            BOTTOM - top,
            never_x + slot / 2.0,
            BOTTOM + 14.0
        );
    }
    // Where a duration falls on the axis; an unrecovered percentile on
    // the unrecovered bar.
    let width = buckets
        .first()
        .map_or(Duration::from_secs(1), |b| b.to - b.from);
    let x_of = |recovery: Recovery| match recovery {
        Recovery::After(after) => {
            LEFT + slot * after.as_secs_f64() / width.as_secs_f64().max(f64::MIN_POSITIVE)
        }
        Recovery::Never => never_x + slot / 2.0,
    };
    let mut marks = vec![
        (recovery.p50, "p50", "#2e7d32", "4 3"),
        (recovery.p95, "p95", "#ef6c00", "4 3"),
    ];
    if let Some(objective) = &group.objective {
        marks.push((
            Some(Recovery::After(objective.max)),
            "objective",
            "#c62828",
            "none",
        ));
    }
    for (offset, (at, key, colour, dash)) in marks.into_iter().enumerate() {
        let Some(at) = at else { continue };
        let x = x_of(at).clamp(LEFT, right);
        let _ = writeln!(
            out,
            "<line class=\"mark\" data-k=\"{key}\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"{colour}\" stroke-width=\"1.5\" stroke-dasharray=\"{dash}\"/><text x=\"{:.1}\" y=\"{}\" fill=\"{colour}\">{key}</text>",
            x + 3.0,
            TOP + 10.0 + 11.0 * offset as f64
        );
    }
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" x2=\"{right:.1}\" y1=\"{BOTTOM}\" y2=\"{BOTTOM}\" stroke=\"#8a94a6\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">recovery time after the restart</text>\n</svg>",
        (LEFT + right.max(LEFT + 160.0)) / 2.0,
        HEIGHT - 6.0
    );
    out.push_str("<figcaption>Restarts by recovery time");
    out.push_str("<span class=\"key\" style=\"background:#2e7d32\"></span>p50");
    out.push_str("<span class=\"key\" style=\"background:#ef6c00\"></span>p95");
    if group.objective.is_some() {
        out.push_str("<span class=\"key\" style=\"background:#c62828\"></span>objective");
    }
    if never > 0 {
        out.push_str("; the red bar: restarts that never recovered");
    }
    out.push_str(".</figcaption>\n</figure>\n");
}

fn bar(out: &mut String, x: f64, slot: f64, y: impl Fn(f64) -> f64, bucket: &Bucket) {
    let top = y(f64::from(bucket.count));
    let _ = writeln!(
        out,
        "<rect class=\"bar\" data-count=\"{}\" x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#4c78a8\"><title>{} from {} to {}</title></rect>",
        bucket.count,
        x + 1.0,
        (slot - 2.0).max(1.0),
        BOTTOM - top,
        bucket.count,
        human(bucket.from),
        human(bucket.to)
    );
}

fn label(out: &mut String, x: f64, text: &str) {
    let _ = writeln!(
        out,
        "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        BOTTOM + 14.0,
        escape(text)
    );
}
