//! `mandrill publish` knows what it sent, through the real binary on real
//! SQLite: it prints each request's id and host (what `wait` and `explain`
//! take), or JSON objects; with the service's configuration it refuses,
//! before publishing anything, what the service would reject; `--reply-to`
//! travels inside the signed claims. (Tokens signed by PyJWT, expired or
//! by unknown requesters, are refused in `tests/requesters.rs`.)

mod services;
mod support;

use std::fs;
use std::path::Path;

use base64::Engine as _;
use serde_json::Value;
use services::{NatsNames, nats_server};
use support::{mandrill, queue_len, queue_rows, sqlite_url, temp_dir};

/// A configuration on the SQLite queue and store in `dir`: `backend` (TOML
/// for `[restarter]`), alice a requester with the key `mandrill keygen`
/// made, and `extra` (TOML, top-level keys first).
fn write_config(dir: &Path, backend: &str, extra: &str) {
    let db = sqlite_url(dir);
    fs::write(
        dir.join("mandrill.toml"),
        format!(
            "{extra}\n[store]\nurl = {db:?}\n{backend}\n\
             [safety]\ndry_run = false\nallow = [\"cattle-*\"]\n\
             [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
             hours = [\"00:00-24:00\"]\n\
             [[requesters]]\nname = \"alice\"\npublic_key_file = \"alice.pub\"\nallow = [\"cattle-*\"]\n"
        ),
    )
    .unwrap();
}

fn broker(dir: &Path) -> String {
    format!("[broker]\nurl = {:?}\n", sqlite_url(dir))
}

const COMMAND: &str = "[restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"true\", \"{instance_name}\"]\n";
const SIMULATE: &str =
    "[restarter]\nkind = \"simulate\"\nfailure_rate = 0.0\nmax_latency = \"5ms\"\n";

fn keygen(dir: &Path, name: &str) {
    let (status, _, stderr) = mandrill(dir, &["keygen", name], &[]);
    assert!(status.success(), "{stderr}");
}

fn publish(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let mut all = vec!["publish", "--config", "mandrill.toml"];
    all.extend_from_slice(args);
    mandrill(dir, &all, &[])
}

/// A signed request as the service (and here publish) would never accept:
/// exit 2 naming why, nothing printed and nothing in the queue.
#[test]
fn publish_refuses_what_the_service_would_reject_before_publishing_anything() {
    let (_guard, dir) = temp_dir();
    keygen(&dir, "alice");
    keygen(&dir, "bob");
    // A real backend: a signature is required.
    write_config(&dir, COMMAND, &broker(&dir));
    let cases: [(&[&str], &str); 4] = [
        (
            &["cattle-1", "cattle-2"],
            "unsigned: a signature is required (safety.require_signed)",
        ),
        (
            &["--as", "alice", "--key-file", "bob.key", "cattle-1"],
            "the signature does not verify with requester alice's key",
        ),
        (
            &["--as", "nobody", "--key-file", "bob.key", "cattle-1"],
            "unknown requester \"nobody\"",
        ),
        (
            &[
                "--as",
                "alice",
                "--key-file",
                "alice.key",
                "--reply-to",
                "a.b",
                "cattle-1",
            ],
            "denied by reply_to: the request asks for its verdict on \"a.b\"",
        ),
    ];
    for (args, why) in cases {
        let (status, stdout, stderr) = publish(&dir, args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(
            stderr.contains("nothing was published (1 refusal)") && stderr.contains(why),
            "{args:?}: {stderr}"
        );
        assert_eq!(queue_len(&sqlite_url(&dir)), 0, "{args:?}: published");
    }
    // Refused first, whatever else is valid: one bad line keeps the rest.
    let (status, _, stderr) = publish(
        &dir,
        &[
            "--as",
            "alice",
            "--key-file",
            "alice.key",
            "cattle-1",
            "Cattle_2",
        ],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(queue_len(&sqlite_url(&dir)), 0);

    // Signed now and sent at --rate: the last would be sent 200 s later,
    // its token expired after 60 s.
    let (status, _, stderr) = publish(
        &dir,
        &[
            "--as",
            "alice",
            "--key-file",
            "alice.key",
            "--ttl",
            "1m",
            "--rate",
            "0.01",
            "cattle-1",
            "cattle-2",
            "cattle-3",
        ],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--ttl 1m has expired its token"),
        "{stderr}"
    );
    assert_eq!(queue_len(&sqlite_url(&dir)), 0);

    // The requester's own key: published, each printed.
    let (status, stdout, stderr) = publish(
        &dir,
        &[
            "--as",
            "alice",
            "--key-file",
            "alice.key",
            "cattle-1",
            "cattle-2",
        ],
    );
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(stderr.contains("published 2 requests"), "{stderr}");
    assert_eq!(queue_len(&sqlite_url(&dir)), 2);
    // --unchecked publishes what the service will refuse, to test it.
    let (status, stdout, stderr) = publish(&dir, &["--unchecked", "cattle-3"]);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert_eq!(queue_len(&sqlite_url(&dir)), 3);
}

/// What publish prints is what `wait` and `explain` take: the id alone,
/// the line as one argument, or as two.
#[test]
fn the_ids_publish_prints_are_what_wait_and_explain_take() {
    let (_guard, dir) = temp_dir();
    keygen(&dir, "alice");
    write_config(&dir, SIMULATE, &broker(&dir));
    let db = sqlite_url(&dir);
    let (status, stdout, stderr) = publish(&dir, &["cattle-1", "cattle-2"]);
    assert!(status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].ends_with(" cattle-1.example.net"), "{stdout}");
    assert!(lines[1].ends_with(" cattle-2.example.net"), "{stdout}");
    // The printed ids are the queued requests' ids.
    let queued: Vec<String> = queue_rows(&db)
        .iter()
        .map(|row| {
            let wire: Value = serde_json::from_slice(&row.payload).unwrap();
            wire["message_id"].as_str().unwrap().to_owned()
        })
        .collect();
    let printed: Vec<&str> = lines
        .iter()
        .map(|line| line.split(' ').next().unwrap())
        .collect();
    assert_eq!(printed, queued);

    let (status, lines_out) =
        support::Mandrill::run(&dir, &["--config", "mandrill.toml", "--until-idle"]).wait_exit();
    assert!(status.success(), "{lines_out:?}");
    let (id, host) = lines[0].split_once(' ').unwrap();
    for args in [vec![id], vec![lines[0]], vec![id, host]] {
        let mut wait = vec!["wait", "--config", "mandrill.toml", "--timeout", "30s"];
        wait.extend(&args);
        let (status, out, err) = mandrill(&dir, &wait, &[]);
        assert_eq!(status.code(), Some(0), "wait {args:?}: {out} {err}");
        assert!(out.contains("verdict: succeeded"), "{out}");
        let mut explain = vec!["explain", "--config", "mandrill.toml"];
        explain.extend(&args);
        let (status, out, err) = mandrill(&dir, &explain, &[]);
        assert!(status.success(), "explain {args:?}: {err}");
        assert!(
            out.contains("instance cattle-1 (cattle-1.example.net)"),
            "{out}"
        );
    }
    // A host that is not the request's is named, not ignored.
    let (status, _, err) = mandrill(
        &dir,
        &[
            "explain",
            "--config",
            "mandrill.toml",
            id,
            "cattle-2.example.net",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("recorded for host cattle-1.example.net, not cattle-2.example.net"),
        "{err}"
    );
}

/// `--json`: one object per request; `--reply-to` inside the signed
/// claims (on NATS, which can carry a reply: `broker.reply_to_allowed`
/// admits it), and refused for a line that says its own.
#[test]
fn json_output_and_reply_to_inside_the_signed_claims() {
    use futures::StreamExt as _;

    let (_guard, dir) = temp_dir();
    keygen(&dir, "alice");
    let names = NatsNames::new(&nats_server());
    write_config(
        &dir,
        SIMULATE,
        &format!(
            "[broker]\nurl = {:?}\nreply_to_allowed = [\"verdicts.*\"]\n",
            names.url
        ),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Subscribed before publishing: the stream's subject is heard too.
    let (_client, mut heard) = runtime.block_on(async {
        let client = async_nats::connect(names.url.as_str()).await.unwrap();
        let heard = client.subscribe(names.subject().to_owned()).await.unwrap();
        client.flush().await.unwrap();
        (client, heard)
    });
    let mut args = vec![
        "--as",
        "alice",
        "--key-file",
        "alice.key",
        "--reply-to",
        "verdicts.team-a",
        "--json",
        "cattle-1",
    ];
    let flags = names.flags();
    args.extend(flags.iter().map(String::as_str));
    let (status, stdout, stderr) = publish(&dir, &args);
    assert!(status.success(), "{stderr}");
    let objects: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(objects.len(), 1, "{stdout}");
    let sent = &objects[0];
    assert_eq!(sent["instance_name"], "cattle-1", "{sent}");
    assert_eq!(sent["host"], "cattle-1.example.net", "{sent}");
    assert_eq!(sent["requester"], "alice", "{sent}");
    assert_eq!(sent["signed"], true, "{sent}");
    assert_eq!(sent["reply_to"], "verdicts.team-a", "{sent}");
    // On the subject: a token whose signed claims carry the reply_to.
    let message = runtime
        .block_on(async { tokio::time::timeout(support::DEADLINE, heard.next()).await })
        .expect("the request is heard on the subject")
        .unwrap();
    let token = String::from_utf8(message.payload.to_vec()).unwrap();
    let claims = token.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["reply_to"], "verdicts.team-a", "{claims}");
    assert_eq!(claims["message_id"], sent["message_id"], "{claims}");
    assert_eq!(claims["iss"], "alice", "{claims}");

    // A JSON line says its own reply_to: --reply-to does not apply to it.
    fs::write(
        dir.join("requests.jsonl"),
        format!(
            "{{\"message_id\":\"{}\",\"instance_name\":\"cattle-2\"}}\n",
            uuid::Uuid::new_v4()
        ),
    )
    .unwrap();
    let mut args = vec!["--reply-to", "verdicts.team-a", "--file", "requests.jsonl"];
    args.extend(flags.iter().map(String::as_str));
    let (status, _, stderr) = publish(&dir, &args);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("requests.jsonl:1: --reply-to applies"),
        "{stderr}"
    );
}
