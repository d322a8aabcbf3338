//! The inventory (`[inventory]`) through the real binary, with real
//! sources: the real `ansible-inventory` run as `inventory.command` on an
//! INI file, an HTTP server (whose refresh fails and recovers, and whose
//! copy grows too old), and a Prometheus `file_sd` file. Restarts are
//! counted from the restart journal (`restarter.journal`).

mod support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mandrill::Status;
use serde_json::Value;
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

/// Hosts in the restart journal, in order.
fn journal(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split(' ').next().unwrap_or_default().to_owned())
        .collect()
}

fn wait(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fast simulated backend that never fails, writing the journal.
fn config_file(dir: &Path, inventory: &str) -> String {
    let path = dir.join("mandrill.toml");
    std::fs::write(
        &path,
        format!(
            "[restarter]\nfailure_rate = 0.0\nmax_latency = \"5ms\"\njournal = {:?}\n\n\
             [debug]\nstatus_interval = \"0s\"\n\n[inventory]\n{inventory}",
            dir.join("restarts.journal").display().to_string()
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn publish(dir: &Path, db: &str, lines: &[String]) {
    let file = dir.join(format!("requests-{}.jsonl", uuid::Uuid::new_v4()));
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (status, _, stderr) = mandrill(
        dir,
        &[
            "publish",
            "--broker",
            db,
            "--file",
            &file.display().to_string(),
        ],
        &[],
    );
    assert!(status.success(), "publish failed: {stderr}");
}

fn request(instance: &str, group: Option<&str>) -> String {
    let group = group.map_or_else(String::new, |g| format!(r#","group":"{g}""#));
    format!(
        r#"{{"message_id":"{}","instance_name":"{instance}"{group}}}"#,
        uuid::Uuid::new_v4()
    )
}

/// A configuration whose inventory is the real `ansible-inventory` over
/// `hosts.ini` in `dir`, written with `ini`; `rest` follows the command.
fn ansible_config(dir: &Path, ini: &str, rest: &str) -> String {
    let path = dir.join("hosts.ini");
    std::fs::write(&path, ini).unwrap();
    config_file(
        dir,
        &format!(
            "command = [\"ansible-inventory\", \"-i\", {:?}, \"--list\"]\n{rest}",
            path.display().to_string()
        ),
    )
}

/// Runs the service over `db` (queue and store in one file) until the queue
/// is idle; it must exit cleanly.
fn run_until_idle(dir: &Path, config: &str, db: &str) {
    let args = [
        "--config",
        config,
        "--db",
        db,
        "--broker",
        db,
        "--until-idle",
    ];
    let (status, lines) = Mandrill::run(dir, &args).wait_exit();
    assert!(status.success(), "exit {status}: {lines:?}");
}

fn status_of(db: &str, instance: &str) -> Option<(Status, Option<String>)> {
    history(db)
        .into_iter()
        .find(|e| e.instance_name.as_deref() == Some(instance))
        .map(|e| (e.status, e.last_error))
}

#[test]
fn the_real_ansible_inventory_decides_groups_and_unknown_hosts_are_denied() {
    assert!(
        std::process::Command::new("ansible-inventory")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "ansible-inventory is needed (pip install ansible-core; .ci/run installs it)"
    );
    let (_guard, dir) = temp_dir();
    let config = ansible_config(
        &dir,
        "[web]\n\
         web-1 ansible_host=127.0.0.1 ansible_port=2222 ansible_user=ops zone=eu-1\n\
         web-2 zone=eu-2\n\n\
         [db]\ndb-1\n\n\
         [stateful:children]\ndb\n",
        "",
    );

    let (status, stdout, stderr) =
        mandrill(&dir, &["inventory", "--config", &config, "--json"], &[]);
    assert!(status.success(), "inventory failed: {stderr}");
    let listed: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(listed["format"], "ansible");
    assert_eq!(
        listed["groups"],
        serde_json::json!({"db": 1, "web": 2}),
        "{listed}"
    );
    assert_eq!(listed["zones"], serde_json::json!({"eu-1": 1, "eu-2": 1}));
    let hosts = listed["hosts"].as_array().unwrap();
    let web_1 = hosts.iter().find(|h| h["name"] == "web-1").unwrap();
    assert_eq!(web_1["group"], "web");
    assert_eq!(web_1["address"], "127.0.0.1");
    assert_eq!(web_1["port"], 2222);
    assert_eq!(web_1["user"], "ops");
    assert_eq!(web_1["zone"], "eu-1");
    let db_1 = hosts.iter().find(|h| h["name"] == "db-1").unwrap();
    assert_eq!(db_1["group"], "db", "db is more specific than stateful");
    assert!(
        listed["source"]
            .as_str()
            .unwrap()
            .contains("ansible-inventory")
    );

    let db = sqlite_url(&dir);
    publish(
        &dir,
        &db,
        &[
            request("web-1", None),
            request("db-1", Some("db")),
            request("cattle-9", None),
            request("web-2", Some("db")),
        ],
    );
    run_until_idle(&dir, &config, &db);
    let mut restarted = journal(&dir.join("restarts.journal"));
    restarted.sort();
    assert_eq!(restarted.len(), 2, "{restarted:?}");
    assert!(restarted[0].starts_with("db-1") && restarted[1].starts_with("web-1"));
    let (status, reason) = status_of(&db, "cattle-9").unwrap();
    assert_eq!(status, Status::Denied);
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("not in the inventory"), "{reason}");
    let (status, reason) = status_of(&db, "web-2").unwrap();
    assert_eq!(status, Status::Denied);
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("names group db") && reason.contains("in group web"),
        "{reason}"
    );
}

/// `POST path` with a JSON `body` and the admin token: status and body.
fn post_json(addr: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// The guards that deferred `instance`'s request, as its story records them.
fn deferred_by(db: &str, instance: &str) -> Vec<String> {
    let Some(id) = history(db)
        .into_iter()
        .find(|e| e.instance_name.as_deref() == Some(instance))
        .and_then(|e| e.message_id)
    else {
        return Vec::new();
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let records = mandrill::Records::open(db).await.unwrap();
        let story = records.story(id).await.unwrap();
        records.close().await;
        story
            .map(|story| story.decisions)
            .unwrap_or_default()
            .into_iter()
            .filter(|decision| decision.verdict == "deferred")
            .map(|decision| decision.guard)
            .collect()
    })
}

/// A group pause names a group the inventory counts hosts in: a name it
/// does not know (`Web` for `web`) is refused, naming the known groups; an
/// ansible parent group, whose hosts take their deepest group, pauses
/// every group beneath it, and says so. With the real `ansible-inventory`.
#[test]
fn a_group_pause_must_name_a_known_group_and_an_ansible_parent_pauses_the_groups_beneath() {
    let (_guard, dir) = temp_dir();
    let config = ansible_config(
        &dir,
        "[web_eu]\nweb-1\n\n[web_us]\nweb-2\n\n[web:children]\nweb_eu\nweb_us\n\n[db]\ndb-1\n",
        "",
    );
    let db = sqlite_url(&dir);
    let turn = |command: &str, group: &str| {
        let args = [command, "--config", &config, "--db", &db, "--group", group];
        mandrill(&dir, &args, &[])
    };

    let (status, stdout, stderr) = turn("pause", "Web");
    assert_eq!(status.code(), Some(2), "{stdout}");
    assert!(
        stderr.contains("\"Web\"") && stderr.contains("db, web, web_eu, web_us"),
        "{stderr}"
    );
    let (status, stdout, stderr) = turn("pause", "web");
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains("web is an ansible parent group")
            && stdout.contains("group web_eu paused")
            && stdout.contains("group web_us paused"),
        "{stdout}"
    );

    publish(
        &dir,
        &db,
        &[
            request("web-1", None),
            request("web-2", None),
            request("db-1", None),
        ],
    );
    let token = "group-pause-token-7f3";
    let service = Mandrill::run_with_env(
        &dir,
        &["--config", &config, "--db", &db, "--broker", &db],
        &[("MANDRILL_ADMIN__TOKEN", token)],
    );
    let journal_path = dir.join("restarts.journal");
    let restarted = |host: &str| {
        journal(&journal_path)
            .iter()
            .any(|line| line.starts_with(&format!("{host}.")) || line == host)
    };
    wait("db-1 restarted", || restarted("db-1"));
    for host in ["web-1", "web-2"] {
        wait(&format!("{host} deferred by the group pause"), || {
            deferred_by(&db, host).contains(&"group pause".to_owned())
        });
    }
    assert!(
        !restarted("web-1") && !restarted("web-2"),
        "{:?}",
        journal(&journal_path)
    );

    let (status, stdout, stderr) = turn("resume", "web");
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("group web_us resumed"), "{stdout}");
    wait("web-1 and web-2 restarted after the resume", || {
        restarted("web-1") && restarted("web-2")
    });

    // The admin API decides the same way.
    let addr = service.wait_for("admin listening", 1)[0]["fields"]["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = post_json(&addr, "/api/pause", token, r#"{"group":"Web"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("db, web, web_eu, web_us"), "{body}");
    let (status, body) = post_json(&addr, "/api/pause", token, r#"{"group":"web"}"#);
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["groups"], serde_json::json!(["web_eu", "web_us"]));
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit {status}: {lines:?}");
}

/// `ansible-inventory` on an INI file that is not there exits 0 with a
/// `[WARNING]` on stderr and no hosts: the first load is refused (exit code
/// 2, naming the source's key and quoting the warning) rather than a
/// service started that denies every request as "not in the inventory".
#[test]
fn a_real_ansible_inventory_of_a_missing_file_is_refused_at_start() {
    let (_guard, dir) = temp_dir();
    let missing = dir.join("missing.ini");
    let config = config_file(
        &dir,
        &format!(
            "command = [\"ansible-inventory\", \"-i\", {:?}, \"--list\"]\n",
            missing.display().to_string()
        ),
    );
    for args in [
        &["run", "--config", &config][..],
        &["inventory", "--config", &config][..],
    ] {
        let (status, _, stderr) = mandrill(&dir, args, &[]);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("inventory.command"), "{args:?}: {stderr}");
        assert!(stderr.contains("lists no hosts"), "{args:?}: {stderr}");
        assert!(stderr.contains("[WARNING]"), "{args:?}: {stderr}");
    }
}

/// Entries of a real `ansible-inventory` that share an address are one
/// machine: `mandrill inventory` shows them as aliases, a group's size
/// counts machines (so aliases never pad a percentage budget), and
/// `safety.deny` matches the address and the aliases: `deny = ["db-*"]`
/// stops `cattle-a9`, which is `db-primary.internal`.
#[test]
fn entries_sharing_an_address_are_one_machine_that_deny_stops_by_any_name() {
    let (_guard, dir) = temp_dir();
    let config = ansible_config(
        &dir,
        "[cattle]\n\
         cattle-a1 ansible_host=10.0.0.1\n\
         cattle-a2 ansible_host=10.0.0.2\n\
         cattle-a3 ansible_host=10.0.0.2\n\
         cattle-a9 ansible_host=db-primary.internal\n\
         primary ansible_host=db-primary.internal\n",
        "\n\
             [safety]\ndeny = [\"db-*\"]\n",
    );

    let (status, stdout, stderr) =
        mandrill(&dir, &["inventory", "--config", &config, "--json"], &[]);
    assert!(status.success(), "inventory failed: {stderr}");
    let listed: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        listed["groups"],
        serde_json::json!({"cattle": 3}),
        "five entries of cattle, three machines: {listed}"
    );
    let aliases = |name: &str| {
        let hosts = listed["hosts"].as_array().unwrap();
        hosts.iter().find(|h| h["name"] == name).unwrap()["aliases"].clone()
    };
    assert_eq!(aliases("cattle-a2"), serde_json::json!(["cattle-a3"]));
    assert_eq!(aliases("cattle-a9"), serde_json::json!(["primary"]));
    assert_eq!(aliases("primary"), serde_json::json!(["cattle-a9"]));
    assert_eq!(aliases("cattle-a1"), Value::Null);
    let (status, text, stderr) = mandrill(&dir, &["inventory", "--config", &config], &[]);
    assert!(status.success(), "inventory failed: {stderr}");
    assert!(
        text.contains("cattle-a9  group cattle  address db-primary.internal  aliases primary"),
        "{text}"
    );

    let db = sqlite_url(&dir);
    publish(
        &dir,
        &db,
        &[request("cattle-a9", None), request("cattle-a1", None)],
    );
    run_until_idle(&dir, &config, &db);
    let restarted = journal(&dir.join("restarts.journal"));
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert!(restarted[0].starts_with("cattle-a1"), "{restarted:?}");
    let (status, reason) = status_of(&db, "cattle-a9").unwrap();
    assert_eq!(status, Status::Denied);
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("safety.deny") && reason.contains("db-primary.internal"),
        "{reason}"
    );
}

/// A machine whose names a real `ansible-inventory` puts in two groups is
/// counted in neither: a request naming it in `cattle` would otherwise pass
/// `prod`'s rate limit, budget, pause and requesters' groups. Both names
/// are denied, saying why; `mandrill inventory` shows it.
#[test]
fn a_machine_named_in_two_groups_is_counted_in_neither() {
    let (_guard, dir) = temp_dir();
    let config = ansible_config(
        &dir,
        "[cattle]\n\
         cattle-a1 ansible_host=10.0.0.1\n\
         cattle-a9 ansible_host=db-primary.internal\n\n\
         [prod]\n\
         primary ansible_host=DB-Primary.internal\n\
         replica ansible_host=10.0.0.7\n",
        "",
    );
    let (status, text, stderr) = mandrill(&dir, &["inventory", "--config", &config], &[]);
    assert!(status.success(), "inventory failed: {stderr}");
    assert!(
        text.contains("cattle: 1 host") && text.contains("prod: 1 host"),
        "{text}"
    );
    assert!(
        text.contains(
            "cattle-a9  no group (it is the machine at db-primary.internal, also listed as \
             primary (group prod): a machine whose names are in two groups is counted in neither"
        ),
        "{text}"
    );

    let db = sqlite_url(&dir);
    publish(
        &dir,
        &db,
        &[
            request("cattle-a9", None),
            request("primary", None),
            request("cattle-a1", None),
        ],
    );
    run_until_idle(&dir, &config, &db);
    let restarted = journal(&dir.join("restarts.journal"));
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert!(restarted[0].starts_with("cattle-a1"), "{restarted:?}");
    for name in ["cattle-a9", "primary"] {
        let (status, reason) = status_of(&db, name).unwrap();
        assert_eq!(status, Status::Denied, "{name}");
        let reason = reason.unwrap_or_default();
        assert!(
            reason.contains("has no group") && reason.contains("two groups"),
            "{name}: {reason}"
        );
    }
}

/// Two names of one machine in a real `ansible-inventory` are one host to
/// the counting guards: restarted as `cattle-a2`, the machine is cooled
/// (`safety.rate.host_cooldown`) under its alias `cattle-a3` too.
#[test]
fn an_alias_is_cooled_by_its_machines_restart_under_another_name() {
    let (_guard, dir) = temp_dir();
    let config = ansible_config(
        &dir,
        "[cattle]\n\
         cattle-a1 ansible_host=10.0.0.1\n\
         cattle-a2 ansible_host=10.0.0.2\n\
         cattle-a3 ansible_host=10.0.0.2\n",
        "\n\
             [safety.rate]\nhost_cooldown = \"1h\"\n",
    );
    let db = sqlite_url(&dir);
    let service = Mandrill::run(
        &dir,
        &[
            "--config",
            &config,
            "--db",
            &db,
            "--broker",
            &db,
            "--set",
            "broker.sqlite.poll_interval=5ms",
        ],
    );
    publish(&dir, &db, &[request("cattle-a2", None)]);
    wait("cattle-a2 is restarted", || {
        status_of(&db, "cattle-a2").is_some_and(|(status, _)| status == Status::Restarted)
    });
    publish(&dir, &db, &[request("cattle-a3", None)]);
    let deferred = service.wait_for("deferred", 1);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit {status}: {lines:?}");
    assert_eq!(
        deferred[0]["fields"]["guard"], "host cooldown",
        "{deferred:?}"
    );
    let restarted = journal(&dir.join("restarts.journal"));
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert!(restarted[0].starts_with("cattle-a2"), "{restarted:?}");
}

/// An HTTP inventory server on a runtime of its own: `GET /hosts` answers
/// `body`, or 500 while `failing` is set.
fn inventory_server(body: &'static str, failing: Arc<AtomicBool>) -> String {
    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::get;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = Router::new().route(
                "/hosts",
                get(move || {
                    let failing = failing.load(Ordering::SeqCst);
                    async move {
                        if failing {
                            (StatusCode::INTERNAL_SERVER_ERROR, "down")
                        } else {
                            (StatusCode::OK, body)
                        }
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap().to_string()
}

/// `GET /metrics` from the admin server at `addr`.
fn metrics(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn an_http_inventory_keeps_its_last_good_copy_and_defers_once_it_is_too_old() {
    const HOSTS: &str = r#"{"hosts": [
        {"name": "web-1", "group": "web"},
        {"name": "web-2", "group": "web"},
        {"name": "web-3", "group": "web"}
    ]}"#;
    let failing = Arc::new(AtomicBool::new(false));
    let server = inventory_server(HOSTS, failing.clone());
    let (_guard, dir) = temp_dir();
    let config = config_file(
        &dir,
        &format!(
            "url = \"http://ops:s3cret-pw@{server}/hosts\"\nrefresh = \"1s\"\nmax_age = \"6s\"\n"
        ),
    );
    let journal_path = dir.join("restarts.journal");
    let db = sqlite_url(&dir);
    publish(
        &dir,
        &db,
        &[request("web-1", None), request("cattle-9", None)],
    );
    let service = Mandrill::run(&dir, &["--config", &config, "--db", &db, "--broker", &db]);
    let admin = service.wait_for("admin listening", 1).remove(0)["fields"]["addr"]
        .as_str()
        .unwrap()
        .to_owned();
    wait("web-1 is restarted", || journal(&journal_path).len() == 1);
    // The log line comes before the decision is written: wait for the record.
    service.wait_for("denied", 1);
    wait("cattle-9 is recorded denied", || {
        status_of(&db, "cattle-9").is_some_and(|(status, _)| status == Status::Denied)
    });
    let (status, reason) = status_of(&db, "cattle-9").unwrap();
    assert_eq!(status, Status::Denied);
    assert!(reason.unwrap_or_default().contains("not in the inventory"));

    // The source fails: the last good copy still decides.
    failing.store(true, Ordering::SeqCst);
    service.wait_for("inventory refresh failed; keeping the last good copy", 1);
    publish(&dir, &db, &[request("web-2", None)]);
    wait("web-2 is restarted", || journal(&journal_path).len() == 2);
    let scraped = metrics(&admin);
    assert!(metric(&scraped, "mandrill_inventory_refresh_failures_total") >= 1.0);
    assert_eq!(metric(&scraped, "mandrill_inventory_hosts"), 3.0);
    assert!(metric(&scraped, "mandrill_inventory_age_seconds") > 0.5);

    // Past max_age: every request is deferred, naming the inventory.
    let web_3 = request("web-3", None);
    wait("the copy is too old", || {
        metric(&metrics(&admin), "mandrill_inventory_age_seconds") > 6.0
    });
    publish(&dir, &db, &[web_3]);
    wait("web-3 is deferred by the inventory", || {
        service.messages("deferred").iter().any(|line| {
            line["fields"]["guard"] == "inventory"
                && line["fields"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("inventory.max_age"))
        })
    });
    assert_eq!(
        journal(&journal_path).len(),
        2,
        "nothing restarted meanwhile"
    );

    // The source answers again: the deferred request goes through.
    failing.store(false, Ordering::SeqCst);
    wait("web-3 is restarted", || journal(&journal_path).len() == 3);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let log = format!("{lines:?}");
    assert!(
        log.contains("http://ops:") && log.contains("inventory refresh failed"),
        "the failed refresh names its source, redacted"
    );
    assert!(
        !log.contains("s3cret-pw"),
        "the URL's password is never printed"
    );
}

#[test]
fn a_file_sd_inventory_takes_groups_from_a_label_and_policy_check_denies_unknown_hosts() {
    let (_guard, dir) = temp_dir();
    let targets = dir.join("targets.json");
    std::fs::write(
        &targets,
        r#"[
            {"targets": ["web-1:9100", "web-2:9100"], "labels": {"team": "web", "zone": "eu-1"}},
            {"targets": ["db-1:9100"], "labels": {"team": "db"}},
            {"targets": ["10.0.0.9:9100"], "labels": {"team": "db"}}
        ]"#,
    )
    .unwrap();
    let path = targets.display().to_string();
    let set = [
        "--set".to_owned(),
        format!("inventory.file={path}"),
        "--set".into(),
        "inventory.group_label=team".into(),
    ];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .map(|s| (*s).to_owned())
            .chain(set.iter().cloned())
            .collect()
    };
    let args = with(&["inventory", "--json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout, stderr) = mandrill(&dir, &args, &[]);
    assert!(status.success(), "inventory failed: {stderr}");
    let listed: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(listed["format"], "file-sd");
    assert_eq!(listed["groups"], serde_json::json!({"db": 1, "web": 2}));
    assert_eq!(listed["zones"], serde_json::json!({"eu-1": 2}));
    assert_eq!(listed["skipped"], serde_json::json!(["10.0.0.9:9100"]));

    let args = with(&["inventory"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout, _) = mandrill(&dir, &args, &[]);
    assert!(status.success());
    assert!(
        stdout.contains("web: 2 hosts") && stdout.contains("file "),
        "{stdout}"
    );

    let args = with(&["policy", "check", "--json", "web-1", "cattle-9"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout, stderr) = mandrill(&dir, &args, &[]);
    assert!(status.success(), "policy check failed: {stderr}");
    let verdicts: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(verdicts[0]["group"], "web");
    assert_eq!(verdicts[0]["inventory"]["verdict"], "allow");
    assert_eq!(verdicts[0]["inventory"]["zone"], "eu-1");
    assert_eq!(verdicts[1]["inventory"]["verdict"], "deny");
    assert_eq!(verdicts[1]["eligibility"]["verdict"], "deny");
    assert!(
        verdicts[1]["inventory"]["reason"]
            .as_str()
            .unwrap()
            .contains("not in the inventory"),
        "{stdout}"
    );

    // A source that cannot be read stops start-up, naming it.
    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "run",
            "--broker",
            "memory",
            "--db",
            "memory",
            "--set",
            "inventory.file=/nonexistent/hosts.toml",
        ],
        &[],
    );
    assert!(!status.success());
    assert!(stderr.contains("/nonexistent/hosts.toml"), "{stderr}");
}

/// SIGHUP applies a changed `[inventory]` at once: the refresh task reads
/// the new source, and a host only it lists is restarted.
#[test]
fn a_reload_reads_a_changed_inventory_source_at_once() {
    let (_guard, dir) = temp_dir();
    let first = dir.join("first.toml");
    let second = dir.join("second.toml");
    std::fs::write(&first, "[[hosts]]\nname = \"web-1\"\ngroup = \"web\"\n").unwrap();
    std::fs::write(&second, "[[hosts]]\nname = \"web-2\"\ngroup = \"web\"\n").unwrap();
    let inventory = |file: &Path| format!("file = {:?}\n", file.display().to_string());
    let config = config_file(&dir, &inventory(&first));
    let db = sqlite_url(&dir);
    let service = Mandrill::run(&dir, &["--config", &config, "--db", &db, "--broker", &db]);
    service.wait_for("mandrill started", 1);
    config_file(&dir, &inventory(&second));
    service.signal("HUP");
    service.wait_for("[inventory] changed by a reload; reading it again now", 1);
    service.wait_for("inventory loaded", 2);
    publish(&dir, &db, &[request("web-2", None), request("web-1", None)]);
    wait("web-2 is restarted", || {
        journal(&dir.join("restarts.journal")).len() == 1
    });
    // The log line comes before the decision is written: wait for the record.
    service.wait_for("denied", 1);
    wait("web-1 is recorded denied", || {
        status_of(&db, "web-1").is_some_and(|(status, _)| status == Status::Denied)
    });
    let (status, reason) = status_of(&db, "web-1").unwrap();
    assert_eq!(status, Status::Denied, "no longer in the inventory");
    assert!(reason.unwrap_or_default().contains("second.toml"));
    service.signal("TERM");
    let (status, _) = service.wait_exit();
    assert!(status.success());
}
