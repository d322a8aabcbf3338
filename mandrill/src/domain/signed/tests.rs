//! The verification rules of signed requests, with fixed keys (made by
//! Python's `cryptography` for these tests only).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{LEEWAY, MAX_LIFETIME, Signatures, Signer, SigningKey};
use crate::domain::{Domain, ParseRules, Rejection, RestartRequest, WireRequest};

const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJKZIohg0kTgT0r1qaO/WUCF0GokEli8bJBBjTpGeOvA
-----END PRIVATE KEY-----
";
const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAiXnPth0YTU/nwanl6fRVhSdyP7GowJ3i9meT7iYSEjw=
-----END PUBLIC KEY-----
";
const OTHER_ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIF4YSSVXLGNsrt4KclFqNqLuLtEs08djmzZjbdE9K6v1
-----END PRIVATE KEY-----
";
const P256_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgbpy5VfNT6qGMy/AI
YlGG19JO6XB94eEXYQwRjTgTPbKhRANCAARmlwL7BeMclaT6G51PFUSP9KhsonzD
TmKjDsXHhG4avCw96AUAGZsc0T1m7J/UspKzwisNkA/swzG3+E/X0Rpn
-----END PRIVATE KEY-----
";
const P256_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEZpcC+wXjHJWk+hudTxVEj/SobKJ8
w05iow7Fx4RuGrwsPegFABmbHNE9Zuyf1LKSs8IrDZAP7MMxt/hP19EaZw==
-----END PUBLIC KEY-----
";
const P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEa601gO6oh3KENcqk8nXYkBeVI8Ekq0ob
0GukCYgPnKtDL8NhtzxirGajEJofUzdX//eHh7ZVmgTmsbnqnEOAkoFQwGqRp7vC
dhMF94ElUpSfI0SKlgwPG2JYpQf9VIaR
-----END PUBLIC KEY-----
";

const MESSAGE_ID: &str = "0193a5c4-7d2e-7f00-8000-000000000001";

fn rules() -> ParseRules {
    ParseRules {
        domain: Domain::parse("example.net").unwrap(),
        max_payload_bytes: 64 * 1024,
    }
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// alice (Ed25519) and bob (P-256), unsigned requests refused.
fn signatures() -> Signatures {
    let signers = HashMap::from([
        ("alice".to_owned(), Signer::from_pem(ED_PUBLIC).unwrap()),
        ("bob".to_owned(), Signer::from_pem(P256_PUBLIC).unwrap()),
    ]);
    Signatures::new(signers, true)
}

fn wire(instance: &str) -> WireRequest {
    WireRequest {
        message_id: MESSAGE_ID.into(),
        instance_name: instance.into(),
        requested_by: Some("someone else".into()),
        reason: Some("leaking memory".into()),
        published_at: None,
        group: None,
        not_before: None,
        reply_to: None,
    }
}

fn sign(private: &str, requester: &str) -> String {
    SigningKey::from_pem(private)
        .unwrap()
        .sign(
            &wire("cattle-ab12"),
            requester,
            now(),
            Duration::from_secs(3600),
        )
        .unwrap()
}

fn parse(token: &str) -> Result<RestartRequest, Rejection> {
    RestartRequest::parse_verified_at(token.as_bytes(), &rules(), &signatures(), now())
}

/// A token with the given header and claims, signed by nobody.
fn forged(header: &str, claims: &serde_json::Value, signature: &str) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        signature
    )
}

fn claims(iat: u64, exp: u64) -> serde_json::Value {
    serde_json::json!({
        "message_id": MESSAGE_ID, "instance_name": "cattle-ab12",
        "iss": "alice", "iat": iat, "exp": exp, "jti": MESSAGE_ID,
    })
}

fn rejected(result: Result<RestartRequest, Rejection>) -> String {
    match result {
        Err(rejection @ Rejection::BadSignature(_)) => rejection.to_string(),
        other => panic!("expected a bad signature, got {other:?}"),
    }
}

fn epoch(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn an_ed25519_or_es256_signed_request_names_its_verified_requester() {
    for (private, requester) in [(ED_PRIVATE, "alice"), (P256_PRIVATE, "bob")] {
        let request = parse(&sign(private, requester)).unwrap();
        assert_eq!(request.requester.as_deref(), Some(requester));
        // The free text's "someone else" is replaced by the verified name.
        assert_eq!(request.requested_by.as_deref(), Some(requester));
        assert_eq!(request.instance_name.as_str(), "cattle-ab12");
        assert_eq!(request.reason.as_deref(), Some("leaking memory"));
        assert_eq!(request.message_id.to_string(), MESSAGE_ID);
        // No published_at: the signed iat stands for it.
        assert_eq!(request.published_at, Some(now()));
    }
}

#[test]
fn a_tampered_token_does_not_verify() {
    let token = sign(ED_PRIVATE, "alice");
    let mut parts: Vec<&str> = token.split('.').collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["instance_name"] = "cattle-db01".into();
    let tampered = URL_SAFE_NO_PAD.encode(claims.to_string());
    parts[1] = &tampered;
    let reason = rejected(parse(&parts.join(".")));
    assert!(reason.contains("does not verify"), "{reason}");
}

#[test]
fn a_token_signed_by_another_key_or_an_unknown_requester_is_rejected() {
    let reason = rejected(parse(&sign(OTHER_ED_PRIVATE, "alice")));
    assert!(
        reason.contains("does not verify with requester alice's key"),
        "{reason}"
    );
    let reason = rejected(parse(&sign(OTHER_ED_PRIVATE, "mallory")));
    assert!(reason.contains("unknown requester \"mallory\""), "{reason}");
    let mut anonymous = claims(epoch(now()), epoch(now()) + 60);
    anonymous.as_object_mut().unwrap().remove("iss");
    let reason = rejected(parse(&forged(r#"{"alg":"EdDSA"}"#, &anonymous, "AAAA")));
    assert!(reason.contains("no iss"), "{reason}");
}

#[test]
fn only_the_keys_own_algorithm_is_accepted() {
    let at = epoch(now());
    // alg none: not an algorithm jsonwebtoken knows, never a bypass.
    let none = forged(
        r#"{"alg":"none","typ":"JWT"}"#,
        &claims(at, at + 60),
        "AAAA",
    );
    let none = none.trim_end_matches("AAAA").to_owned() + "AA";
    let reason = rejected(parse(&none));
    assert!(reason.contains("bad header"), "{reason}");
    // HS256 keyed with the public key's text: the classic confusion.
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims(at, at + 60).to_string());
    let message = format!("{header}.{body}");
    let mac = jsonwebtoken::crypto::sign(
        message.as_bytes(),
        &jsonwebtoken::EncodingKey::from_secret(ED_PUBLIC.as_bytes()),
        jsonwebtoken::Algorithm::HS256,
    )
    .unwrap();
    let reason = rejected(parse(&format!("{message}.{mac}")));
    assert!(
        reason.contains("HS256") && reason.contains("EdDSA"),
        "{reason}"
    );
    // An ES256 token naming alice, whose key is Ed25519.
    let reason = rejected(parse(&sign(P256_PRIVATE, "alice")));
    assert!(
        reason.contains("ES256") && reason.contains("EdDSA"),
        "{reason}"
    );
}

#[test]
fn exp_is_required_and_bounds_the_token() {
    let at = epoch(now());
    let expired = SigningKey::from_pem(ED_PRIVATE)
        .unwrap()
        .sign(
            &wire("cattle-ab12"),
            "alice",
            now() - Duration::from_secs(7200),
            Duration::from_secs(3600),
        )
        .unwrap();
    let reason = rejected(parse(&expired));
    assert!(reason.contains("expired"), "{reason}");
    // Within the leeway it still holds (clocks drift).
    let late = now() + Duration::from_secs(3600) + LEEWAY - Duration::from_secs(1);
    let token = sign(ED_PRIVATE, "alice");
    assert!(
        RestartRequest::parse_verified_at(token.as_bytes(), &rules(), &signatures(), late).is_ok()
    );
    // Missing exp, a lifetime over the maximum, an iat in the future: each
    // signed properly, each refused.
    let key = jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
    let signed = |claims: serde_json::Value| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA),
            &claims,
            &key,
        )
        .unwrap()
    };
    let mut no_exp = claims(at, 0);
    no_exp.as_object_mut().unwrap().remove("exp");
    assert!(rejected(parse(&signed(no_exp))).contains("no exp"));
    let too_long = claims(at, at + MAX_LIFETIME.as_secs() + 1);
    assert!(rejected(parse(&signed(too_long))).contains("lifetime"));
    let future = claims(at + 3600, at + 7200);
    assert!(rejected(parse(&signed(future))).contains("future"));
}

#[test]
fn jti_must_be_the_message_id() {
    let at = epoch(now());
    let key = jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
    let mut other = claims(at, at + 60);
    other["jti"] = "0193a5c4-7d2e-7f00-8000-000000000002".into();
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA),
        &other,
        &key,
    )
    .unwrap();
    let reason = rejected(parse(&token));
    assert!(
        reason.contains("jti") && reason.contains(MESSAGE_ID),
        "{reason}"
    );
}

#[test]
fn unsigned_json_is_refused_only_when_a_signature_is_required() {
    let json =
        br#"{"message_id":"0193a5c4-7d2e-7f00-8000-000000000001","instance_name":"cattle-ab12"}"#;
    assert_eq!(
        RestartRequest::parse_verified_at(json, &rules(), &signatures(), now()),
        Err(Rejection::Unsigned)
    );
    let request = RestartRequest::parse(json, &rules()).unwrap();
    assert_eq!(request.requester, None);
    // A signed request where no key is configured: rejected, not trusted.
    let reason = rejected(RestartRequest::parse(
        sign(ED_PRIVATE, "alice").as_bytes(),
        &rules(),
    ));
    assert!(reason.contains("unknown requester"), "{reason}");
}

#[test]
fn only_ed25519_and_p256_public_keys_are_accepted() {
    assert!(Signer::from_pem(ED_PUBLIC).is_ok());
    assert!(Signer::from_pem(P256_PUBLIC).is_ok());
    for bad in [
        P384_PUBLIC,
        ED_PRIVATE,
        "not a key",
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n",
    ] {
        let why = Signer::from_pem(bad).unwrap_err();
        assert!(why.contains("PEM Ed25519 or P-256"), "{why}");
    }
}

#[test]
fn only_three_base64url_parts_look_signed() {
    use super::is_compact_jws;
    assert!(is_compact_jws(b"eyJh.eyJp.c2ln"));
    // An unsecured token's empty signature: signed-looking, so rejected as
    // a bad signature (saying why), never parsed as JSON.
    assert!(is_compact_jws(b"eyJh.eyJp."));
    for not in [
        &br#"{"message_id":"x"}"#[..],
        b"a.b",
        b"a.b.c.d",
        b".b.c",
        b"a..c",
        b"a.b.c=",
        b"a.b.c\n",
        b"",
    ] {
        assert!(!is_compact_jws(not), "{}", String::from_utf8_lossy(not));
    }
}

#[test]
fn a_signed_requests_reply_to_is_inside_its_claims() {
    let mut wire = wire("cattle-ab12");
    wire.reply_to = Some("chaos.verdicts.alice".into());
    let token = SigningKey::from_pem(ED_PRIVATE)
        .unwrap()
        .sign(&wire, "alice", now(), Duration::from_secs(3600))
        .unwrap();
    let request = parse(&token).unwrap();
    assert_eq!(request.reply_to.as_deref(), Some("chaos.verdicts.alice"));
    // Redirecting it means changing the claims, which breaks the signature.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(&parts[1]).unwrap()).unwrap();
    claims["reply_to"] = "chaos.verdicts.mallory".into();
    parts[1] = URL_SAFE_NO_PAD.encode(claims.to_string());
    rejected(parse(&parts.join(".")));
}

/// A token signed as alice, valid for an hour from `now()`, with `extra`
/// claims.
fn signed_with(extra: serde_json::Value) -> String {
    let mut claims = claims(epoch(now()), epoch(now()) + 3600);
    let fields = claims.as_object_mut().unwrap();
    fields.extend(extra.as_object().unwrap().clone());
    let key = jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

#[test]
fn a_token_not_valid_yet_is_rejected() {
    let in_an_hour = epoch(now()) + 3600;
    let reason = rejected(parse(&signed_with(
        serde_json::json!({ "nbf": in_an_hour }),
    )));
    assert!(reason.contains("not valid yet (nbf"), "{reason}");
    assert!(parse(&signed_with(serde_json::json!({ "nbf": epoch(now()) }))).is_ok());
}

#[test]
fn with_an_audience_set_a_token_must_name_it() {
    let ours = signatures().for_audience(Some("prod-eu".into()));
    let parse_ours =
        |token: &str| RestartRequest::parse_verified_at(token.as_bytes(), &rules(), &ours, now());
    assert!(parse_ours(&signed_with(serde_json::json!({ "aud": "prod-eu" }))).is_ok());
    let other = rejected(parse_ours(&signed_with(
        serde_json::json!({ "aud": "staging" }),
    )));
    assert!(other.contains("audience (prod-eu)"), "{other}");
    let none = rejected(parse_ours(&signed_with(serde_json::json!({}))));
    assert!(none.contains("no aud claim"), "{none}");
    // A key for the audience signs for it.
    let token = SigningKey::from_pem(ED_PRIVATE)
        .unwrap()
        .for_audience(Some("prod-eu".into()))
        .sign(
            &wire("cattle-ab12"),
            "alice",
            now(),
            Duration::from_secs(3600),
        )
        .unwrap();
    assert!(parse_ours(&token).is_ok());
    // Without one there is nothing to compare an aud with.
    assert!(parse(&signed_with(serde_json::json!({ "aud": "staging" }))).is_ok());
}

#[test]
fn a_signature_holds_again_only_with_the_same_key_and_before_exp() {
    let terms = parse(&sign(ED_PRIVATE, "alice"))
        .unwrap()
        .signature
        .expect("signed");
    assert_eq!(signatures().still_valid("alice", terms, now()), Ok(()));
    // The same key, its PEM laid out otherwise (a file saved again).
    let reformatted = ED_PUBLIC.replace('\n', "\r\n");
    let same = Signatures::new(
        HashMap::from([("alice".to_owned(), Signer::from_pem(&reformatted).unwrap())]),
        true,
    );
    assert_eq!(same.still_valid("alice", terms, now()), Ok(()));
    let rotated = Signatures::new(
        HashMap::from([("alice".to_owned(), Signer::from_pem(P256_PUBLIC).unwrap())]),
        true,
    );
    let replaced = rotated.still_valid("alice", terms, now()).unwrap_err();
    assert!(replaced.contains("replaced by a reload"), "{replaced}");
    let removed = Signatures::none()
        .still_valid("alice", terms, now())
        .unwrap_err();
    assert!(removed.contains("no longer trusted"), "{removed}");
    let past_exp = now() + Duration::from_secs(3600) + LEEWAY + Duration::from_secs(1);
    let expired = signatures()
        .still_valid("alice", terms, past_exp)
        .unwrap_err();
    assert!(expired.contains("expired (exp)"), "{expired}");
}
