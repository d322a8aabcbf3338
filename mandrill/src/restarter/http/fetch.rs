//! A bounded HTTP GET for what mandrill reads over HTTP besides webhooks
//! (the inventory's `inventory.url`): here so that reqwest stays inside
//! `restarter/http/`. Errors never show the URL unredacted.

use std::time::Duration;

use crate::settings::redact_url;

/// GETs `url` within `timeout`, following no redirect, and returns the
/// body if the answer is a 2xx and the body at most `max_bytes`.
pub(crate) async fn get_bounded(
    url: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Vec<u8>, String> {
    super::install_crypto_provider();
    let shown = redact_url(url);
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("mandrill/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let transport = |error: reqwest::Error| {
        if error.is_timeout() {
            format!("GET {shown} took longer than {timeout:?}")
        } else {
            // reqwest's message may quote the URL: it is left out.
            format!("GET {shown} failed: {}", error.without_url())
        }
    };
    let mut response = client.get(url).send().await.map_err(transport)?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("GET {shown} answered {status}"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > max_bytes {
            return Err(format!("GET {shown} answered more than {max_bytes} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
