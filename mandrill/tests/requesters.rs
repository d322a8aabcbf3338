//! Verified requesters through the real binary on real SQLite: JWTs made by
//! PyJWT (a real, independent implementation) with keys made by `mandrill
//! keygen` and by Python's `cryptography`, published with `mandrill publish
//! --file` (or signed by `mandrill publish --as`), then handled by `mandrill
//! run`. Needs python3 with `jwt` and `cryptography` (`.ci/run` installs
//! them).

mod services;
mod support;

use std::fs;
use std::path::Path;
use std::process::Command;

use mandrill::HistoryEntry;
use mandrill::Status;
use services::{Database, NatsNames, nats_server};
use support::{
    Mandrill, history, mandrill, queue_rows, sqlite_url, temp_dir, until_both_deferred,
    wait_for_deferrals,
};

/// Signs one token with PyJWT. `spec` is JSON: `key` (a private key PEM
/// file, or for `HS256-public` the public key used as an HMAC secret),
/// `alg`, `iss`, `instance`; optional `ttl` (seconds, may be negative),
/// `message_id`, `jti`, `tamper` (change the instance after signing).
const SIGN_PY: &str = r#"
import base64, hashlib, hmac, json, sys, time, uuid
import jwt
spec = json.loads(sys.argv[1])
now = int(time.time())
mid = spec.get("message_id") or str(uuid.uuid4())
ttl = spec.get("ttl", 600)
claims = {"message_id": mid, "instance_name": spec["instance"], "reason": "game day",
          "requested_by": "whoever the message says", "iss": spec["iss"],
          "iat": now if ttl > 0 else now + 2 * ttl, "exp": now + ttl, "jti": spec.get("jti", mid)}
def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
alg = spec["alg"]
if alg == "none":
    token = jwt.encode(claims, None, algorithm="none")
elif alg == "HS256-public":
    # The classic confusion: the verifier's public key as an HMAC secret
    # (PyJWT itself refuses to do this, so it is done by hand).
    secret = open(spec["key"], "rb").read()
    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + b64(json.dumps(claims).encode())
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    token = signing_input + "." + b64(mac)
else:
    token = jwt.encode(claims, open(spec["key"]).read(), algorithm=alg)
if spec.get("tamper"):
    header, body, signature = token.split(".")
    tampered = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    tampered["instance_name"] = spec["tamper"]
    token = ".".join([header, b64(json.dumps(tampered).encode()), signature])
print(token)
"#;

/// Makes a key pair with Python's `cryptography`: argv[1] `ed25519` or
/// `p256`, argv[2] the path stem (writes STEM.key, STEM.pub).
const KEYGEN_PY: &str = r#"
import sys
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
key = ed25519.Ed25519PrivateKey.generate() if sys.argv[1] == "ed25519" else ec.generate_private_key(ec.SECP256R1())
open(sys.argv[2] + ".key", "wb").write(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
open(sys.argv[2] + ".pub", "wb").write(key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
"#;

fn python(dir: &Path, script: &str, args: &[&str]) -> String {
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("python3 runs (with jwt and cryptography: see .ci/run)");
    assert!(
        output.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

fn sign(dir: &Path, spec: serde_json::Value) -> String {
    python(dir, SIGN_PY, &[&spec.to_string()])
}

/// The configuration: SQLite queue and store, `backend` (TOML for
/// `[restarter]` and its section), every guard but the ones under test
/// opened, and `requesters` (TOML).
fn write_config(dir: &Path, backend: &str, safety: &str, requesters: &str) {
    let db = sqlite_url(dir);
    let config = format!(
        "[broker]\nurl = {db:?}\n[store]\nurl = {db:?}\n{backend}\n\
         [safety]\ndry_run = false\nallow = [\"cattle-*\", \"pet-*\"]\n{safety}\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n\
         [safety.rate]\ngroup_max = 0\n[safety.budget]\nmax_disrupted = 0\n\n{requesters}"
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
}

const COMMAND: &str = "[restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"true\", \"{instance_name}\"]\n";
const SIMULATE: &str =
    "[restarter]\nkind = \"simulate\"\nfailure_rate = 0.0\nmax_latency = \"5ms\"\n";

fn requester(name: &str, key_file: &str, allow: &str) -> String {
    format!("[[requesters]]\nname = {name:?}\npublic_key_file = {key_file:?}\nallow = [{allow}]\n")
}

fn publish_file(dir: &Path, lines: &[String]) {
    let (status, _, stderr) = publish_lines(dir, lines, &[]);
    assert!(status.success(), "publish failed: {stderr}");
}

/// `mandrill publish --config mandrill.toml --file requests.txt FLAGS`
/// with `lines` in the file.
fn publish_lines(
    dir: &Path,
    lines: &[String],
    flags: &[&str],
) -> (std::process::ExitStatus, String, String) {
    fs::write(dir.join("requests.txt"), lines.join("\n")).unwrap();
    let mut args = vec![
        "publish",
        "--config",
        "mandrill.toml",
        "--file",
        "requests.txt",
    ];
    args.extend(flags);
    mandrill(dir, &args, &[])
}

fn run_until_idle(dir: &Path) -> Vec<serde_json::Value> {
    let (status, lines) =
        Mandrill::run(dir, &["--config", "mandrill.toml", "--until-idle"]).wait_exit();
    assert!(status.success(), "run failed: {lines:?}");
    lines
}

fn entry<'a>(entries: &'a [HistoryEntry], instance: &str) -> &'a HistoryEntry {
    entries
        .iter()
        .find(|e| e.instance_name.as_deref() == Some(instance))
        .unwrap_or_else(|| panic!("{instance} not in {entries:?}"))
}

fn dead_letter_count(dir: &Path) -> usize {
    support::queue_len(&sqlite_url(dir))
}

#[test]
fn jwts_made_by_pyjwt_with_mandrill_and_python_keys_are_verified_and_restarted_as_their_requester()
{
    let (_guard, dir) = temp_dir();
    // alice: Ed25519 from `mandrill keygen`; bob: ES256 and carol: Ed25519,
    // both from Python's cryptography.
    let (status, snippet, stderr) = mandrill(&dir, &["keygen", "alice"], &[]);
    assert!(status.success(), "keygen failed: {stderr}");
    assert!(
        snippet.contains("[[requesters]]") && snippet.contains("name = \"alice\""),
        "{snippet}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = fs::metadata(dir.join("alice.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the private key is the owner's only");
    let (status, _, stderr) = mandrill(&dir, &["keygen", "alice"], &[]);
    assert_eq!(status.code(), Some(2), "keygen never overwrites a key");
    assert!(stderr.contains("exists"), "{stderr}");
    python(&dir, KEYGEN_PY, &["p256", "bob"]);
    python(&dir, KEYGEN_PY, &["ed25519", "carol"]);
    // The snippet keygen printed is the configuration, as pasted.
    let requesters = format!(
        "{snippet}\n{}{}",
        requester("bob", "bob.pub", "\"cattle-*\""),
        requester("carol", "carol.pub", "\"cattle-*\""),
    );
    write_config(&dir, COMMAND, "", &requesters);

    let lines = vec![
        sign(
            &dir,
            serde_json::json!({"key": "alice.key", "alg": "EdDSA", "iss": "alice", "instance": "cattle-a1"}),
        ),
        sign(
            &dir,
            serde_json::json!({"key": "bob.key", "alg": "ES256", "iss": "bob", "instance": "cattle-b1"}),
        ),
        sign(
            &dir,
            serde_json::json!({"key": "carol.key", "alg": "EdDSA", "iss": "carol", "instance": "cattle-c1"}),
        ),
    ];
    // --file passes a signed line through unchanged.
    publish_file(&dir, &lines);
    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "publish",
            "--config",
            "mandrill.toml",
            "--as",
            "alice",
            "--key-file",
            "alice.key",
            "cattle-a2",
        ],
        &[],
    );
    assert!(status.success(), "publish --as failed: {stderr}");
    let queued: Vec<String> = queue_rows(&sqlite_url(&dir))
        .iter()
        .map(|row| String::from_utf8(row.payload.clone()).unwrap())
        .collect();
    assert_eq!(queued[..3], lines[..], "published unchanged");
    assert_eq!(
        queued[3].split('.').count(),
        3,
        "publish --as signs: {}",
        queued[3]
    );

    run_until_idle(&dir);
    let entries = history(&sqlite_url(&dir));
    for (instance, requester) in [
        ("cattle-a1", "alice"),
        ("cattle-b1", "bob"),
        ("cattle-c1", "carol"),
        ("cattle-a2", "alice"),
    ] {
        let found = entry(&entries, instance);
        assert_eq!(found.status, Status::Restarted, "{found:?}");
        // The verified name, not the message's "whoever the message says".
        assert_eq!(found.requested_by.as_deref(), Some(requester), "{found:?}");
    }
    assert_eq!(queue_rows(&sqlite_url(&dir)).len(), 0, "all acked");

    // The history's table shows who asked.
    let (status, table, _) = mandrill(&dir, &["history", "--config", "mandrill.toml"], &[]);
    assert!(status.success());
    let row = table
        .lines()
        .find(|line| line.contains("cattle-b1"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" bob "), "{table}");
    // explain shows the verified requester too.
    let id = entry(&entries, "cattle-b1").message_id.unwrap().to_string();
    let (status, story, _) = mandrill(
        &dir,
        &["explain", "--config", "mandrill.toml", "--json", &id],
        &[],
    );
    assert!(status.success());
    let story: serde_json::Value = serde_json::from_str(story.trim()).unwrap();
    assert_eq!(story["entry"]["requested_by"], "bob", "{story}");
}

#[test]
fn bad_signatures_are_rejected_with_their_reasons_and_dead_lettered() {
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "alice"], &[]);
    assert!(status.success(), "{stderr}");
    python(&dir, KEYGEN_PY, &["p256", "bob"]);
    python(&dir, KEYGEN_PY, &["ed25519", "mallory"]);
    let requesters = format!(
        "{}{}",
        requester("alice", "alice.pub", "\"cattle-*\""),
        requester("bob", "bob.pub", "\"cattle-*\""),
    );
    write_config(&dir, SIMULATE, "", &requesters);
    let spec = |key: &str, alg: &str, iss: &str, instance: &str| serde_json::json!({"key": key, "alg": alg, "iss": iss, "instance": instance});
    let mut tampered = spec("alice.key", "EdDSA", "alice", "cattle-t1");
    tampered["tamper"] = "cattle-db01".into();
    let mut expired = spec("alice.key", "EdDSA", "alice", "cattle-t2");
    expired["ttl"] = (-3600).into();
    let mut wrong_jti = spec("alice.key", "EdDSA", "alice", "cattle-t8");
    wrong_jti["jti"] = "01a2161b-0000-7000-8000-000000000000".into();
    let cases = [
        (tampered, "does not verify with requester alice's key"),
        (expired, "expired"),
        (
            spec("mallory.key", "EdDSA", "mallory", "cattle-t3"),
            "unknown requester \"mallory\"",
        ),
        (
            spec("mallory.key", "EdDSA", "alice", "cattle-t4"),
            "does not verify with requester alice's key",
        ),
        (spec("", "none", "alice", "cattle-t5"), "bad header"),
        (
            spec("alice.pub", "HS256-public", "alice", "cattle-t6"),
            "algorithm HS256 is not EdDSA",
        ),
        (
            spec("bob.key", "ES256", "alice", "cattle-t7"),
            "algorithm ES256 is not EdDSA",
        ),
        (wrong_jti, "jti"),
    ];
    let lines: Vec<String> = cases
        .iter()
        .map(|(spec, _)| sign(&dir, spec.clone()))
        .collect();
    // publish, reading the service's configuration, refuses them all
    // before publishing any, each naming why, as the service would.
    let (status, stdout, stderr) = publish_lines(&dir, &lines, &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stdout.is_empty(), "nothing printed as published: {stdout}");
    assert!(
        stderr.contains(&format!("nothing was published ({} refusals)", cases.len())),
        "{stderr}"
    );
    for (line, (_, why)) in (1..).zip(&cases) {
        let refusal = stderr
            .lines()
            .find(|refusal| refusal.contains(&format!("requests.txt:{line}: ")))
            .unwrap_or_else(|| panic!("line {line} not refused: {stderr}"));
        assert!(refusal.contains(why), "line {line}: {refusal}");
    }
    assert_eq!(dead_letter_count(&dir), 0, "nothing in the queue");
    // --unchecked publishes them, to test the service's own refusals.
    let (status, _, stderr) = publish_lines(&dir, &lines, &["--unchecked"]);
    assert!(status.success(), "{stderr}");
    let log = run_until_idle(&dir);
    let entries = history(&sqlite_url(&dir));
    let rejected: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), cases.len(), "{entries:?}");
    assert!(
        entries.iter().all(|e| e.status == Status::Rejected),
        "nothing else happened: {entries:?}"
    );
    // A rejected payload's record keeps what it asked for, unverified:
    // the host it named and the requester it claimed to be signed by.
    let forged = entry(&entries, "cattle-t3");
    assert_eq!(
        (forged.requested_by.as_deref(), forged.verified),
        (Some("mallory"), false),
        "{forged:?}"
    );
    assert!(
        rejected
            .iter()
            .all(|e| !e.verified && e.instance_name.is_some()),
        "{rejected:?}"
    );
    let (status, table, _) = mandrill(&dir, &["history", "--config", "mandrill.toml"], &[]);
    assert!(status.success());
    let row = table
        .lines()
        .find(|line| line.contains("cattle-t3"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("mallory (unverified)"), "{table}");
    let reasons: Vec<String> = rejected
        .iter()
        .map(|e| e.last_error.clone().unwrap_or_default())
        .collect();
    for (_, why) in &cases {
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with("signature rejected: ") && r.contains(*why)),
            "no rejection says {why:?}: {reasons:#?}"
        );
    }
    let restarted = log
        .iter()
        .filter(|line| line["fields"]["message"] == "restarted")
        .count();
    assert_eq!(restarted, 0, "nothing rejected is restarted");
    // Dead-lettered, each with its reason.
    let (status, dead, _) = mandrill(
        &dir,
        &["dead-letters", "--config", "mandrill.toml", "--json"],
        &[],
    );
    assert!(status.success());
    let dead: Vec<serde_json::Value> = dead
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(dead.len(), cases.len(), "{dead:?}");
    assert!(
        dead.iter()
            .all(|d| d.to_string().contains("signature rejected")),
        "{dead:?}"
    );
    assert_eq!(dead_letter_count(&dir), 0, "nothing left in the queue");
}

#[test]
fn a_signed_request_outside_its_requesters_allow_is_denied_naming_the_requester() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    // safety.allow admits pet-*; alice's own allow does not.
    write_config(
        &dir,
        COMMAND,
        "",
        &requester("alice", "alice.pub", "\"cattle-*\""),
    );
    let lines = vec![
        sign(
            &dir,
            serde_json::json!({"key": "alice.key", "alg": "EdDSA", "iss": "alice", "instance": "pet-01"}),
        ),
        sign(
            &dir,
            serde_json::json!({"key": "alice.key", "alg": "EdDSA", "iss": "alice", "instance": "cattle-ok"}),
        ),
    ];
    publish_file(&dir, &lines);
    run_until_idle(&dir);
    let entries = history(&sqlite_url(&dir));
    let denied = entry(&entries, "pet-01");
    assert_eq!(denied.status, Status::Denied);
    assert_eq!(denied.requested_by.as_deref(), Some("alice"));
    let reason = denied.last_error.as_deref().unwrap_or_default();
    assert!(
        reason.contains("requester alice may not restart pet-01"),
        "{reason}"
    );
    assert_eq!(entry(&entries, "cattle-ok").status, Status::Restarted);
    assert_eq!(
        dead_letter_count(&dir),
        0,
        "denied is acked, not dead-lettered"
    );
}

#[test]
fn an_unsigned_request_is_rejected_with_a_real_backend_unless_require_signed_is_false() {
    let (_guard, dir) = temp_dir();
    write_config(&dir, COMMAND, "", "");
    // publish refuses it, as the service would; --unchecked publishes it.
    let publish = ["publish", "--config", "mandrill.toml", "cattle-u1"];
    let (status, stdout, stderr) = mandrill(&dir, &publish, &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("nothing was published")
            && stderr.contains("a signature is required (safety.require_signed)")
            && stderr.contains("--as NAME --key-file FILE"),
        "{stderr}"
    );
    assert_eq!(dead_letter_count(&dir), 0, "nothing in the queue");
    let (status, _, stderr) = mandrill(&dir, &[&publish[..], &["--unchecked"]].concat(), &[]);
    assert!(status.success(), "{stderr}");
    run_until_idle(&dir);
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].status, Status::Rejected);
    let reason = entries[0].last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("a signature is required"), "{reason}");
    let (_, dead, _) = mandrill(&dir, &["dead-letters", "--config", "mandrill.toml"], &[]);
    assert!(dead.contains("a signature is required"), "{dead}");

    let (status, shown, _) = mandrill(&dir, &["status", "--config", "mandrill.toml"], &[]);
    assert!(status.success());
    assert!(shown.contains("signed:    required"), "{shown}");

    // Explicitly off: accepted, and the start-up says so loudly.
    write_config(&dir, COMMAND, "require_signed = false", "");
    let (status, _, _) = mandrill(
        &dir,
        &["publish", "--config", "mandrill.toml", "cattle-u2"],
        &[],
    );
    assert!(status.success());
    let log = run_until_idle(&dir);
    assert!(
        log.iter().any(|line| line["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("UNSIGNED REQUESTS ACCEPTED")),
        "the warning is loud"
    );
    let entries = history(&sqlite_url(&dir));
    let accepted = entry(&entries, "cattle-u2");
    assert_eq!(accepted.status, Status::Restarted);
    // Free text, never shown as if a signature vouched for it.
    assert!(!accepted.verified, "{accepted:?}");
    let rejected = entry(&entries, "cattle-u1");
    assert_eq!(
        (
            rejected.status,
            rejected.requested_by.as_deref(),
            rejected.verified
        ),
        (Status::Rejected, Some("mandrill-publish"), false),
        "the rejected record keeps who it said asked: {rejected:?}"
    );
    let (status, table, _) = mandrill(&dir, &["history", "--config", "mandrill.toml"], &[]);
    assert!(status.success());
    for instance in ["cattle-u1", "cattle-u2"] {
        let row = table
            .lines()
            .find(|line| line.contains(instance))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(row.contains("mandrill-publish (unverified)"), "{table}");
    }
    let id = accepted.message_id.unwrap().to_string();
    let (status, story, _) = mandrill(&dir, &["explain", "--config", "mandrill.toml", &id], &[]);
    assert!(status.success());
    assert!(
        story.contains("requested by mandrill-publish (unverified)"),
        "{story}"
    );
}

#[test]
fn a_bad_key_fails_start_up_naming_its_key() {
    let (_guard, dir) = temp_dir();
    fs::write(
        dir.join("bad.pub"),
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    for (requesters, key) in [
        (
            requester("alice", "bad.pub", "\"cattle-*\""),
            "requesters[0].public_key_file",
        ),
        (
            requester("alice", "missing.pub", "\"cattle-*\""),
            "requesters[0].public_key_file",
        ),
        (
            "[[requesters]]\nname = \"alice\"\npublic_key = \"not a key\"\nallow = []\n".into(),
            "requesters[0].public_key",
        ),
    ] {
        write_config(&dir, COMMAND, "", &requesters);
        let (status, _, stderr) = mandrill(&dir, &["run", "--config", "mandrill.toml"], &[]);
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(key), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

fn stop(instance: Mandrill) {
    instance.signal("TERM");
    let (status, lines) = instance.wait_exit();
    assert!(status.success(), "exit {status}: {lines:?}");
}

const QUOTA: &str = "[requesters.quota]\nmax = 2\nwindow = \"1h\"\n";

#[test]
fn a_requesters_quota_of_two_per_hour_restarts_two_and_defers_the_third() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    write_config(
        &dir,
        SIMULATE,
        "",
        &format!("{}{QUOTA}", requester("alice", "alice.pub", "\"cattle-*\"")),
    );
    // Three instances of three groups: only the requester's quota binds.
    let lines: Vec<String> = ["cattle-q1", "cattle-r2", "cattle-s3"]
        .iter()
        .map(|instance| {
            sign(
                &dir,
                serde_json::json!({"key": "alice.key", "alg": "EdDSA", "iss": "alice", "instance": instance}),
            )
        })
        .collect();
    let (status, shown, _) = mandrill(&dir, &["status", "--config", "mandrill.toml"], &[]);
    assert!(status.success());
    assert!(
        shown.contains("requesters: alice (allow [\"cattle-*\"], 2 per hour)"),
        "{shown}"
    );
    publish_file(&dir, &lines);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    wait_for_deferrals(&[&service], 1);
    service.wait_for("acked", 2);
    stop(service);
    let entries = history(&sqlite_url(&dir));
    let restarted = entries
        .iter()
        .filter(|e| e.status == Status::Restarted)
        .count();
    assert_eq!(restarted, 2, "{entries:?}");
    let waiting: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status != Status::Restarted)
        .collect();
    assert_eq!(waiting.len(), 1, "{entries:?}");
    assert!(
        waiting[0].status == Status::Received && waiting[0].attempts == 0,
        "deferred, nothing claimed: {waiting:?}"
    );
    assert_eq!(queue_rows(&sqlite_url(&dir)).len(), 1, "still queued");
    let id = waiting[0].message_id.unwrap().to_string();
    let (status, story, _) = mandrill(&dir, &["explain", "--config", "mandrill.toml", &id], &[]);
    assert!(status.success());
    assert!(
        story.contains("alice"),
        "the deferral names the requester: {story}"
    );
}

/// Two `mandrill run` on one SQLite file share a requester's quota exactly:
/// of 40 signed requests or more (a host each; the group's own limits off), 5
/// are restarted, the rest deferred, whichever process handles them.
#[test]
fn two_processes_on_one_sqlite_file_keep_a_requesters_quota_exactly() {
    const REQUESTS: usize = 40;
    const ROUND: usize = 20;
    const MAX: usize = 5;
    let (_guard, dir) = temp_dir();
    let (status, _, stderr) = mandrill(&dir, &["keygen", "alice"], &[]);
    assert!(status.success(), "{stderr}");
    let journal = dir.join("restarts.journal");
    write_config(
        &dir,
        &format!("{SIMULATE}journal = {:?}\n", journal.display().to_string()),
        "",
        &format!(
            "{}[requesters.quota]\nmax = {MAX}\nwindow = \"1h\"\n",
            requester("alice", "alice.pub", "\"cattle-*\"")
        ),
    );
    let publish = |n: usize, rate: &str| {
        let (status, _, stderr) = mandrill(
            &dir,
            &[
                "publish",
                "--config",
                "mandrill.toml",
                "--as",
                "alice",
                "--key-file",
                "alice.key",
                "--random",
                &n.to_string(),
                "--rate",
                rate,
            ],
            &[],
        );
        assert!(status.success(), "publish failed: {stderr}");
    };
    // One creates the file; the rest are spread once both pull (as
    // tests/limits.rs does: SQLite's lock is not fair).
    publish(1, "1000");
    let args = [
        "--config",
        "mandrill.toml",
        "--max-in-flight",
        "4",
        "--set",
        "broker.sqlite.poll_interval=5ms",
    ];
    let (a, b) = (Mandrill::run(&dir, &args), Mandrill::run(&dir, &args));
    a.wait_for("mandrill started", 1);
    b.wait_for("mandrill started", 1);
    publish(REQUESTS - 1, "200");
    let published = until_both_deferred((&a, &b), REQUESTS, MAX, (ROUND, 5 * REQUESTS), |n| {
        publish(n, "200")
    });
    stop(a);
    stop(b);
    let issued = fs::read_to_string(&journal)
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(issued, MAX, "exactly the quota issued");
    let entries = history(&sqlite_url(&dir));
    let restarted: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status == Status::Restarted)
        .collect();
    assert_eq!(restarted.len(), MAX);
    assert!(
        restarted
            .iter()
            .all(|e| e.requested_by.as_deref() == Some("alice"))
    );
    assert_eq!(
        queue_rows(&sqlite_url(&dir)).len(),
        published - MAX,
        "none lost"
    );
}

/// `[[requesters]]` is reloaded on SIGHUP: removing a requester revokes it
/// at once, without a restart; its next request is rejected.
#[test]
fn a_sighup_revokes_a_removed_requester() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    write_config(
        &dir,
        SIMULATE,
        "",
        &requester("alice", "alice.pub", "\"cattle-*\""),
    );
    let signed = |instance: &str| {
        sign(
            &dir,
            serde_json::json!({"key": "alice.key", "alg": "EdDSA", "iss": "alice", "instance": instance}),
        )
    };
    publish_file(&dir, &[signed("cattle-before")]);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    service.wait_for("acked", 1);
    write_config(&dir, SIMULATE, "", "");
    service.signal("HUP");
    service.wait_for("safety policy reloaded", 1);
    // publish, reading the new configuration, knows alice no more; the
    // service's own refusal is what is tested here.
    let after = [signed("cattle-after")];
    let (status, _, stderr) = publish_lines(&dir, &after, &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown requester \"alice\""), "{stderr}");
    let (status, _, stderr) = publish_lines(&dir, &after, &["--unchecked"]);
    assert!(status.success(), "{stderr}");
    service.wait_for("dead-lettered", 1);
    stop(service);
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entry(&entries, "cattle-before").status, Status::Restarted);
    let rejected: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1, "{entries:?}");
    let reason = rejected[0].last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("unknown requester \"alice\""), "{reason}");
}

/// Revoking by deleting a key file: the reload leaves that requester out
/// (logged naming its key) instead of being refused and keeping its old
/// key trusted; the other requesters keep working.
#[test]
fn a_sighup_after_a_key_file_is_deleted_revokes_that_key() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    python(&dir, KEYGEN_PY, &["ed25519", "bob"]);
    write_config(
        &dir,
        SIMULATE,
        "",
        &format!(
            "{}{}",
            requester("alice", "alice.pub", "\"cattle-*\""),
            requester("bob", "bob.pub", "\"cattle-*\"")
        ),
    );
    let signed = |by: &str, instance: &str| {
        sign(
            &dir,
            serde_json::json!({"key": format!("{by}.key"), "alg": "EdDSA", "iss": by, "instance": instance}),
        )
    };
    publish_file(&dir, &[signed("alice", "cattle-before")]);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    service.wait_for("acked", 1);
    fs::remove_file(dir.join("alice.pub")).unwrap();
    service.signal("HUP");
    let left_out = service.wait_for(
        "requester left out: its key cannot be used, so it is no longer trusted",
        1,
    );
    assert_eq!(
        left_out[0]["fields"]["key"], "requesters[0].public_key_file",
        "{left_out:?}"
    );
    service.wait_for("safety policy reloaded", 1);
    // Published without the configuration, which no longer starts (its
    // key file is gone): `publish` reads it.
    fs::write(
        dir.join("requests.txt"),
        [signed("alice", "cattle-after"), signed("bob", "cattle-bob")].join("\n"),
    )
    .unwrap();
    let (status, _, stderr) = mandrill(
        &dir,
        &[
            "publish",
            "--broker",
            &sqlite_url(&dir),
            "--file",
            "requests.txt",
        ],
        &[],
    );
    assert!(status.success(), "publish failed: {stderr}");
    service.wait_for("dead-lettered", 1);
    service.wait_for("acked", 2);
    stop(service);
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entry(&entries, "cattle-before").status, Status::Restarted);
    assert_eq!(entry(&entries, "cattle-bob").status, Status::Restarted);
    // Rejected at the parse, before its instance is read.
    let rejected: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1, "{entries:?}");
    let reason = rejected[0].last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("unknown requester \"alice\""), "{reason}");
}

/// A reload refused for a mistake in `[[requesters]]` (here an empty
/// `allow` pattern in the entry being edited) keeps no old key trusted:
/// the edit may have been a revocation.
#[test]
fn a_sighup_refused_for_its_requesters_trusts_no_key_until_a_reload_succeeds() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    let alice = requester("alice", "alice.pub", "\"cattle-*\"");
    write_config(&dir, SIMULATE, "", &alice);
    let signed = |instance: &str| {
        sign(
            &dir,
            serde_json::json!({"key": "alice.key", "alg": "EdDSA", "iss": "alice", "instance": instance}),
        )
    };
    let publish = |lines: &[String]| {
        // Not `publish_file`: it reads the configuration, invalid below.
        fs::write(dir.join("requests.txt"), lines.join("\n")).unwrap();
        let (status, _, stderr) = mandrill(
            &dir,
            &[
                "publish",
                "--broker",
                &sqlite_url(&dir),
                "--file",
                "requests.txt",
            ],
            &[],
        );
        assert!(status.success(), "publish failed: {stderr}");
    };
    publish(&[signed("cattle-before")]);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    service.wait_for("acked", 1);
    write_config(
        &dir,
        SIMULATE,
        "",
        &requester("alice", "alice.pub", "\"cattle-*\", \"\""),
    );
    service.signal("HUP");
    service.wait_for("reload failed; keeping the running configuration", 1);
    publish(&[signed("cattle-refused")]);
    service.wait_for("dead-lettered", 1);
    // Fixed: alice is trusted again.
    write_config(&dir, SIMULATE, "", &alice);
    service.signal("HUP");
    service.wait_for("safety policy reloaded", 1);
    publish(&[signed("cattle-again")]);
    service.wait_for("acked", 2);
    stop(service);
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entry(&entries, "cattle-before").status, Status::Restarted);
    assert_eq!(entry(&entries, "cattle-again").status, Status::Restarted);
    let rejected: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1, "{entries:?}");
    let reason = rejected[0].last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("unknown requester \"alice\""), "{reason}");
}

/// A reload refused for a key outside `[[requesters]]` still revokes the
/// requester whose entry the same edit removed (the others stay trusted);
/// a file that is not TOML at all leaves no key trusted. Both until a
/// reload succeeds.
#[test]
fn a_reload_refused_for_another_key_still_revokes_a_removed_requester() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    python(&dir, KEYGEN_PY, &["ed25519", "bob"]);
    let alice = requester("alice", "alice.pub", "\"cattle-*\"");
    let bob = requester("bob", "bob.pub", "\"cattle-*\"");
    write_config(&dir, SIMULATE, "", &format!("{alice}{bob}"));
    let signed = |by: &str, instance: &str| {
        sign(
            &dir,
            serde_json::json!({"key": format!("{by}.key"), "alg": "EdDSA", "iss": by, "instance": instance}),
        )
    };
    let publish = |lines: &[String]| {
        // Not `publish_file`: it reads the configuration, invalid below.
        fs::write(dir.join("requests.txt"), lines.join("\n")).unwrap();
        let (status, _, stderr) = mandrill(
            &dir,
            &[
                "publish",
                "--broker",
                &sqlite_url(&dir),
                "--file",
                "requests.txt",
            ],
            &[],
        );
        assert!(status.success(), "publish failed: {stderr}");
    };
    publish(&[signed("alice", "cattle-before")]);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    service.wait_for("acked", 1);
    // alice's block deleted, and a typo elsewhere refuses the reload.
    write_config(&dir, SIMULATE, "colour = \"blue\"", &bob);
    service.signal("HUP");
    service.wait_for("reload failed; keeping the running configuration", 1);
    const REVOKED: &str = "requester revoked: the refused reload removes or changes its entry \
                           (or its file cannot be read), so it is no longer trusted until a \
                           reload succeeds";
    let revoked = service.wait_for(REVOKED, 1);
    assert_eq!(revoked[0]["fields"]["requester"], "alice", "{revoked:?}");
    publish(&[signed("alice", "cattle-after"), signed("bob", "cattle-bob")]);
    service.wait_for("dead-lettered", 1);
    service.wait_for("acked", 2);
    // Not TOML at all: no key is trusted (unsigned requests are refused or
    // not as before: only a mistake in `[[requesters]]` itself says more).
    fs::write(dir.join("mandrill.toml"), "[safety\n").unwrap();
    service.signal("HUP");
    service.wait_for("reload failed; keeping the running configuration", 2);
    let revoked = service.wait_for(REVOKED, 2);
    assert_eq!(revoked[1]["fields"]["requester"], "bob", "{revoked:?}");
    publish(&[signed("bob", "cattle-bob-unread")]);
    service.wait_for("dead-lettered", 2);
    stop(service);
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entry(&entries, "cattle-before").status, Status::Restarted);
    assert_eq!(entry(&entries, "cattle-bob").status, Status::Restarted);
    let rejected: Vec<&str> = entries
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .map(|e| e.last_error.as_deref().unwrap_or_default())
        .collect();
    assert_eq!(rejected.len(), 2, "{entries:?}");
    assert!(
        rejected
            .iter()
            .any(|reason| reason.contains("unknown requester \"alice\"")),
        "{rejected:?}"
    );
    assert!(
        rejected
            .iter()
            .any(|reason| reason.contains("unknown requester \"bob\"")),
        "{rejected:?}"
    );
}

/// The fallback of a refused `[[requesters]]` lasts until a reload
/// succeeds, even one whose configuration is the running one again: here a
/// service with no requester, whose unsigned requests are refused while a
/// broken entry is in its file, and accepted again once it is gone.
#[test]
fn a_reload_after_a_refused_requesters_entry_restores_the_policy() {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "alice"]);
    write_config(&dir, SIMULATE, "", "");
    let url = sqlite_url(&dir);
    // With --broker, not the configuration, which is invalid for a while.
    let publish = |instance: &str| {
        let (status, _, stderr) = mandrill(&dir, &["publish", "--broker", &url, instance], &[]);
        assert!(status.success(), "publish failed: {stderr}");
    };
    publish("cattle-before");
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    service.wait_for("acked", 1);
    write_config(&dir, SIMULATE, "", &requester("alice", "alice.pub", "\"\""));
    service.signal("HUP");
    service.wait_for("reload failed; keeping the running configuration", 1);
    publish("cattle-refused");
    service.wait_for("dead-lettered", 1);
    write_config(&dir, SIMULATE, "", "");
    service.signal("HUP");
    service.wait_for("safety policy reloaded", 1);
    publish("cattle-again");
    service.wait_for("acked", 2);
    stop(service);
    let entries = history(&url);
    assert_eq!(entry(&entries, "cattle-before").status, Status::Restarted);
    assert_eq!(entry(&entries, "cattle-again").status, Status::Restarted);
    let rejected: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.status == Status::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1, "{entries:?}");
    let reason = rejected[0].last_error.as_deref().unwrap_or_default();
    assert!(reason.contains("a signature is required"), "{reason}");
}

/// Three `mandrill run` on NATS JetStream + PostgreSQL share a requester's
/// quota exactly: the claim takes the requester's advisory lock, so claims
/// of one requester in different groups cannot both read room for one.
#[test]
fn three_processes_on_nats_and_postgres_keep_a_requesters_quota_exactly() {
    const REQUESTS: usize = 40;
    const MAX: usize = 5;
    let (_guard, dir) = temp_dir();
    let db = Database::create();
    let names = NatsNames::new(&nats_server());
    let (status, _, stderr) = mandrill(&dir, &["keygen", "alice"], &[]);
    assert!(status.success(), "{stderr}");
    let journal = dir.join("restarts.journal");
    write_config(
        &dir,
        &format!("{SIMULATE}journal = {:?}\n", journal.display().to_string()),
        "",
        &format!(
            "{}[requesters.quota]\nmax = {MAX}\nwindow = \"1h\"\n",
            requester("alice", "alice.pub", "\"cattle-*\"")
        ),
    );
    let mut args = vec![
        "--config".to_owned(),
        "mandrill.toml".into(),
        "--broker".into(),
        names.url.clone(),
        "--db".into(),
        db.url.clone(),
        "--max-in-flight".into(),
        "32".into(),
    ];
    args.extend(names.flags());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let instances: Vec<Mandrill> = (0..3).map(|_| Mandrill::run(&dir, &args)).collect();
    for instance in &instances {
        instance.wait_for("mandrill started", 1);
    }
    let mut publish = vec![
        "publish".to_owned(),
        "--config".into(),
        "mandrill.toml".into(),
        "--broker".into(),
        names.url.clone(),
        "--as".into(),
        "alice".into(),
        "--key-file".into(),
        "alice.key".into(),
        "--random".into(),
        REQUESTS.to_string(),
    ];
    publish.extend(names.flags());
    let publish: Vec<&str> = publish.iter().map(String::as_str).collect();
    let (status, _, stderr) = mandrill(&dir, &publish, &[]);
    assert!(status.success(), "publish failed: {stderr}");
    let refs: Vec<&Mandrill> = instances.iter().collect();
    wait_for_deferrals(&refs, REQUESTS - MAX);
    let took_part = instances
        .iter()
        .filter(|i| !i.messages("deferred").is_empty() || !i.messages("acked").is_empty())
        .count();
    assert!(took_part >= 2, "the work was shared");
    for instance in instances {
        stop(instance);
    }
    let issued = fs::read_to_string(&journal)
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(issued, MAX, "exactly the quota issued");
    let statuses = db.statuses();
    let restarted: i64 = statuses
        .iter()
        .filter(|(status, _)| status == "restarted")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(restarted, MAX as i64, "{statuses:?}");
    let total: i64 = statuses.iter().map(|(_, n)| n).sum();
    assert_eq!(
        total, REQUESTS as i64,
        "every request recorded: {statuses:?}"
    );
}

/// Where the identity test runs: the SQLite queue and store, or NATS and
/// PostgreSQL.
enum Backing {
    Sqlite,
    NatsPostgres { db: Box<Database>, names: NatsNames },
}

impl Backing {
    /// The flags that point a command at the backing, after `--config`.
    fn flags(&self, broker: bool) -> Vec<String> {
        match self {
            Self::Sqlite => Vec::new(),
            Self::NatsPostgres { db, names } => {
                let mut flags = vec!["--db".to_owned(), db.url.clone()];
                if broker {
                    flags.extend(["--broker".to_owned(), names.url.clone()]);
                    flags.extend(names.flags());
                }
                flags
            }
        }
    }

    fn store_url(&self, dir: &Path) -> String {
        match self {
            Self::Sqlite => sqlite_url(dir),
            Self::NatsPostgres { db, .. } => db.url.clone(),
        }
    }

    /// Publishes one signed line as any client allowed on the queue can:
    /// `mandrill publish` on SQLite; on NATS, a JetStream client of the
    /// test's own (no `Nats-Msg-Id`, so that JetStream's duplicate window,
    /// keyed on the message's id by mandrill's publisher, does not drop
    /// it before mandrill sees it).
    fn publish_raw(&self, dir: &Path, line: &str) {
        match self {
            Self::Sqlite => publish_file(dir, &[line.to_owned()]),
            Self::NatsPostgres { names, .. } => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let client = async_nats::connect(names.url.as_str()).await.unwrap();
                    let jetstream = async_nats::jetstream::new(client);
                    jetstream
                        .publish(names.subject().to_owned(), line.to_owned().into())
                        .await
                        .unwrap()
                        .await
                        .expect("published and stored");
                });
            }
        }
    }
}

/// Requester v's signed request for `cattle-a1` waits on a paused group;
/// requester m, validly signed, publishes its own request for `pet-7`
/// under v's `message_id` (anyone who reads the queue sees it). m's is
/// refused naming the conflict, recorded apart with its signer, and
/// dead-lettered; v's runs once the group resumes, its record intact.
fn a_request_under_another_requesters_id_is_refused_and_the_original_runs(backing: Backing) {
    let (_guard, dir) = temp_dir();
    python(&dir, KEYGEN_PY, &["ed25519", "v"]);
    python(&dir, KEYGEN_PY, &["p256", "m"]);
    let journal = dir.join("restarts.journal");
    write_config(
        &dir,
        &format!("{SIMULATE}journal = {:?}\n", journal.display().to_string()),
        "",
        &format!(
            "{}{}",
            requester("v", "v.pub", "\"cattle-*\""),
            requester("m", "m.pub", "\"pet-*\"")
        ),
    );
    let command = |verb: &str, extra: &[&str], broker: bool| {
        let mut args = vec![verb.to_owned(), "--config".into(), "mandrill.toml".into()];
        args.extend(backing.flags(broker));
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, stdout, stderr) = mandrill(&dir, &args, &[]);
        assert!(status.success(), "{args:?} failed: {stderr}");
        stdout
    };
    run(command(
        "pause",
        &["--group", "cattle", "--by", "sre", "--reason", "drill"],
        false,
    ));
    let service_args = command("run", &[], true);
    let service_args: Vec<&str> = service_args.iter().map(String::as_str).collect();
    let service = Mandrill::run(&dir, &service_args[1..]);
    service.wait_for("mandrill started", 1);

    let id = uuid::Uuid::new_v4().to_string();
    let original = sign(
        &dir,
        serde_json::json!({"key": "v.key", "alg": "EdDSA", "iss": "v", "instance": "cattle-a1", "message_id": id}),
    );
    backing.publish_raw(&dir, &original);
    service.wait_for("deferred", 1);
    let impostor = sign(
        &dir,
        serde_json::json!({"key": "m.key", "alg": "ES256", "iss": "m", "instance": "pet-7", "message_id": id}),
    );
    backing.publish_raw(&dir, &impostor);
    let dead = service.wait_for("dead-lettered", 1);
    let reason = dead[0]["fields"]["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.contains(&format!("message_id {id} is recorded for another request"))
            && reason.contains("instance cattle-a1 (this payload: pet-7)")
            && reason.contains("requested by v (verified) (this payload: m (verified))"),
        "the refusal names the conflict: {reason}"
    );
    run(command(
        "resume",
        &["--group", "cattle", "--by", "sre", "--reason", "drill over"],
        false,
    ));
    service.wait_for("acked", 1);
    stop(service);

    // Only v's host was restarted, once.
    let issued = fs::read_to_string(&journal).unwrap_or_default();
    let hosts: Vec<&str> = issued
        .lines()
        .map(|line| line.split(' ').next().unwrap())
        .collect();
    assert_eq!(hosts, ["cattle-a1.example.net"], "{issued}");
    let entries = history(&backing.store_url(&dir));
    let recorded: Vec<&HistoryEntry> = entries
        .iter()
        .filter(|e| e.message_id.map(|m| m.to_string()) == Some(id.clone()))
        .collect();
    assert_eq!(
        recorded.len(),
        2,
        "the request and the refusal: {entries:?}"
    );
    let kept = recorded
        .iter()
        .find(|e| e.status == Status::Restarted)
        .unwrap_or_else(|| panic!("v's request restarted: {entries:?}"));
    assert_eq!(
        (
            kept.instance_name.as_deref(),
            kept.requested_by.as_deref(),
            kept.verified,
            kept.attempts
        ),
        (Some("cattle-a1"), Some("v"), true, 1),
        "the original's record is intact: {kept:?}"
    );
    let refused = recorded
        .iter()
        .find(|e| e.status == Status::Rejected)
        .unwrap_or_else(|| panic!("m's payload recorded apart: {entries:?}"));
    assert_eq!(
        (
            refused.instance_name.as_deref(),
            refused.requested_by.as_deref(),
            refused.verified
        ),
        (Some("pet-7"), Some("m"), true),
        "the refused payload and who signed it: {refused:?}"
    );
    assert_eq!(refused.last_error.as_deref(), Some(reason.as_str()));
    // explain tells v's story alone: its host, its signer, one attempt.
    let story = run(command("explain", &["--json", &id], false));
    let story: serde_json::Value = serde_json::from_str(story.trim()).unwrap();
    assert_eq!(story["entry"]["instance_name"], "cattle-a1", "{story}");
    assert_eq!(story["entry"]["requested_by"], "v", "{story}");
    assert_eq!(story["attempts"].as_array().unwrap().len(), 1, "{story}");
    assert_eq!(story["attempts"][0]["group"], "cattle", "{story}");
    if let Backing::Sqlite = backing {
        let dead = run(command("dead-letters", &["--json"], false));
        assert_eq!(dead.lines().count(), 1, "m's payload dead-lettered: {dead}");
        assert!(dead.contains("is recorded for another request"), "{dead}");
    }
}

#[test]
fn a_request_under_another_requesters_id_is_refused_and_the_original_runs_on_sqlite() {
    a_request_under_another_requesters_id_is_refused_and_the_original_runs(Backing::Sqlite);
}

#[test]
fn a_request_under_another_requesters_id_is_refused_and_the_original_runs_on_nats_and_postgres() {
    a_request_under_another_requesters_id_is_refused_and_the_original_runs(Backing::NatsPostgres {
        db: Box::new(Database::create()),
        names: NatsNames::new(&nats_server()),
    });
}
