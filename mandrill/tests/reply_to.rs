//! Reply destinations: a request may name a `reply_to`, and its final
//! verdict is published there, only where the operator's
//! `broker.reply_to_allowed` patterns admit it. The real binary, the real
//! NATS server of this machine.

mod services;
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use services::{NatsNames, nats_server};
use support::{DEADLINE, Mandrill, history, mandrill, sqlite_url, temp_dir};

fn flags(names: &NatsNames) -> Vec<String> {
    let mut args = vec!["--broker".to_owned(), names.url.clone()];
    args.extend(names.flags());
    args
}

#[test]
fn a_verdict_is_published_on_an_allowed_reply_subject_and_only_there() {
    let (_guard, dir) = temp_dir();
    let names = NatsNames::new(&nats_server());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (allowed, refused) = (
        format!("verdicts.{id}.team-a"),
        format!("verdicts.{id}.elsewhere"),
    );
    std::fs::write(
        dir.join("mandrill.toml"),
        format!(
            "[broker]\nreply_to_allowed = [\"verdicts.{id}.team-*\"]\n\
             [store]\nurl = \"{}\"\n[restarter]\nfailure_rate = 0.0\n",
            sqlite_url(&dir)
        ),
    )
    .unwrap();
    let (heard, refused_id) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    std::fs::write(
        dir.join("requests.jsonl"),
        format!(
            "{{\"message_id\":\"{heard}\",\"instance_name\":\"cattle-ab12\",\"reply_to\":\"{allowed}\"}}\n\
             {{\"message_id\":\"{refused_id}\",\"instance_name\":\"cattle-cd34\",\"reply_to\":\"{refused}\"}}\n"
        ),
    )
    .unwrap();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Subscribed before anything is published: everything on the test's
    // subjects is heard.
    let (client, mut verdicts) = runtime.block_on(async {
        let client = async_nats::connect(names.url.as_str()).await.unwrap();
        let verdicts = client.subscribe(format!("verdicts.{id}.>")).await.unwrap();
        client.flush().await.unwrap();
        (client, verdicts)
    });

    let mut publish = vec![
        "publish",
        "--config",
        "mandrill.toml",
        "--file",
        "requests.jsonl",
    ];
    let flags = flags(&names);
    publish.extend(flags.iter().map(String::as_str));
    // publish refuses the destination the configuration does not allow,
    // as the service would deny it, before publishing either...
    let (status, stdout, stderr) = mandrill(&dir, &publish, &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("requests.jsonl:2: the service would deny it: denied by reply_to")
            && !stderr.contains("requests.jsonl:1:"),
        "{stderr}"
    );
    // ...and --unchecked publishes both, for the service to decide.
    publish.push("--unchecked");
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "publish failed: {stderr}");

    let mut run = vec!["--config", "mandrill.toml"];
    run.extend(flags.iter().map(String::as_str));
    let service = Mandrill::run(&dir, &run);
    service.wait_for("verdict published", 1);
    service.wait_for("denied", 1);
    service.wait_for("verdict not published", 1);
    service.signal("TERM");
    let (status, lines) = service.wait_exit();
    assert!(status.success(), "exit status {status}");
    let published: Vec<&Value> = lines
        .iter()
        .filter(|line| line["fields"]["message"] == "verdict published")
        .collect();
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0]["fields"]["destination"], allowed.as_str());

    // The service flushed each verdict before logging it; a round trip on
    // this connection now delivers everything routed to it before.
    let heard_verdicts: Vec<async_nats::Message> = runtime.block_on(async {
        client.flush().await.unwrap();
        let mut heard = Vec::new();
        let until = Instant::now() + DEADLINE;
        while heard.is_empty() && Instant::now() < until {
            if let Ok(Some(message)) =
                tokio::time::timeout(Duration::from_millis(100), verdicts.next()).await
            {
                heard.push(message);
            }
        }
        // Anything else already delivered is taken too.
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(1), verdicts.next()).await
        {
            heard.push(message);
        }
        heard
    });
    assert_eq!(heard_verdicts.len(), 1, "{heard_verdicts:?}");
    assert_eq!(heard_verdicts[0].subject.as_str(), allowed);
    let verdict: Value = serde_json::from_slice(&heard_verdicts[0].payload).unwrap();
    assert_eq!(verdict["message_id"], heard.to_string());
    assert_eq!(verdict["status"], "restarted");
    assert!(
        verdict["host"]
            .as_str()
            .is_some_and(|host| host.starts_with("cattle-ab12")),
        "{verdict}"
    );
    assert!(
        verdict["at"]
            .as_str()
            .is_some_and(|at| at.parse::<jiff::Timestamp>().is_ok())
    );

    // The refused one is recorded denied, saying why; nothing was restarted.
    let entries = history(&sqlite_url(&dir));
    let denied = entries
        .iter()
        .find(|entry| entry.message_id == Some(refused_id))
        .expect("the refused request is recorded");
    assert_eq!(denied.status, mandrill::Status::Denied);
    let why = denied.last_error.as_deref().unwrap_or_default();
    assert!(
        why.contains("denied by reply_to") && why.contains(&refused),
        "{why}"
    );
    let restarted = entries
        .iter()
        .find(|entry| entry.message_id == Some(heard))
        .expect("the heard request is recorded");
    assert_eq!(restarted.status, mandrill::Status::Restarted);
}

#[test]
fn reply_patterns_on_a_broker_that_cannot_carry_a_reply_fail_start_up() {
    let (_guard, dir) = temp_dir();
    std::fs::write(
        dir.join("mandrill.toml"),
        "[broker]\nurl = \"sqlite:queue.db\"\nreply_to_allowed = [\"verdicts.*\"]\n",
    )
    .unwrap();
    let (status, _, stderr) = mandrill(&dir, &["run", "--config", "mandrill.toml"], &[]);
    assert!(!status.success());
    assert!(stderr.contains("broker.reply_to_allowed"), "{stderr}");
    assert!(
        stderr.contains("cannot carry a reply") || stderr.contains("only NATS and Pub/Sub"),
        "{stderr}"
    );
}

#[test]
fn a_pattern_that_admits_the_request_subject_fails_start_up() {
    let (_guard, dir) = temp_dir();
    let names = NatsNames::new(&nats_server());
    std::fs::write(
        dir.join("mandrill.toml"),
        "[broker]\nreply_to_allowed = [\"mandrill.*\"]\n",
    )
    .unwrap();
    let mut run = vec!["run", "--config", "mandrill.toml"];
    let flags = flags(&names);
    run.extend(flags.iter().map(String::as_str));
    let (status, _, stderr) = mandrill(&dir, &run, &[]);
    assert!(!status.success());
    assert!(stderr.contains("broker.reply_to_allowed"), "{stderr}");
    assert!(
        stderr.contains("a verdict must never be published there"),
        "{stderr}"
    );
}

/// A reload that narrows `broker.reply_to_allowed` is in force for the
/// next request: a destination the operator revoked is refused.
#[test]
fn a_reload_that_revokes_a_reply_destination_refuses_it() {
    let (_guard, dir) = temp_dir();
    let names = NatsNames::new(&nats_server());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let config = |allowed: &str| {
        format!(
            "[broker]\nreply_to_allowed = [{allowed}]\n\
             [store]\nurl = \"{}\"\n[restarter]\nfailure_rate = 0.0\n",
            sqlite_url(&dir)
        )
    };
    std::fs::write(
        dir.join("mandrill.toml"),
        config(&format!("\"verdicts.{id}.*\"")),
    )
    .unwrap();
    let flags = flags(&names);
    let mut run = vec!["--config", "mandrill.toml"];
    run.extend(flags.iter().map(String::as_str));
    let service = Mandrill::run(&dir, &run);
    service.wait_for("mandrill started", 1);
    std::fs::write(dir.join("mandrill.toml"), config("")).unwrap();
    service.signal("HUP");
    service.wait_for("configuration reloaded", 1);

    let request = uuid::Uuid::new_v4();
    std::fs::write(
        dir.join("requests.jsonl"),
        format!(
            "{{\"message_id\":\"{request}\",\"instance_name\":\"cattle-ab12\",\"reply_to\":\"verdicts.{id}.a\"}}\n"
        ),
    )
    .unwrap();
    let mut publish = vec![
        "publish",
        "--config",
        "mandrill.toml",
        "--file",
        "requests.jsonl",
        "--unchecked",
    ];
    publish.extend(flags.iter().map(String::as_str));
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "publish failed: {stderr}");
    service.wait_for("denied", 1);
    service.signal("TERM");
    assert!(service.wait_exit().0.success());
    let entry = history(&sqlite_url(&dir))
        .into_iter()
        .find(|entry| entry.message_id == Some(request))
        .expect("the request is recorded");
    assert_eq!(entry.status, mandrill::Status::Denied);
    let why = entry.last_error.unwrap_or_default();
    assert!(why.contains("denied by reply_to"), "{why}");
}
