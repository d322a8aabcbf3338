//! The HTTP client. The only module that knows about `reqwest`.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, LOCATION, RETRY_AFTER};
use url::Url;

/// How the shared client is built.
#[derive(Debug, Clone)]
pub struct FetchSettings {
    /// The User-Agent header.
    pub user_agent: String,
    /// Whole-request timeout (connect, headers and body).
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Redirects followed before giving up.
    pub max_redirects: usize,
    /// Largest body read, in bytes.
    pub max_body: u64,
    /// Idle connections kept per host, for reuse.
    pub idle_per_host: usize,
}

/// Which responses have their body read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyWanted {
    /// Always (robots.txt).
    Always,
    /// Only when the Content-Type says HTML, or says nothing (to sniff).
    HtmlOnly,
}

/// A successful (status < 400) response.
#[derive(Debug)]
pub struct Response {
    /// Where the content came from, after redirects.
    pub final_url: Url,
    /// The HTTP status.
    pub status: u16,
    /// The Content-Type header, if any.
    pub content_type: Option<String>,
    /// The body, when it was wanted.
    pub body: Option<Vec<u8>>,
    /// A redirect that was not followed (the `follow` test refused its
    /// target); `status` is then the redirect's, and there is no body.
    pub redirect_to: Option<Url>,
}

/// Why a URL could not be fetched. Never fatal to the crawl.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server answered with a status of 400 or more.
    #[error("http status {status}")]
    Status {
        /// The status code.
        status: u16,
        /// The Retry-After header, as a delay from now.
        retry_after: Option<Duration>,
    },
    /// The request took longer than the timeout.
    #[error("timed out")]
    Timeout,
    /// No connection could be made (refused, DNS, TLS).
    #[error("connection failed: {0}")]
    Connect(String),
    /// More redirects than allowed.
    #[error("too many redirects")]
    TooManyRedirects,
    /// The body exceeded the size limit.
    #[error("body larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// Reading or decompressing the body failed.
    #[error("reading the body failed: {0}")]
    Body(String),
    /// Anything else the client reported.
    #[error("request failed: {0}")]
    Request(String),
}

/// One pooled HTTP client for the whole run.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    max_body: u64,
    max_redirects: usize,
    /// The whole request, redirects included (reqwest's own timeout
    /// covers one hop, as areq follows redirects itself).
    timeout: Duration,
}

impl Fetcher {
    /// Builds the client: connection pooling, gzip and brotli, rustls.
    pub fn new(settings: &FetchSettings) -> anyhow::Result<Self> {
        // reqwest is built without a default TLS provider; this picks ring.
        // It fails only when a provider is already installed, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent(settings.user_agent.clone())
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            // Redirects are followed by `get`, which asks the caller about
            // each target (the crawl keeps them within its scope).
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(settings.idle_per_host)
            .gzip(true)
            .brotli(true)
            .build()
            .map_err(|error| anyhow::anyhow!("building the http client failed: {error}"))?;
        Ok(Self {
            client,
            max_body: settings.max_body,
            max_redirects: settings.max_redirects,
            timeout: settings.timeout,
        })
    }

    /// GETs a URL, reading its body when wanted and within the size limit.
    ///
    /// Redirects are followed up to the limit while `follow` accepts their
    /// target; the first target it refuses ends the request with
    /// [`Response::redirect_to`] set.
    pub async fn get(
        &self,
        url: &Url,
        wanted: BodyWanted,
        follow: impl Fn(&Url) -> bool,
    ) -> Result<Response, FetchError> {
        tokio::time::timeout(self.timeout, self.get_within(url, wanted, follow))
            .await
            .unwrap_or(Err(FetchError::Timeout))
    }

    async fn get_within(
        &self,
        url: &Url,
        wanted: BodyWanted,
        follow: impl Fn(&Url) -> bool,
    ) -> Result<Response, FetchError> {
        let mut current = url.clone();
        let mut redirects = 0;
        let response = loop {
            let response = self
                .client
                .get(current.clone())
                .send()
                .await
                .map_err(classify)?;
            let Some(target) = redirect_target(&response) else {
                break response;
            };
            if redirects == self.max_redirects {
                return Err(FetchError::TooManyRedirects);
            }
            redirects += 1;
            if !follow(&target) {
                return Ok(Response {
                    final_url: current,
                    status: response.status().as_u16(),
                    content_type: None,
                    body: None,
                    redirect_to: Some(target),
                });
            }
            current = target;
        };
        let status = response.status().as_u16();
        if status >= 400 {
            return Err(FetchError::Status {
                status,
                retry_after: retry_after(response.headers()),
            });
        }
        let final_url = current;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let read = match wanted {
            BodyWanted::Always => true,
            BodyWanted::HtmlOnly => content_type
                .as_deref()
                .is_none_or(|ct| crate::extract::is_html(Some(ct), b"")),
        };
        let body = if read {
            Some(self.read_body(response).await?)
        } else {
            None
        };
        Ok(Response {
            final_url,
            status,
            content_type,
            body,
            redirect_to: None,
        })
    }

    async fn read_body(&self, mut response: reqwest::Response) -> Result<Vec<u8>, FetchError> {
        let too_large = FetchError::BodyTooLarge {
            limit: self.max_body,
        };
        let declared = content_length(response.headers());
        if declared.is_some_and(|length| length > self.max_body) {
            return Err(too_large);
        }
        // Compressed responses declare the compressed length; the cap on the
        // initial capacity keeps a lying header from allocating much.
        let capacity = declared.unwrap_or(0).min(self.max_body).min(1 << 20);
        let mut body = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
        while let Some(chunk) = response.chunk().await.map_err(classify)? {
            if body.len() as u64 + chunk.len() as u64 > self.max_body {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// Where a redirect response points, resolved against its URL; `None` for
/// other responses and for a missing or invalid Location (then the response
/// stands for itself, as browsers treat it).
fn redirect_target(response: &reqwest::Response) -> Option<Url> {
    let redirects = [
        StatusCode::MOVED_PERMANENTLY,
        StatusCode::FOUND,
        StatusCode::SEE_OTHER,
        StatusCode::TEMPORARY_REDIRECT,
        StatusCode::PERMANENT_REDIRECT,
    ];
    if !redirects.contains(&response.status()) {
        return None;
    }
    let location = response.headers().get(LOCATION)?.to_str().ok()?;
    let target = response.url().join(location).ok()?;
    matches!(target.scheme(), "http" | "https").then_some(target)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Retry-After as delay-seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(SystemTime::now()).unwrap_or_default())
}

fn classify(error: reqwest::Error) -> FetchError {
    if error.is_timeout() {
        FetchError::Timeout
    } else if error.is_redirect() {
        FetchError::TooManyRedirects
    } else if error.is_connect() {
        FetchError::Connect(root_cause(&error))
    } else if error.is_body() || error.is_decode() {
        FetchError::Body(root_cause(&error))
    } else {
        FetchError::Request(root_cause(&error))
    }
}

/// The innermost cause, which is the informative one ("connection refused").
fn root_cause(error: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(
            retry_after(&headers),
            Some(Duration::ZERO),
            "a past date means now"
        );
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers), None);
    }
}
