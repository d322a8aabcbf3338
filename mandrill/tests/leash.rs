//! The leash through the real binary (issue 37, "one truth for the
//! leash"): a routine SIGHUP never turns it; `mandrill leash` holds every
//! instance sharing the store from its next claim, with who, why and when
//! in `mandrill status`; `mandrill unleash --reason` lets them act.

mod services;
mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use mandrill::Status;
use serde_json::Value;
use services::{Database, NatsNames, nats_server};
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

/// The production pattern's `[safety]` (the README's, before issue 37:
/// `dry_run = true` kept in the file, the service started with
/// `--unleash`), on the command backend over one SQLite file, with a
/// calendar open at all times (these tests must not depend on the day).
fn write_config(dir: &Path, group_max: u32) {
    let db = sqlite_url(dir);
    let urls = format!("[broker]\nurl = {db:?}\n\n[store]\nurl = {db:?}\n\n");
    write_config_with(dir, &urls, group_max);
}

/// As [`write_config`], the broker and the store given by `urls` (or by
/// flags, with `urls` empty).
fn write_config_with(dir: &Path, urls: &str, group_max: u32) {
    fs::write(
        dir.join("mandrill.toml"),
        format!(
            "{urls}[restarter]\nkind = \"command\"\n\n[restarter.command]\nargv = [\"true\"]\n\n\
             [safety]\ndry_run = true\nallow = [\"cattle-*\"]\nrequire_signed = false\n\n\
             [safety.rate]\ngroup_max = {group_max}\n\n\
             [safety.budget]\nmax_disrupted = 10\n\n\
             [safety.calendar]\n\
             weekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
             hours = [\"00:00-24:00\"]\n"
        ),
    )
    .unwrap();
}

fn publish(dir: &Path, names: &[&str]) {
    let db = sqlite_url(dir);
    let mut args = vec!["publish", "--broker", &db];
    args.extend(names);
    let (status, _, stderr) = mandrill(dir, &args, &[]);
    assert!(status.success(), "publish failed: {stderr}");
}

/// Waits until every one of `names` has a final status in the SQLite
/// store in `dir`; returns them.
fn finished(dir: &Path, names: &[&str]) -> Vec<Status> {
    finished_in(&sqlite_url(dir), names)
}

/// As [`finished`], in the store at `url`.
fn finished_in(url: &str, names: &[&str]) -> Vec<Status> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let entries = history(url);
        let statuses: Vec<Option<Status>> = names
            .iter()
            .map(|name| {
                entries
                    .iter()
                    .find(|e| e.instance_name.as_deref() == Some(name))
                    .map(|e| e.status)
                    .filter(|status| status.is_final())
            })
            .collect();
        if statuses.iter().all(Option::is_some) {
            return statuses.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "{names:?} not all finished: {entries:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The trap an SRE walked into on a game day: the file keeps `dry_run =
/// true`, the service runs `--unleash`; raising `group_max` and sending
/// SIGHUP leashed it ("the stricter wins"), and the campaign's targets were
/// recorded as dry runs. Now a reload turns the leash only when the file's
/// own `safety.dry_run` changed: this one does not, says so, and the next
/// request is restarted for real.
#[test]
fn a_routine_reload_keeps_the_leash_as_it_runs_and_a_request_restarts_for_real() {
    let (_guard, dir) = temp_dir();
    write_config(&dir, 1);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml", "--unleash"]);
    service.wait_for("UNLEASHED: restarts of real hosts will be issued", 1);

    write_config(&dir, 2);
    service.signal("HUP");
    let unchanged = service.wait_for(
        "the leash is unchanged by this reload: the configuration file's own safety.dry_run \
         did not change",
        1,
    );
    assert_eq!(unchanged[0]["fields"]["leashed"], false, "{unchanged:?}");
    assert!(
        unchanged[0]["fields"]["by"]
            .as_str()
            .unwrap()
            .contains("--unleash"),
        "{unchanged:?}"
    );
    service.wait_for("configuration reloaded", 1);

    publish(&dir, &["cattle-ab12"]);
    assert_eq!(finished(&dir, &["cattle-ab12"]), [Status::Restarted]);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success());
    let turned = lines.iter().any(|line| {
        line["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("LEASHED"))
    });
    assert!(!turned, "nothing leashed the service");
}

/// `mandrill leash` is one word every instance sharing the store obeys,
/// whatever each was started with (both here with `--unleash`): the claim
/// reads it in its own transaction, so requests published right after it
/// returned are recorded as dry runs on both instances, before either has
/// polled it; each then says so, and `mandrill status` shows who, why and
/// when, for the store and for each instance. `mandrill unleash` needs a
/// reason, and lets them act again.
#[test]
fn an_operators_leash_holds_every_instance_on_one_sqlite_store_until_unleashed() {
    let (_guard, dir) = temp_dir();
    let db = sqlite_url(&dir);
    write_config(&dir, 10);
    let args = ["--config", "mandrill.toml", "--unleash"];
    let instances = [Mandrill::run(&dir, &args), Mandrill::run(&dir, &args)];
    for instance in &instances {
        instance.wait_for("UNLEASHED: restarts of real hosts will be issued", 1);
    }

    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "leash",
            "--db",
            &db,
            "--by",
            "ana",
            "--reason",
            "game day over",
        ],
        &[],
    );
    assert!(status.success(), "leash failed: {stderr}");
    assert!(
        stdout.starts_with("leashed by ana (game day over): every instance using this store"),
        "{stdout}"
    );
    let leashed = [
        "cattle-0001",
        "cattle-0002",
        "cattle-0003",
        "cattle-0004",
        "cattle-0005",
        "cattle-0006",
    ];
    publish(&dir, &leashed);
    assert!(
        finished(&dir, &leashed)
            .iter()
            .all(|status| *status == Status::DryRun),
        "{:?}",
        history(&db)
    );
    for instance in &instances {
        let said = instance.wait_for(
            "LEASHED (dry run) by the leash recorded in the store: every instance sharing it \
             records restarts as dry runs, none is issued",
            1,
        );
        assert_eq!(said[0]["fields"]["by"], "ana");
        assert_eq!(said[0]["fields"]["reason"], "game day over");
    }

    let (status, stdout, stderr) = mandrill(&dir, &["status", "--db", &db, "--json"], &[]);
    assert!(status.success(), "status failed: {stderr}");
    let status: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(status["leash"]["leashed"], true, "{status}");
    assert_eq!(status["leash"]["by"], "ana", "{status}");
    assert_eq!(status["leash"]["reason"], "game day over", "{status}");
    assert!(status["leash"]["since"].is_string(), "{status}");
    assert_eq!(status["mode"], "leashed (dry run)", "{status}");
    let running = status["instances"].as_array().unwrap();
    assert_eq!(running.len(), 2, "{status}");
    for instance in running {
        assert_eq!(instance["leash"]["by"], "ana", "{status}");
        assert_eq!(instance["leash"]["reason"], "game day over", "{status}");
        assert_eq!(instance["leash"]["from"], "store", "{status}");
    }
    let (_, text, _) = mandrill(&dir, &["status", "--db", &db], &[]);
    assert!(
        text.contains("leash:     LEASHED by ana (game day over) since "),
        "{text}"
    );

    // Unleashing needs a reason: clap refuses without one (exit code 2).
    let (status, _, stderr) = mandrill(&dir, &["unleash", "--db", &db], &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    let (status, stdout, stderr) = mandrill(
        &dir,
        &[
            "unleash",
            "--db",
            &db,
            "--by",
            "bob",
            "--reason",
            "game day 2, ticket 12",
        ],
        &[],
    );
    assert!(status.success(), "unleash failed: {stderr}");
    assert!(
        stdout.contains("it was leashed by ana (game day over) since"),
        "{stdout}"
    );
    publish(&dir, &["cattle-0007"]);
    assert_eq!(finished(&dir, &["cattle-0007"]), [Status::Restarted]);
    for instance in instances {
        instance.signal("TERM");
        assert!(instance.wait_exit().0.success());
    }
}

/// The same on the production stack: three instances on one NATS stream
/// and one PostgreSQL database, each started with `--unleash`. Requests
/// published right after `mandrill leash` returned are dry runs on every
/// instance (PostgreSQL: the claim reads the leash under the share lock
/// that `set_leash`'s update waits for); after `mandrill unleash` they act.
#[test]
fn an_operators_leash_holds_three_instances_on_nats_and_postgres() {
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    write_config_with(&dir, "", 50);
    let mut args = vec![
        "--config".to_owned(),
        "mandrill.toml".into(),
        "--broker".into(),
        names.url.clone(),
        "--db".into(),
        db.url.clone(),
        "--unleash".into(),
    ];
    args.extend(names.flags());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let instances: Vec<Mandrill> = (0..3).map(|_| Mandrill::run(&dir, &args)).collect();
    for instance in &instances {
        instance.wait_for("UNLEASHED: restarts of real hosts will be issued", 1);
    }
    let publish = |hosts: &[&str]| {
        let mut publish = vec!["publish".to_owned(), "--broker".into(), names.url.clone()];
        publish.extend(names.flags());
        publish.extend(hosts.iter().map(|host| (*host).to_owned()));
        let publish: Vec<&str> = publish.iter().map(String::as_str).collect();
        let (status, _, stderr) = mandrill(&dir, &publish, &[]);
        assert!(status.success(), "publish failed: {stderr}");
    };

    let (status, _, stderr) = mandrill(
        &dir,
        &["leash", "--db", &db.url, "--by", "ana", "--reason", "done"],
        &[],
    );
    assert!(status.success(), "leash failed: {stderr}");
    let leashed: Vec<String> = (1..=12).map(|n| format!("cattle-{n:04}")).collect();
    let leashed: Vec<&str> = leashed.iter().map(String::as_str).collect();
    publish(&leashed);
    let statuses = finished_in(&db.url, &leashed);
    assert!(
        statuses.iter().all(|status| *status == Status::DryRun),
        "{statuses:?}: {:?}",
        history(&db.url)
    );
    for instance in &instances {
        instance.wait_for(
            "LEASHED (dry run) by the leash recorded in the store: every instance sharing it \
             records restarts as dry runs, none is issued",
            1,
        );
    }

    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "unleash", "--db", &db.url, "--by", "bob", "--reason", "again",
        ],
        &[],
    );
    assert!(status.success(), "unleash failed: {stderr}");
    publish(&["cattle-0100"]);
    assert_eq!(finished_in(&db.url, &["cattle-0100"]), [Status::Restarted]);
    for instance in instances {
        instance.signal("TERM");
        assert!(instance.wait_exit().0.success());
    }
}
