//! A bounded HTTP GET for what mandrill reads over HTTP besides webhooks
//! (the inventory's `inventory.url`): here so that reqwest stays inside
//! `restarter/http/`. Errors never show the URL unredacted.

use std::time::Duration;

use crate::settings::redact_url;

/// Why a GET brought no body back. The URL is shown redacted, and left
/// out of reqwest's own message, which may quote it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum FetchError {
    /// The client could not be built (no TLS provider, say).
    #[error("cannot build an http client")]
    Client(#[source] reqwest::Error),
    /// No answer within the timeout.
    #[error("GET {url} took longer than {after:?}")]
    TimedOut {
        /// The URL, redacted.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The connection or the transfer failed.
    #[error("GET {url} failed")]
    Failed {
        /// The URL, redacted.
        url: String,
        /// What reqwest saw.
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not a 2xx.
    #[error("GET {url} answered {status}")]
    Status {
        /// The URL, redacted.
        url: String,
        /// The status.
        status: reqwest::StatusCode,
    },
    /// The body was longer than allowed.
    #[error("GET {url} answered more than {max_bytes} bytes")]
    TooBig {
        /// The URL, redacted.
        url: String,
        /// The limit.
        max_bytes: usize,
    },
}

/// GETs `url` within `timeout`, following no redirect, and returns the
/// body if the answer is a 2xx and the body at most `max_bytes`.
pub(crate) async fn get_bounded(
    url: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Vec<u8>, FetchError> {
    super::install_crypto_provider();
    let shown = redact_url(url);
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| FetchError::Client(e.without_url()))?;
    let transport = |error: reqwest::Error| {
        if error.is_timeout() {
            FetchError::TimedOut {
                url: shown.clone(),
                after: timeout,
            }
        } else {
            FetchError::Failed {
                url: shown.clone(),
                source: error.without_url(),
            }
        }
    };
    let mut response = client.get(url).send().await.map_err(transport)?;
    let status = response.status();
    if !status.is_success() {
        return Err(FetchError::Status { url: shown, status });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > max_bytes {
            return Err(FetchError::TooBig {
                url: shown,
                max_bytes,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
