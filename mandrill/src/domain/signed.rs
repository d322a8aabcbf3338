//! Signed requests: a compact JWS (RFC 7515) whose JWT claims (RFC 7519)
//! are a request's fields plus `iss` (the requester), `iat`, `exp` and
//! `jti` (= `message_id`), signed with EdDSA (Ed25519) or ES256.
//!
//! Verification trusts nothing the token says until its signature holds:
//! the unverified claims are read for `iss` only, to find that requester's
//! key; the key alone decides the algorithm (the header's `alg` must equal
//! it, so neither `none`, nor HS*, nor another key type can be slipped in);
//! `exp` and `iat` are required and the lifetime between them bounded;
//! `nbf` is honoured, and `aud` must name `safety.audience` when one is set.
//!
//! A signature is checked again right before the restart
//! ([`Signatures::still_valid`]): the request keeps which key verified it
//! and its `exp` ([`SignatureTerms`]), so a key a reload replaced or
//! removed, or a token that expired while its claim waited, is refused then.
//!
//! One format, verified and signed, with the keys of both sides, so one
//! file past 400 lines.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;

use super::request::{Rejection, excerpt};

/// Longest lifetime (`exp - iat`) a signed request may claim. A signed
/// request is verified again on every delivery, so it must outlive the
/// deferrals it may meet: one day, the default `safety.max_defer` (a
/// request deferred past its `exp` is rejected, as the requester asked).
/// Bounded so that a leaked token is not a standing order.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Clock skew tolerated between a requester and mandrill, on `exp` and on
/// an `iat` in the future: a minute, jsonwebtoken's default, small beside
/// any lifetime worth signing.
pub(crate) const LEEWAY: Duration = Duration::from_secs(60);

/// A requester's public key and the one algorithm it verifies.
#[derive(Clone)]
pub(crate) struct Signer {
    algorithm: Algorithm,
    key: DecodingKey,
    fingerprint: KeyFingerprint,
}

/// Which public key verified a request: the first 64 bits of the SHA-256
/// of the key's PEM body (white space left out). Only compared with the
/// fingerprint of the key configured now, both the operator's, so 64 bits
/// are plenty: it tells "the same key" from "replaced by a reload".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyFingerprint(u64);

impl KeyFingerprint {
    fn of_pem(pem: &[u8]) -> Self {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for line in pem.split(|b| *b == b'\n') {
            if !line.starts_with(b"-----") {
                hasher.update(line.trim_ascii());
            }
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Self(u64::from_be_bytes(first))
    }
}

/// What a verified signature promised, kept with the request so that it is
/// checked again right before the restart ([`Signatures::still_valid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignatureTerms {
    /// The key that verified it.
    pub key: KeyFingerprint,
    /// `exp`, seconds since the epoch.
    pub expires_at: u64,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// Which key this is.
    pub(crate) fn fingerprint(&self) -> KeyFingerprint {
        self.fingerprint
    }

    /// A public key from its PEM text (SPKI): Ed25519 (verifies EdDSA) or
    /// P-256 (verifies ES256). The error says what is wrong, without the
    /// key.
    pub(crate) fn from_pem(pem: &str) -> Result<Self, String> {
        let pem = pem.trim().as_bytes();
        let candidates = [
            (Algorithm::EdDSA, DecodingKey::from_ed_pem(pem)),
            (Algorithm::ES256, DecodingKey::from_ec_pem(pem)),
        ];
        for (algorithm, key) in candidates {
            let Ok(key) = key else { continue };
            // jsonwebtoken's Ed25519 verifier slices the first 32 bytes
            // without checking there are so many: a short key is refused
            // here rather than panicking there.
            if algorithm == Algorithm::EdDSA
                && key.try_get_as_bytes().map_or(true, |b| b.len() != 32)
            {
                continue;
            }
            // Building a verifier checks the key itself (its length, its
            // point on the curve): a bad key fails here, at start-up, not
            // on the first message. The signature is a dummy; only an
            // error (not `false`) means the key is unusable.
            let usable = jsonwebtoken::crypto::verify("AA", b"probe", &key, algorithm).is_ok();
            if usable {
                return Ok(Self {
                    algorithm,
                    key,
                    fingerprint: KeyFingerprint::of_pem(pem),
                });
            }
        }
        Err("is not a PEM Ed25519 or P-256 (ES256) public key \
             (-----BEGIN PUBLIC KEY-----, as `mandrill keygen` writes)"
            .into())
    }
}

/// The configured requesters' keys, by name, and whether an unsigned
/// request is refused. Cheap to share (the policy holds it in an `Arc`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Signatures {
    signers: HashMap<String, Signer>,
    required: bool,
    /// `safety.audience`: a token must name it in `aud`.
    audience: Option<String>,
}

impl Signatures {
    /// Keys by requester name; `required`: refuse unsigned requests.
    pub(crate) fn new(signers: HashMap<String, Signer>, required: bool) -> Self {
        Self {
            signers,
            required,
            audience: None,
        }
    }

    /// These keys, accepting only tokens whose `aud` names `audience`
    /// (`safety.audience`), when one is given.
    pub(crate) fn for_audience(self, audience: Option<String>) -> Self {
        Self { audience, ..self }
    }

    /// Whether `requester`'s key in force now is still the one that
    /// verified a request (`terms`), and its token still within `exp` at
    /// `now`: checked right before the restart, since a reload may have
    /// replaced or removed the key, and a claim may have waited past `exp`,
    /// after the parse. Else why not, as a denial records it.
    pub(crate) fn still_valid(
        &self,
        requester: &str,
        terms: SignatureTerms,
        now: SystemTime,
    ) -> Result<(), String> {
        match self.signers.get(requester) {
            None => {
                return Err(format!(
                    "denied: requester {requester} is no longer trusted (its key was removed \
                     or could not be read at a reload)"
                ));
            }
            Some(signer) if signer.fingerprint != terms.key => {
                return Err(format!(
                    "denied: the key that signed it is no longer requester {requester}'s \
                     (replaced by a reload)"
                ));
            }
            Some(_) => {}
        }
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if terms.expires_at.saturating_add(LEEWAY.as_secs()) < now {
            return Err("denied: its signed token expired (exp) before the restart".into());
        }
        Ok(())
    }

    /// No keys, nothing required: every signed request is rejected (no
    /// key to verify it with), every unsigned one parsed as before.
    pub(crate) fn none() -> Self {
        Self::default()
    }

    /// The fingerprint of `requester`'s key, if it has one.
    pub(crate) fn fingerprint(&self, requester: &str) -> Option<KeyFingerprint> {
        self.signers.get(requester).map(|signer| signer.fingerprint)
    }

    /// These keys less those of the requesters `keep` says no to.
    pub(crate) fn retaining(mut self, keep: impl Fn(&str) -> bool) -> Self {
        self.signers.retain(|name, _| keep(name));
        self
    }

    /// Whether unsigned requests are refused.
    pub(crate) fn required(&self) -> bool {
        self.required
    }
}

/// Whether `text` has the shape of a compact JWS: three base64url parts
/// joined by two dots, the first two non-empty (JSON, which starts with
/// `{`, never has it). The signature may be empty, as an unsecured
/// (`alg: none`) token's is: such a token is then rejected as a bad
/// signature, saying why, rather than as bad JSON.
pub(crate) fn is_compact_jws(text: &[u8]) -> bool {
    let mut dots = 0;
    let mut part_len = 0;
    for &byte in text {
        if byte == b'.' {
            if part_len == 0 || dots == 2 {
                return false;
            }
            dots += 1;
            part_len = 0;
        } else if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            part_len += 1;
        } else {
            return false;
        }
    }
    dots == 2
}

/// The registered claims verification reads; the request's own fields are
/// read from the same (verified) claims by the request's parser.
#[derive(Deserialize)]
struct Registered {
    iat: Option<u64>,
    exp: Option<u64>,
    nbf: Option<u64>,
    jti: Option<String>,
}

/// A token whose signature holds, from a known requester, within its
/// lifetime.
pub(super) struct Verified<'s> {
    /// The requester's name, as configured.
    pub requester: &'s str,
    /// The claims, decoded JSON: the request's fields.
    pub claims: Vec<u8>,
    /// `jti`, which must be the request's `message_id`.
    pub jti: String,
    /// `iat`, seconds since the epoch.
    pub issued_at: u64,
    /// What to check again right before the restart.
    pub terms: SignatureTerms,
}

fn bad(why: impl Into<String>) -> Rejection {
    Rejection::BadSignature(why.into())
}

/// Verifies `token` (already known to be a compact JWS) against the
/// requester its `iss` names, at `now`.
pub(super) fn verify<'s>(
    token: &str,
    signatures: &'s Signatures,
    now: SystemTime,
) -> Result<Verified<'s>, Rejection> {
    // is_compact_jws checked the shape: three parts.
    let mut parts = token.split('.');
    let (Some(_), Some(claims_part), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("not a compact jws"));
    };
    let header = jsonwebtoken::decode_header(token)
        .map_err(|e| bad(format!("bad header: {}", excerpt(&e.to_string()))))?;
    let claims = URL_SAFE_NO_PAD
        .decode(claims_part)
        .map_err(|_| bad("claims are not base64url"))?;
    // Unverified: read only to find the key. Nothing else from it is used
    // before the signature holds.
    #[derive(Deserialize)]
    struct Issuer<'a> {
        #[serde(borrow)]
        iss: Option<Cow<'a, str>>,
    }
    let issuer: Issuer<'_> = serde_json::from_slice(&claims).map_err(|e| {
        bad(format!(
            "claims are not a json object: {}",
            excerpt(&e.to_string())
        ))
    })?;
    let Some(iss) = issuer.iss else {
        return Err(bad("no iss claim: the requester is not named"));
    };
    let Some((requester, signer)) = signatures.signers.get_key_value(iss.as_ref()) else {
        return Err(bad(format!("unknown requester {:?} (iss)", excerpt(&iss))));
    };
    if header.alg != signer.algorithm {
        return Err(bad(format!(
            "algorithm {:?} is not {:?}, the one requester {requester}'s key verifies",
            header.alg, signer.algorithm
        )));
    }
    let mut validation = Validation::new(signer.algorithm);
    validation.leeway = LEEWAY.as_secs();
    validation.set_required_spec_claims(&["exp", "iss"]);
    validation.set_issuer(&[requester]);
    // With `safety.audience` set a token must name it (one without `aud`
    // is refused too: it would be good for every deployment); without,
    // there is nothing to compare an `aud` with.
    match &signatures.audience {
        Some(audience) => {
            validation.set_audience(&[audience]);
            validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        }
        None => validation.validate_aud = false,
    }
    // `exp` is checked below against `now` (the caller's clock, so that
    // tests and the worker agree), not jsonwebtoken's own reading.
    validation.validate_exp = false;
    let registered = jsonwebtoken::decode::<Registered>(token, &signer.key, &validation)
        .map_err(|error| match error.kind() {
            ErrorKind::InvalidSignature => bad(format!(
                "the signature does not verify with requester {requester}'s key"
            )),
            ErrorKind::MissingRequiredClaim(claim) => bad(format!("no {claim} claim")),
            ErrorKind::InvalidAudience => bad(format!(
                "aud does not name this deployment's audience ({})",
                signatures.audience.as_deref().unwrap_or_default()
            )),
            _ => bad(excerpt(&error.to_string())),
        })?
        .claims;
    let (Some(exp), Some(iat), Some(jti)) = (registered.exp, registered.iat, registered.jti) else {
        let missing = if registered.exp.is_none() {
            "exp"
        } else if registered.iat.is_none() {
            "iat"
        } else {
            "jti"
        };
        return Err(bad(format!("no {missing} claim")));
    };
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    if exp.saturating_add(LEEWAY.as_secs()) < now {
        return Err(bad("expired (exp is past)"));
    }
    if iat > now.saturating_add(LEEWAY.as_secs()) {
        return Err(bad("issued in the future (iat)"));
    }
    if registered
        .nbf
        .is_some_and(|nbf| nbf > now.saturating_add(LEEWAY.as_secs()))
    {
        return Err(bad("not valid yet (nbf is in the future)"));
    }
    let lifetime = exp.saturating_sub(iat);
    if lifetime > MAX_LIFETIME.as_secs() {
        return Err(bad(format!(
            "lifetime exp - iat is {lifetime}s, over the maximum of {}s",
            MAX_LIFETIME.as_secs()
        )));
    }
    Ok(Verified {
        requester,
        claims,
        jti,
        issued_at: iat,
        terms: SignatureTerms {
            key: signer.fingerprint,
            expires_at: exp,
        },
    })
}

/// The `message_id` of a compact JWS's claims, unverified: for recording a
/// rejection against it (shown only, never trusted).
pub(super) fn unverified_message_id(token: &[u8]) -> Option<String> {
    let claims = token.split(|b| *b == b'.').nth(1)?;
    let claims = URL_SAFE_NO_PAD.decode(claims).ok()?;
    #[derive(Deserialize)]
    struct IdOnly {
        message_id: String,
    }
    serde_json::from_slice::<IdOnly>(&claims)
        .ok()
        .map(|id| id.message_id)
}

/// The claims of a compact JWS, decoded and unverified: for recording
/// what a rejected payload asked (shown only, marked unverified), and for
/// `mandrill publish` to say what a token it cannot verify names.
pub(crate) fn unverified_claims(token: &[u8]) -> Option<Vec<u8>> {
    let claims = token.split(|b| *b == b'.').nth(1)?;
    URL_SAFE_NO_PAD.decode(claims).ok()
}

/// A private key to sign requests with (`mandrill publish --as`): PKCS#8
/// PEM, Ed25519 (EdDSA) or P-256 (ES256).
pub(crate) struct SigningKey {
    algorithm: Algorithm,
    key: jsonwebtoken::EncodingKey,
    /// `aud` of every token it signs (`safety.audience`).
    audience: Option<String>,
}

impl SigningKey {
    /// The key from its PEM text; the error never quotes it.
    pub(crate) fn from_pem(pem: &str) -> Result<Self, String> {
        let pem = pem.trim().as_bytes();
        let candidates = [
            (
                Algorithm::EdDSA,
                jsonwebtoken::EncodingKey::from_ed_pem(pem),
            ),
            (
                Algorithm::ES256,
                jsonwebtoken::EncodingKey::from_ec_pem(pem),
            ),
        ];
        for (algorithm, key) in candidates {
            let Ok(key) = key else { continue };
            // Signing once checks the key can sign at all.
            if jsonwebtoken::crypto::sign(b"probe", &key, algorithm).is_ok() {
                return Ok(Self {
                    algorithm,
                    key,
                    audience: None,
                });
            }
        }
        Err("is not a PKCS#8 PEM Ed25519 or P-256 private key \
             (-----BEGIN PRIVATE KEY-----, as `mandrill keygen` writes)"
            .into())
    }

    /// This key, naming `audience` (`safety.audience`, where the tokens are
    /// meant to be verified) in every token it signs.
    pub(crate) fn for_audience(self, audience: Option<String>) -> Self {
        Self { audience, ..self }
    }

    /// `request` as a signed token from `requester`, valid from `now` for
    /// `lifetime` (at most [`MAX_LIFETIME`]), naming the key's audience
    /// ([`SigningKey::for_audience`]) if it has one.
    pub(crate) fn sign(
        &self,
        request: &super::WireRequest,
        requester: &str,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<String, jsonwebtoken::errors::Error> {
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            #[serde(flatten)]
            request: &'a super::WireRequest,
            iss: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            aud: Option<&'a str>,
            iat: u64,
            exp: u64,
            jti: &'a str,
        }
        let iat = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            request,
            iss: requester,
            aud: self.audience.as_deref(),
            iat,
            exp: iat.saturating_add(lifetime.min(MAX_LIFETIME).as_secs()),
            jti: &request.message_id,
        };
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(self.algorithm),
            &claims,
            &self.key,
        )
    }
}

#[cfg(test)]
mod tests;
