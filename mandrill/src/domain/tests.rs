use super::*;
use uuid::Uuid;

fn rules() -> ParseRules {
    ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 512,
    }
}

const ID: &str = "1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b";

#[test]
fn valid_request_parses_and_builds_hostname() {
    let payload = format!(
        r#"{{"message_id":"{ID}","instance_name":"cattle-ab12","requested_by":"sre","extra":1}}"#
    );
    let request = RestartRequest::parse(payload.as_bytes(), &rules()).unwrap();
    assert_eq!(request.hostname.as_str(), "cattle-ab12.example.net");
    assert_eq!(request.requested_by.as_deref(), Some("sre"));
    assert_eq!(request.message_id.to_string(), ID);
}

#[test]
fn each_malformed_payload_gets_its_own_reason() {
    let cases: &[(&[u8], &str)] = &[
        (b"not json", "payload is not a valid request"),
        (b"\xff\xfe", "not valid utf-8"),
        (br#"{"instance_name":"cattle-ab12"}"#, "missing field `message_id`"),
        (
            br#"{"message_id":"nope","instance_name":"cattle-ab12"}"#,
            "is not a uuid",
        ),
        (
            br#"{"message_id":"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b","instance_name":"Cattle"}"#,
            "contains 'C'",
        ),
        (
            br#"{"message_id":"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b","instance_name":"-x"}"#,
            "hyphen",
        ),
        (
            br#"{"message_id":"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b","instance_name":""}"#,
            "is empty",
        ),
        (
            br#"{"message_id":"1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b","instance_name":"a","published_at":"yesterday"}"#,
            "rfc 3339",
        ),
    ];
    for (payload, expected) in cases {
        let reason = RestartRequest::parse(payload, &rules())
            .unwrap_err()
            .to_string();
        assert!(
            reason.contains(expected),
            "{:?}: {reason:?} lacks {expected:?}",
            String::from_utf8_lossy(payload)
        );
    }
}

#[test]
fn free_text_that_a_store_could_not_keep_is_rejected_with_the_field_named() {
    let with = |field: &str, value: &str| {
        let value = serde_json::to_string(value).unwrap();
        let payload =
            format!(r#"{{"message_id":"{ID}","instance_name":"cattle-ab12","{field}":{value}}}"#);
        let rules = ParseRules {
            max_payload_bytes: 8192,
            ..rules()
        };
        RestartRequest::parse(payload.as_bytes(), &rules)
    };
    // PostgreSQL cannot store NUL in text: seen restarting a host ten times.
    let nul = with("reason", "game\u{0}day").unwrap_err().to_string();
    assert!(nul.contains("reason") && nul.contains("U+0000"), "{nul}");
    let newline = with("requested_by", "sre\nteam").unwrap_err().to_string();
    assert!(
        newline.contains("requested_by") && newline.contains("U+000A"),
        "{newline}"
    );
    let escape = with("reason", "\u{1b}[31mred").unwrap_err().to_string();
    assert!(escape.contains("U+001B"), "{escape}");
    // Bidirectional and zero-width characters make what is shown differ
    // from what was sent: each of them is refused, in either field.
    let reordering_or_hidden = [
        '\u{061C}',
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{200E}',
        '\u{200F}',
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}',
        '\u{2060}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{FEFF}',
        // Format characters beyond those, separators, and what shows as
        // nothing: "alice\u{2063}" would read as "alice".
        '\u{00AD}',
        '\u{034F}',
        '\u{115F}',
        '\u{180E}',
        '\u{2028}',
        '\u{2029}',
        '\u{2061}',
        '\u{2063}',
        '\u{2064}',
        '\u{206A}',
        '\u{3164}',
        '\u{FE0F}',
        '\u{FFA0}',
        '\u{E0041}',
        '\u{E0100}',
    ];
    for (field, c) in ["requested_by", "reason"]
        .into_iter()
        .flat_map(|field| reordering_or_hidden.map(|c| (field, c)))
    {
        let error = with(field, &format!("oncall{c}toor"))
            .expect_err(&format!("{field} with U+{:04X}", u32::from(c)))
            .to_string();
        let code = format!("U+{:04X} at character 6", u32::from(c));
        assert!(
            error.contains(field)
                && error.contains("bidirectional, zero-width or invisible")
                && error.contains(&code),
            "{error}"
        );
    }
    // Right-to-left text and emoji are not refused.
    assert!(with("reason", "יום משחק 🐒").is_ok());
    let long = with("reason", &"x".repeat(MAX_REASON_CHARS + 1)).unwrap_err();
    assert!(long.to_string().contains("at most 1024"), "{long}");
    let long = with("requested_by", &"é".repeat(MAX_REQUESTED_BY_CHARS + 1)).unwrap_err();
    assert!(long.to_string().contains("at most 128"), "{long}");
    // At the limit (in characters, not bytes) is fine; space is trimmed.
    let ok = with("requested_by", &"é".repeat(MAX_REQUESTED_BY_CHARS)).unwrap();
    assert_eq!(
        ok.requested_by.unwrap().chars().count(),
        MAX_REQUESTED_BY_CHARS
    );
    let trimmed = with("reason", "  game day \t").unwrap();
    assert_eq!(trimmed.reason.as_deref(), Some("game day"));
    assert_eq!(with("reason", "   ").unwrap().reason, None);
}

#[test]
fn a_rejection_quotes_at_most_a_short_excerpt_of_what_was_sent() {
    let rules = ParseRules {
        max_payload_bytes: 1 << 20,
        ..rules()
    };
    let huge = "X".repeat(100_000);
    for payload in [
        format!(r#"{{"message_id":"{ID}","instance_name":"{huge}"}}"#),
        format!(r#"{{"message_id":"{huge}","instance_name":"a"}}"#),
        format!(r#"{{"message_id":"{ID}","instance_name":"a","published_at":"{huge}"}}"#),
        format!(r#"{{"message_id":"{ID}","instance_name":"a","extra":{huge}}}"#),
    ] {
        let reason = RestartRequest::parse(payload.as_bytes(), &rules)
            .unwrap_err()
            .to_string();
        assert!(reason.len() < 300, "{} bytes: {reason:.200}", reason.len());
    }
}

/// A rejection quotes what the payload held escaped: a JWT whose header
/// names an `alg` of terminal escapes (the JWT library's error quotes it
/// whole), an unknown field and an id made of them, never reach the
/// history, a dead letter's reason or an operator's terminal as escapes.
#[test]
fn a_rejection_quotes_control_and_hiding_characters_escaped() {
    use base64::Engine as _;
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(r#"{"alg":"\u001b]2;pwned\u0007\u001b[2J"}"#);
    let jwt = format!("{header}.e30.x");
    for payload in [
        jwt,
        format!(r#"{{"message_id":"{ID}","instance_name":"a\u001b[31m"}}"#),
        r#"{"message_id":"\u001b[2J\u202e","instance_name":"a"}"#.to_owned(),
    ] {
        let reason = RestartRequest::parse(payload.as_bytes(), &rules())
            .unwrap_err()
            .to_string();
        assert!(
            !reason.contains(['\u{1b}', '\u{7}', '\u{202e}']),
            "{reason:?}"
        );
        assert!(reason.contains("\\u{1b}"), "{reason:?}");
    }
}

#[test]
fn a_prefix_of_an_oversized_payload_is_rejected_by_its_full_size() {
    assert_eq!(
        RestartRequest::parse_sized(b"{", 20_000_000, &rules()),
        Err(Rejection::TooLarge {
            size: 20_000_000,
            limit: 512
        })
    );
}

#[test]
fn oversized_payload_is_rejected_before_parsing() {
    let payload = vec![b'x'; 513];
    assert_eq!(
        RestartRequest::parse(&payload, &rules()),
        Err(Rejection::TooLarge {
            size: 513,
            limit: 512
        })
    );
}

#[test]
fn label_rules_follow_dns() {
    assert!(InstanceName::parse(&"a".repeat(63)).is_ok());
    assert!(InstanceName::parse(&"a".repeat(64)).is_err());
    assert!(InstanceName::parse("a-1").is_ok());
    assert!(InstanceName::parse("a_1").is_err());
    assert!(InstanceName::parse("a.b").is_err());
    assert!(Domain::parse("example.net").is_ok());
    assert!(Domain::parse("example..net").is_err());
}

#[test]
fn wire_form_round_trips() {
    let mut rng = rand::rng();
    let instance_name = random_instance_name(&mut rng);
    assert!(instance_name.as_str().starts_with("cattle-") && instance_name.as_str().len() == 11);
    let request = RestartRequest {
        message_id: Uuid::new_v4(),
        hostname: Hostname::new(&instance_name, &Domain::default()),
        instance_name,
        requested_by: None,
        reason: Some("chaos".into()),
        published_at: Some(humantime::parse_rfc3339("2026-11-21T10:00:00.123Z").unwrap()),
        group: None,
        requested_group: None,
        zone: None,
        requester: None,
        signature: None,
        reach: None,
        machine: None,
        not_before: None,
        reply_to: None,
    };
    assert_eq!(
        RestartRequest::parse(&request.to_wire(), &rules()),
        Ok(request)
    );
}

#[test]
fn salvage_finds_id_in_rejected_payload() {
    let payload = format!(r#"{{"message_id":"{ID}","instance_name":"BAD"}}"#);
    assert_eq!(
        salvage_message_id(payload.as_bytes()).unwrap().to_string(),
        ID
    );
    assert_eq!(salvage_message_id(b"garbage"), None);
}

#[test]
fn a_rejected_payload_keeps_what_it_asked_for_unverified_and_only_what_passes_the_checks() {
    let payload = format!(
        r#"{{"message_id":"{ID}","instance_name":"cattle-a1","requested_by":"oncall-bot","reason":"bad\u0007bell","published_at":"never"}}"#
    );
    assert_eq!(
        Asked::salvage(payload.as_bytes()),
        Asked {
            message_id: Some(Uuid::parse_str(ID).unwrap()),
            instance_name: Some("cattle-a1".into()),
            requested_by: Some("oncall-bot".into()),
            // A control character: left out, not shown.
            reason: None,
            requester: None,
        }
    );
    let bad_name = format!(r#"{{"message_id":"{ID}","instance_name":"BAD NAME"}}"#);
    assert_eq!(Asked::salvage(bad_name.as_bytes()).instance_name, None);
    // A signed one's claims are read unverified: its `iss` is who it says
    // signed it, never a verified requester.
    let claims = format!(
        r#"{{"message_id":"{ID}","instance_name":"cattle-a1","requested_by":"someone","iss":"mallory"}}"#
    );
    let token = format!(
        "eyJhbGciOiJFZERTQSJ9.{}.c2lnbmF0dXJl",
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, claims)
    );
    let asked = Asked::salvage(token.as_bytes());
    assert_eq!(
        (
            asked.instance_name.as_deref(),
            asked.requested_by.as_deref(),
            asked.requester
        ),
        (Some("cattle-a1"), Some("mallory"), None)
    );
    assert_eq!(Asked::salvage(b"garbage"), Asked::default());
}

#[test]
fn minted_ids_are_version_7_and_sort_by_their_time_in_text_too() {
    let mut rng = rand::rng();
    let at = humantime::parse_rfc3339("2026-11-23T01:00:00.123Z").unwrap();
    let later = at + std::time::Duration::from_millis(1);
    let (first, second) = (
        new_message_id(at, &mut rng),
        new_message_id(later, &mut rng),
    );
    assert_eq!(first.get_version(), Some(uuid::Version::SortRand));
    let (seconds, nanos) = first.get_timestamp().unwrap().to_unix();
    assert_eq!((seconds, nanos), (1_795_395_600, 123_000_000));
    // The stores keep ids as text: the text must sort as the time does, or
    // the indexes' right edge would not be where new ids go.
    assert!(first < second && first.to_string() < second.to_string());
    // Two ids of one millisecond differ in their 74 random bits.
    assert_ne!(new_message_id(at, &mut rng), first);
}

#[test]
fn a_messages_group_is_kept_apart_and_never_counted_in() {
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"cattle-a1","group":"g1"}}"#,
        Uuid::new_v4()
    );
    let request = RestartRequest::parse(payload.as_bytes(), &rules()).unwrap();
    assert_eq!(request.requested_group.as_deref(), Some("g1"));
    assert_eq!(request.group, None);
    assert_eq!(
        request.group(),
        "cattle",
        "the name's default until assigned"
    );
}

#[test]
fn a_reply_to_is_a_plain_subject_or_topic_or_the_request_is_rejected() {
    let parse = |reply_to: &str| {
        let payload = serde_json::json!({
            "message_id": ID, "instance_name": "cattle-ab12", "reply_to": reply_to,
        });
        RestartRequest::parse(payload.to_string().as_bytes(), &rules())
    };
    let request = parse("chaos.verdicts.team-a_1").unwrap();
    assert_eq!(request.reply_to.as_deref(), Some("chaos.verdicts.team-a_1"));
    assert_eq!(
        RestartRequest::parse(&request.to_wire(), &rules()).unwrap(),
        request,
        "kept on the wire"
    );
    for (bad, why) in [
        ("chaos.*", "contains '*'"),
        ("chaos.>", "contains '>'"),
        ("$JS.API.STREAM.DELETE.X", "contains '$'"),
        ("chaos verdicts", "contains ' '"),
        ("chaos..verdicts", "empty token"),
        (".chaos", "empty token"),
        ("", "1 to 255 bytes"),
    ] {
        match parse(bad) {
            Err(Rejection::BadText {
                field: "reply_to",
                why: said,
            }) => {
                assert!(said.contains(why), "{bad:?}: {said}");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(parse(&"a".repeat(256)).is_err());
}
