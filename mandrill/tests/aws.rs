//! mandrill on AWS through the real binary, against a private moto server
//! (`services/moto.rs`), checked from outside with boto3
//! (`services/ec2_fleet.py`): the fleet from EC2 tags and Auto Scaling
//! groups; reboot, stop-start and terminate with recovery judged by EC2;
//! an instance left stopped by a mandrill killed with SIGKILL started by
//! the next one; a proxy that throttles, stalls, fails or rewrites AWS's
//! answers (retries, unknown outcomes, the start-after tag kept); a campaign
//! over an EC2 group; signatures and IAM checked by moto. One file past
//! 400 lines: every test shares the moto fleet, the configuration and the
//! helpers.

mod services;
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mandrill::Status;
use serde_json::Value;
use services::moto::{ENV, Moto, parse};
use support::{Mandrill, history, mandrill, sqlite_url, temp_dir};

/// A calendar open at all times: with a real backend the default is
/// Mon–Fri 09:00–15:00 UTC.
const ALWAYS_OPEN: &str = "[safety.calendar]\n\
    weekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
    hours = [\"00:00-24:00\"]\n";

/// A configuration with the ec2 restarter at `endpoint` doing `action`,
/// verified by EC2, with `more` (an inventory, say) appended.
fn config(dir: &Path, endpoint: &str, action: &str, more: &str) -> String {
    let db = sqlite_url(dir);
    let text = format!(
        "[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n\
         [worker]\nrestart_timeout = \"5m\"\n\n\
         [restarter]\nkind = \"ec2\"\n\n\
         [restarter.ec2]\nendpoint_url = {endpoint:?}\naction = {action:?}\n\
         stopped_for = \"3s\"\nstop_timeout = \"5s\"\nstart_timeout = \"5s\"\npoll_interval = \"100ms\"\ncall_timeout = \"5s\"\n\n\
         [verify]\nprobe = \"ec2\"\ninitial_delay = \"0s\"\ninterval = \"200ms\"\ntimeout = \"30s\"\n\n\
         [safety]\nallow = [\"i-*\"]\n# Not about signing: unsigned requests.\nrequire_signed = false\n\n\
         {ALWAYS_OPEN}\n{more}"
    );
    std::fs::write(dir.join("mandrill.toml"), text).unwrap();
    db
}

/// `[inventory.ec2]` at `endpoint`: the instances tagged `chaos = yes`.
fn inventory(endpoint: &str) -> String {
    format!(
        "[inventory.ec2]\nendpoint_url = {endpoint:?}\nfilters = {{ \"tag:chaos\" = [\"yes\"] }}\n\
         label_tags = [\"team\"]\n"
    )
}

fn publish(dir: &Path, db: &str, instances: &[&str]) {
    let mut args = vec!["publish", "--broker", db];
    args.extend_from_slice(instances);
    let (status, _, stderr) = mandrill(dir, &args, &[]);
    assert!(status.success(), "publish failed: {stderr}");
}

/// Runs the service until the queue is empty; its log.
fn run_until_idle(dir: &Path) -> Vec<Value> {
    let service = Mandrill::run_with_env(
        dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
        ENV,
    );
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    lines
}

fn entry(db: &str, instance: &str) -> mandrill::HistoryEntry {
    history(db)
        .into_iter()
        .find(|entry| entry.instance_name.as_deref() == Some(instance))
        .unwrap_or_else(|| panic!("{instance} is not in the history"))
}

fn ids(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect()
}

/// An instance's state and whether it carries mandrill's start-after tag.
fn state_and_tag(moto: &Moto, instance: &str) -> (String, bool) {
    let state = moto.fleet(&["state", instance]);
    let name = state["state"].as_str().unwrap_or_default().to_owned();
    (name, state["tags"].get("mandrill:start-after").is_some())
}

#[test]
fn the_inventory_lists_tagged_instances_and_auto_scaling_members_with_their_groups_and_zones() {
    let moto = Moto::start();
    let web = ids(&moto.fleet(&[
        "run",
        "us-east-1a",
        "2",
        "chaos=yes",
        "chaos-group=web",
        "team=payments",
        "db-password=hunter2",
    ]));
    let lone = ids(&moto.fleet(&["run", "us-east-1c", "1", "chaos=yes"]));
    let untagged = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=no", "chaos-group=web"]));
    let members = ids(&moto.fleet(&["group", "api-asg", "us-east-1b", "2"]));
    let (_guard, dir) = temp_dir();
    config(
        &dir,
        &moto.endpoint(),
        "reboot",
        &inventory(&moto.endpoint()),
    );

    let (status, stdout, stderr) = mandrill(
        &dir,
        &["inventory", "--json", "--config", "mandrill.toml"],
        ENV,
    );
    assert!(status.success(), "inventory failed: {stderr}");
    assert!(
        !stdout.contains("hunter2"),
        "a tag not named is shown: {stdout}"
    );
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(shown["format"], "ec2");
    let hosts: BTreeMap<String, &Value> = shown["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|host| (host["name"].as_str().unwrap().to_owned(), host))
        .collect();
    assert_eq!(hosts.len(), 5, "{stdout}");
    assert!(!hosts.contains_key(&untagged[0]));
    for id in &web {
        assert_eq!(hosts[id]["group"], "web");
        assert_eq!(hosts[id]["zone"], "us-east-1a");
        assert_eq!(hosts[id]["labels"]["team"], "payments");
        assert!(hosts[id]["address"].as_str().unwrap().starts_with("10."));
    }
    for id in &members {
        assert_eq!(hosts[id]["group"], "api-asg");
        assert_eq!(hosts[id]["zone"], "us-east-1b");
        assert_eq!(hosts[id]["labels"]["auto_scaling_group"], "api-asg");
    }
    assert!(hosts[&lone[0]]["group"].is_null());
    assert_eq!(shown["groups"]["web"], 2);
    assert_eq!(shown["groups"]["api-asg"], 2);

    // The operator asks why: an instance in no group is denied, saying so.
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "policy",
            "check",
            "--json",
            "--config",
            "mandrill.toml",
            &web[0],
            &lone[0],
        ],
        ENV,
    );
    assert!(status.success(), "policy check failed: {stderr}");
    let verdicts: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(verdicts[0]["group"], "web");
    assert_eq!(verdicts[0]["inventory"]["verdict"], "allow");
    assert_eq!(verdicts[0]["inventory"]["zone"], "us-east-1a");
    assert_eq!(verdicts[1]["inventory"]["verdict"], "deny");
    assert!(
        verdicts[1].to_string().contains("no chaos-group tag"),
        "{}",
        verdicts[1]
    );
}

/// What [`Proxy`] does with a call.
enum Act {
    /// Sends it on to moto and returns moto's answer.
    Forward,
    /// Answers this instead, moto never asked.
    Answer(axum::http::StatusCode, String),
    /// Sends it on to moto, then answers this instead of moto's answer.
    ForwardThenAnswer(axum::http::StatusCode, String),
    /// Never answers (the connection stays open).
    Stall,
    /// Sends it on to moto and answers moto's answer rewritten.
    Rewrite(Box<dyn FnOnce(String) -> String + Send>),
}

/// EC2's error answer with `code`.
fn ec2_error(code: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
         <Code>{code}</Code><Message>{code} (from the test's proxy)</Message></Error></Errors>\
         <RequestID>x</RequestID></Response>"
    )
}

/// Whether `call` (a form) is `action` on `instance`.
fn is_call(call: &str, action: &str, instance: &str) -> bool {
    call.contains(&format!("Action={action}&")) && call.contains(instance)
}

/// A proxy in front of moto that records each call's form and does with
/// it what `rule` says, given the form and every call so far (this one
/// last).
struct Proxy {
    endpoint: String,
    calls: Arc<Mutex<Vec<String>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    fn start(
        upstream: String,
        rule: impl Fn(&str, &[String]) -> Act + Send + Sync + 'static,
    ) -> Self {
        let rule = Arc::new(rule);
        // reqwest is built without a default TLS provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let recorded = calls.clone();
        let client = reqwest::Client::new();
        let app = axum::Router::new().fallback(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let recorded = recorded.clone();
                let rule = rule.clone();
                let client = client.clone();
                let upstream = upstream.clone();
                async move {
                    let form = String::from_utf8_lossy(&body).into_owned();
                    let act = {
                        let mut calls = recorded.lock().unwrap();
                        calls.push(form.clone());
                        rule(&form, &calls)
                    };
                    let mut rewrite = None;
                    let instead = match act {
                        Act::Answer(status, answer) => return (status, answer),
                        Act::Stall => {
                            std::future::pending::<()>().await;
                            None
                        }
                        Act::Forward => None,
                        Act::ForwardThenAnswer(status, answer) => Some((status, answer)),
                        Act::Rewrite(with) => {
                            rewrite = Some(with);
                            None
                        }
                    };
                    let mut forward = client.post(&upstream).body(body.to_vec());
                    for (name, value) in &headers {
                        if name != "host" && name != "content-length" {
                            forward = forward.header(name.as_str(), value.as_bytes());
                        }
                    }
                    let answer = forward.send().await.unwrap();
                    let status =
                        axum::http::StatusCode::from_u16(answer.status().as_u16()).unwrap();
                    let mut answer = answer.text().await.unwrap();
                    if let Some(rewrite) = rewrite {
                        answer = rewrite(answer);
                    }
                    instead.unwrap_or((status, answer))
                }
            },
        );
        runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            endpoint,
            calls,
            _runtime: runtime,
        }
    }

    /// A proxy that answers the first `throttle` calls of `action` on
    /// `instance` with EC2's `RequestLimitExceeded` (503) and forwards
    /// everything else.
    fn throttling(upstream: String, action: &'static str, instance: &str, throttle: usize) -> Self {
        let instance = instance.to_owned();
        Self::start(upstream, move |form, calls| {
            let throttled = |call: &str| is_call(call, action, &instance);
            let seen = calls.iter().filter(|call| throttled(call)).count();
            if throttled(form) && seen <= throttle {
                Act::Answer(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    ec2_error("RequestLimitExceeded"),
                )
            } else {
                Act::Forward
            }
        })
    }

    /// A proxy that does what `act` says with every call of `action` on
    /// `instance` and forwards everything else.
    fn on(
        upstream: String,
        action: &'static str,
        instance: &str,
        act: impl Fn() -> Act + Send + Sync + 'static,
    ) -> Self {
        let instance = instance.to_owned();
        Self::start(upstream, move |form, _| {
            if is_call(form, action, &instance) {
                act()
            } else {
                Act::Forward
            }
        })
    }

    /// How many calls of `action` mentioned `needle`.
    fn count(&self, action: &str, needle: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|call| is_call(call, action, needle))
            .count()
    }
}

#[test]
fn a_reboot_is_retried_through_throttling_verified_by_ec2_and_an_unknown_instance_is_not_retried() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let unknown = "i-0000000000000000f";
    let proxy = Proxy::throttling(moto.endpoint(), "RebootInstances", &instance, 3);
    let (_guard, dir) = temp_dir();
    // Without an inventory every instance id is in the group "i" (the
    // name's default): two restarts of it, not one, per day.
    let db = config(
        &dir,
        &proxy.endpoint,
        "reboot",
        "[safety.rate]\ngroup_max = 2\n",
    );
    publish(&dir, &db, &[&instance, unknown]);

    let lines = run_until_idle(&dir);

    let rebooted = entry(&db, &instance);
    assert_eq!(rebooted.status, Status::Restarted, "{rebooted:?}");
    assert_eq!(
        rebooted.attempts, 1,
        "throttling is retried inside the attempt"
    );
    assert!(rebooted.recovered_after.is_some(), "{rebooted:?}");
    // Three throttled, then forwarded; the unknown instance asked once.
    assert_eq!(proxy.count("RebootInstances", &instance), 4);
    assert_eq!(proxy.count("RebootInstances", unknown), 1);
    assert!(proxy.count("DescribeInstanceStatus", &instance) >= 1);
    let retried = lines
        .iter()
        .filter(|line| line["fields"]["message"] == "an aws call is tried again")
        .count();
    assert_eq!(retried, 3, "each throttled answer is retried once");
    // Without an inventory the operator is told what groups become.
    assert!(
        lines.iter().any(|line| line["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("restarter.kind = \"ec2\" without an inventory"))),
        "no warning about the group \"i\""
    );

    let failed = entry(&db, unknown);
    assert_eq!(failed.status, Status::Failed, "{failed:?}");
    assert_eq!(failed.attempts, 1, "a permanent refusal is not retried");
    let error = failed.last_error.unwrap_or_default();
    assert!(error.contains("InvalidInstanceID.NotFound"), "{error}");
}

/// The worker's line for a restart whose outcome is unknown.
const OUTCOME_UNKNOWN: &str = "the restart's outcome is unknown (it may still be running on the host): no outcome recorded, so its claim holds the host until it expires and then counts as a used attempt";

/// Sets `key = value` in the configuration [`config`] wrote, on the line
/// that sets `key` (one line sets it).
fn set(dir: &Path, key: &str, value: &str) {
    let path = dir.join("mandrill.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let prefix = format!("{key} = ");
    assert_eq!(
        text.lines()
            .filter(|line| line.starts_with(&prefix))
            .count(),
        1,
        "{key}: {text}"
    );
    let text: String = text
        .lines()
        .map(|line| {
            if line.starts_with(&prefix) {
                format!("{key} = {value:?}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// Waits until the restart of the one request published has an end
/// (recorded, or its outcome unknown).
fn wait_until_concluded(service: &Mandrill) {
    let deadline = std::time::Instant::now() + support::DEADLINE;
    while [
        OUTCOME_UNKNOWN,
        "restarted",
        "restart failed; will retry",
        "restart refused for good; not retrying",
        "restarted, but the host did not come back",
    ]
    .iter()
    .all(|message| service.messages(message).is_empty())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the restart did not end: {}",
            service.raw()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs the service until the restart of the one request published has
/// an end, then stops it; its log.
fn run_until_concluded(dir: &Path) -> Vec<Value> {
    let service = Mandrill::run_with_env(dir, &["--config", "mandrill.toml", "--unleash"], ENV);
    wait_until_concluded(&service);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "{lines:?}");
    lines
}

/// A reboot that reached AWS and whose answer never came is sent once,
/// not once per try: AWS may have done it, and a second one is a second
/// restart. Its outcome is unknown: nothing recorded, the claim holding
/// the instance.
#[test]
fn a_reboot_whose_answer_never_comes_is_sent_once_and_its_claim_holds_the_instance() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let stalled = instance.clone();
    let proxy = Proxy::start(moto.endpoint(), move |form, _| {
        if is_call(form, "RebootInstances", &stalled) {
            Act::Stall
        } else {
            Act::Forward
        }
    });
    let (_guard, dir) = temp_dir();
    let db = config(&dir, &proxy.endpoint, "reboot", "");
    set(&dir, "call_timeout", "1s");
    publish(&dir, &db, &[&instance]);

    let lines = run_until_concluded(&dir);

    assert_eq!(proxy.count("RebootInstances", &instance), 1);
    assert!(
        lines
            .iter()
            .any(|line| line["fields"]["message"] == OUTCOME_UNKNOWN),
        "{lines:?}"
    );
    let held = entry(&db, &instance);
    assert_eq!(held.status, Status::Received, "{held:?}");
}

/// A StopInstances that AWS did but answered with a 5xx: the instance
/// is stopped, so its start-after tag stays for the companion to start it
/// (it was removed, leaving the instance stopped for good), and the
/// stop is not sent again.
#[test]
fn a_stop_done_but_answered_with_a_5xx_keeps_the_start_after_tag() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let proxy = Proxy::on(moto.endpoint(), "StopInstances", &instance, || {
        Act::ForwardThenAnswer(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            ec2_error("InternalError"),
        )
    });
    let (_guard, dir) = temp_dir();
    let db = config(&dir, &proxy.endpoint, "stop-start", "");
    publish(&dir, &db, &[&instance]);

    let lines = run_until_concluded(&dir);

    assert_eq!(
        state_and_tag(&moto, &instance),
        ("stopped".to_owned(), true),
        "(state, tagged mandrill:start-after)"
    );
    assert_eq!(proxy.count("StopInstances", &instance), 1);
    assert!(
        lines
            .iter()
            .any(|line| line["fields"]["message"] == OUTCOME_UNKNOWN),
        "{lines:?}"
    );
}

/// A start AWS refuses once the stop was done (a role allowed to stop
/// but not to start) leaves the instance down: recorded unrecovered, not
/// refused (nothing done) nor retried (stopped again, its start put off),
/// and its start-after tag stays for the companion.
#[test]
fn a_start_refused_after_the_stop_is_unrecovered_not_refused_nor_retried() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let proxy = Proxy::on(moto.endpoint(), "StartInstances", &instance, || {
        Act::Answer(
            axum::http::StatusCode::FORBIDDEN,
            ec2_error("UnauthorizedOperation"),
        )
    });
    let (_guard, dir) = temp_dir();
    let db = config(&dir, &proxy.endpoint, "stop-start", "");
    publish(&dir, &db, &[&instance]);

    run_until_concluded(&dir);

    let unrecovered = entry(&db, &instance);
    assert_eq!(unrecovered.status, Status::Unrecovered, "{unrecovered:?}");
    let error = unrecovered.last_error.unwrap_or_default();
    assert!(
        error.contains(&format!(
            "StartInstances {instance} after StopInstances was accepted"
        )) && error.contains("UnauthorizedOperation"),
        "{error}"
    );
    assert_eq!(proxy.count("StopInstances", &instance), 1);
    assert_eq!(
        state_and_tag(&moto, &instance),
        ("stopped".to_owned(), true),
        "(state, tagged mandrill:start-after)"
    );
}

#[test]
fn a_stop_start_keeps_the_instance_stopped_for_stopped_for_then_ec2_sees_it_recover() {
    let moto = Moto::start();
    let instance =
        ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes", "chaos-group=web"])).remove(0);
    let (_guard, dir) = temp_dir();
    let db = config(
        &dir,
        &moto.endpoint(),
        "stop-start",
        &inventory(&moto.endpoint()),
    );
    publish(&dir, &db, &[&instance]);
    let watch_args = ["watch", instance.as_str(), "100"];
    let mut watch = moto.fleet_command(&watch_args).spawn().unwrap();
    // Its first line once it has seen the instance running: it watches
    // from before the stop.
    // (Byte by byte: what follows is read with the rest of the output.)
    let mut first = Vec::new();
    let mut byte = [0u8];
    while first.last() != Some(&b'\n') {
        let read = std::io::Read::read(watch.stdout.as_mut().unwrap(), &mut byte).unwrap();
        assert_eq!(read, 1, "the watch ended early");
        first.push(byte[0]);
    }
    assert_eq!(
        String::from_utf8_lossy(&first).trim(),
        r#"{"watching": "running"}"#
    );

    run_until_idle(&dir);

    let seen: Value = parse(&watch_args, &watch.wait_with_output().unwrap());
    let seen_stopped_for = seen["seen_stopped_for"].as_f64().unwrap();
    // stopped_for is 3s; boto3 looks every 0.1s.
    assert!(
        seen_stopped_for >= 2.5,
        "stopped for {seen_stopped_for}s only"
    );
    let restarted = entry(&db, &instance);
    assert_eq!(restarted.status, Status::Restarted, "{restarted:?}");
    assert!(restarted.recovered_after.is_some(), "{restarted:?}");
    assert_eq!(
        state_and_tag(&moto, &instance),
        ("running".to_owned(), false),
        "(state, tagged mandrill:start-after)"
    );
}

/// An instance its operator stopped (it has no start-after tag, which
/// only mandrill puts) is refused by a stop-start, for good, and stays
/// stopped: StopInstances would leave it so and StartInstances would power
/// it on. One stopped with the tag is a stop-start cut short (a crash, a
/// redelivery): the stop-start ends it, and it runs again.
#[test]
fn a_stop_start_refuses_an_instance_stopped_by_someone_else_and_ends_one_of_its_own() {
    let moto = Moto::start();
    let theirs = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let ours = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    moto.fleet(&["stop", &theirs]);
    // A time far off: the companion leaves it to the stop-start.
    moto.fleet(&["stop", &ours, "mandrill:start-after=9999999999"]);
    let (_guard, dir) = temp_dir();
    let db = config(
        &dir,
        &moto.endpoint(),
        "stop-start",
        "[safety.rate]\ngroup_max = 2\n",
    );
    // One after the other: a refused host counts against the group's
    // disruption budget.
    publish(&dir, &db, &[&ours]);
    run_until_idle(&dir);
    publish(&dir, &db, &[&theirs]);
    run_until_idle(&dir);

    assert_eq!(
        state_and_tag(&moto, &theirs),
        ("stopped".to_owned(), false),
        "(state, tagged mandrill:start-after)"
    );
    let refused = entry(&db, &theirs);
    assert_eq!(refused.status, Status::Failed, "{refused:?}");
    assert_eq!(refused.attempts, 1, "a refusal is not retried");
    let error = refused.last_error.unwrap_or_default();
    assert!(
        error.contains("is stopped without the mandrill:start-after tag"),
        "{error}"
    );

    let ended = entry(&db, &ours);
    assert_eq!(ended.status, Status::Restarted, "{ended:?}");
    assert_eq!(
        state_and_tag(&moto, &ours),
        ("running".to_owned(), false),
        "(state, tagged mandrill:start-after)"
    );
}

/// EC2's answer to a `StartInstances` of `id` it accepted (pending), sent
/// by the proxy in moto's stead: the instance stays stopped, as one whose
/// start fell back.
fn start_accepted(id: &str) -> Act {
    Act::Answer(
        axum::http::StatusCode::OK,
        format!(
            "<StartInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
             <requestId>x</requestId><instancesSet><item><instanceId>{id}</instanceId>\
             <currentState><code>0</code><name>pending</name></currentState>\
             <previousState><code>80</code><name>stopped</name></previousState>\
             </item></instancesSet></StartInstancesResponse>"
        ),
    )
}

/// A start AWS accepted that leaves the instance stopped (pending, then
/// stopped again: a key its volumes cannot be decrypted with, no
/// capacity) is not a restart that ended well, even without a probe: it
/// is recorded unrecovered, naming the state and EC2's reason, and the
/// start-after tag stays for the companion.
#[test]
fn a_start_that_falls_back_to_stopped_is_unrecovered_and_keeps_the_start_after_tag() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let id = instance.clone();
    // moto starts what it is asked to: the proxy accepts the start itself,
    // then shows the instance pending once and stopped again after.
    let proxy = Proxy::start(moto.endpoint(), move |form, calls| {
        let start = |call: &str| is_call(call, "StartInstances", &id);
        if start(form) {
            return start_accepted(&id);
        }
        let looks_since_start = calls
            .iter()
            .skip_while(|call| !start(call))
            .filter(|call| is_call(call, "DescribeInstances", &id))
            .count();
        match (is_call(form, "DescribeInstances", &id), looks_since_start) {
            (true, 1) => Act::Rewrite(Box::new(|answer| {
                answer.replace("<name>stopped</name>", "<name>pending</name>")
            })),
            (true, 2..) => Act::Rewrite(Box::new(|answer| {
                answer.replace(
                    "Client.UserInitiatedShutdown: User initiated shutdown",
                    "Client.InternalError: Client error on launch",
                )
            })),
            _ => Act::Forward,
        }
    });
    let (_guard, dir) = temp_dir();
    let db = config(&dir, &proxy.endpoint, "stop-start", "");
    // Without a probe, nothing but the stop-start itself sees the host.
    set(&dir, "probe", "none");
    publish(&dir, &db, &[&instance]);

    run_until_idle(&dir);

    let unrecovered = entry(&db, &instance);
    assert_eq!(unrecovered.status, Status::Unrecovered, "{unrecovered:?}");
    let error = unrecovered.last_error.unwrap_or_default();
    assert!(
        error.contains(&format!(
            "{instance} fell back to stopped (Client.InternalError: Client error on launch)"
        )),
        "{error}"
    );
    assert_eq!(
        state_and_tag(&moto, &instance),
        ("stopped".to_owned(), true),
        "(state, tagged mandrill:start-after)"
    );
}

#[test]
fn an_instance_left_stopped_by_a_mandrill_killed_with_sigkill_is_started_by_the_next_one() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    let (_guard, dir) = temp_dir();
    let db = config(&dir, &moto.endpoint(), "stop-start", "");
    // Stopped long enough to be killed meanwhile.
    let text = std::fs::read_to_string(dir.join("mandrill.toml"))
        .unwrap()
        .replace("stopped_for = \"3s\"", "stopped_for = \"20s\"")
        .replace("stop_timeout = \"5s\"", "stop_timeout = \"2s\"");
    std::fs::write(dir.join("mandrill.toml"), text).unwrap();
    publish(&dir, &db, &[&instance]);
    let service = Mandrill::run_with_env(&dir, &["--config", "mandrill.toml", "--unleash"], ENV);
    let stopped = moto.fleet(&["wait", &instance, "stopped", "60"]);
    service.signal("KILL");
    let (status, _) = service.wait_exit();
    assert!(!status.success());
    assert_eq!(
        stopped["tags"]["mandrill:start-after"]
            .as_str()
            .map(str::len),
        Some(10)
    );
    assert_eq!(moto.fleet(&["state", &instance])["state"], "stopped");

    // The next mandrill shares nothing with the first but the fleet: its
    // own store and queue.
    let (_other_guard, other) = temp_dir();
    std::fs::copy(dir.join("mandrill.toml"), other.join("mandrill.toml")).unwrap();
    let text = std::fs::read_to_string(other.join("mandrill.toml"))
        .unwrap()
        .replace(&sqlite_url(&dir), &sqlite_url(&other));
    std::fs::write(other.join("mandrill.toml"), text).unwrap();
    let next = Mandrill::run_with_env(&other, &["--config", "mandrill.toml"], ENV);
    moto.fleet(&["wait", &instance, "running", "120"]);
    next.wait_for(
        "started an instance a stop-start left stopped (the mandrill that stopped it did not start it in time)",
        1,
    );
    let deadline = std::time::Instant::now() + support::DEADLINE;
    while moto.fleet(&["state", &instance])["tags"]
        .get("mandrill:start-after")
        .is_some()
    {
        assert!(std::time::Instant::now() < deadline, "the tag stays");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    next.signal("TERM");
    let (status, _) = next.wait_exit();
    assert!(status.success());
}

/// Launches a running instance whose start-after time, `due`, has passed.
fn run_tagged(moto: &Moto, due: &str) -> String {
    ids(&moto.fleet(&[
        "run",
        "us-east-1a",
        "1",
        "chaos=yes",
        &format!("mandrill:start-after={due}"),
    ]))
    .remove(0)
}

/// Waits until no instance of `instances` has a start-after tag.
fn wait_untagged(moto: &Moto, instances: &[&str], service: &Mandrill) {
    let deadline = std::time::Instant::now() + support::DEADLINE;
    for instance in instances {
        while moto.fleet(&["state", instance])["tags"]
            .get("mandrill:start-after")
            .is_some()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{instance} keeps its tag: {}",
                service.raw()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// The companion removes a start-after tag only with the value it read:
/// one a new stop-start wrote since stays.
#[test]
fn the_companion_removes_only_the_start_after_tag_it_read() {
    let moto = Moto::start();
    let instance = run_tagged(&moto, "2000");
    let proxy = Proxy::start(moto.endpoint(), |form, _| {
        if is_call(form, "DescribeInstances", "tag-key") {
            // As if read before a new stop-start tagged it again.
            Act::Rewrite(Box::new(|answer| {
                answer.replace("<value>2000</value>", "<value>1999</value>")
            }))
        } else {
            Act::Forward
        }
    });
    let (_guard, dir) = temp_dir();
    config(&dir, &proxy.endpoint, "stop-start", "");
    let service = Mandrill::run_with_env(&dir, &["--config", "mandrill.toml"], ENV);

    let deadline = std::time::Instant::now() + support::DEADLINE;
    while proxy.count("DeleteTags", &instance) == 0 {
        assert!(std::time::Instant::now() < deadline, "{}", service.raw());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    service.signal("TERM");
    assert!(service.wait_exit().0.success());
    assert_eq!(
        moto.fleet(&["state", &instance])["tags"]["mandrill:start-after"],
        "2000",
        "a tag written since it was read was removed"
    );
}

/// An instance the companion cannot finish is logged and passed over:
/// the same sweep finishes the others (it used to end there, leaving them
/// to a later sweep that may end at the same instance).
#[test]
fn the_companion_passes_over_an_instance_it_cannot_finish() {
    let moto = Moto::start();
    let instances = [
        run_tagged(&moto, "1000"),
        run_tagged(&moto, "2000"),
        run_tagged(&moto, "3000"),
    ];
    // Whichever instance the sweep asks for first.
    let proxy = Proxy::start(moto.endpoint(), |form, calls| {
        let first = calls
            .iter()
            .filter(|call| is_call(call, "DeleteTags", ""))
            .count()
            == 1;
        if is_call(form, "DeleteTags", "") && first {
            Act::Answer(
                axum::http::StatusCode::FORBIDDEN,
                ec2_error("UnauthorizedOperation"),
            )
        } else {
            Act::Forward
        }
    });
    let (_guard, dir) = temp_dir();
    config(&dir, &proxy.endpoint, "stop-start", "");
    let service = Mandrill::run_with_env(&dir, &["--config", "mandrill.toml"], ENV);

    let deadline = std::time::Instant::now() + support::DEADLINE;
    let denied = loop {
        let first = proxy
            .calls
            .lock()
            .unwrap()
            .iter()
            .find(|call| is_call(call, "DeleteTags", ""))
            .cloned();
        if let Some(first) = first {
            break instances
                .iter()
                .find(|instance| first.contains(instance.as_str()))
                .unwrap()
                .clone();
        }
        assert!(std::time::Instant::now() < deadline, "{}", service.raw());
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let others: Vec<&str> = instances
        .iter()
        .map(String::as_str)
        .filter(|instance| *instance != denied)
        .collect();
    wait_untagged(&moto, &others, &service);
    assert_eq!(
        proxy.count("DescribeInstances", "tag-key"),
        1,
        "not finished by the sweep that could not finish {denied}"
    );

    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    assert!(
        lines.iter().any(|line| line["fields"]["message"]
            == "cannot finish a stop-start left unfinished; the next sweep tries again"
            && line["fields"]["instance"] == denied.as_str()),
        "{lines:?}"
    );
    assert!(
        moto.fleet(&["state", &denied])["tags"]
            .get("mandrill:start-after")
            .is_some()
    );
}

/// A start the companion made that falls back to stopped is made again:
/// the tag stays until the instance is seen running (it used to be
/// removed as soon as the start was accepted, and the instance stayed
/// stopped for good).
#[test]
fn a_start_by_the_companion_that_falls_back_to_stopped_is_made_again() {
    let moto = Moto::start();
    let instance = ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes"])).remove(0);
    moto.fleet(&["stop", &instance, "mandrill:start-after=1000"]);
    let id = instance.clone();
    // The first start is accepted and not done; the next reach moto.
    let proxy = Proxy::start(moto.endpoint(), move |form, calls| {
        let start = |call: &str| is_call(call, "StartInstances", &id);
        if start(form) && calls.iter().filter(|call| start(call)).count() == 1 {
            start_accepted(&id)
        } else {
            Act::Forward
        }
    });
    let (_guard, dir) = temp_dir();
    config(&dir, &proxy.endpoint, "stop-start", "");
    let service = Mandrill::run_with_env(&dir, &["--config", "mandrill.toml"], ENV);

    let deadline = std::time::Instant::now() + support::DEADLINE;
    while moto.fleet(&["state", &instance])["state"] != "running" {
        assert!(
            std::time::Instant::now() < deadline,
            "still stopped after {} start(s), tagged: {:?}: {}",
            proxy.count("StartInstances", &instance),
            state_and_tag(&moto, &instance),
            service.raw()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    wait_untagged(&moto, &[&instance], &service);
    service.signal("TERM");
    assert!(service.wait_exit().0.success());
    assert_eq!(proxy.count("StartInstances", &instance), 2);
}

#[test]
fn terminate_replaces_a_group_member_and_refuses_an_instance_in_no_group() {
    let moto = Moto::start();
    let members = ids(&moto.fleet(&["group", "api-asg", "us-east-1b", "2"]));
    let lone =
        ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes", "chaos-group=web"])).remove(0);
    let (_guard, dir) = temp_dir();
    let db = config(
        &dir,
        &moto.endpoint(),
        "terminate",
        &inventory(&moto.endpoint()),
    );
    publish(&dir, &db, &[&members[0], &lone]);

    run_until_idle(&dir);

    let terminated = entry(&db, &members[0]);
    assert_eq!(terminated.status, Status::Restarted, "{terminated:?}");
    assert!(terminated.recovered_after.is_some(), "{terminated:?}");
    let old = moto.fleet(&["state", &members[0]]);
    assert!(
        matches!(old["state"].as_str(), Some("terminated" | "shutting-down")),
        "{old}"
    );
    let group = moto.fleet(&["describe-group", "api-asg"]);
    assert_eq!(group["desired"], 2);
    let in_service = ids(&group["in_service"]);
    assert_eq!(in_service.len(), 2, "{group}");
    assert!(!in_service.contains(&members[0]), "{group}");

    let refused = entry(&db, &lone);
    assert_eq!(refused.status, Status::Failed, "{refused:?}");
    assert_eq!(refused.attempts, 1);
    let error = refused.last_error.unwrap_or_default();
    assert!(error.contains("in no auto scaling group"), "{error}");
    assert_eq!(moto.fleet(&["state", &lone])["state"], "running");
}

/// A game day on EC2 as on any fleet: `campaign start --group web
/// --percent 50`, signed, over the group the inventory reads from tags,
/// paced by the budget per zone (one instance of an availability zone at
/// a time; no daily rate limit), each reboot judged by EC2, and `wait`
/// exits 0.
#[test]
fn a_campaign_over_a_tagged_group_reboots_half_of_it_and_wait_sees_each_recovered() {
    let moto = Moto::start();
    let mut web = ids(&moto.fleet(&["run", "us-east-1a", "2", "chaos=yes", "chaos-group=web"]));
    web.extend(ids(&moto.fleet(&[
        "run",
        "us-east-1b",
        "2",
        "chaos=yes",
        "chaos-group=web",
    ])));
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "chaos"], &[]);
    assert!(status.success(), "{stderr}");
    let db = config(
        &dir,
        &moto.endpoint(),
        "reboot",
        &format!(
            "{}\n[safety.rate]\ngroup_max = 0\n\n\
             [safety.budget]\nmax_disrupted_per_zone = 1\nretry = \"100ms\"\n\n\
             [[requesters]]\nname = \"chaos\"\npublic_key_file = \"chaos.pub\"\nallow = [\"i-*\"]\n",
            inventory(&moto.endpoint())
        ),
    );
    // Signed requests only (the default with a real backend).
    let text = std::fs::read_to_string(dir.join("mandrill.toml"))
        .unwrap()
        .replace("require_signed = false\n", "");
    std::fs::write(dir.join("mandrill.toml"), text).unwrap();
    let (status, out, stderr) = mandrill(
        &dir,
        &[
            "campaign",
            "start",
            "--group",
            "web",
            "--percent",
            "50",
            "--as",
            "chaos",
            "--key-file",
            "chaos.key",
            "--config",
            "mandrill.toml",
        ],
        ENV,
    );
    assert!(status.success(), "{out}{stderr}");
    let chosen: Vec<String> = out
        .lines()
        .filter(|line| line.starts_with("  "))
        .map(|line| line.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(chosen.len(), 2, "{out}");
    assert!(chosen.iter().all(|id| web.contains(id)), "{out}");
    let campaign = out.lines().last().unwrap().to_owned();

    let waiter = {
        let (dir, campaign) = (dir.clone(), campaign.clone());
        std::thread::spawn(move || {
            mandrill(
                &dir,
                &[
                    "wait",
                    &campaign,
                    "--timeout",
                    "120s",
                    "--config",
                    "mandrill.toml",
                ],
                ENV,
            )
        })
    };
    run_until_idle(&dir);
    let (status, waited, stderr) = waiter.join().unwrap();
    assert_eq!(status.code(), Some(0), "{waited}{stderr}");
    assert!(waited.ends_with("verdict: succeeded\n"), "{waited}");
    for id in &chosen {
        let rebooted = entry(&db, id);
        assert_eq!(rebooted.status, Status::Restarted, "{rebooted:?}");
        assert_eq!(rebooted.requested_by.as_deref(), Some("chaos"));
        assert!(rebooted.recovered_after.is_some(), "{rebooted:?}");
    }
    assert_eq!(history(&db).len(), 2);
}

/// With moto checking signatures and IAM policies: keys read from a
/// profile of the shared credentials file sign calls moto accepts (the
/// inventory reads), and a permission the policy lacks fails the reboot
/// once, permanently, with AWS's code; the secret is never logged.
#[test]
fn a_profile_from_the_credentials_file_signs_and_a_missing_permission_fails_once_with_its_code() {
    // Five unchecked calls: the two that launch the instance, the three
    // that make the user.
    let moto = Moto::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "5")]);
    let instance =
        ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes", "chaos-group=web"])).remove(0);
    let keys = moto.fleet(&[
        "user",
        "chaos",
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceStatus",
    ]);
    let (id, secret) = (
        keys["id"].as_str().unwrap(),
        keys["secret"].as_str().unwrap(),
    );
    let (_guard, dir) = temp_dir();
    let credentials = dir.join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = AKIDNOTTHISONE\naws_secret_access_key = wrong\n\n\
             [chaos]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n"
        ),
    )
    .unwrap();
    let credentials = credentials.display().to_string();
    let home = dir.display().to_string();
    let env = [
        ("AWS_ACCESS_KEY_ID", ""),
        ("AWS_SECRET_ACCESS_KEY", ""),
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.as_str()),
        ("AWS_PROFILE", "chaos"),
        ("AWS_REGION", services::moto::REGION),
        ("HOME", home.as_str()),
    ];
    let db = config(
        &dir,
        &moto.endpoint(),
        "reboot",
        &inventory(&moto.endpoint()),
    );

    let (status, stdout, stderr) = mandrill(
        &dir,
        &["inventory", "--json", "--config", "mandrill.toml"],
        &env,
    );
    assert!(status.success(), "inventory failed: {stderr}");
    assert!(stdout.contains(&instance), "{stdout}");

    publish(&dir, &db, &[&instance]);
    let service = Mandrill::run_with_env(
        &dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
        &env,
    );
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let log = serde_json::to_string(&lines).unwrap();
    assert!(!log.contains(secret), "the secret is logged");
    let refused = entry(&db, &instance);
    assert_eq!(refused.status, Status::Failed, "{refused:?}");
    assert_eq!(refused.attempts, 1, "a missing permission is not retried");
    let error = refused.last_error.unwrap_or_default();
    // moto's code for it; AWS's EC2 answers UnauthorizedOperation.
    assert!(error.contains("AccessDenied"), "{error}");
    assert!(error.contains("ec2:RebootInstances"), "{error}");
}

/// An environment in which the chain finds no keys: no key variables, no
/// profile, shared files that do not exist; `more` added.
fn without_keys(dir: &Path, more: &[(&str, &str)]) -> Vec<(String, String)> {
    let absent = |name: &str| dir.join(name).display().to_string();
    let mut env: Vec<(String, String)> = [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ROLE_SESSION_NAME",
        "AWS_ENDPOINT_URL_STS",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
        "AWS_EC2_METADATA_DISABLED",
    ]
    .iter()
    .map(|name| ((*name).to_owned(), String::new()))
    .collect();
    env.extend([
        ("HOME".to_owned(), absent("no-home")),
        (
            "AWS_SHARED_CREDENTIALS_FILE".to_owned(),
            absent("no-credentials"),
        ),
        ("AWS_CONFIG_FILE".to_owned(), absent("no-config")),
        ("AWS_REGION".to_owned(), services::moto::REGION.to_owned()),
    ]);
    env.extend(more.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    env
}

/// Lists the fleet and reboots an instance with the credentials the
/// chain finds in `env`; all that both commands wrote to standard error,
/// and the service's log lines.
fn inventory_and_reboot(moto: &Moto, env: &[(String, String)]) -> (String, Vec<Value>) {
    let instance =
        ids(&moto.fleet(&["run", "us-east-1a", "1", "chaos=yes", "chaos-group=web"])).remove(0);
    let (_guard, dir) = temp_dir();
    let db = config(
        &dir,
        &moto.endpoint(),
        "reboot",
        &inventory(&moto.endpoint()),
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (status, stdout, stderr) = mandrill(
        &dir,
        &["inventory", "--json", "--config", "mandrill.toml"],
        &env,
    );
    assert!(status.success(), "inventory failed: {stderr}");
    assert!(stdout.contains(&instance), "{stdout}");

    publish(&dir, &db, &[&instance]);
    let service = Mandrill::run_with_env(
        &dir,
        &["--config", "mandrill.toml", "--until-idle", "--unleash"],
        &env,
    );
    let (status, lines) = service.wait_exit();
    let raw = serde_json::to_string(&lines).unwrap();
    assert!(status.success(), "run failed: {raw}");
    let rebooted = entry(&db, &instance);
    assert_eq!(rebooted.status, Status::Restarted, "{rebooted:?}");
    assert!(rebooted.recovered_after.is_some(), "{rebooted:?}");
    (format!("{stderr}\n{raw}"), lines)
}

/// The source each `aws credentials fetched` line names.
fn fetched_from(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|line| line["fields"]["message"] == "aws credentials fetched")
        .map(|line| line["fields"]["source"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// On an instance with a role and nothing else: the keys and session
/// token come from the instance metadata service (IMDSv2, moto's), sign
/// the inventory and the reboot, and are never logged.
#[test]
fn on_an_instance_with_a_role_the_keys_come_from_the_instance_metadata_service_unlogged() {
    let moto = Moto::start();
    let (_guard, home) = temp_dir();
    let env = without_keys(
        &home,
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &moto.endpoint())],
    );

    let (log, lines) = inventory_and_reboot(&moto, &env);

    // Once for the whole run (start-up check, inventory, reboot, probe):
    // cached until shortly before they expire.
    let sources = fetched_from(&lines);
    assert_eq!(sources.len(), 1, "{log}");
    assert!(
        sources.iter().all(|s| s == "instance metadata"),
        "{sources:?}"
    );
    for secret in ["test-session-token", "test-secret-key"] {
        assert!(!log.contains(secret), "{secret} is logged");
    }
}

/// On EKS with a service account's role: the token file is exchanged
/// with STS (moto's, through `AWS_ENDPOINT_URL_STS`) for keys that sign
/// the inventory and the reboot; the metadata service is not asked (it is
/// disabled), and neither the token nor the keys are logged.
#[test]
fn with_a_web_identity_token_the_role_is_assumed_through_sts_and_nothing_secret_is_logged() {
    let moto = Moto::start();
    let (_guard, home) = temp_dir();
    let token_file = home.join("token");
    std::fs::write(&token_file, "web-identity-token-not-to-log\n").unwrap();
    let token_file = token_file.display().to_string();
    let env = without_keys(
        &home,
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file),
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/chaos"),
            ("AWS_ENDPOINT_URL_STS", &moto.endpoint()),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
    );

    let (log, lines) = inventory_and_reboot(&moto, &env);

    // Once for the whole run (start-up check, inventory, reboot, probe):
    // cached until shortly before they expire.
    let sources = fetched_from(&lines);
    assert_eq!(sources.len(), 1, "{log}");
    assert_eq!(sources[0], "web identity");
    // moto's session tokens all start so.
    for secret in ["web-identity-token-not-to-log", "FQoGZXIvYXdz"] {
        assert!(!log.contains(secret), "{secret} is logged");
    }
}

/// With no source at all, start-up fails as a configuration error
/// (exit 2) naming every source tried; with a metadata service that does
/// not answer (not on EC2), it fails at once naming it.
#[test]
fn without_any_source_of_credentials_start_up_fails_naming_every_source_tried() {
    let (_guard, dir) = temp_dir();
    config(&dir, "http://127.0.0.1:9", "reboot", "");
    let env = without_keys(&dir, &[("AWS_EC2_METADATA_DISABLED", "true")]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (status, _, stderr) = mandrill(&dir, &["run", "--config", "mandrill.toml"], &env);
    assert_eq!(status.code(), Some(2), "{stderr}");
    for source in [
        "restarter.ec2",
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "profile \"default\"",
        "no-credentials, absent",
        "no-config, absent",
        "instance metadata service (disabled by AWS_EC2_METADATA_DISABLED)",
    ] {
        assert!(stderr.contains(source), "{source} not named: {stderr}");
    }

    // Port 9 (discard) on loopback: nothing listens, as off EC2.
    let env = without_keys(
        &dir,
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")],
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (status, _, stderr) = mandrill(&dir, &["run", "--config", "mandrill.toml"], &env);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the instance metadata service at http://127.0.0.1:9/")
            && stderr.contains("not on EC2?"),
        "{stderr}"
    );
}
