//! The dashboard as a game-day console, on the real binary: an inventory
//! of three groups, a recovery objective, a schedule, a calendar, a
//! campaign in flight and a group paused by `mandrill pause --group`; read
//! over HTTP, then driven in headless Chromium through the DevTools
//! protocol (on a pipe: no port, no client library), where the operator
//! pastes the token, pauses a group from the page and resumes it, and
//! `mandrill status` says so each time.

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use serde_json::{Value, json};

use super::{admin_addr, get, wait_until};
use crate::support::{DEADLINE, Mandrill, mandrill, sqlite_url, temp_dir};

const TOKEN: &str = "console-token-8d1f2a";

/// Keys, an inventory (web, db, cattle), and a configuration with a
/// recovery objective, a schedule and an all-week calendar.
fn setup(dir: &Path) {
    let (status, _, stderr) = mandrill(dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    let mut inventory = String::new();
    for (group, count) in [("web", 4), ("db", 2), ("cattle", 6)] {
        for n in 1..=count {
            inventory.push_str(&format!(
                "[[hosts]]\nname = \"{group}-{n:02}\"\ngroup = \"{group}\"\n"
            ));
        }
    }
    fs::write(dir.join("hosts.toml"), inventory).unwrap();
    let db = sqlite_url(dir);
    let config = format!(
        "[broker]\nurl = {db:?}\n[broker.sqlite]\npoll_interval = \"5ms\"\n\
         [store]\nurl = {db:?}\n\
         [restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"true\"]\n\
         [verify]\nprobe = \"command\"\nargv = [\"true\"]\ninitial_delay = \"0s\"\n\
         interval = \"50ms\"\ntimeout = \"1s\"\n\
         [inventory]\nfile = \"hosts.toml\"\n\
         [safety]\ndry_run = false\nallow = [\"web-*\", \"db-*\", \"cattle-*\"]\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n\
         [safety.rate]\ngroup_max = 0\n[safety.budget]\nmax_disrupted = 1\nretry = \"100ms\"\n\n\
         [[requesters]]\nname = \"chaos\"\npublic_key_file = \"chaos.pub\"\n\
         allow = [\"web-*\", \"cattle-*\"]\n\n\
         [[recovery_objective]]\ngroup = \"cattle\"\nmax = \"2m\"\n\n\
         [[recovery_objective]]\ngroup = \"web\"\nmax = \"30s\"\npause_on_breach = true\n\n\
         [[schedule]]\nname = \"weekly-web\"\ngroup = \"web\"\nmean_time_between = \"3d\"\n\
         requester = \"chaos\"\nkey_file = \"chaos.key\"\n"
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
}

fn run(dir: &Path, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--config", "mandrill.toml"]);
    let (status, out, stderr) = mandrill(dir, &all, &[]);
    assert!(status.success(), "{args:?}: {out}{stderr}");
    out
}

#[test]
fn the_console_shows_a_game_day_and_pauses_a_group_that_status_then_reports() {
    let (_guard, dir) = temp_dir();
    setup(&dir);
    let service = Mandrill::run_with_env(
        &dir,
        &["--config", "mandrill.toml"],
        &[("MANDRILL_ADMIN__TOKEN", TOKEN)],
    );
    let addr = admin_addr(&service);
    run(
        &dir,
        &[
            "pause",
            "--group",
            "db",
            "--by",
            "ana",
            "--reason",
            "failover drill",
        ],
    );
    let out = run(
        &dir,
        &[
            "campaign",
            "start",
            "--group",
            "cattle",
            "--count",
            "3",
            "--spread",
            "1h",
            "--as",
            "chaos",
            "--key-file",
            "chaos.key",
        ],
    );
    let campaign = out.lines().last().unwrap().to_owned();
    // In flight: the first target restarted, the other two deferred to
    // their time.
    let targets = wait_until("the campaign's first target restarted", || {
        let out = run(&dir, &["campaign", "status", &campaign, "--json"]);
        let status: Value = serde_json::from_str(&out).unwrap();
        let states: Vec<_> = status["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["state"].as_str().unwrap().to_owned())
            .collect();
        (states == ["restarted", "deferred", "deferred"]).then_some(status["targets"].clone())
    });
    let host = |n: usize| targets[n]["instance_name"].as_str().unwrap().to_owned();

    // Without the token: the instance and its mode, the switch, every
    // group with who paused it and why and its objective, the calendar
    // and the next slots; no host names (victims, targets, history).
    let bearer = format!("Bearer {TOKEN}");
    let (status, page) = get(&addr, "/", &[]);
    assert_eq!(status, 200);
    assert!(
        page.contains(&format!("<td>http://{addr}/</td>")) && page.contains("unleashed since"),
        "{page}"
    );
    assert!(page.contains("restarts running"), "{page}");
    assert!(
        page.contains("PAUSED by ana (failover drill) since"),
        "{page}"
    );
    assert!(page.contains("data-post=\"/api/resume\" data-group=\"db\""));
    assert!(
        page.contains("p95 ≤ 30.0s: no verified restart yet"),
        "{page}"
    );
    assert!(page.contains("<p id=\"calendar\">calendar: "), "{page}");
    assert!(page.contains("<b>open now</b>"), "{page}");
    assert!(page.contains("No planned restarts shown: admin.token is set"));
    assert!(page.contains("Campaigns not shown: admin.token is set"));
    assert!(!page.contains(&host(0)), "{page}");
    // With it: the slots' victims, the campaign target by target with a
    // stop button, and the latest requests with their verdicts.
    let (_, page) = get(&addr, "/", &[("Authorization", &bearer)]);
    assert!(page.contains("<td>weekly-web</td><td>web</td>"), "{page}");
    assert!(page.contains(&format!("data-post=\"/api/campaigns/{campaign}/stop\"")));
    assert!(
        page.contains(&format!("<td>{}</td>", host(0)))
            && page.contains("restarted; recovered after"),
        "{page}"
    );
    for n in [1, 2] {
        assert!(page.contains(&format!("<td>{}</td>", host(n))), "{page}");
    }
    assert!(page.contains("deferred by not_before"), "{page}");
    assert!(
        page.contains(&format!(
            ">{}</a></td><td>chaos</td><td>restarted</td>",
            host(0)
        )),
        "{page}"
    );

    // In a browser: the token pasted, the group paused from the page, and
    // `mandrill status` (the real binary, reading the store) says so.
    let mut browser = Browser::launch(&dir.join("profile"));
    let session = browser.open(&format!("http://{addr}/"));
    let page = |browser: &mut Browser, expression: &str| browser.evaluate(&session, expression);
    wait_until("the console loaded", || {
        let loaded = "document.readyState === 'complete' && !!document.getElementById('live')";
        (page(&mut browser, loaded) == true).then_some(())
    });
    page(
        &mut browser,
        &format!(
            "document.getElementById('token').value = '{TOKEN}';
             document.getElementById('by').value = 'bob';
             document.getElementById('reason').value = 'game day: web';
             document.getElementById('token').dispatchEvent(new Event('change'))"
        ),
    );
    // The token makes the refresh show what it keeps.
    let target = host(1);
    wait_until("the campaign shown once the token is pasted", || {
        let html = page(&mut browser, "document.getElementById('live').innerHTML");
        html.as_str()?.contains(&target).then_some(())
    });
    let click = |browser: &mut Browser, selector: &str| {
        page(
            browser,
            &format!("document.querySelector(\"{selector}\").click()"),
        );
        wait_until("the action's answer", || {
            let outcome = page(browser, "document.getElementById('outcome').textContent");
            let outcome = outcome.as_str()?.to_owned();
            (!outcome.ends_with('…') && !outcome.is_empty()).then_some(outcome)
        })
    };
    let outcome = click(
        &mut browser,
        "button[data-post='/api/pause'][data-group='web']",
    );
    assert!(outcome.starts_with("Pause: 200"), "{outcome}");
    let status = run(&dir, &["status"]);
    assert!(
        status.contains("group web: PAUSED, restarts of group web paused by bob (game day: web)"),
        "{status}"
    );
    assert!(status.contains("group db: PAUSED"), "{status}");
    wait_until("the page shows web paused", || {
        let row = page(
            &mut browser,
            "document.querySelector('tr.group[data-name=web]').textContent",
        );
        row.as_str()?
            .contains("PAUSED by bob (game day: web)")
            .then_some(())
    });
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    browser.screenshot(&session, &screenshot);

    let outcome = click(
        &mut browser,
        "button[data-post='/api/resume'][data-group='web']",
    );
    assert!(outcome.starts_with("Resume: 200"), "{outcome}");
    let status = run(&dir, &["status"]);
    assert!(!status.contains("group web: PAUSED"), "{status}");
    assert!(status.contains("group db: PAUSED"), "{status}");
    drop(browser);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    assert!(!serde_json::to_string(&lines).unwrap().contains(TOKEN));
}

/// Headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: it reads commands on fd 3 and writes answers
/// on fd 4, each a JSON object ended by a NUL byte), its answers read by a
/// thread so that each wait has a deadline. Killed when dropped.
struct Browser {
    child: Child,
    commands: std::io::PipeWriter,
    answers: mpsc::Receiver<Value>,
    next_id: u64,
}

impl Browser {
    fn launch(profile: &Path) -> Self {
        let (theirs_in, commands) = std::io::pipe().unwrap();
        let (answers, theirs_out) = std::io::pipe().unwrap();
        let (read_fd, write_fd) = (theirs_in.as_raw_fd(), theirs_out.as_raw_fd());
        let mut command = Command::new("chromium");
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-pipe",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls
        // (fcntl, dup2) on descriptors this process owns.
        unsafe {
            command.pre_exec(move || {
                // Above 4 first, so that placing one cannot close the other;
                // the copies close at exec, 3 and 4 stay open.
                let read = libc::fcntl(read_fd, libc::F_DUPFD_CLOEXEC, 10);
                let write = libc::fcntl(write_fd, libc::F_DUPFD_CLOEXEC, 10);
                if read < 0 || write < 0 || libc::dup2(read, 3) < 0 || libc::dup2(write, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .expect("chromium (Debian's `chromium` package; .ci/run installs it)");
        // Its ends are its own now: the answers end when it exits.
        drop((theirs_in, theirs_out));
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || {
            let mut answers = BufReader::new(answers);
            loop {
                let mut answer = Vec::new();
                match answers.read_until(0, &mut answer) {
                    Ok(read) if read > 0 && answer.pop() == Some(0) => {}
                    _ => break,
                }
                let Ok(answer) = serde_json::from_slice(&answer) else {
                    break;
                };
                if send.send(answer).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            commands,
            answers: receive,
            next_id: 1,
        }
    }

    /// Sends `method` with `params` (to the page of `session`, if any) and
    /// waits for its answer, passing over events.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).unwrap();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .answers
                .recv_timeout(left)
                .unwrap_or_else(|error| panic!("chromium did not answer {method}: {error}"));
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// Opens `url` in a new page; the session that drives it.
    fn open(&mut self, url: &str) -> String {
        let target = self.call(None, "Target.createTarget", json!({ "url": url }));
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        let session = attached["sessionId"].as_str().unwrap().to_owned();
        self.call(
            Some(&session),
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 1400, "deviceScaleFactor": 1, "mobile": false }),
        );
        session
    }

    /// The value of `expression` in the page (a promise awaited).
    fn evaluate(&mut self, session: &str, expression: &str) -> Value {
        let result = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// The whole page as a PNG into `path`.
    fn screenshot(&mut self, session: &str, path: &Path) {
        use base64::Engine as _;
        let shot = self.call(
            Some(session),
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
