//! The domain: restart requests and their outcomes. No I/O lives here.
//!
//! Raw bytes from a broker become a [`RestartRequest`] in exactly one place,
//! [`RestartRequest::parse`]; anything that does not parse becomes a
//! [`Rejection`] whose `Display` is the dead-letter reason. The rest of the
//! code never sees an unvalidated instance name or hostname.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Limits and defaults applied while parsing a payload.
#[derive(Debug, Clone)]
pub struct ParseRules {
    /// Appended to the instance name to form the hostname, e.g. `example.net`.
    pub domain: Domain,
    /// Payloads larger than this are rejected before any parsing.
    pub max_payload_bytes: usize,
}

/// A validated DNS label: lower-case letters, digits and hyphens, 1 to 63
/// characters, neither starting nor ending with a hyphen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceName(String);

impl InstanceName {
    /// Parses `raw`, explaining what is wrong when it is not a valid DNS label.
    pub fn parse(raw: &str) -> Result<Self, String> {
        validate_label(raw).map(|()| Self(raw.to_owned()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn validate_label(raw: &str) -> Result<(), String> {
    if raw.is_empty() {
        return Err("is empty".into());
    }
    if raw.len() > 63 {
        return Err(format!("is {} characters long (at most 63)", raw.len()));
    }
    if let Some(bad) = raw
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "contains {bad:?} (only a-z, 0-9 and '-' are allowed)"
        ));
    }
    if raw.starts_with('-') || raw.ends_with('-') {
        return Err("starts or ends with a hyphen".into());
    }
    Ok(())
}

/// A validated DNS domain, e.g. `example.net`: dot-separated valid labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain(String);

impl Domain {
    /// Parses a domain such as `example.net`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.len() > 253 - 64 {
            return Err(format!("domain {raw:?} is too long"));
        }
        for label in raw.split('.') {
            validate_label(label).map_err(|why| format!("domain label {label:?} {why}"))?;
        }
        Ok(Self(raw.to_owned()))
    }
}

impl Default for Domain {
    fn default() -> Self {
        Self("example.net".to_owned())
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fully-qualified host to restart: `{instance_name}.{domain}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hostname(String);

impl Hostname {
    /// Builds the hostname of an instance in a domain; both are already valid.
    pub fn new(instance: &InstanceName, domain: &Domain) -> Self {
        Self(format!("{}.{}", instance.0, domain.0))
    }

    /// The hostname as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A request to restart one host, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRequest {
    /// The publisher's id for this request; the unit of idempotency.
    pub message_id: Uuid,
    /// The instance to restart.
    pub instance_name: InstanceName,
    /// `instance_name` qualified with the configured domain.
    pub hostname: Hostname,
    /// Who asked, if the publisher said.
    pub requested_by: Option<String>,
    /// Why, if the publisher said.
    pub reason: Option<String>,
    /// When the publisher sent it, if it said.
    pub published_at: Option<SystemTime>,
    /// The group the publisher named, if it did; see
    /// [`crate::safety::Counting::group`] for how a group is chosen otherwise.
    pub group: Option<String>,
}

/// The wire format. Unknown fields are accepted so that newer publishers can
/// add fields without older services dead-lettering their messages.
#[derive(Debug, Serialize, Deserialize)]
pub struct WireRequest {
    /// A UUID.
    pub message_id: String,
    /// A DNS label, e.g. `cattle-ab12`.
    pub instance_name: String,
    /// Optional: who asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Optional: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Optional: RFC 3339 timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<String>,
    /// Optional: the group the instance belongs to, for the rate limits and
    /// the disruption budget (a DNS label, like an instance name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Why a payload was not accepted as a restart request. The `Display` text is
/// the dead-letter reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The payload is larger than the configured limit.
    #[error("payload is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// Size of the payload.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The payload is not UTF-8.
    #[error("payload is not valid utf-8 (at byte {valid_up_to})")]
    NotUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The payload is not a JSON object of the expected shape.
    #[error("payload is not a valid request: {0}")]
    BadJson(String),
    /// `message_id` is not a UUID.
    #[error("message_id {0:?} is not a uuid")]
    BadMessageId(String),
    /// `instance_name` is not a DNS label.
    #[error("instance_name {name:?} {why}")]
    BadInstanceName {
        /// The offending name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// `published_at` is not an RFC 3339 timestamp.
    #[error("published_at {0:?} is not an rfc 3339 timestamp")]
    BadPublishedAt(String),
    /// A free-text field (`requested_by`, `reason`) cannot be stored as is.
    #[error("{field} {why}")]
    BadText {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

impl Rejection {
    /// The kinds, as `/metrics` labels them (`mandrill_rejections_total{reason}`).
    pub const KINDS: [&'static str; 7] = [
        "too_large",
        "not_utf8",
        "bad_json",
        "bad_message_id",
        "bad_instance_name",
        "bad_published_at",
        "bad_text",
    ];

    /// This rejection's index in [`Rejection::KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            Self::TooLarge { .. } => 0,
            Self::NotUtf8 { .. } => 1,
            Self::BadJson(_) => 2,
            Self::BadMessageId(_) => 3,
            Self::BadInstanceName { .. } => 4,
            Self::BadPublishedAt(_) => 5,
            Self::BadText { .. } => 6,
        }
    }
}

/// Most characters of an offending value a rejection quotes: reasons go to
/// logs, dead-letter headers and the history, and must stay short whatever
/// the payload held.
const MAX_QUOTED_CHARS: usize = 64;

/// `value`, cut to [`MAX_QUOTED_CHARS`] characters with a mark if it was cut.
fn excerpt(value: &str) -> String {
    match value.char_indices().nth(MAX_QUOTED_CHARS) {
        None => value.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &value[..cut], value.len()),
    }
}

/// Longest `requested_by` accepted, in characters.
pub const MAX_REQUESTED_BY_CHARS: usize = 128;
/// Longest `reason` accepted, in characters.
pub const MAX_REASON_CHARS: usize = 1024;

/// Validates and normalises a free-text field so that whatever parses can
/// be stored by every store: surrounding white space is trimmed, an empty
/// value is no value, control characters (NUL included, which PostgreSQL
/// cannot store in text) are refused, and the length is bounded.
fn free_text(
    field: &'static str,
    raw: Option<String>,
    max_chars: usize,
) -> Result<Option<String>, Rejection> {
    let Some(raw) = raw else { return Ok(None) };
    let trimmed = raw.trim();
    if let Some((at, bad)) = trimmed.chars().enumerate().find(|(_, c)| c.is_control()) {
        return Err(Rejection::BadText {
            field,
            why: format!(
                "contains the control character U+{:04X} at character {at}",
                u32::from(bad)
            ),
        });
    }
    let chars = trimmed.chars().count();
    if chars > max_chars {
        return Err(Rejection::BadText {
            field,
            why: format!("is {chars} characters long (at most {max_chars})"),
        });
    }
    Ok((!trimmed.is_empty()).then(|| trimmed.to_owned()))
}

impl RestartRequest {
    /// Parses and validates a payload from the wire.
    pub fn parse(payload: &[u8], rules: &ParseRules) -> Result<Self, Rejection> {
        Self::parse_sized(payload, payload.len(), rules)
    }

    /// Parses a payload of which the broker may have read only a prefix:
    /// `full_size` is the size of the whole, checked against the limit first.
    pub fn parse_sized(
        payload: &[u8],
        full_size: usize,
        rules: &ParseRules,
    ) -> Result<Self, Rejection> {
        let size = full_size.max(payload.len());
        if size > rules.max_payload_bytes {
            return Err(Rejection::TooLarge {
                size,
                limit: rules.max_payload_bytes,
            });
        }
        let text = std::str::from_utf8(payload).map_err(|e| Rejection::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        let wire: WireRequest =
            serde_json::from_str(text).map_err(|e| Rejection::BadJson(excerpt(&e.to_string())))?;
        let message_id = Uuid::parse_str(&wire.message_id)
            .map_err(|_| Rejection::BadMessageId(excerpt(&wire.message_id)))?;
        let instance_name =
            InstanceName::parse(&wire.instance_name).map_err(|why| Rejection::BadInstanceName {
                name: excerpt(&wire.instance_name),
                why,
            })?;
        let published_at = wire
            .published_at
            .as_deref()
            .map(|raw| {
                humantime::parse_rfc3339_weak(raw)
                    .map_err(|_| Rejection::BadPublishedAt(excerpt(raw)))
            })
            .transpose()?;
        let group = wire
            .group
            .as_deref()
            .map(|raw| {
                InstanceName::parse(raw)
                    .map(|name| name.as_str().to_owned())
                    .map_err(|why| Rejection::BadText {
                        field: "group",
                        why: format!("{:?} {why}", excerpt(raw)),
                    })
            })
            .transpose()?;
        Ok(Self {
            message_id,
            group,
            hostname: Hostname::new(&instance_name, &rules.domain),
            instance_name,
            requested_by: free_text("requested_by", wire.requested_by, MAX_REQUESTED_BY_CHARS)?,
            reason: free_text("reason", wire.reason, MAX_REASON_CHARS)?,
            published_at,
        })
    }

    /// The request's group as the request alone tells it: its own `group`,
    /// else [`Self::default_group`]. (Configured group patterns are applied
    /// by [`crate::safety::Counting::group`].)
    pub fn group(&self) -> &str {
        self.group
            .as_deref()
            .unwrap_or_else(|| self.default_group())
    }

    /// The instance name without its last `-suffix` (`cattle-ab12` →
    /// `cattle`), or the whole name when it has none.
    pub fn default_group(&self) -> &str {
        let name = self.instance_name.as_str();
        name.rsplit_once('-').map_or(name, |(group, _)| group)
    }

    /// The wire form of a request, as publishers send it.
    pub fn to_wire(&self) -> Vec<u8> {
        let wire = WireRequest {
            message_id: self.message_id.to_string(),
            instance_name: self.instance_name.to_string(),
            requested_by: self.requested_by.clone(),
            reason: self.reason.clone(),
            published_at: self
                .published_at
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
            group: self.group.clone(),
        };
        // Serialising a struct of strings to JSON cannot fail.
        serde_json::to_vec(&wire).expect("a struct of strings serialises")
    }
}

/// Best effort at finding the message id in a payload that was rejected, so
/// that the rejection can be recorded against it.
pub fn salvage_message_id(payload: &[u8]) -> Option<Uuid> {
    #[derive(Deserialize)]
    struct IdOnly {
        message_id: String,
    }
    let parsed: IdOnly = serde_json::from_slice(payload).ok()?;
    Uuid::parse_str(&parsed.message_id).ok()
}

/// A tutorial-style random instance name: `cattle-` plus 4 characters from `[a-z0-9]`.
pub fn random_instance_name(rng: &mut impl rand::Rng) -> InstanceName {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..4)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    InstanceName(format!("cattle-{suffix}"))
}

/// Where a request stands in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Received; a restart may be in progress.
    Received,
    /// The last attempt failed; the message was nacked for a retry.
    Retrying,
    /// The host was restarted. Final.
    Restarted,
    /// Every attempt failed; the message was dead-lettered. Final.
    Failed,
    /// The payload was malformed and dead-lettered. Final.
    Rejected,
    /// The host was restarted but did not come back healthy within the
    /// verification timeout. Final.
    Unrecovered,
    /// A safety guard refused the request for good. Final.
    Denied,
    /// Leashed: the restart was decided and recorded, never issued. Final.
    DryRun,
    /// Deferred by a guard past `safety.max_defer`; never issued. Final.
    Expired,
}

impl Status {
    /// Every status, in declaration order (`store::sql` tests that none is
    /// missing): what the stores derive their SQL lists of statuses from.
    pub const ALL: [Self; 9] = [
        Self::Received,
        Self::Retrying,
        Self::Restarted,
        Self::Failed,
        Self::Rejected,
        Self::Unrecovered,
        Self::Denied,
        Self::DryRun,
        Self::Expired,
    ];

    /// Whether no further work will be done for this request.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Restarted
                | Self::Failed
                | Self::Rejected
                | Self::Unrecovered
                | Self::Denied
                | Self::DryRun
                | Self::Expired
        )
    }

    /// The name used in storage and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Retrying => "retrying",
            Self::Restarted => "restarted",
            Self::Failed => "failed",
            Self::Rejected => "rejected",
            Self::Unrecovered => "unrecovered",
            Self::Denied => "denied",
            Self::DryRun => "dry-run",
            Self::Expired => "expired",
        }
    }

    /// Parses the name used in storage.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "received" => Self::Received,
            "retrying" => Self::Retrying,
            "restarted" => Self::Restarted,
            "failed" => Self::Failed,
            "rejected" => Self::Rejected,
            "unrecovered" => Self::Unrecovered,
            "denied" => Self::Denied,
            "dry-run" => Self::DryRun,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a successful restart leaves for the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restarted {
    /// How long the host took to pass its health probe after the restart;
    /// `None` when recovery is not verified.
    pub recovered_after: Option<std::time::Duration>,
    /// What the backend printed or answered, truncated.
    pub output: Option<String>,
}

/// The outcome of one attempt at a request, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The host was restarted (and, if verification is on, came back).
    Restarted(Restarted),
    /// The restart failed and will be retried.
    Retrying {
        /// What went wrong.
        error: String,
    },
    /// The restart failed for the last time, or for good.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// The host was restarted but did not come back in time. Final: the
    /// restart happened, and doing it again is not the answer.
    Unrecovered {
        /// What the verification saw.
        error: String,
        /// What the backend printed or answered, truncated.
        output: Option<String>,
    },
    /// A safety guard refused the request for good. Final.
    Denied {
        /// Which guard, and why.
        reason: String,
    },
    /// Leashed: nothing was issued. Final.
    DryRun {
        /// The exact action that would have been taken.
        action: String,
    },
    /// A guard deferred the request past `safety.max_defer`. Final.
    Expired {
        /// What deferred it, and since when.
        reason: String,
    },
}

impl Outcome {
    /// A restart with nothing more to say.
    pub fn restarted() -> Self {
        Self::Restarted(Restarted::default())
    }

    /// The status this outcome leaves the request in.
    pub fn status(&self) -> Status {
        match self {
            Self::Restarted(_) => Status::Restarted,
            Self::Retrying { .. } => Status::Retrying,
            Self::Failed { .. } => Status::Failed,
            Self::Unrecovered { .. } => Status::Unrecovered,
            Self::Denied { .. } => Status::Denied,
            Self::DryRun { .. } => Status::DryRun,
            Self::Expired { .. } => Status::Expired,
        }
    }

    /// The error text, if the attempt failed.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Restarted(_) | Self::DryRun { .. } => None,
            Self::Retrying { error }
            | Self::Failed { error }
            | Self::Unrecovered { error, .. }
            | Self::Denied { reason: error }
            | Self::Expired { reason: error } => Some(error),
        }
    }

    /// The backend's output, if it gave any.
    pub fn output(&self) -> Option<&str> {
        match self {
            Self::Restarted(restarted) => restarted.output.as_deref(),
            Self::Unrecovered { output, .. } => output.as_deref(),
            Self::DryRun { action } => Some(action),
            Self::Retrying { .. }
            | Self::Failed { .. }
            | Self::Denied { .. }
            | Self::Expired { .. } => None,
        }
    }

    /// How long the host took to recover, if that was verified.
    pub fn recovered_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Restarted(restarted) => restarted.recovered_after,
            _ => None,
        }
    }
}

/// Valid requests for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A valid request for `instance` in the default domain, with a fresh id.
    pub fn request(instance: &str) -> RestartRequest {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let payload = format!(
                r#"{{"message_id":"{ID}","instance_name":"cattle-ab12","{field}":{value}}}"#
            );
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
        assert!(
            instance_name.as_str().starts_with("cattle-") && instance_name.as_str().len() == 11
        );
        let request = RestartRequest {
            message_id: Uuid::new_v4(),
            hostname: Hostname::new(&instance_name, &Domain::default()),
            instance_name,
            requested_by: None,
            reason: Some("chaos".into()),
            published_at: Some(humantime::parse_rfc3339("2026-11-21T10:00:00.123Z").unwrap()),
            group: None,
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
}
