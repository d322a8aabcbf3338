//! The `http` restarter: calls a webhook that restarts the host.
//!
//! The URL, body and header values are templates filled per request; the
//! message id always travels as `Idempotency-Key`; the body can be signed
//! with HMAC-SHA256, together with the time of signing, so that a captured
//! request cannot be replayed later. Plain `http://` goes only to a
//! loopback address unless `allow_plain_http` says otherwise. The answer
//! decides the outcome: 2xx restarted (the body
//! is the recorded output), 408, 429, 5xx and transport errors are retried
//! (honouring `Retry-After`), any other answer is a permanent refusal.
//! Redirects are not followed: a signed POST must not be replayed elsewhere.

mod answer;
pub(crate) mod aws;
pub(crate) mod fetch;
mod settings;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use hmac::{Hmac, Mac};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;
use tracing::debug;
use url::Url;

use super::hosts::HostMap;
use super::template::{Template, Values};
use super::{Cause, Reservation, RestartError, Restarter, SettingError};
use crate::causes::WithCauses;
use crate::domain::{RestartRequest, Restarted};

pub(crate) use answer::MAX_OUTPUT_BYTES;
use answer::{
    MAX_REASON_BODY_BYTES, failure_reason, is_retryable, read_bounded, recorded_output, retry_after,
};
pub(crate) use settings::{HttpSettings, IDEMPOTENCY_HEADER};
#[cfg(test)]
use {
    answer::{MAX_RETRY_AFTER, one_line},
    reqwest::{StatusCode, header::RETRY_AFTER},
};

/// Restarts hosts by calling a webhook. Build it with [`HttpRestarter::new`].
/// `Debug` shows no key, header value, URL credentials or query.
pub(crate) struct HttpRestarter {
    client: reqwest::Client,
    method: Method,
    url: Template,
    body: Template,
    headers: Vec<(HeaderName, Template)>,
    signer: Option<Signer>,
    allow_plain_http: bool,
    timeout: Duration,
    hosts: HostMap,
}

impl fmt::Debug for HttpRestarter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpRestarter")
            .field("method", &self.method)
            .field("url", &settings::masked_url(&self.url.to_string()))
            .field("headers", &headers)
            .field("signer", &self.signer)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The HMAC key and the header its signature goes in.
#[derive(Debug)]
struct Signer {
    header: HeaderName,
    key: Secret,
}

/// Key bytes that never reach a log: `Debug` prints `****`.
struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl HttpRestarter {
    /// Validates `settings`, reads the HMAC key and the CA file, and builds
    /// the client. Errors name the setting (relative to `[restarter.http]`).
    pub(crate) fn new(settings: &HttpSettings, hosts: HostMap) -> Result<Self, SettingError> {
        let parsed = settings
            .parse()
            .map_err(|(key, why)| SettingError::new(format!("{SECTION}.{key}"), why))?;
        let key = match (&settings.hmac_secret_file, &settings.hmac_secret_env) {
            (Some(path), _) => Some(secret_from_file(path)?),
            (None, Some(name)) => Some(secret_from_env(name)?),
            (None, None) => None,
        };
        let signer = key.map(|key| Signer {
            header: parsed.hmac_header,
            key,
        });
        install_crypto_provider();
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &settings.ca_file {
            builder = builder.tls_certs_merge(ca_certificates(path)?);
        }
        let client = builder.build().map_err(|error| {
            SettingError::because(SECTION, "cannot build the http client", error.without_url())
        })?;
        Ok(Self {
            client,
            method: parsed.method,
            url: parsed.url,
            body: parsed.body,
            headers: parsed.headers,
            signer,
            allow_plain_http: parsed.allow_plain_http,
            timeout: settings.timeout,
            hosts,
        })
    }

    /// The request for one restart, or why it cannot be made (permanent:
    /// the same request would render the same way next time).
    fn build(&self, values: &Values<'_>) -> Result<(Url, HeaderMap, Vec<u8>), String> {
        let url = parse_url(&self.url.render_url(values)).map_err(|why| format!("url {why}"))?;
        check_plain_http(&url, self.allow_plain_http).map_err(|why| format!("url {why}"))?;
        let body = self.body.render_json(values).into_bytes();
        let mut headers = HeaderMap::new();
        if !body.is_empty() {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        for (name, template) in &self.headers {
            let value = HeaderValue::from_str(&template.render(values))
                .map_err(|_| format!("header {name} renders to an invalid value"))?;
            headers.insert(name.clone(), value);
        }
        let message_id = values.request.message_id.to_string();
        headers.insert(
            HeaderName::from_static(IDEMPOTENCY_HEADER),
            // A UUID's text is always a valid header value.
            HeaderValue::from_str(&message_id).expect("a uuid is a header value"),
        );
        if let Some(signer) = &self.signer {
            headers.insert(signer.header.clone(), signer.sign(&body, SystemTime::now()));
        }
        Ok((url, headers, body))
    }
}

#[async_trait]
impl Restarter for HttpRestarter {
    fn describe(&self, request: &RestartRequest) -> String {
        let target = self.hosts.target(request);
        let values = Values {
            host: &target.address,
            request,
        };
        match self.build(&values) {
            Ok((url, _headers, body)) => format!(
                "{} {} {}",
                self.method,
                redacted(&url),
                String::from_utf8_lossy(&body)
            ),
            Err(reason) => format!("{} (refused: {reason})", self.method),
        }
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        _reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let host = &request.hostname;
        let target = self.hosts.target(request);
        let values = Values {
            host: &target.address,
            request,
        };
        let (url, headers, body) = self
            .build(&values)
            .map_err(|reason| RestartError::permanent(host, reason))?;
        let shown = redacted(&url);
        debug!(method = %self.method, url = %shown, "calling the webhook");
        let call = self
            .client
            .request(self.method.clone(), url)
            .headers(headers)
            .body(body);
        let transport = |error: reqwest::Error| {
            if error.is_timeout() {
                RestartError::TimedOut {
                    host: host.clone(),
                    after: self.timeout,
                }
            } else {
                RestartError::failed(
                    host,
                    Cause::new(
                        format!("{} {shown} failed", self.method),
                        error.without_url(),
                    ),
                )
            }
        };
        let mut response = call.send().await.map_err(transport)?;
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        debug!(%status, url = %shown, "the webhook answered");
        if status.is_success() {
            let output = match read_bounded(&mut response, MAX_OUTPUT_BYTES).await {
                Ok(body) => recorded_output(&body),
                // The webhook accepted the restart; only its explanation
                // was lost. The restart must not be repeated for that.
                Err(error) => Some(format!(
                    "(answer unreadable: {})",
                    WithCauses(&error.without_url())
                )),
            };
            return Ok(Restarted {
                recovered_after: None,
                output,
            });
        }
        let body = read_bounded(&mut response, MAX_REASON_BODY_BYTES)
            .await
            .unwrap_or_default();
        let reason = failure_reason(&self.method, &shown, status, &body);
        if is_retryable(status) {
            Err(RestartError::Failed {
                host: host.clone(),
                cause: reason.into(),
                retry_after,
            })
        } else {
            Err(RestartError::permanent(host, reason))
        }
    }
}

impl Signer {
    /// `t=<unix seconds>,v1=<hex>`: the HMAC-SHA256 of `<t>.<body>`, signed
    /// `at`. The time is inside the MAC, so that the receiver can refuse an
    /// old request replayed, and the same body signed at another second
    /// carries another signature.
    fn sign(&self, body: &[u8], at: SystemTime) -> HeaderValue {
        // A clock before 1970 signs as 0, which every receiver refuses.
        let t = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        // HMAC takes a key of any length; `new_from_slice` cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key.0).expect("hmac takes any key");
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        let signature = format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()));
        // ASCII digits and hex: always a valid header value.
        HeaderValue::from_str(&signature).expect("hex is a header value")
    }
}

/// Refuses plain `http://` to an address that is not loopback, unless
/// allowed: the body, its signature and the tokens in the URL and headers
/// would cross the network unencrypted. The address is not echoed.
fn check_plain_http(url: &Url, allowed: bool) -> Result<(), String> {
    if allowed || url.scheme() != "http" {
        return Ok(());
    }
    let loopback = match url.host() {
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => {
            address.is_loopback() || address.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    };
    if loopback {
        return Ok(());
    }
    Err(
        "sends plain http:// to an address that is not loopback (a placeholder in the host \
         counts as not loopback): use https://, or set restarter.http.allow_plain_http = true"
            .into(),
    )
}

/// Parses a rendered URL; only http and https are accepted. The text is not
/// echoed in the error: it may hold a token.
fn parse_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("renders to an invalid address ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "renders to a {}: address, not http or https",
            url.scheme()
        ));
    }
    if url.host().is_none() {
        return Err("renders to an address without a host".into());
    }
    Ok(url)
}

/// `url` as it may be logged: user, password and every query value replaced
/// by `****` (a query parameter is as likely to be `token=` as `id=`), no
/// fragment.
pub(crate) fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if !shown.username().is_empty() {
        // Fails only for URLs that cannot have credentials, which have none.
        let _ = shown.set_username("****");
    }
    if shown.password().is_some() {
        let _ = shown.set_password(Some("****"));
    }
    if url.query().is_some() {
        let names: Vec<String> = url
            .query_pairs()
            .map(|(name, _)| name.into_owned())
            .collect();
        shown
            .query_pairs_mut()
            .clear()
            .extend_pairs(names.iter().map(|name| (name, "****")));
    }
    shown.set_fragment(None);
    shown.to_string()
}

/// The section the errors of [`HttpRestarter::new`] name their keys in.
const SECTION: &str = "restarter.http";

fn secret_from_file(path: &Path) -> Result<Secret, SettingError> {
    let key_name = format!("{SECTION}.hmac_secret_file");
    let mut key = std::fs::read(path).map_err(|error| {
        SettingError::because(&key_name, format!("cannot read {}", path.display()), error)
    })?;
    // Files written by editors and `echo` end in a newline that is not part
    // of the key.
    if key.ends_with(b"\n") {
        key.pop();
        if key.ends_with(b"\r") {
            key.pop();
        }
    }
    if key.is_empty() {
        return Err(SettingError::new(
            key_name,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(Secret(key))
}

fn secret_from_env(name: &str) -> Result<Secret, SettingError> {
    use std::os::unix::ffi::OsStringExt;
    let key = format!("{SECTION}.hmac_secret_env");
    match std::env::var_os(name) {
        Some(value) if !value.is_empty() => Ok(Secret(value.into_vec())),
        Some(_) => Err(SettingError::new(
            key,
            format!("the variable {name} is empty"),
        )),
        None => Err(SettingError::new(
            key,
            format!("the variable {name} is not set"),
        )),
    }
}

fn ca_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, SettingError> {
    let key = format!("{SECTION}.ca_file");
    let pem = std::fs::read(path).map_err(|error| {
        SettingError::because(&key, format!("cannot read {}", path.display()), error)
    })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|error| {
        SettingError::because(
            &key,
            format!("{} is not a PEM certificate bundle", path.display()),
            error,
        )
    })?;
    if certificates.is_empty() {
        return Err(SettingError::new(
            key,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certificates)
}

/// reqwest is built without a TLS provider (so that aws-lc never enters the
/// build); rustls picks up the process default, installed here once. Failing
/// means a provider is already installed, which serves as well.
pub(crate) fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
