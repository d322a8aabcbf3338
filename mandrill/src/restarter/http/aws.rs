//! A small client for AWS's Query APIs (EC2, Auto Scaling): a form POST
//! signed with SigV4 (`sigv4.rs`) on the reqwest client this folder owns,
//! an XML answer (`xml.rs`), credentials from the standard chain
//! (`credentials.rs`, its source decided at each call; temporary ones from
//! STS or the instance metadata service cached in `temporary.rs`). Throttling (`RequestLimitExceeded`,
//! `Throttling`) and 5xx answers are retried here with a jittered
//! exponential backoff and, past the tries, are transient; any other AWS
//! error is returned at once with AWS's code (an unknown instance, a
//! missing permission: retrying cannot fix them). A call that acts on a
//! machine ([`AwsClient::act`]) is sent again only when AWS did nothing
//! (throttling, no connection): a reboot whose answer was lost may have
//! been done, and a second one is a second restart.
//!
//! Chosen over the official `aws-sdk-ec2`/`aws-sdk-autoscaling` crates:
//! mandrill makes eight calls, and those crates (with `aws-smithy-*` and
//! `aws-config`) are among the slowest crates to compile on a small
//! machine; this client adds no crate (quick-xml is already built for
//! pprof's flamegraphs).
//!
//! One piece past 400 lines: a call, from its credentials and signature
//! to its answer or AWS's error code, and what an endpoint may be.

mod credentials;
pub(crate) mod sigv4;
mod temporary;
pub(crate) mod xml;

use std::fmt;
use std::time::Duration;

use rand::Rng;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use tracing::warn;
use url::Url;

pub(crate) use xml::Element;

use crate::backoff::Backoff;

/// Tries of one call that AWS throttles or answers with a 5xx.
const MAX_TRIES: u32 = 5;
/// Waits between those tries (each drawn between half and all of it).
const RETRY_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(200),
    max: Duration::from_secs(5),
};
/// The longest one call can take, each try bounded by `timeout`: every
/// try, and the backoff between them at its longest (the jitter only
/// shortens it). Fetching temporary credentials comes on top.
pub(crate) fn longest_call(timeout: Duration) -> Duration {
    (1..MAX_TRIES)
        .map(|failures| RETRY_BACKOFF.delay(failures))
        .fold(timeout.saturating_mul(MAX_TRIES), Duration::saturating_add)
}

/// Largest answer read: a page of `DescribeInstances` is well below.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Error codes that mean "slow down", whatever the service.
const THROTTLING: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
];

/// Which API a client calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Ec2,
    AutoScaling,
    /// Only for `AssumeRoleWithWebIdentity`, which is not signed.
    Sts,
}

impl Service {
    fn signing_name(self) -> &'static str {
        match self {
            Self::Ec2 => "ec2",
            Self::AutoScaling => "autoscaling",
            Self::Sts => "sts",
        }
    }

    fn version(self) -> &'static str {
        match self {
            Self::Ec2 => "2016-11-15",
            Self::AutoScaling => "2011-01-01",
            Self::Sts => "2011-06-15",
        }
    }

    /// The public endpoint in `region`.
    fn endpoint(self, region: &str) -> String {
        let suffix = if region.starts_with("cn-") {
            "amazonaws.com.cn"
        } else {
            "amazonaws.com"
        };
        format!("https://{}.{region}.{suffix}/", self.signing_name())
    }
}

/// Why a call brought no answer back. Shows no credential, and no URL
/// beyond its host (an endpoint may be a private one, but holds nothing
/// secret: credentials are never in it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum AwsError {
    /// No credentials could be found (permanent until the operator acts).
    #[error("{0}")]
    Credentials(String),
    /// A source of temporary credentials (STS, the instance metadata
    /// service) failed or could not be reached: it may answer later.
    #[error("no AWS credentials: {0}")]
    CredentialsUnavailable(String),
    /// The call cannot be made as configured (an endpoint, the TLS
    /// provider, a fleet larger than mandrill reads).
    #[error("{0}")]
    Setup(String),
    /// AWS answered an error, with its code.
    #[error("{service} {action} answered {code} ({status}): {message}")]
    Api {
        service: &'static str,
        action: String,
        code: String,
        message: String,
        status: u16,
    },
    /// The connection or the transfer failed, or took too long.
    #[error("{service} {action} at {host} failed")]
    Transport {
        service: &'static str,
        action: String,
        host: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not what the API answers.
    #[error("{service} {action} answered something unreadable ({status}): {why}")]
    Unreadable {
        service: &'static str,
        action: String,
        status: u16,
        why: String,
    },
}

impl AwsError {
    /// Whether trying again later may succeed: throttling, a 5xx, a
    /// connection that failed. An unknown instance, a missing permission or
    /// missing credentials are not.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Credentials(_) | Self::Setup(_) => false,
            Self::Api { code, status, .. } => is_throttling(code) || *status >= 500,
            Self::CredentialsUnavailable(_) | Self::Transport { .. } | Self::Unreadable { .. } => {
                true
            }
        }
    }

    /// Whether AWS may have done what the call asked although no answer
    /// said so: the request went out and its answer was lost, late,
    /// unreadable or a 5xx (AWS's own failure, which may come after the
    /// work). Throttling, a refusal, a connection never made and missing
    /// credentials mean nothing was done.
    pub(crate) fn may_have_been_done(&self) -> bool {
        match self {
            Self::Credentials(_) | Self::CredentialsUnavailable(_) | Self::Setup(_) => false,
            Self::Api { code, status, .. } => !is_throttling(code) && *status >= 500,
            Self::Transport { source, .. } => !source.is_connect(),
            Self::Unreadable { .. } => true,
        }
    }

    /// Whether AWS answered that it will not do what the call asked: an
    /// error answer below 500 that is not throttling.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(self, Self::Api { code, status, .. } if *status < 500 && !is_throttling(code))
    }
}

fn is_throttling(code: &str) -> bool {
    THROTTLING.contains(&code)
}

/// A client of one service in one region.
#[derive(Clone)]
pub(crate) struct AwsClient {
    http: reqwest::Client,
    service: Service,
    region: String,
    endpoint: Url,
}

impl fmt::Debug for AwsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsClient")
            .field("service", &self.service)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

impl AwsClient {
    /// A client of `service` in `region`, at `endpoint` (else AWS's
    /// public one), each try of a call bounded by `timeout`. The error says
    /// what is wrong with the endpoint (the caller names the key).
    pub(crate) fn new(
        service: Service,
        region: &str,
        endpoint: Option<&str>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let endpoint =
            check_endpoint(&endpoint.map_or_else(|| service.endpoint(region), str::to_owned))?;
        super::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the http client: {}", e.without_url()))?;
        Ok(Self {
            http,
            service,
            region: region.to_owned(),
            endpoint,
        })
    }

    /// Calls `action` with `params`, retrying throttling, 5xx answers and
    /// failed transfers; the answer's root element. Only for a call that
    /// may be repeated: a read, a tag set or removed.
    pub(crate) async fn call(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Element, AwsError> {
        self.call_retrying(action, params, AwsError::is_transient)
            .await
    }

    /// Calls `action`, which acts on a machine (reboots, stops, starts or
    /// terminates it): tried again only when AWS did nothing. An error
    /// after which AWS may have acted ([`AwsError::may_have_been_done`])
    /// is returned at once.
    pub(crate) async fn act(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Element, AwsError> {
        self.call_retrying(action, params, |error| {
            error.is_transient() && !error.may_have_been_done()
        })
        .await
    }

    async fn call_retrying(
        &self,
        action: &str,
        params: &[(String, String)],
        retry: impl Fn(&AwsError) -> bool,
    ) -> Result<Element, AwsError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.try_once(action, params).await {
                Err(error) if retry(&error) && tries < MAX_TRIES => {
                    let delay = RETRY_BACKOFF
                        .delay(tries)
                        .mul_f64(rand::rng().random_range(0.5..=1.0));
                    warn!(error = %crate::causes::WithCauses(&error), try_number = tries, ?delay, "an aws call is tried again");
                    tokio::time::sleep(delay).await;
                }
                answer => return answer,
            }
        }
    }

    async fn try_once(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Element, AwsError> {
        let credentials = credentials(&self.region).await?;
        let mut form_params = vec![
            ("Action".to_owned(), action.to_owned()),
            ("Version".to_owned(), self.service.version().to_owned()),
        ];
        form_params.extend_from_slice(params);
        let body = sigv4::form(&form_params);
        let amz_date = jiff::Timestamp::now()
            .strftime("%Y%m%dT%H%M%SZ")
            .to_string();
        let host = match self.endpoint.port() {
            Some(port) => format!("{}:{port}", self.endpoint.host_str().unwrap_or_default()),
            None => self.endpoint.host_str().unwrap_or_default().to_owned(),
        };
        const FORM: &str = "application/x-www-form-urlencoded; charset=utf-8";
        let token = credentials.session_token.as_ref().map(|t| t.0.as_str());
        let mut signed = vec![
            ("content-type", FORM),
            ("host", host.as_str()),
            ("x-amz-date", amz_date.as_str()),
        ];
        if let Some(token) = token {
            signed.push(("x-amz-security-token", token));
        }
        let authorization = sigv4::authorization(
            &sigv4::Signing {
                method: "POST",
                path: self.endpoint.path(),
                query: "",
                headers: &signed,
                body: body.as_bytes(),
                region: &self.region,
                service: self.service.signing_name(),
                amz_date: &amz_date,
            },
            &credentials.access_key_id,
            &credentials.secret_access_key.0,
        );
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(FORM));
        let header = |value: &str| {
            HeaderValue::from_str(value).map_err(|_| {
                AwsError::Credentials(
                    "the AWS credentials hold characters no header can carry".into(),
                )
            })
        };
        headers.insert("x-amz-date", header(&amz_date)?);
        if let Some(token) = token {
            let mut value = header(token)?;
            value.set_sensitive(true);
            headers.insert("x-amz-security-token", value);
        }
        let mut value = header(&authorization)?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);

        let service = self.service.signing_name();
        let transport = |source: reqwest::Error| AwsError::Transport {
            service,
            action: action.to_owned(),
            host: host.clone(),
            source: source.without_url(),
        };
        let mut response = self
            .http
            .post(self.endpoint.clone())
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(self.unreadable(
                    action,
                    status,
                    format!("more than {MAX_ANSWER_BYTES} bytes"),
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&bytes);
        let root = Element::parse(&text).map_err(|why| {
            self.unreadable(
                action,
                status,
                format!(
                    "{why}; {}",
                    crate::restarter::process::for_log(text.trim(), 200)
                ),
            )
        })?;
        if (200..300).contains(&status) {
            return Ok(root);
        }
        match api_error(&root) {
            Some((code, message)) => Err(AwsError::Api {
                service,
                action: action.to_owned(),
                code,
                message,
                status,
            }),
            None => Err(self.unreadable(action, status, "an error without a code".into())),
        }
    }

    fn unreadable(&self, action: &str, status: u16, why: String) -> AwsError {
        AwsError::Unreadable {
            service: self.service.signing_name(),
            action: action.to_owned(),
            status,
            why,
        }
    }
}

/// The code and message of an error answer: EC2's
/// `<Response><Errors><Error>` and Auto Scaling's
/// `<ErrorResponse><Error>` alike.
pub(crate) fn api_error(root: &Element) -> Option<(String, String)> {
    let error = root.find("Error")?;
    let code = error.text_at(&["Code"])?.to_owned();
    let message =
        crate::restarter::process::for_log(error.text_at(&["Message"]).unwrap_or(""), 300)
            .into_owned();
    Some((code, message))
}

/// An endpoint mandrill may send signed calls to: http(s) with a host;
/// plain http only to a loopback address (an emulator), as a session
/// token travels in a header.
pub(crate) fn check_endpoint(raw: &str) -> Result<Url, String> {
    let shown = quoted_endpoint(raw);
    let url = Url::parse(raw).map_err(|e| format!("{shown} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(format!(
            "{shown} must be an http:// or https:// URL with a host"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err("an endpoint holds no credentials or query (not shown)".into());
    }
    if url.scheme() == "http" && super::check_plain_http(&url, false).is_err() {
        return Err(format!(
            "{raw:?} is plain http to a host that is not loopback: a session token would travel \
             in clear; use https"
        ));
    }
    Ok(url)
}

/// An endpoint as an error quotes it: not at all if it holds an `@`, which
/// may end credentials however the rest is misspelt
/// (`https//AKIA:secret@vpce…` parses as no URL, so no parser finds them).
pub(crate) fn quoted_endpoint(raw: &str) -> String {
    if raw.contains('@') {
        "the endpoint (not shown: it holds an @, perhaps credentials)".to_owned()
    } else {
        format!("{raw:?}")
    }
}

/// The credentials the chain gives now, for a call in `region`.
async fn credentials(region: &str) -> Result<credentials::Credentials, AwsError> {
    match credentials::source().map_err(AwsError::Credentials)? {
        credentials::Source::Keys(keys) => Ok(keys),
        temporary_source => temporary::credentials(&temporary_source, region)
            .await
            .map_err(AwsError::CredentialsUnavailable),
    }
}

/// Whether the credentials chain names a source: checked when a backend
/// is built, without a network call.
pub(crate) fn check_credentials_source() -> Result<(), String> {
    credentials::source().map(drop)
}

/// Whether the credentials chain gives credentials now, for a call in
/// `region` (fetching temporary ones): checked at start-up, so that a
/// service without any fails there, not at its first restart.
pub(crate) async fn check_credentials(region: &str) -> Result<(), String> {
    credentials(region)
        .await
        .map(drop)
        .map_err(|error| error.to_string())
}

/// The region a section names, else `AWS_REGION`, else
/// `AWS_DEFAULT_REGION`, as the AWS tools read it.
pub(crate) fn region(configured: Option<&str>) -> Option<String> {
    configured
        .map(str::to_owned)
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .filter(|region| !region.is_empty())
}

/// Whether `region` looks like an AWS region (`us-east-1`,
/// `us-gov-west-1`): it becomes part of a host name and a signature.
pub(crate) fn check_region(region: &str) -> Result<(), String> {
    if region.is_empty()
        || region.len() > 32
        || !region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(format!(
            "{region:?} is not an AWS region such as \"us-east-1\""
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
