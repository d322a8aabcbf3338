//! Temporary credentials: a role assumed with a web identity token (STS
//! `AssumeRoleWithWebIdentity`, an unsigned Query API call) or the
//! instance's role from the instance metadata service (IMDSv2: a token,
//! then the role's name, then its keys). One cache for the process, as
//! the chain's sources are the process's (its environment, its files, its
//! instance): every client shares the keys, and they are fetched again
//! [`REFRESH_BEFORE`] their expiry, one fetch at a time. Nothing fetched
//! here is logged; the token headers are marked sensitive.

use std::future::Future;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use tracing::{info, warn};

use super::credentials::{Credentials, Source};
use super::{Element, Service, api_error, sigv4};
use crate::settings::Secret;

/// How long before their expiry temporary credentials are fetched again:
/// a call signed just before the expiry must still be accepted.
const REFRESH_BEFORE: jiff::SignedDuration = jiff::SignedDuration::from_secs(5 * 60);
/// The connection to the metadata service: it answers at once on EC2, so
/// anywhere else the chain fails fast.
const METADATA_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const METADATA_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the metadata service's session token lasts (it is asked for
/// at each fetch).
const METADATA_TOKEN_TTL_SECONDS: &str = "300";
const STS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const STS_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read from STS or the metadata service.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The process's cache.
static CACHE: Cache = Cache::new();

/// The credentials `source` (a temporary one) gives in `region`: the
/// cached ones while fresh, else fetched.
pub(super) async fn credentials(source: &Source, region: &str) -> Result<Credentials, String> {
    CACHE
        .get(source, jiff::Timestamp::now(), || fetch(source, region))
        .await
}

/// The credentials fetched last and the source they came from. A lock
/// held across the fetch: concurrent calls wait for one fetch rather than
/// each asking STS or the metadata service.
struct Cache(tokio::sync::Mutex<Option<(Source, Credentials)>>);

impl Cache {
    const fn new() -> Self {
        Self(tokio::sync::Mutex::const_new(None))
    }

    /// The cached credentials of `source` if fresh at `now`, else those
    /// `fetch` brings; if it fails while the cached ones still work, those,
    /// saying so.
    async fn get<F>(
        &self,
        source: &Source,
        now: jiff::Timestamp,
        fetch: impl FnOnce() -> F,
    ) -> Result<Credentials, String>
    where
        F: Future<Output = Result<Credentials, String>>,
    {
        let mut cache = self.0.lock().await;
        let cached = cache
            .as_ref()
            .filter(|(cached_source, _)| cached_source == source)
            .map(|(_, credentials)| credentials);
        if let Some(credentials) = cached.filter(|c| is_fresh(c.expires, now)) {
            return Ok(credentials.clone());
        }
        match fetch().await {
            Ok(fetched) => {
                info!(source = describe(source), expires = ?fetched.expires, "aws credentials fetched");
                *cache = Some((source.clone(), fetched.clone()));
                Ok(fetched)
            }
            Err(why) => match cached.filter(|c| c.expires.is_some_and(|expires| expires > now)) {
                Some(still_valid) => {
                    warn!(source = describe(source), error = %why, "aws credentials not refreshed; the cached ones still work");
                    Ok(still_valid.clone())
                }
                None => Err(why),
            },
        }
    }
}

/// Whether credentials that expire at `expires` may be used at `now`
/// without fetching new ones.
fn is_fresh(expires: Option<jiff::Timestamp>, now: jiff::Timestamp) -> bool {
    expires.is_none_or(|expires| {
        now.saturating_add(REFRESH_BEFORE)
            .is_ok_and(|soon| soon < expires)
    })
}

fn describe(source: &Source) -> &'static str {
    match source {
        Source::Keys(_) => "keys",
        Source::WebIdentity { .. } => "web identity",
        Source::InstanceMetadata { .. } => "instance metadata",
    }
}

async fn fetch(source: &Source, region: &str) -> Result<Credentials, String> {
    match source {
        Source::Keys(keys) => Ok(keys.clone()),
        Source::WebIdentity {
            token_file,
            role_arn,
            session_name,
            sts_endpoint,
        } => {
            let endpoint = match sts_endpoint {
                Some(endpoint) => endpoint.clone(),
                None => super::check_endpoint(&Service::Sts.endpoint(region))?,
            };
            let token = std::fs::read_to_string(token_file)
                .map_err(|e| format!("web identity: cannot read {}: {e}", token_file.display()))?;
            assume_role_with_web_identity(&endpoint, role_arn, session_name, token.trim())
                .await
                .map_err(|why| format!("web identity (role {role_arn}): {why}"))
        }
        Source::InstanceMetadata { endpoint } => instance_metadata(endpoint)
            .await
            .map_err(|why| format!("the instance metadata service at {endpoint}: {why}")),
    }
}

fn client(connect: Duration, whole: Duration) -> Result<reqwest::Client, String> {
    super::super::install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(connect)
        .timeout(whole)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the http client: {}", e.without_url()))
}

/// The status and text of an answer, at most [`MAX_ANSWER_BYTES`] read.
async fn answer(request: reqwest::RequestBuilder) -> Result<(u16, String), String> {
    let failed = |e: reqwest::Error| crate::causes::WithCauses(&e.without_url()).to_string();
    let mut response = request.send().await.map_err(failed)?;
    let status = response.status().as_u16();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!("an answer of more than {MAX_ANSWER_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

async fn assume_role_with_web_identity(
    endpoint: &url::Url,
    role_arn: &str,
    session_name: &str,
    token: &str,
) -> Result<Credentials, String> {
    let body = sigv4::form(&[
        ("Action".into(), "AssumeRoleWithWebIdentity".into()),
        ("Version".into(), Service::Sts.version().into()),
        ("RoleArn".into(), role_arn.into()),
        ("RoleSessionName".into(), session_name.into()),
        ("WebIdentityToken".into(), token.into()),
    ]);
    let http = client(STS_CONNECT_TIMEOUT, STS_TIMEOUT)?;
    let (status, text) = answer(
        http.post(endpoint.clone())
            .header(
                CONTENT_TYPE,
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .body(body),
    )
    .await
    .map_err(|why| format!("sts at {}: {why}", endpoint.host_str().unwrap_or_default()))?;
    let root = Element::parse(&text).map_err(|why| {
        format!(
            "sts answered something unreadable ({status}): {why}; {}",
            crate::restarter::process::for_log(text.trim(), 200)
        )
    })?;
    if !(200..300).contains(&status) {
        return Err(match api_error(&root) {
            Some((code, message)) => format!("sts answered {code} ({status}): {message}"),
            None => format!("sts answered {status} without an error code"),
        });
    }
    assumed_role_credentials(&root)
}

/// The `Credentials` of an `AssumeRoleWithWebIdentityResponse`. Pure.
fn assumed_role_credentials(root: &Element) -> Result<Credentials, String> {
    let credentials = root
        .find("Credentials")
        .ok_or("sts answered no Credentials")?;
    let field = |name: &str| {
        credentials
            .text_at(&[name])
            .map(str::to_owned)
            .ok_or_else(|| format!("sts answered Credentials without {name}"))
    };
    Ok(Credentials {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: Secret(field("SecretAccessKey")?),
        session_token: Some(Secret(field("SessionToken")?)),
        expires: Some(expiration(&field("Expiration")?)?),
    })
}

fn expiration(raw: &str) -> Result<jiff::Timestamp, String> {
    raw.parse()
        .map_err(|e| format!("an Expiration that is not a time ({raw:?}): {e}"))
}

async fn instance_metadata(endpoint: &url::Url) -> Result<Credentials, String> {
    let http = client(METADATA_CONNECT_TIMEOUT, METADATA_TIMEOUT)?;
    let url = |path: &str| format!("{}/latest/{path}", endpoint.as_str().trim_end_matches('/'));
    let ok = |(status, text): (u16, String), what: &str| {
        if (200..300).contains(&status) {
            Ok(text)
        } else {
            Err(format!("{what} answered {status}"))
        }
    };
    let token = ok(
        answer(http.put(url("api/token")).header(
            "x-aws-ec2-metadata-token-ttl-seconds",
            METADATA_TOKEN_TTL_SECONDS,
        ))
        .await
        .map_err(|why| format!("cannot get a token (not on EC2?): {why}"))?,
        "the token request",
    )?;
    let mut token = HeaderValue::from_str(token.trim())
        .map_err(|_| "a token no header can carry".to_owned())?;
    token.set_sensitive(true);
    let get = |path: String| {
        http.get(path)
            .header("x-aws-ec2-metadata-token", token.clone())
    };
    let roles = ok(
        answer(get(url("meta-data/iam/security-credentials/"))).await?,
        "the role request (does the instance have an instance profile?)",
    )?;
    let role = instance_role(&roles)?;
    let keys = ok(
        answer(get(url(&format!(
            "meta-data/iam/security-credentials/{role}"
        ))))
        .await?,
        "the credentials request",
    )?;
    instance_credentials(&keys)
}

/// The role the metadata service names (the first line), if it is a role
/// name and nothing else can hide in a path. Pure.
fn instance_role(answer: &str) -> Result<&str, String> {
    let role = answer.lines().next().unwrap_or("").trim();
    let allowed = |c: char| c.is_ascii_alphanumeric() || "+=,.@_-".contains(c);
    if role.is_empty() || role.len() > 128 || !role.chars().all(allowed) {
        return Err(format!(
            "the instance has no role (the service answered {})",
            crate::restarter::process::for_log(answer.trim(), 80)
        ));
    }
    Ok(role)
}

/// The keys of the metadata service's JSON answer. Pure.
fn instance_credentials(answer: &str) -> Result<Credentials, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        code: Option<String>,
        access_key_id: String,
        secret_access_key: String,
        token: String,
        expiration: String,
    }
    let answer: Answer =
        serde_json::from_str(answer).map_err(|e| format!("unreadable credentials: {e}"))?;
    if let Some(code) = answer.code.filter(|code| code != "Success") {
        return Err(format!("the credentials are not available: {code}"));
    }
    Ok(Credentials {
        access_key_id: answer.access_key_id,
        secret_access_key: Secret(answer.secret_access_key),
        session_token: Some(Secret(answer.token)),
        expires: Some(expiration(&answer.expiration)?),
    })
}

#[cfg(test)]
mod tests;
