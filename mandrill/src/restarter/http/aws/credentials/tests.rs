//! The chain's order, each source's keys and the errors that name what
//! was tried.
use super::*;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}

fn file(text: &str) -> SharedFile {
    (
        PathBuf::from("/home/ops/.aws/credentials"),
        Some(text.to_owned()),
    )
}

/// The access key id the chain settles on, or the source's kind.
fn found(
    env: &[(&str, &str)],
    credentials: Option<&SharedFile>,
    config: Option<&SharedFile>,
) -> String {
    match resolve(&env_of(env), credentials, config).unwrap() {
        Source::Keys(keys) => keys.access_key_id,
        Source::WebIdentity { role_arn, .. } => format!("web identity {role_arn}"),
        Source::InstanceMetadata { endpoint } => format!("metadata {endpoint}"),
    }
}

#[test]
fn the_chain_reads_the_environment_then_web_identity_then_the_profile_then_the_instance() {
    let credentials = file(
        "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s1\n\
         [chaos]\naws_access_key_id=AKCHAOS\naws_secret_access_key=s2\naws_session_token=t2\n",
    );
    let config = file(
        "[default]\nregion = eu-west-1\n[profile other]\naws_access_key_id = AKOTHER\n\
         aws_secret_access_key = s3\n  s3 =\n    max_concurrent_requests = 1\n\
         [profile eks]\nrole_arn = arn:aws:iam::1:role/eks\n\
         web_identity_token_file = /var/run/token\nrole_session_name = chaos\n",
    );
    let (credentials, config) = (Some(&credentials), Some(&config));
    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKENV"),
        ("AWS_SECRET_ACCESS_KEY", "s0"),
    ];
    let web = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/env"),
    ];
    let all = [&keys[..], &web[..]].concat();
    assert_eq!(found(&all, credentials, config), "AKENV");
    assert_eq!(
        found(&web, credentials, config),
        "web identity arn:aws:iam::1:role/env"
    );
    assert_eq!(found(&[], credentials, config), "AKDEFAULT");
    assert_eq!(
        found(&[("AWS_PROFILE", "other")], credentials, config),
        "AKOTHER"
    );
    assert_eq!(
        found(&[("AWS_PROFILE", "eks")], credentials, config),
        "web identity arn:aws:iam::1:role/eks"
    );
    assert_eq!(
        found(&[("AWS_PROFILE", "nobody")], credentials, config),
        "metadata http://169.254.169.254/"
    );
    assert_eq!(
        found(
            &[("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6")],
            None,
            None
        ),
        "metadata http://[fd00:ec2::254]/"
    );
    let Source::Keys(chaos) =
        resolve(&env_of(&[("AWS_PROFILE", "chaos")]), credentials, config).unwrap()
    else {
        panic!("keys expected");
    };
    assert_eq!(chaos.session_token, Some(Secret("t2".into())));
    assert!(!format!("{chaos:?}").contains("s2"), "{chaos:?}");
}

#[test]
fn web_identity_takes_its_session_name_and_an_sts_endpoint_that_is_https_or_loopback() {
    let web = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/env"),
    ];
    let Source::WebIdentity {
        session_name,
        sts_endpoint,
        ..
    } = resolve(&env_of(&web), None, None).unwrap()
    else {
        panic!("web identity expected");
    };
    assert_eq!((session_name.as_str(), sts_endpoint), ("mandrill", None));
    let with = |more: (&str, &str)| resolve(&env_of(&[&web[..], &[more]].concat()), None, None);
    let Ok(Source::WebIdentity { sts_endpoint, .. }) =
        with(("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:5000"))
    else {
        panic!("web identity expected");
    };
    assert_eq!(sts_endpoint.unwrap().as_str(), "http://127.0.0.1:5000/");
    let why = with(("AWS_ENDPOINT_URL_STS", "http://sts.example.com")).unwrap_err();
    assert!(why.starts_with("AWS_ENDPOINT_URL_STS"), "{why}");
}

#[test]
fn with_the_metadata_service_disabled_and_nothing_else_every_source_tried_is_named() {
    let why = resolve(
        &env_of(&[("AWS_EC2_METADATA_DISABLED", "true")]),
        None,
        None,
    )
    .unwrap_err();
    for source in [
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "profile \"default\"",
        "shared credentials file",
        "instance metadata service (disabled",
    ] {
        assert!(why.contains(source), "{source} missing: {why}");
    }
}

#[test]
fn a_profile_that_assumes_a_role_from_another_profile_is_refused_naming_what_is_not_read() {
    let config = file("[profile ops]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = a\n");
    let why = resolve(&env_of(&[("AWS_PROFILE", "ops")]), None, Some(&config)).unwrap_err();
    assert!(
        why.contains("role_arn") && why.contains("does not read"),
        "{why}"
    );
}
