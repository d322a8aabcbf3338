//! `[[schedule]]` through the real binary: two `mandrill run` processes on
//! one SQLite file (queue and store), the `command` backend with a restart
//! journal, a real inventory file and a requester key made by `mandrill
//! keygen`, an all-day calendar and a mean of one second. Both processes
//! publish the same slots; each slot is restarted exactly once.

mod services;
mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use mandrill::HistoryEntry;
use mandrill::Status;
use mandrill::{Plan, ScheduleSettings};
use services::{Database, NatsNames, nats_server};
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

const HOSTS: [&str; 5] = [
    "cattle-a1",
    "cattle-a2",
    "cattle-a3",
    "cattle-a4",
    "cattle-a5",
];

fn write_config(dir: &Path, journal: &Path) {
    let db = sqlite_url(dir);
    let mut hosts = String::new();
    for name in HOSTS {
        hosts.push_str(&format!("[[hosts]]\nname = {name:?}\ngroup = \"cattle\"\n"));
    }
    hosts.push_str("[[hosts]]\nname = \"pet-01\"\ngroup = \"pets\"\n");
    fs::write(dir.join("hosts.toml"), hosts).unwrap();
    let config = format!(
        "[broker]\nurl = {db:?}\n[store]\nurl = {db:?}\n\
         [restarter]\nkind = \"command\"\njournal = {journal:?}\n\
         [restarter.command]\nargv = [\"true\", \"{{instance_name}}\"]\n\
         [inventory]\nfile = \"hosts.toml\"\n\
         [safety]\ndry_run = false\nallow = [\"cattle-*\", \"pet-*\"]\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n\
         [safety.rate]\ngroup_max = 0\n[safety.budget]\nmax_disrupted = 0\n\n\
         [[requesters]]\nname = \"chaos\"\npublic_key_file = \"chaos.pub\"\nallow = [\"cattle-*\"]\n\n\
         [[schedule]]\nname = \"drip\"\ngroup = \"cattle\"\nmean_time_between = \"1s\"\n\
         requester = \"chaos\"\nkey_file = \"chaos.key\"\nmax_lateness = \"2s\"\n",
        journal = journal.display().to_string(),
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
}

fn stop(instance: Mandrill) {
    instance.signal("TERM");
    let (status, lines) = instance.wait_exit();
    assert!(status.success(), "exit {status}: {lines:?}");
}

fn restarted_slots(entries: &[HistoryEntry]) -> usize {
    entries
        .iter()
        .filter(|e| e.status == Status::Restarted)
        .filter(|e| {
            e.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("scheduled by"))
        })
        .count()
}

/// The plan as every instance computes it: the schedule's settings and
/// its key file.
fn plan(dir: &Path) -> Plan {
    Plan::new(
        &ScheduleSettings {
            name: "drip".into(),
            group: "cattle".into(),
            mean_time_between: Duration::from_secs(1),
            requester: None,
            key_file: None,
            max_lateness: mandrill::DEFAULT_MAX_LATENESS,
        },
        &fs::read(dir.join("chaos.key")).unwrap(),
    )
}

/// `schedule preview --days 1 --json` of `dir`'s configuration: the slots.
fn preview_a_day(dir: &Path) -> Vec<serde_json::Value> {
    let args = [
        "schedule",
        "preview",
        "--config",
        "mandrill.toml",
        "--days",
        "1",
        "--json",
    ];
    let (status, out, stderr) = mandrill(dir, &args, &[]);
    assert!(status.success(), "{stderr}");
    serde_json::from_str(&out).unwrap()
}

/// `GET path` from the admin server at `addr`: the body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// Waits until `slots` scheduled restarts are recorded in the store.
fn wait_for_restarted_slots(url: &str, slots: usize) {
    let started = Instant::now();
    while restarted_slots(&history(url)) < slots {
        assert!(
            started.elapsed() < DEADLINE,
            "slots restarted: {:?}",
            history(url)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every request in the store is a slot of the plan (its id the slot's
/// UUIDv5), signed, for a host of the group, recorded once and restarted
/// once; the journal has one line per slot restarted (and at most one
/// more per slot still open at shutdown, issued without its outcome),
/// never two.
fn assert_each_slot_restarted_once(url: &str, journal: &Path, plan: &Plan, slots: usize) {
    let entries = history(url);
    let mut ids = BTreeSet::new();
    for entry in &entries {
        if entry.status == Status::Rejected {
            // Another instance drew another victim for the same slot (its
            // copy of the slot is other bytes, so the broker did not
            // collapse it): refused as another request under the slot's
            // id, recorded apart, never restarted.
            let why = entry.last_error.as_deref().unwrap_or_default();
            assert!(
                why.contains("is recorded for another request: instance"),
                "{entry:?}"
            );
            continue;
        }
        let reason = entry.reason.as_deref().unwrap_or_default();
        let slot = reason
            .strip_prefix("scheduled by [[schedule]] drip, slot ")
            .unwrap_or_else(|| panic!("only scheduled requests: {entry:?}"));
        let id = entry.message_id.unwrap();
        assert_eq!(plan.slot(slot.parse().unwrap()).message_id, id, "{entry:?}");
        assert!(ids.insert(id), "one history row per slot");
        assert_eq!(
            entry.requested_by.as_deref(),
            Some("chaos"),
            "signed: {entry:?}"
        );
        let victim = entry.instance_name.as_deref().unwrap();
        assert!(HOSTS.contains(&victim), "{victim}");
        if entry.status == Status::Restarted {
            assert_eq!(entry.attempts, 1, "restarted once: {entry:?}");
        }
    }
    let restarted = restarted_slots(&entries);
    assert!(restarted >= slots);
    let issued = fs::read_to_string(journal).unwrap();
    let open = entries.iter().filter(|e| !e.status.is_final()).count();
    assert!(
        (restarted..=restarted + open).contains(&issued.lines().count()),
        "{} restarts issued for {restarted} restarted slots ({open} open)",
        issued.lines().count()
    );
    assert!(issued.lines().all(|line| line.starts_with("cattle-a")));
}

#[test]
fn two_processes_on_one_sqlite_file_restart_each_scheduled_slot_exactly_once() {
    const SLOTS: usize = 12;
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    let journal = dir.join("restarts.journal");
    write_config(&dir, &journal);
    // The preview computes what the instances will: the same ids.
    let preview = preview_a_day(&dir);
    assert!(
        preview.len() > 10_000,
        "about 86400 slots a day: {}",
        preview.len()
    );
    assert!(
        preview
            .iter()
            .all(|slot| slot["victim"].as_str().is_some_and(|v| HOSTS.contains(&v))),
        "victims only from the group: {:?}",
        &preview[..3]
    );

    let args = [
        "--config",
        "mandrill.toml",
        "--set",
        "broker.sqlite.poll_interval=5ms",
    ];
    let (a, b) = (Mandrill::run(&dir, &args), Mandrill::run(&dir, &args));
    a.wait_for(
        "schedule running: restarts planned over the calendar's open time",
        1,
    );
    b.wait_for(
        "schedule running: restarts planned over the calendar's open time",
        1,
    );
    let url = sqlite_url(&dir);
    wait_for_restarted_slots(&url, SLOTS);
    // Both instances publish the slots (the same ids): the store's
    // idempotency, not a leader, makes each happen once.
    let published = |m: &Mandrill| m.messages("scheduled restart published").len();
    let (by_a, by_b) = (published(&a), published(&b));
    assert!(by_a > 0 && by_b > 0, "both published: {by_a}, {by_b}");
    let plan = plan(&dir);
    // The running service's JSON API and dashboard show the next planned
    // restarts, the plan's own slots, with their provisional victims.
    let admin = a.wait_for("admin listening", 1)[0]["fields"]["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    let api: serde_json::Value = serde_json::from_str(&http_get(&admin, "/api/status")).unwrap();
    let next = api["schedules"][0]["next"].as_array().unwrap();
    assert_eq!(api["schedules"][0]["name"], "drip", "{api}");
    assert_eq!(next.len(), 3, "{api}");
    for slot in next {
        // No admin.token: nobody proves who they are, so no slot's id is
        // shown (known ahead, it could be published first).
        assert!(slot.get("message_id").is_none(), "{slot}");
        assert!(HOSTS.contains(&slot["victim"].as_str().unwrap()), "{slot}");
    }
    let page = http_get(&admin, "/");
    assert!(
        page.contains("<table id=\"planned\">") && page.contains("<td>drip</td><td>cattle</td>"),
        "{page}"
    );
    stop(a);
    stop(b);
    assert_each_slot_restarted_once(&url, &journal, &plan, SLOTS);

    // `explain` of a scheduled request names its schedule and slot, checked
    // against the plan (the reason alone is free text).
    let entry = history(&url)
        .into_iter()
        .find(|e| e.status == Status::Restarted)
        .unwrap();
    let id = entry.message_id.unwrap().to_string();
    let slot = entry
        .reason
        .as_deref()
        .unwrap()
        .strip_prefix("scheduled by [[schedule]] drip, slot ")
        .unwrap()
        .to_owned();
    let (status, story, stderr) =
        mandrill(&dir, &["explain", "--config", "mandrill.toml", &id], &[]);
    assert!(status.success(), "{stderr}");
    assert!(
        story.contains(&format!(
            "  scheduled by [[schedule]] drip, slot {slot} (signed by its requester; its \
             message id is that slot's)"
        )),
        "{story}"
    );
    let (status, story, stderr) = mandrill(
        &dir,
        &["explain", "--config", "mandrill.toml", "--json", &id],
        &[],
    );
    assert!(status.success(), "{stderr}");
    let story: serde_json::Value = serde_json::from_str(&story).unwrap();
    assert_eq!(story["schedule"]["name"], "drip", "{story}");
    assert_eq!(story["schedule"]["slot"], slot.as_str());
    assert_eq!(story["schedule"]["verified"], true);

    // `status` shows the next planned restarts: the plan's own slots.
    let (status, out, stderr) = mandrill(
        &dir,
        &["status", "--config", "mandrill.toml", "--json"],
        &[],
    );
    assert!(status.success(), "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let next = status["schedules"][0]["next"].as_array().unwrap();
    assert_eq!(next.len(), 3, "{status}");
    for slot in next {
        let at = slot["at"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            slot["message_id"].as_str().unwrap(),
            plan.slot(at).message_id.to_string()
        );
        assert!(HOSTS.contains(&slot["victim"].as_str().unwrap()), "{slot}");
    }
}

/// `explain` calls a request scheduled only when the schedule's requester
/// signed it. A slot's id is no proof: it can be computed by whoever holds
/// the key, and was shown on `/api/status`; here another requester, allowed
/// the same hosts, signs a request under a slot's id and reason, and is
/// restarted, but never told as the schedule's.
#[test]
fn explain_calls_a_request_scheduled_only_when_the_schedule_s_requester_signed_it() {
    let (_guard, dir) = temp_dir();
    for name in ["chaos", "mallory"] {
        let (status, _, stderr) = mandrill(&dir, &["keygen", name], &[]);
        assert!(status.success(), "{stderr}");
    }
    let journal = dir.join("restarts.journal");
    write_config(&dir, &journal);
    let config = fs::read_to_string(dir.join("mandrill.toml")).unwrap();
    let mallory = "[[requesters]]\nname = \"mallory\"\npublic_key_file = \"mallory.pub\"\n\
                   allow = [\"cattle-*\"]\n\n";
    let config = config.replacen("[[schedule]]", &format!("{mallory}[[schedule]]"), 1);
    fs::write(dir.join("mandrill.toml"), &config).unwrap();
    // The service runs without the schedule (so that it goes idle), the
    // explanation reads the schedule from the whole file.
    let (without_schedule, _) = config.split_once("[[schedule]]").unwrap();
    fs::write(dir.join("run.toml"), without_schedule).unwrap();

    let slot = plan(&dir).slot("2031-01-01T09:00:00Z".parse().unwrap());
    let forged = serde_json::json!({
        "message_id": slot.message_id.to_string(),
        "instance_name": "cattle-a1",
        "requested_by": "schedule:drip",
        "reason": slot.reason(),
    });
    fs::write(dir.join("forged.jsonl"), format!("{forged}\n")).unwrap();
    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "publish",
            "--config",
            "run.toml",
            "--as",
            "mallory",
            "--key-file",
            "mallory.key",
            "--file",
            "forged.jsonl",
        ],
        &[],
    );
    assert!(status.success(), "{stderr}");
    let (status, lines) =
        Mandrill::run(&dir, &["--config", "run.toml", "--until-idle"]).wait_exit();
    assert!(status.success(), "{lines:?}");
    let url = sqlite_url(&dir);
    let entry = history(&url)
        .into_iter()
        .find(|e| e.message_id == Some(slot.message_id))
        .unwrap();
    assert_eq!(entry.status, Status::Restarted, "{entry:?}");

    let id = slot.message_id.to_string();
    let (status, story, stderr) =
        mandrill(&dir, &["explain", "--config", "mandrill.toml", &id], &[]);
    assert!(status.success(), "{stderr}");
    assert!(!story.contains("  scheduled by [[schedule]]"), "{story}");
    assert!(
        story.contains("NOT a scheduled restart")
            && story.contains("signed by mallory, not by the schedule's requester chaos"),
        "{story}"
    );
    let (status, story, stderr) = mandrill(
        &dir,
        &["explain", "--config", "mandrill.toml", "--json", &id],
        &[],
    );
    assert!(status.success(), "{stderr}");
    let story: serde_json::Value = serde_json::from_str(&story).unwrap();
    assert_eq!(story["schedule"]["verified"], false, "{story}");
}

/// A slot's request signed by the schedule's requester and denied before
/// any claim (its victim deny-listed) has no journal row: its own row's
/// verified signer is what `explain` checks, and it is told as the
/// schedule's, not as a forgery.
#[test]
fn explain_calls_a_slot_denied_before_its_claim_scheduled_by_its_signer() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    let journal = dir.join("restarts.journal");
    write_config(&dir, &journal);
    let config = fs::read_to_string(dir.join("mandrill.toml")).unwrap();
    let (without_schedule, _) = config.split_once("[[schedule]]").unwrap();
    let denying = without_schedule.replacen("[safety]\n", "[safety]\ndeny = [\"cattle-a1\"]\n", 1);
    fs::write(dir.join("run.toml"), denying).unwrap();
    let slot = plan(&dir).slot("2031-01-01T09:00:00Z".parse().unwrap());
    let request = serde_json::json!({
        "message_id": slot.message_id.to_string(),
        "instance_name": "cattle-a1",
        "reason": slot.reason(),
    });
    fs::write(dir.join("slot.jsonl"), format!("{request}\n")).unwrap();
    let publish = [
        "publish",
        "--config",
        "run.toml",
        "--as",
        "chaos",
        "--key-file",
        "chaos.key",
        "--file",
        "slot.jsonl",
    ];
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "{stderr}");
    let (status, lines) =
        Mandrill::run(&dir, &["--config", "run.toml", "--until-idle"]).wait_exit();
    assert!(status.success(), "{lines:?}");
    let entry = history(&sqlite_url(&dir))
        .into_iter()
        .find(|e| e.message_id == Some(slot.message_id))
        .unwrap();
    assert_eq!(entry.status, Status::Denied, "{entry:?}");

    let id = slot.message_id.to_string();
    let (status, story, stderr) =
        mandrill(&dir, &["explain", "--config", "mandrill.toml", &id], &[]);
    assert!(status.success(), "{stderr}");
    assert!(!story.contains("NOT a scheduled restart"), "{story}");
    assert!(
        story.contains("(signed by its requester; its message id is that slot's)"),
        "{story}"
    );
}

/// Every mistake in the configuration stops start-up with exit code 2
/// naming the key, those found only once the inventory is read included
/// (`deploy/mandrill.service` does not restart on 2: a broken
/// configuration must not be retried every few seconds); `schedule
/// preview` refuses what `run` refuses.
#[test]
fn every_start_up_refusal_exits_2_naming_the_key() {
    let (_guard, dir) = temp_dir();
    for name in ["chaos", "other"] {
        let (status, _, stderr) = mandrill(&dir, &["keygen", name], &[]);
        assert!(status.success(), "{stderr}");
    }
    let journal = dir.join("restarts.journal");
    write_config(&dir, &journal);
    let good = fs::read_to_string(dir.join("mandrill.toml")).unwrap();
    let edits = [
        // A key that is not the requester's: every slot would be rejected.
        (
            good.replace("key_file = \"chaos.key\"", "key_file = \"other.key\""),
            "schedule[0].key_file",
            true,
        ),
        // (the configuration, the key named, whether `schedule preview` reads it)
        (
            good.replace("group = \"cattle\"\nmean", "group = \"catle\"\nmean"),
            "schedule[0].group",
            true,
        ),
        (
            good.replace("requester = \"chaos\"", "requester = \"nobody\""),
            "schedule[0].requester",
            true,
        ),
        (
            good.replace("file = \"hosts.toml\"", "file = \"missing.toml\""),
            "inventory.file",
            true,
        ),
        (
            good.replace("file = \"hosts.toml\"", "command = [\"false\"]"),
            "inventory.command",
            true,
        ),
        (
            good.replace(
                "[safety]\n",
                "[safety]\npause_file = \"no-such-dir/PAUSE\"\n",
            ),
            "safety.pause_file",
            false,
        ),
        (
            good.replace("\"chaos.pub\"", "\"missing.pub\""),
            "requesters[0].public_key_file",
            true,
        ),
        (
            good.replace(
                &format!("journal = {journal:?}"),
                "journal = \"no-such-dir/restarts.journal\"",
            ),
            "restarter.journal",
            false,
        ),
        (
            good.replace("[safety]\n", "[safety]\ncolour = \"blue\"\n"),
            "safety.colour",
            true,
        ),
    ];
    for (edit, key, previewed) in edits {
        fs::write(dir.join("mandrill.toml"), edit).unwrap();
        // Each stops before anything runs (nothing to wait for).
        let (status, _, said) = mandrill(&dir, &["run", "--config", "mandrill.toml"], &[]);
        assert_eq!(status.code(), Some(2), "{key}: {said}");
        assert!(said.contains(key), "{key}: {said}");
        if previewed {
            let (status, _, said) = mandrill(
                &dir,
                &["schedule", "preview", "--config", "mandrill.toml"],
                &[],
            );
            assert_eq!(status.code(), Some(2), "preview, {key}: {said}");
            assert!(said.contains(key), "preview, {key}: {said}");
        }
    }
    assert_eq!(
        fs::read_to_string(&journal).unwrap_or_default(),
        "",
        "nothing restarted"
    );
}

/// Instances whose copies of the schedule's key differ only in how the
/// file is written (CRLF line ends, no final newline) draw the same slots
/// under the same ids: each slot is published once, not once per copy.
#[test]
fn copies_of_the_key_written_otherwise_plan_the_same_slots() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    write_config(&dir, &dir.join("restarts.journal"));
    let preview = || {
        preview_a_day(&dir)
            .iter()
            .map(|slot| slot["message_id"].as_str().unwrap().to_owned())
            .collect::<std::collections::HashSet<String>>()
    };
    let original = preview();
    assert!(original.len() > 10_000, "{} slots", original.len());
    let key = fs::read_to_string(dir.join("chaos.key")).unwrap();
    for copy in [key.replace('\n', "\r\n"), key.trim_end().to_owned()] {
        assert_ne!(copy, key);
        fs::write(dir.join("chaos.key"), copy).unwrap();
        // The same slots, but those the seconds between the two previews
        // moved across the day's edges.
        let again = preview();
        let shared = original.intersection(&again).count();
        assert!(
            shared + 100 > original.len(),
            "{shared} of {} slots the same",
            original.len()
        );
    }
}

/// Three instances on one NATS JetStream stream and one PostgreSQL
/// database run the same schedule: each slot restarted exactly once.
#[test]
fn three_processes_on_nats_and_postgres_restart_each_scheduled_slot_exactly_once() {
    const SLOTS: usize = 12;
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    let (status, _, stderr) = mandrill(&dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    let journal = dir.join("restarts.journal");
    write_config(&dir, &journal);
    let mut args = vec![
        "--config".to_owned(),
        "mandrill.toml".into(),
        "--broker".into(),
        names.url.clone(),
        "--db".into(),
        db.url.clone(),
    ];
    args.extend(names.flags());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let instances: Vec<Mandrill> = (0..3).map(|_| Mandrill::run(&dir, &args)).collect();
    for instance in &instances {
        instance.wait_for(
            "schedule running: restarts planned over the calendar's open time",
            1,
        );
    }
    wait_for_restarted_slots(&db.url, SLOTS);
    let publishing = instances
        .iter()
        .filter(|i| !i.messages("scheduled restart published").is_empty())
        .count();
    assert!(publishing >= 2, "the instances publish the slots alike");
    for instance in instances {
        stop(instance);
    }
    assert_each_slot_restarted_once(&db.url, &journal, &plan(&dir), SLOTS);
}
