//! What `mandrill publish` checks before it publishes anything: each
//! request parsed as the service that reads the same configuration will
//! parse it (`RestartRequest::parse_verified` with the `[[requesters]]`
//! keys, `safety.require_signed` and `safety.audience`, built by
//! `Requesters` as the service builds them), so that a request the service
//! would reject (unsigned where a signature is required, a key that is not
//! the named requester's, an unknown requester, an expired token) is
//! refused here, before anything is sent, naming why.

use serde::Serialize;
use uuid::Uuid;

use crate::config::{Config, ConfigError};
use crate::domain::signed::{is_compact_jws, unverified_claims};
use crate::domain::{ParseRules, Rejection, RestartRequest, Signatures};
use crate::safety::{ReplyDestinations, Requesters};

/// What publish says of a request it sent: one line of its output.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Sent {
    /// The request's id: what `mandrill wait` and `mandrill explain` take.
    pub message_id: Uuid,
    /// The instance it names.
    pub instance_name: String,
    /// The host the service restarts: the instance in `message.domain`.
    pub host: String,
    /// The requester it is signed as: `--as` (checked against the
    /// configuration's key when one was given), or a signed line's `iss`
    /// once verified; `None` unsigned, or a line not verified here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    /// Whether it is a signed token.
    pub signed: bool,
    /// Where the verdict is to be published, if it asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

impl Sent {
    /// What a parsed request says of itself.
    pub(super) fn of(request: &RestartRequest, signed: bool) -> Self {
        Self {
            message_id: request.message_id,
            instance_name: request.instance_name.to_string(),
            host: request.hostname.to_string(),
            requester: request.requester.clone(),
            signed,
            reply_to: request.reply_to.clone(),
        }
    }

    /// The line printed without `--json`: `<message id> <host>`.
    pub(super) fn line(&self) -> String {
        format!("{} {}", self.message_id, self.host)
    }
}

/// The service's view of trust, as the configuration given describes it.
pub(super) struct Checks {
    /// The keys, the signing rule and the audience, as the service builds
    /// them from the same configuration.
    signatures: Signatures,
    /// Whether a signed request is verified: only against a configuration
    /// file (`--config`, `MANDRILL_CONFIG`), which names the requesters;
    /// without one publish knows no key, and the service verifies.
    verify_signed: bool,
    /// `broker.reply_to_allowed`, with a configuration file: a `--reply-to`
    /// it does not admit would be denied.
    reply_to: Option<ReplyDestinations>,
}

impl Checks {
    /// The checks for `config`; `from_file`: whether a configuration file
    /// was given; `unchecked`: `--unchecked` (nothing about trust checked).
    pub(super) fn new(
        config: &Config,
        from_file: bool,
        unchecked: bool,
    ) -> Result<Self, ConfigError> {
        if unchecked {
            return Ok(Self {
                signatures: Signatures::none(),
                verify_signed: false,
                reply_to: None,
            });
        }
        let requesters = Requesters::new(&config.requesters, config.require_signed())
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?
            .for_audience(config.safety.audience.clone());
        let reply_to = if from_file {
            Some(
                ReplyDestinations::new(&config.broker.reply_to_allowed)
                    .map_err(|(key, why)| ConfigError::invalid(&key, why))?,
            )
        } else {
            None
        };
        Ok(Self {
            signatures: requesters.signatures().clone(),
            verify_signed: from_file,
            reply_to,
        })
    }

    /// Whether signed requests go out unverified (no configuration file).
    pub(super) fn signed_unverified(&self) -> bool {
        !self.verify_signed
    }

    /// `payload` read as the service will read it: what it says of itself,
    /// or why the service would refuse it. A signed payload not verified
    /// here (no configuration file, or `--unchecked`) is read unverified,
    /// only to say what it names.
    pub(super) fn examine(&self, payload: &[u8], rules: &ParseRules) -> Result<Sent, String> {
        let signed = is_compact_jws(payload);
        let request = if signed && !self.verify_signed {
            let claims = unverified_claims(payload)
                .ok_or_else(|| "signed, but its claims are not base64url".to_owned())?;
            let mut request =
                RestartRequest::parse(&claims, rules).map_err(|why| why.to_string())?;
            // Nothing vouched for it here.
            request.requester = None;
            request
        } else {
            RestartRequest::parse_verified(payload, payload.len(), rules, &self.signatures)
                .map_err(|why| with_advice(&why))?
        };
        if let (Some(allowed), Some(destination)) = (&self.reply_to, &request.reply_to) {
            allowed
                .check(destination)
                .map_err(|why| format!("the service would deny it: {why}"))?;
        }
        Ok(Sent::of(&request, signed))
    }
}

/// A rejection as the service would record it, said as publish's reason
/// for refusing.
fn with_advice(rejection: &Rejection) -> String {
    match rejection {
        Rejection::Unsigned => format!(
            "the service would reject it: {rejection} (--as NAME --key-file FILE signs it as a \
             [[requesters]] entry)"
        ),
        Rejection::BadSignature(_) => format!("the service would reject it: {rejection}"),
        // Malformed: as `publish` always said.
        _ => rejection.to_string(),
    }
}
