//! The page's layout: the controls the script reads (outside `#live`, so
//! that a refresh keeps what the operator typed), then the live part, one
//! section each: the instances and their modes, the kill switch, the
//! groups, the calendar and the schedules, the campaigns, the requests.

use std::fmt::Write as _;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use sha2::Digest as _;

use super::groups::GroupRow;
use crate::admin::RunningModes;
use crate::admin::instances::{Instance, RunningMode};
use crate::campaign::Judged as JudgedCampaign;
use crate::domain::Timestamp;
use crate::schedule::Planned;
use crate::stats::StatsSnapshot;
use crate::store::{HistoryEntry, Switch};

/// Seconds between refreshes.
pub(super) const REFRESH_SECONDS: u32 = 5;

/// What the page shows. Each `Err` says why that part is not shown (the
/// store did not answer; `admin.token` keeps host names to its holders).
pub(crate) struct Page<'a> {
    pub(crate) now: Timestamp,
    /// This instance's mode: shown when no instance is listed.
    pub(crate) own_mode: RunningMode,
    /// The instances in `admin.instances_dir`, each with its mode.
    pub(crate) instances: &'a [(Instance, Result<RunningMode, String>)],
    pub(crate) ready: Result<(), &'static str>,
    pub(crate) stats: &'a StatsSnapshot,
    /// The kill switch.
    pub(crate) switch: Result<&'a Switch, &'static str>,
    /// Every known group, its pause, objective and use of its limits.
    pub(crate) groups: Result<&'a [GroupRow], &'static str>,
    /// The window the rate limits count restarts over.
    pub(crate) window: Duration,
    /// The calendar in words, and whether it is open now.
    pub(crate) calendar: Option<(String, String)>,
    /// Each `[[schedule]]`'s next restarts (empty without one).
    pub(crate) schedules: Result<&'a [Planned], &'static str>,
    /// The latest campaigns, each target with where it stands.
    pub(crate) campaigns: Result<&'a [JudgedCampaign], &'a str>,
    /// How far back they were looked for.
    pub(crate) campaigns_lookback: Duration,
    /// The latest requests.
    pub(crate) history: Result<&'a [HistoryEntry], &'static str>,
}

/// Text safe inside HTML, attributes included (also the game-day report's).
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
h2{margin:1.2em 0 .4em;font-size:1.15em}h3{margin:.8em 0 .3em;font-size:1em}\
table{border-collapse:collapse}td,th{padding:.25em .6em;white-space:nowrap;border-bottom:1px solid #ddd;text-align:left}\
.mode{font-weight:bold;padding:.2em .5em;border-radius:.3em}.leashed{background:#cfe8cf}\
.unleashed{background:#f6c6c6}.counters td:last-child{text-align:right}\
#switch{padding:.5em;margin:.5em 0;border-radius:.3em}.paused{background:#f6c6c6}.running{background:#eee}\
#controls{position:sticky;top:0;background:#f4f4f8;padding:.5em;border-radius:.3em}\
#controls input{margin-right:.4em}#outcome{margin-left:.5em;font-family:monospace}\
button{margin-left:.5em}.failed{color:#b00}.succeeded{color:#070}.wrap{white-space:normal}";

/// The controls' script, served inline (no build step, no asset route).
const SCRIPT: &str = include_str!("console.js");

/// `'sha256-…'` of `text`, the form a Content-Security-Policy names an
/// inline script or style by.
fn source_hash(text: &str) -> String {
    let digest = sha2::Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The page's Content-Security-Policy: only its own inline script and
/// style run (by hash), it talks only to this server, and nothing frames
/// it; a name that slipped through escaping could still run nothing.
pub(super) fn content_security_policy() -> String {
    static POLICY: LazyLock<String> = LazyLock::new(|| {
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
            source_hash(SCRIPT),
            source_hash(STYLE)
        )
    });
    POLICY.clone()
}

pub(crate) fn render(page: &Page<'_>) -> String {
    let mut html = String::new();
    // Writing to a String cannot fail: the results are ignored throughout.
    let _ = write!(
        html,
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <noscript><meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\"></noscript>\
         <title>mandrill</title><style>{STYLE}</style></head>\
         <body data-refresh-seconds=\"{REFRESH_SECONDS}\">\
         <div id=\"controls\"><b>mandrill</b> \
         <input id=\"token\" type=\"password\" placeholder=\"admin token\" autocomplete=\"off\">\
         <input id=\"by\" placeholder=\"your name\" maxlength=\"128\">\
         <input id=\"reason\" placeholder=\"reason\" maxlength=\"1024\" size=\"30\">\
         <span id=\"outcome\"></span></div><div id=\"live\">"
    );
    overview(&mut html, page);
    switch(&mut html, page.switch);
    super::groups::render(&mut html, page.groups, page.window);
    super::planned::render(&mut html, page.calendar.as_ref(), page.schedules);
    super::campaigns::render(&mut html, page.campaigns, page.campaigns_lookback);
    super::requests::render(&mut html, page.stats, page.history, page.now);
    let _ = write!(html, "</div><script>{SCRIPT}</script></body></html>");
    html
}

/// The mode the instances say they run in (as `mandrill status`'s first
/// line), readiness, and each instance with its own mode.
fn overview(html: &mut String, page: &Page<'_>) {
    let own = [Ok(page.own_mode.clone())];
    let modes: Vec<_> = page.instances.iter().map(|(_, mode)| mode).collect();
    let what_runs = if modes.is_empty() {
        RunningModes::of(&own)
    } else {
        RunningModes::of(modes)
    };
    let (class, mode) = match what_runs {
        RunningModes::All(true) => ("leashed", "leashed"),
        RunningModes::All(false) | RunningModes::Partly(false) => ("unleashed", "unleashed"),
        // Not green: an instance that did not answer may be unleashed.
        RunningModes::Partly(true) => ("unleashed", "leashed? not every instance answered"),
        RunningModes::Mixed => ("unleashed", "mixed"),
        RunningModes::Unknown => ("unleashed", "mode unknown"),
    };
    let s = page.stats;
    let ready = match page.ready {
        Ok(()) => "ready".to_owned(),
        Err(why) => format!("not ready: {why}"),
    };
    let _ = write!(
        html,
        "<h1><span id=\"mode\" class=\"mode {class}\">{mode}</span></h1>\
         <p id=\"readiness\">{ready} · in flight <b id=\"in-flight\">{}</b> · store {}</p>\
         <table id=\"instances\"><tr><th>instance</th><th>pid</th><th>mode</th></tr>",
        s.in_flight,
        if s.store_down == 0 { "up" } else { "down" },
    );
    if page.instances.is_empty() {
        let _ = write!(
            html,
            "<tr><td>this instance</td><td>{}</td><td>{}</td></tr>",
            std::process::id(),
            escape(&page.own_mode.describe())
        );
    }
    for (instance, mode) in page.instances {
        let mode = match mode {
            Ok(mode) => mode.describe(),
            Err(error) => format!("mode unknown: {error}"),
        };
        let _ = write!(
            html,
            "<tr class=\"instance\"><td>{}</td><td>{}</td><td class=\"wrap\">{}</td></tr>",
            escape(&instance.url),
            instance.pid,
            escape(&mode)
        );
    }
    html.push_str("</table>");
}

/// The kill switch, and the button that turns it.
fn switch(html: &mut String, switch: Result<&Switch, &'static str>) {
    let (class, text, button) = match switch {
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
            action("/api/resume", None, "Resume all restarts"),
        ),
        Ok(_) => (
            "running",
            "restarts running".to_owned(),
            action("/api/pause", None, "Pause all restarts"),
        ),
    };
    let _ = write!(
        html,
        "<div id=\"switch\" class=\"{class}\"><span id=\"switch-state\">{text}</span>{button}</div>"
    );
}

/// A button the script turns into `POST path` with the token, who and why
/// (and `group`, when one is named).
pub(super) fn action(path: &str, group: Option<&str>, label: &str) -> String {
    let group = group.map_or_else(String::new, |group| {
        format!(" data-group=\"{}\"", escape(group))
    });
    format!(
        "<button type=\"button\" data-post=\"{}\"{group}>{label}</button>",
        escape(path)
    )
}
