use super::*;
use uuid::Uuid;

/// A valid request for `instance` in the default domain, with a fresh id.
pub(crate) fn request(instance: &str) -> RestartRequest {
    let payload = format!(
        r#"{{"message_id":"{}","instance_name":"{instance}"}}"#,
        Uuid::new_v4()
    );
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    RestartRequest::parse(payload.as_bytes(), &rules).expect("a valid test request")
}
