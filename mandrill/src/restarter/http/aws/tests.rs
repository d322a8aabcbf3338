//! The error shapes, the endpoints and the regions accepted.
use super::*;

#[test]
fn both_error_shapes_give_their_code_and_message() {
    let ec2 = Element::parse(
        r#"<?xml version="1.0" encoding="utf-8"?>
<Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15"><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-0123456789abcdef0' does not exist</Message></Error></Errors><RequestID>request-id</RequestID></Response>"#,
    )
    .unwrap();
    assert_eq!(
        api_error(&ec2),
        Some((
            "InvalidInstanceID.NotFound".into(),
            "The instance ID 'i-0123456789abcdef0' does not exist".into()
        ))
    );
    let autoscaling = Element::parse(
        r#"<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>x</RequestId></ErrorResponse>"#,
    )
    .unwrap();
    let (code, _) = api_error(&autoscaling).unwrap();
    let error = AwsError::Api {
        service: "autoscaling",
        action: "DescribeAutoScalingGroups".into(),
        code,
        message: String::new(),
        status: 400,
    };
    assert!(error.is_transient());
    let denied = AwsError::Api {
        service: "ec2",
        action: "RebootInstances".into(),
        code: "UnauthorizedOperation".into(),
        message: String::new(),
        status: 403,
    };
    assert!(!denied.is_transient());
}

#[test]
fn an_endpoint_is_https_or_loopback_http_and_holds_no_credentials() {
    assert!(check_endpoint("http://127.0.0.1:5000").is_ok());
    assert!(check_endpoint("https://vpce-1.ec2.us-east-1.vpce.amazonaws.com").is_ok());
    assert!(check_endpoint("http://ec2.internal:80").is_err());
    assert!(check_endpoint("https://user:pw@ec2.internal").is_err());
    assert!(check_endpoint("ftp://x").is_err());
    // Misspelt so that no parser finds the credentials: still not shown.
    for raw in ["https//AKIA:S3cr3t@vpce-1.example", "ftp://AKIA:S3cr3t@x"] {
        let why = check_endpoint(raw).unwrap_err();
        assert!(
            !why.contains("S3cr3t") && why.contains("not shown"),
            "{why}"
        );
    }
    assert_eq!(
        Service::Ec2.endpoint("us-east-1"),
        "https://ec2.us-east-1.amazonaws.com/"
    );
    assert_eq!(
        Service::AutoScaling.endpoint("cn-north-1"),
        "https://autoscaling.cn-north-1.amazonaws.com.cn/"
    );
    assert!(check_region("us-gov-west-1").is_ok());
    assert!(check_region("us-east-1.evil.com/").is_err());
}

#[test]
fn a_5xx_or_an_unreadable_answer_may_have_been_done_throttling_and_a_refusal_were_not() {
    let answered = |code: &str, status| AwsError::Api {
        service: "ec2",
        action: "RebootInstances".into(),
        code: code.into(),
        message: String::new(),
        status,
    };
    assert!(answered("InternalError", 500).may_have_been_done());
    assert!(!answered("RequestLimitExceeded", 503).may_have_been_done());
    assert!(!answered("IncorrectInstanceState", 400).may_have_been_done());
    assert!(
        AwsError::Unreadable {
            service: "ec2",
            action: "RebootInstances".into(),
            status: 200,
            why: "truncated".into(),
        }
        .may_have_been_done()
    );
    assert!(!AwsError::CredentialsUnavailable("no token".into()).may_have_been_done());
}

#[test]
fn only_an_error_answer_below_500_that_is_not_throttling_is_a_refusal() {
    let answered = |code: &str, status| AwsError::Api {
        service: "ec2",
        action: "StopInstances".into(),
        code: code.into(),
        message: String::new(),
        status,
    };
    assert!(answered("IncorrectInstanceState", 400).is_refusal());
    assert!(answered("UnauthorizedOperation", 403).is_refusal());
    assert!(!answered("RequestLimitExceeded", 503).is_refusal());
    assert!(!answered("Throttling", 400).is_refusal());
    assert!(!answered("InternalError", 500).is_refusal());
    assert!(!AwsError::CredentialsUnavailable("no token".into()).is_refusal());
}
