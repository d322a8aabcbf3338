//! `mandrill report` end to end: a real run (the `command` backend, a
//! `command` verification probe, the disruption budget) fills a real
//! SQLite store with restarts that recovered, one that never did, budget
//! deferrals and a denial; the report is made from that store as JSON and
//! HTML, and the HTML rendered in headless Chromium, whose DOM must show
//! the chart and the store's numbers.
//!
//! `MANDRILL_REPORT_SCREENSHOT=PATH` copies the screenshot the test takes
//! there (how `docs/report.png` is made).

mod support;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mandrill::Status;
use serde_json::Value;
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

/// A calendar open at all times: with a real backend the default is
/// Mon–Fri 09:00–15:00 UTC.
const ALWAYS_OPEN: &str = "\n[safety.calendar]\n\
    weekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
    hours = [\"00:00-24:00\"]\n";

/// The restart: holds the host down a moment (so that the budget defers
/// the group's other hosts meanwhile), then brings it back after a delay
/// of its own (`web-03` after 0.3 s), so that recovery times spread; a
/// `db-` host never comes back.
const RESTART: &str = r#"#!/bin/sh
set -eu
host=$1
dir=$2
rm -f "$dir/up-$host"
sleep 0.2
case "$host" in db-*) exit 0 ;; esac
n=${host##*-}
n=${n#0}
( sleep "0.$n"; touch "$dir/up-$host" ) </dev/null >/dev/null 2>&1 &
echo "restarting $host"
"#;

/// A requester whose name is markup: the report must show it as text.
const HOSTILE: &str = "<script>alert(1)</script>";

#[test]
fn the_report_of_a_real_run_renders_in_chromium_with_the_store_s_numbers() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    let script = dir.join("restart.sh");
    fs::write(&script, RESTART).unwrap();
    let mut permissions = fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    fs::set_permissions(&script, permissions).unwrap();
    let config = format!(
        "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
         [worker]\nrestart_timeout = \"30s\"\nmax_in_flight = 10\n\n\
         [restarter]\nkind = \"command\"\n\n[restarter.command]\n\
         argv = [{script:?}, \"{{instance_name}}\", {dir:?}]\n\n\
         [verify]\nprobe = \"command\"\nargv = [\"test\", \"-e\", {probe:?}]\n\
         initial_delay = \"0s\"\ninterval = \"50ms\"\ntimeout = \"2s\"\n\n\
         [safety]\nallow = [\"web-*\", \"db-*\"]\nrequire_signed = false\n\
         pause_on_unrecovered = false\n{ALWAYS_OPEN}\n\
         [safety.groups]\npets = [\"pet-*\"]\n\n\
         [safety.budget]\nmax_disrupted = 2\nretry = \"100ms\"\n\n\
         [safety.rate]\ngroup_max = 0\n\n\
         [[recovery_objective]]\ngroup = \"web\"\nmax = \"1h\"\n\n\
         [[recovery_objective]]\ngroup = \"db\"\nmax = \"1h\"\n",
        script = script.to_str().unwrap(),
        dir = dir.to_str().unwrap(),
        probe = format!("{}/up-{{instance_name}}", dir.display()),
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
    // A denied request, from a requester whose name is markup.
    let denied_id = uuid::Uuid::new_v4();
    let denied = serde_json::json!({
        "message_id": denied_id.to_string(),
        "instance_name": "pet-01",
        "requested_by": HOSTILE,
    });
    fs::write(dir.join("denied.jsonl"), format!("{denied}\n")).unwrap();
    let hosts = [
        "web-01", "web-02", "web-03", "web-04", "web-05", "web-06", "db-01",
    ];
    let mut publish = vec!["publish", "--broker", &db, "--file", "denied.jsonl"];
    publish.extend(hosts);
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "publish failed: {stderr}");

    let (status, lines) = Mandrill::run(
        &dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
    )
    .wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    let entries = history(&db);
    let status_of = |name: &str| {
        entries
            .iter()
            .find(|e| e.instance_name.as_deref() == Some(name))
            .map(|e| e.status)
    };
    for web in &hosts[..6] {
        assert_eq!(status_of(web), Some(Status::Restarted), "{entries:?}");
    }
    assert_eq!(status_of("db-01"), Some(Status::Unrecovered));
    assert_eq!(status_of("pet-01"), Some(Status::Denied));
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "deferred"
                && l["fields"]["guard"] == "disruption budget"),
        "two at a time in a group of six: the budget deferred some"
    );

    // The report, as JSON, against the store.
    let (status, json, stderr) = mandrill(
        &dir,
        &[
            "report",
            "--config",
            "mandrill.toml",
            "--since",
            "1h",
            "--db",
            &db,
            "--format",
            "json",
        ],
        &[],
    );
    assert!(status.success(), "report failed: {stderr}");
    let report: Value = serde_json::from_str(&json).unwrap();
    let group = |name: &str| -> Value {
        report["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == name)
            .unwrap_or_else(|| panic!("no group {name} in {report}"))
            .clone()
    };
    let web = group("web");
    assert_eq!(web["restarts"], 6);
    assert_eq!(web["outcomes"]["restarted"], 6);
    let mut recovered: Vec<f64> = entries
        .iter()
        .filter(|e| e.status == Status::Restarted)
        .map(|e| e.recovered_after.expect("verified").as_secs_f64())
        .collect();
    recovered.sort_by(f64::total_cmp);
    assert_eq!(
        web["recovery"]["recovered_seconds"],
        serde_json::json!(recovered)
    );
    // Nearest rank of six: p50 the 3rd, p95 the 6th.
    assert_eq!(web["recovery"]["p50"], serde_json::json!(recovered[2]));
    assert_eq!(web["recovery"]["p95"], serde_json::json!(recovered[5]));
    assert!(
        web["deferrals_by_guard"]["disruption budget"]
            .as_u64()
            .unwrap()
            >= 1
    );
    let db_group = group("db");
    assert_eq!(db_group["unrecovered_hosts"], serde_json::json!(["db-01"]));
    assert_eq!(db_group["recovery"]["p50"], "unrecovered");
    // Judged against `[[recovery_objective]]`: web within the hour, db
    // never back.
    assert_eq!(web["objective"]["met"], true, "{web}");
    assert_eq!(db_group["objective"]["met"], false, "{db_group}");
    // Never claimed: placed in the operator's group (`safety.groups`),
    // never in one made from its name (`pet`).
    let pet = group("pets");
    assert!(
        report["groups"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["group"] != "pet"),
        "{report}"
    );
    // Unsigned: its free text is marked wherever it is shown.
    let hostile_shown = format!("{HOSTILE} (unverified)");
    assert_eq!(pet["denials_by_requester"][&hostile_shown], 1, "{pet}");
    assert_eq!(pet["restarts"], 0);
    assert_eq!(report["fleet"]["restarts"], 7);
    assert_eq!(report["fleet"]["unrecovered"], 1);
    assert_eq!(report["fleet"]["denied_requests"], 1);
    // The same rows the store hands to the report.
    let data = store_report(&db);
    assert_eq!(data.attempts.len(), 7);
    assert_eq!(
        data.decisions
            .iter()
            .filter(|d| d.verdict == "denied")
            .map(|d| d.requested_by.as_deref())
            .collect::<Vec<_>>(),
        [Some(hostile_shown.as_str())]
    );

    // The HTML, rendered.
    let page = dir.join("report.html");
    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "report",
            "--config",
            "mandrill.toml",
            "--since",
            "1h",
            "--db",
            &db,
            "--output",
            page.to_str().unwrap(),
        ],
        &[],
    );
    assert!(status.success(), "report failed: {stderr}");
    let dom = chromium(&dir, &["--dump-dom", &file_url(&page)]);
    assert!(dom.contains("<h1>Game-day report</h1>"), "{dom}");
    assert!(
        !dom.contains("<script"),
        "markup from a message became markup: {dom}"
    );
    assert!(
        dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{dom}"
    );
    for name in ["web", "db", "pets"] {
        let json = group(name);
        let section = section(&dom, name);
        // A chart where there is a recovery to chart.
        let charted = name != "pets";
        assert_eq!(section.contains("<svg class=\"chart\""), charted, "{name}");
        assert_eq!(
            field(section, "restarts"),
            json["restarts"].to_string(),
            "{name}"
        );
        assert_eq!(
            field(section, "recovered"),
            json["recovery"]["recovered"].to_string()
        );
        assert_eq!(
            field(section, "unrecovered"),
            json["recovery"]["unrecovered"].to_string()
        );
        for key in ["p50", "p95"] {
            let expected = match &json["recovery"][key] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                number => Some(number.to_string()),
            };
            assert_eq!(
                attribute(section, key, "data-seconds"),
                expected,
                "{name} {key}"
            );
        }
        let bars: Vec<u64> = bar_counts(section);
        let buckets: Vec<u64> = json["recovery"]["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .collect();
        assert_eq!(bars, buckets, "{name}: a bar per bucket");
    }
    let web_section = section(&dom, "web");
    let deferred = web["deferrals_by_guard"]["disruption budget"].to_string();
    assert_eq!(
        count_of(web_section, "deferred", "disruption budget"),
        deferred
    );
    assert!(section(&dom, "db").contains("<li>db-01</li>"));
    assert!(section(&dom, "db").contains("class=\"bar never\" data-count=\"1\""));
    let requester = "&lt;script&gt;alert(1)&lt;/script&gt; (unverified)";
    assert_eq!(count_of(section(&dom, "pets"), "denied", requester), "1");
    for (key, value) in [
        ("restarts", &report["fleet"]["restarts"]),
        ("unrecovered", &report["fleet"]["unrecovered"]),
        ("denied_requests", &report["fleet"]["denied_requests"]),
    ] {
        let fleet = &dom[dom.find("id=\"fleet\"").unwrap()..];
        assert_eq!(field(fleet, key), value.to_string(), "fleet {key}");
    }

    // And as people see it.
    let screenshot = dir.join("report.png");
    let shot = format!("--screenshot={}", screenshot.display());
    chromium(
        &dir,
        &[
            &shot,
            "--window-size=1100,2150",
            "--hide-scrollbars",
            &file_url(&page),
        ],
    );
    let png = fs::read(&screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        png.len() > 20_000,
        "a page, not a blank: {} bytes",
        png.len()
    );
    if let Some(path) = std::env::var_os("MANDRILL_REPORT_SCREENSHOT") {
        fs::copy(&screenshot, path).unwrap();
    }

    // Markdown to a terminal, the default.
    let (status, text, _) = mandrill(&dir, &["report", "--since", "1h", "--db", &db], &[]);
    assert!(status.success());
    assert!(
        text.contains("## Group web") && text.contains("| never | 1 |"),
        "{text}"
    );
    assert!(text.contains("\\<script\\>alert\\(1\\)"), "{text}");
    let bare = text
        .match_indices('<')
        .filter(|(at, _)| !text[..*at].ends_with('\\'));
    assert_eq!(
        bare.count(),
        0,
        "markup from a message in the Markdown: {text}"
    );
}

/// A bad `--since` is bad usage, naming the forms it takes; a store that
/// does not exist is reported, not created.
#[test]
fn a_bad_since_or_a_missing_store_is_refused() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["report", "--since", "last week"], &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("RFC 3339"), "{stderr}");
    let db = sqlite_url(&dir);
    let args = ["report", "--since", "2026-11-20T09:00:00Z", "--db", &db];
    let (status, _, stderr) = mandrill(&dir, &args, &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no database at"), "{stderr}");
    assert!(!dir.join("mandrill.db").exists());
}

fn store_report(url: &str) -> mandrill::ReportData {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let records = mandrill::Records::open(url).await.unwrap();
        let since = mandrill::Timestamp::from_millis(0);
        let data = records.report(since).await.unwrap();
        records.close().await;
        data
    })
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Runs headless Chromium on the page, within the deadline; its standard
/// output.
fn chromium(dir: &Path, args: &[&str]) -> String {
    let profile = dir.join("chromium-profile");
    let mut child = Command::new("chromium")
        .args(["--headless", "--disable-gpu", "--no-sandbox"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium is installed");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium failed: {status}");
            break;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("chromium did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// The group's section of the DOM.
fn section<'a>(dom: &'a str, group: &str) -> &'a str {
    let start = dom
        .find(&format!("data-group=\"{group}\""))
        .unwrap_or_else(|| panic!("no section for {group}"));
    let end = dom[start..].find("</section>").unwrap();
    &dom[start..start + end]
}

/// The text of the element whose `data-k` is `key`.
fn field(html: &str, key: &str) -> String {
    let at = html
        .find(&format!("data-k=\"{key}\""))
        .unwrap_or_else(|| panic!("no {key}"));
    let text = &html[at..];
    let open = text.find('>').unwrap() + 1;
    let close = text[open..].find('<').unwrap();
    text[open..open + close].to_owned()
}

/// An attribute of the element whose `data-k` is `key`, if it has it.
fn attribute(html: &str, key: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("data-k=\"{key}\""))?;
    let tag_end = at + html[at..].find('>')?;
    let tag_start = html[..at].rfind('<')?;
    let tag = &html[tag_start..tag_end];
    let value_at = tag.find(&format!("{name}=\""))? + name.len() + 2;
    let value_end = tag[value_at..].find('"')?;
    Some(tag[value_at..value_at + value_end].to_owned())
}

/// The count in the `prefix` table's row whose name is `name` (as the
/// DOM has it, escaped).
fn count_of(section: &str, prefix: &str, name: &str) -> String {
    let row = format!("data-k=\"{prefix}\">{name}</td>");
    let at = section
        .find(&row)
        .unwrap_or_else(|| panic!("no {prefix} row {name}"));
    field(&section[at..], &format!("{prefix}-count"))
}

/// The `data-count` of each of the section's bucket bars, in order.
fn bar_counts(section: &str) -> Vec<u64> {
    section
        .match_indices("<rect class=\"bar\" data-count=\"")
        .map(|(at, found)| {
            let rest = &section[at + found.len()..];
            rest[..rest.find('"').unwrap()].parse().unwrap()
        })
        .collect()
}
