//! The STS and metadata answers read, and the cache's refresh.
use super::*;

#[test]
fn an_assume_role_answer_gives_its_keys_token_and_expiry() {
    let root = Element::parse(
        r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>system:serviceaccount:chaos:mandrill</SubjectFromWebIdentityToken><Credentials><SessionToken>FwoGZXIvYXdz</SessionToken><SecretAccessKey>wJalrXUtnFEMI</SecretAccessKey><Expiration>2026-11-28T21:00:00Z</Expiration><AccessKeyId>ASIAEXAMPLE</AccessKeyId></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"#,
    )
    .unwrap();
    let found = assumed_role_credentials(&root).unwrap();
    assert_eq!(found.access_key_id, "ASIAEXAMPLE");
    assert_eq!(found.session_token, Some(Secret("FwoGZXIvYXdz".into())));
    assert_eq!(found.expires, Some("2026-11-28T21:00:00Z".parse().unwrap()));
    let shown = format!("{found:?}");
    assert!(
        !shown.contains("wJal") && !shown.contains("FwoG"),
        "{shown}"
    );
    let partial =
        Element::parse("<R><Credentials><AccessKeyId>A</AccessKeyId></Credentials></R>").unwrap();
    assert!(
        assumed_role_credentials(&partial)
            .unwrap_err()
            .contains("SecretAccessKey")
    );
}

#[test]
fn a_metadata_answer_gives_its_keys_and_a_failed_or_foreign_one_is_refused() {
    let found = instance_credentials(
        r#"{"Code":"Success","LastUpdated":"2026-11-28T19:00:00Z","Type":"AWS-HMAC","AccessKeyId":"ASIAROLE","SecretAccessKey":"s","Token":"t","Expiration":"2026-11-28T20:00:00Z"}"#,
    )
    .unwrap();
    assert_eq!(found.access_key_id, "ASIAROLE");
    assert_eq!(found.session_token, Some(Secret("t".into())));
    let failed = r#"{"Code":"AssumeRoleUnauthorizedAccess","AccessKeyId":"","SecretAccessKey":"","Token":"","Expiration":""}"#;
    assert!(
        instance_credentials(failed)
            .unwrap_err()
            .contains("AssumeRoleUnauthorizedAccess")
    );
    assert!(instance_credentials("<html>").is_err());
    assert_eq!(instance_role("web-role\n").unwrap(), "web-role");
    for hostile in ["", "../../user-data", "a role", "<html>"] {
        assert!(instance_role(hostile).is_err(), "{hostile:?}");
    }
}

fn expiring(key: &str, at: &str) -> Credentials {
    Credentials {
        access_key_id: key.to_owned(),
        secret_access_key: Secret("s".into()),
        session_token: Some(Secret("t".into())),
        expires: Some(at.parse().unwrap()),
    }
}

#[tokio::test]
async fn the_cache_fetches_once_until_five_minutes_before_expiry_and_keeps_working_keys_on_failure()
{
    let cache = Cache::new();
    let role = Source::InstanceMetadata {
        endpoint: "http://169.254.169.254".parse().unwrap(),
    };
    let other = Source::InstanceMetadata {
        endpoint: "http://[fd00:ec2::254]".parse().unwrap(),
    };
    let at = |time: &str| time.parse::<jiff::Timestamp>().unwrap();
    let fetched = std::sync::atomic::AtomicUsize::new(0);
    let get = |source: &Source, now: &str, answer: Result<Credentials, String>| {
        let fetched = &fetched;
        let now = at(now);
        let source = source.clone();
        let cache = &cache;
        async move {
            cache
                .get(&source, now, || async {
                    fetched.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    answer
                })
                .await
                .map(|c| c.access_key_id)
        }
    };
    let first = Ok(expiring("A1", "2026-11-28T20:00:00Z"));
    assert_eq!(
        get(&role, "2026-11-28T19:00:00Z", first.clone())
            .await
            .unwrap(),
        "A1"
    );
    let second = Ok(expiring("A2", "2026-11-28T21:00:00Z"));
    assert_eq!(
        get(&role, "2026-11-28T19:54:00Z", second.clone())
            .await
            .unwrap(),
        "A1"
    );
    assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Another source is never answered with this one's keys.
    assert_eq!(
        get(&other, "2026-11-28T19:54:00Z", second.clone())
            .await
            .unwrap(),
        "A2"
    );
    assert_eq!(
        get(&role, "2026-11-28T19:54:00Z", first.clone())
            .await
            .unwrap(),
        "A1"
    );
    // Within five minutes of the expiry: fetched again; a failure
    // keeps the keys while they work, and is the answer after.
    let down = Err("sts: connection refused".to_owned());
    assert_eq!(
        get(&role, "2026-11-28T19:56:00Z", down.clone())
            .await
            .unwrap(),
        "A1"
    );
    assert_eq!(
        get(&role, "2026-11-28T20:00:01Z", down.clone())
            .await
            .unwrap_err(),
        "sts: connection refused"
    );
    assert_eq!(
        get(&role, "2026-11-28T20:00:02Z", second).await.unwrap(),
        "A2"
    );
    assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 6);
}

#[test]
fn temporary_credentials_are_fetched_again_five_minutes_before_they_expire() {
    let expires: jiff::Timestamp = "2026-11-28T20:00:00Z".parse().unwrap();
    let at = |time: &str| time.parse::<jiff::Timestamp>().unwrap();
    assert!(is_fresh(Some(expires), at("2026-11-28T19:54:59Z")));
    assert!(!is_fresh(Some(expires), at("2026-11-28T19:55:00Z")));
    assert!(!is_fresh(Some(expires), at("2026-11-28T20:30:00Z")));
    assert!(is_fresh(None, at("2026-11-28T20:30:00Z")));
}
