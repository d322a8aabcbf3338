//! A restart request parsed from the wire, or the rejection that says why not.
//!
//! Parsing at the edge is one place by design, so one file past 400 lines.

use std::borrow::Cow;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::names::{Domain, Hostname, InstanceName};
use super::signed::{self, Signatures};

/// Limits and defaults applied while parsing a payload.
#[derive(Debug, Clone)]
pub(crate) struct ParseRules {
    /// Appended to the instance name to form the hostname, e.g. `example.net`.
    pub domain: Domain,
    /// Payloads larger than this are rejected before any parsing.
    pub max_payload_bytes: usize,
}

/// A request to restart one host, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestartRequest {
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
    /// The group the request is counted in, as the operator decides it
    /// (`safety.groups`, the name's default, or the inventory): assigned by
    /// the worker before anything counts (`Counting::assign`); never read
    /// from the message.
    pub group: Option<String>,
    /// The group the message itself names, if it does: never counted in,
    /// only compared with the operator's (a message that disagrees is
    /// denied), so that a careless or hostile publisher cannot pick the
    /// group whose limits it is counted against.
    pub requested_group: Option<String>,
    /// The zone the operator's inventory puts the instance in, for the
    /// disruption budget per zone; never read from the message.
    pub zone: Option<String>,
    /// The requester whose signature the message carries, verified; never
    /// read from the message's free text (`requested_by` is set to it).
    pub requester: Option<String>,
    /// Which key verified `requester`'s signature, and until when it
    /// holds: checked again right before the restart. `None` unsigned.
    pub signature: Option<signed::SignatureTerms>,
    /// Where the operator's inventory says the host is reached, for a host
    /// it lists; never read from the message. Shared with the inventory.
    pub reach: Option<std::sync::Arc<Reach>>,
    /// The machine the counting guards know the host by, when other
    /// entries of the operator's inventory share its address (aliases):
    /// the first of its names. `None` is the instance itself
    /// ([`Self::machine`]); never read from the message.
    pub machine: Option<String>,
    /// No restart before this time, if the publisher said (a campaign's
    /// `--spread`): the `not_before` guard defers the request until then.
    /// It can only delay; every other guard still decides after it.
    pub not_before: Option<SystemTime>,
    /// Where the requester asks for the final verdict to be published (a
    /// NATS subject, a Pub/Sub topic): untrusted, honoured only if the
    /// operator's `broker.reply_to_allowed` admits it (`Policy::place`).
    pub reply_to: Option<String>,
}

/// Where a host is reached, as the operator's inventory says: each part
/// takes the place of the `[[hosts]]` map's for the hosts it lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Reach {
    /// The address (a name or an IP) instead of the hostname.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The port backends and probes connect to (SSH, tcp probes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The user, for SSH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The wire format. Unknown fields are accepted so that newer publishers can
/// add fields without older services dead-lettering their messages.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct WireRequest {
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
    /// Optional: the group the publisher believes the instance is in (a DNS
    /// label, like an instance name). Checked against the operator's group,
    /// never used to count: a request that disagrees is denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Optional: RFC 3339 timestamp before which it must not be restarted
    /// (it can only delay: it widens nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    /// Optional: where to publish the final verdict (a NATS subject or a
    /// Pub/Sub topic), if the operator allows it (`broker.reply_to_allowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// The wire format as it is read: each field borrowed from the payload
/// unless JSON escapes make a copy necessary, so that parsing allocates only
/// what the request keeps (the fields of [`WireRequest`], each a `String`,
/// were four allocations per message, freed at once).
#[derive(Deserialize)]
struct BorrowedWire<'a> {
    #[serde(borrow)]
    message_id: Cow<'a, str>,
    #[serde(borrow)]
    instance_name: Cow<'a, str>,
    #[serde(default, borrow)]
    requested_by: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    published_at: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    group: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    not_before: Option<Cow<'a, str>>,
    reply_to: Option<Cow<'a, str>>,
}

/// Why a payload was not accepted as a restart request. The `Display` text is
/// the dead-letter reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Rejection {
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
    /// Unsigned, where a signature is required (`safety.require_signed`).
    #[error("unsigned: a signature is required (safety.require_signed); sign it as a requester")]
    Unsigned,
    /// A compact JWS whose signature, key, algorithm or claims do not
    /// hold: nothing in it is trusted.
    #[error("signature rejected: {0}")]
    BadSignature(String),
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
    pub(crate) const KINDS: [&'static str; 9] = [
        "too_large",
        "not_utf8",
        "bad_json",
        "bad_message_id",
        "bad_instance_name",
        "bad_published_at",
        "bad_text",
        "unsigned",
        "bad_signature",
    ];

    /// This rejection's index in [`Rejection::KINDS`].
    pub(crate) fn kind_index(&self) -> usize {
        match self {
            Self::TooLarge { .. } => 0,
            Self::NotUtf8 { .. } => 1,
            Self::BadJson(_) => 2,
            Self::BadMessageId(_) => 3,
            Self::BadInstanceName { .. } => 4,
            Self::BadPublishedAt(_) => 5,
            Self::BadText { .. } => 6,
            Self::Unsigned => 7,
            Self::BadSignature(_) => 8,
        }
    }
}

/// Most characters of an offending value a rejection quotes: reasons go to
/// logs, dead-letter headers and the history, and must stay short whatever
/// the payload held.
const MAX_QUOTED_CHARS: usize = 64;

/// `value`, cut to [`MAX_QUOTED_CHARS`] characters with a mark if it was
/// cut, and [`printable`]: a rejection quotes what a payload held (a JWT
/// library's error quotes its header), and must not carry its escape
/// sequences to an operator's terminal.
pub(super) fn excerpt(value: &str) -> String {
    match value.char_indices().nth(MAX_QUOTED_CHARS) {
        None => printable(value).into_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", printable(&value[..cut]), value.len()),
    }
}

/// `text` with every control character and every character that reorders
/// or hides text ([`reorders_or_hides`]) escaped (`\n`, `\u{1b}`,
/// `\u{202e}`): what is shown on a terminal of a text a payload or a host
/// may have written, so that it can neither move the cursor, recolour or
/// retitle the terminal, nor start a line of its own. Borrowed when there
/// is nothing to escape.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() || reorders_or_hides(c);
    if !text.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

/// Longest `requested_by` accepted, in characters.
pub(crate) const MAX_REQUESTED_BY_CHARS: usize = 128;
/// Longest `reason` accepted, in characters.
pub(crate) const MAX_REASON_CHARS: usize = 1024;

/// Whether `c` reorders or hides text without being a control character:
/// every format character (Unicode's general category Cf: the
/// bidirectional embeddings, overrides, isolates and marks, the zero-width
/// and invisible operators, the soft hyphen, the tags), the line and
/// paragraph separators, and the characters that show as nothing (variation
/// selectors, the combining grapheme joiner, Hangul fillers). In a name or
/// reason they make what an operator reads in the history, a report or a
/// notification differ from what was sent ("oncall\u{202E}toor" shows as
/// "oncallroot"; "alice\u{2063}" as "alice").
fn reorders_or_hides(c: char) -> bool {
    matches!(
        c,
        // Cf, as of Unicode 15.
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
            // Zl, Zp.
            | '\u{2028}'..='\u{2029}'
            // Shown as nothing: the combining grapheme joiner, Hangul and
            // Khmer fillers, Mongolian and other variation selectors.
            | '\u{034F}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180D}'
            | '\u{180F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{E0100}'..='\u{E01EF}'
    )
}

/// Validates and normalises a free-text field so that whatever parses can
/// be stored by every store and reads as it was sent: surrounding white
/// space is trimmed, an empty value is no value, control characters (NUL
/// included, which PostgreSQL cannot store in text) and bidirectional,
/// zero-width or invisible ones ([`reorders_or_hides`]) are refused, and the length is
/// bounded.
fn free_text(
    field: &'static str,
    raw: Option<&str>,
    max_chars: usize,
) -> Result<Option<String>, Rejection> {
    let Some(raw) = raw else { return Ok(None) };
    let trimmed = raw.trim();
    let refused = |c: &char| c.is_control() || reorders_or_hides(*c);
    if let Some((at, bad)) = trimmed.chars().enumerate().find(|(_, c)| refused(c)) {
        let kind = if bad.is_control() {
            "control"
        } else {
            "bidirectional, zero-width or invisible"
        };
        return Err(Rejection::BadText {
            field,
            why: format!(
                "contains the {kind} character U+{:04X} at character {at}",
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

/// Longest `reply_to` accepted, in bytes (Pub/Sub's limit for a topic id).
const MAX_REPLY_TO_BYTES: usize = 255;

/// Validates a `reply_to`: dot-separated tokens of letters, digits and
/// `_ ~ + % -`, what both a NATS subject and a Pub/Sub topic id can be.
/// Wildcards (`*`, `>`), white space and a leading `$` (NATS's system and
/// JetStream API subjects) are refused whatever the operator allows.
fn reply_to(raw: &str) -> Result<String, Rejection> {
    let bad = |why: String| Rejection::BadText {
        field: "reply_to",
        why: format!("{:?} {why}", excerpt(raw)),
    };
    if raw.is_empty() || raw.len() > MAX_REPLY_TO_BYTES {
        return Err(bad(format!("must be 1 to {MAX_REPLY_TO_BYTES} bytes long")));
    }
    if let Some(c) = raw
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || "._~+%-".contains(c)))
    {
        return Err(bad(format!(
            "contains {c:?}: only letters, digits and . _ ~ + % - are allowed"
        )));
    }
    if raw.split('.').any(str::is_empty) {
        return Err(bad(
            "has an empty token (a leading, trailing or double dot)".into(),
        ));
    }
    Ok(raw.to_owned())
}

impl RestartRequest {
    /// Parses and validates a payload from the wire.
    pub(crate) fn parse(payload: &[u8], rules: &ParseRules) -> Result<Self, Rejection> {
        Self::parse_sized(payload, payload.len(), rules)
    }

    /// Parses a payload of which the broker may have read only a prefix:
    /// `full_size` is the size of the whole, checked against the limit first.
    /// Unsigned only: a signed payload is rejected (no key to verify it).
    pub(crate) fn parse_sized(
        payload: &[u8],
        full_size: usize,
        rules: &ParseRules,
    ) -> Result<Self, Rejection> {
        Self::parse_verified(payload, full_size, rules, &Signatures::none())
    }

    /// Parses a payload, verifying it if it is signed (a compact JWS, see
    /// [`crate::domain::signed`]) against `signatures` at `now`, and
    /// refusing it unsigned if `signatures` requires a signature. A JSON
    /// payload costs one look at its first byte more than it did (the
    /// clock is read only for a signed one).
    pub(crate) fn parse_verified(
        payload: &[u8],
        full_size: usize,
        rules: &ParseRules,
        signatures: &Signatures,
    ) -> Result<Self, Rejection> {
        Self::parse_at(payload, full_size, rules, signatures, None)
    }

    /// As [`Self::parse_verified`], at `now` rather than the system clock.
    #[cfg(test)]
    pub(crate) fn parse_verified_at(
        payload: &[u8],
        rules: &ParseRules,
        signatures: &Signatures,
        now: SystemTime,
    ) -> Result<Self, Rejection> {
        Self::parse_at(payload, payload.len(), rules, signatures, Some(now))
    }

    fn parse_at(
        payload: &[u8],
        full_size: usize,
        rules: &ParseRules,
        signatures: &Signatures,
        now: Option<SystemTime>,
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
        let trimmed = text.trim_ascii();
        if !trimmed.starts_with('{') && signed::is_compact_jws(trimmed.as_bytes()) {
            let now = now.unwrap_or_else(SystemTime::now);
            return Self::from_signed(trimmed, rules, signatures, now);
        }
        if signatures.required() {
            return Err(Rejection::Unsigned);
        }
        let wire: BorrowedWire<'_> =
            serde_json::from_str(text).map_err(|e| Rejection::BadJson(excerpt(&e.to_string())))?;
        Self::from_wire(wire, rules)
    }

    /// A signed request: verified first, then its claims parsed as the wire
    /// format is; the verified requester replaces any `requested_by`.
    #[cold]
    fn from_signed(
        token: &str,
        rules: &ParseRules,
        signatures: &Signatures,
        now: SystemTime,
    ) -> Result<Self, Rejection> {
        let verified = signed::verify(token, signatures, now)?;
        let wire: BorrowedWire<'_> = serde_json::from_slice(&verified.claims)
            .map_err(|e| Rejection::BadJson(excerpt(&e.to_string())))?;
        let mut request = Self::from_wire(wire, rules)?;
        match Uuid::parse_str(&verified.jti) {
            Ok(jti) if jti == request.message_id => {}
            _ => {
                return Err(Rejection::BadSignature(format!(
                    "jti {:?} is not the message_id {}",
                    excerpt(&verified.jti),
                    request.message_id
                )));
            }
        }
        if request.published_at.is_none() {
            // Signed, so the requester's own word for when it asked.
            request.published_at =
                Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(verified.issued_at));
        }
        request.requester = Some(verified.requester.to_owned());
        request.signature = Some(verified.terms);
        request.requested_by = Some(verified.requester.to_owned());
        Ok(request)
    }

    /// The wire format's fields validated into a request.
    fn from_wire(wire: BorrowedWire<'_>, rules: &ParseRules) -> Result<Self, Rejection> {
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
        let not_before = wire
            .not_before
            .as_deref()
            .map(|raw| {
                humantime::parse_rfc3339_weak(raw).map_err(|_| Rejection::BadText {
                    field: "not_before",
                    why: format!("{:?} is not an rfc 3339 timestamp", excerpt(raw)),
                })
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
            group: None,
            requested_group: group,
            hostname: Hostname::new(&instance_name, &rules.domain),
            instance_name,
            requested_by: free_text(
                "requested_by",
                wire.requested_by.as_deref(),
                MAX_REQUESTED_BY_CHARS,
            )?,
            reason: free_text("reason", wire.reason.as_deref(), MAX_REASON_CHARS)?,
            published_at,
            zone: None,
            requester: None,
            signature: None,
            reach: None,
            machine: None,
            not_before,
            reply_to: wire.reply_to.as_deref().map(reply_to).transpose()?,
        })
    }

    /// Who asked, as it may be shown to an operator: the verified
    /// requester of a signed request; else what an unsigned one said,
    /// marked [`unverified`] (free text any publisher may write).
    pub(crate) fn shown_requester(&self) -> Option<String> {
        match (&self.requester, &self.requested_by) {
            (Some(verified), _) => Some(verified.clone()),
            (None, Some(said)) => Some(unverified(said)),
            (None, None) => None,
        }
    }

    /// The group the request is counted in: the operator's, once the worker
    /// assigned it (the safety module's `Counting::assign`), else
    /// [`Self::default_group`]. Never the message's `group`.
    pub(crate) fn group(&self) -> &str {
        self.group
            .as_deref()
            .unwrap_or_else(|| self.default_group())
    }

    /// The name host busy, the cooldown and the budgets count the request's
    /// machine by, and the restart journal records: one machine under
    /// several names (aliases) is counted once.
    pub(crate) fn machine(&self) -> &str {
        self.machine
            .as_deref()
            .unwrap_or(self.instance_name.as_str())
    }

    /// The instance name without its last `-suffix` (`cattle-ab12` →
    /// `cattle`), or the whole name when it has none.
    pub(crate) fn default_group(&self) -> &str {
        let name = self.instance_name.as_str();
        // A byte search ('-' is ASCII, so never inside a UTF-8 sequence):
        // asked several times per message, where the general pattern
        // searcher showed in the profile.
        match name.bytes().rposition(|byte| byte == b'-') {
            Some(dash) => &name[..dash],
            None => name,
        }
    }

    /// The wire form of a request, as publishers send it.
    pub(crate) fn to_wire(&self) -> Vec<u8> {
        // Serialising a struct of strings to JSON cannot fail.
        serde_json::to_vec(&self.to_wire_request()).expect("a struct of strings serialises")
    }

    /// The wire form's fields (what a signed request's claims carry too).
    pub(crate) fn to_wire_request(&self) -> WireRequest {
        WireRequest {
            message_id: self.message_id.to_string(),
            instance_name: self.instance_name.to_string(),
            requested_by: self.requested_by.clone(),
            reason: self.reason.clone(),
            published_at: self
                .published_at
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
            group: self.requested_group.clone(),
            not_before: self
                .not_before
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
            reply_to: self.reply_to.clone(),
        }
    }
}

/// A new message id for a request published at `at`: a UUID version 7,
/// whose first 48 bits are `at` in milliseconds and the other 74 are
/// random (from `rng`, not the kernel: one `getrandom` call per id was ~5%
/// of a profile that publishes fast).
///
/// Time-ordered ids are what mandrill's own publishers mint (`publish`,
/// `--simulate`) because the SQL stores (SQLite, PostgreSQL) keep
/// `message_id` in B-tree indexes (the requests' unique key, the journal's
/// key, decisions, deferrals): ids that grow
/// with time are inserted at the right edge of each index, where random
/// (version 4) ids dirty a random leaf of every index per message. Any
/// UUID is still accepted from other publishers; see `docs/benchmarks.md`,
/// "Time-ordered message ids".
pub(crate) fn new_message_id(at: SystemTime, rng: &mut impl rand::Rng) -> Uuid {
    let millis = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    uuid::Builder::from_unix_timestamp_millis(millis, &rng.random()).into_uuid()
}

/// Best effort at finding the message id in a payload that was rejected, so
/// that the rejection can be recorded against it.
/// A signed payload's id is read from its claims unverified: it is only
/// shown (a rejection keeps it apart from the requests' own ids).
pub(crate) fn salvage_message_id(payload: &[u8]) -> Option<Uuid> {
    #[derive(Deserialize)]
    struct IdOnly {
        message_id: String,
    }
    let trimmed = payload.trim_ascii();
    if signed::is_compact_jws(trimmed) {
        return Uuid::parse_str(&signed::unverified_message_id(trimmed)?).ok();
    }
    let parsed: IdOnly = serde_json::from_slice(payload).ok()?;
    Uuid::parse_str(&parsed.message_id).ok()
}

/// A `requested_by` no signature vouches for, as shown: marked, so that
/// nobody reads a publisher's free text as a verified name.
pub(crate) fn unverified(said: &str) -> String {
    format!("{said} (unverified)")
}

/// What a payload asked for, as far as it could be read: what the record
/// of a refused or rejected payload keeps, apart from every request's own
/// record. Only a field that passes the parse's own check is kept (a name
/// that is not a DNS label, text with control characters: left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Asked {
    /// The `message_id` it carried.
    pub message_id: Option<Uuid>,
    /// The instance it asked to restart.
    pub instance_name: Option<String>,
    /// Who it said asked: for a signed payload, the requester it names as
    /// its signer (`iss`).
    pub requested_by: Option<String>,
    /// Why, as it said.
    pub reason: Option<String>,
    /// The signer, only when the signature was verified; `requested_by`
    /// is unverified free text otherwise.
    pub requester: Option<String>,
}

impl Asked {
    /// What a valid request asked for (its requester verified if signed).
    pub(crate) fn of(request: &RestartRequest) -> Self {
        Self {
            message_id: Some(request.message_id),
            instance_name: Some(request.instance_name.as_str().to_owned()),
            requested_by: request.requested_by.clone(),
            reason: request.reason.clone(),
            requester: request.requester.clone(),
        }
    }

    /// What a payload that could not be parsed into a request asked for,
    /// read without trusting it: a signed one's claims unverified, its
    /// `iss` taken as who asked. Nothing in it is verified.
    pub(crate) fn salvage(payload: &[u8]) -> Self {
        #[derive(Deserialize)]
        struct Fields {
            message_id: Option<String>,
            instance_name: Option<String>,
            requested_by: Option<String>,
            reason: Option<String>,
            iss: Option<String>,
        }
        let trimmed = payload.trim_ascii();
        let fields = if signed::is_compact_jws(trimmed) {
            signed::unverified_claims(trimmed)
                .and_then(|claims| serde_json::from_slice::<Fields>(&claims).ok())
                .map(|mut fields| {
                    fields.requested_by = fields.iss.take();
                    fields
                })
        } else {
            serde_json::from_slice::<Fields>(payload)
                .ok()
                .map(|mut fields| {
                    fields.iss = None;
                    fields
                })
        };
        let Some(fields) = fields else {
            return Self::default();
        };
        let text =
            |field, raw: Option<String>, max| free_text(field, raw.as_deref(), max).ok().flatten();
        Self {
            message_id: fields.message_id.and_then(|id| Uuid::parse_str(&id).ok()),
            instance_name: fields
                .instance_name
                .and_then(|name| InstanceName::parse(&name).ok())
                .map(|name| name.as_str().to_owned()),
            requested_by: text("requested_by", fields.requested_by, MAX_REQUESTED_BY_CHARS),
            reason: text("reason", fields.reason, MAX_REASON_CHARS),
            requester: None,
        }
    }
}
