//! The webhook's answer: which statuses are retried, the reason a failure
//! gives, `Retry-After`, and the body, read bounded and stored bounded.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};

/// Most bytes of an answer's body kept as the recorded output.
pub(crate) const MAX_OUTPUT_BYTES: usize = 4096;
/// Most bytes of an answer's body quoted in a failure's reason (which is
/// logged, stored and becomes a dead-letter reason).
pub(super) const MAX_REASON_BODY_BYTES: usize = 256;
/// A `Retry-After` beyond this is taken as this: a misbehaving webhook must
/// not park a request for years.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// 408, 429 and 5xx may pass; other non-2xx answers will not.
pub(super) fn is_retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

pub(super) fn failure_reason(
    method: &Method,
    url: &str,
    status: StatusCode,
    body: &[u8],
) -> String {
    let mut reason = format!("{method} {url} answered {status}");
    if status.is_redirection() {
        reason.push_str(" (redirects are not followed: point url at the final address)");
    }
    let body = one_line(&String::from_utf8_lossy(body));
    if !body.is_empty() {
        reason.push_str(": ");
        reason.push_str(&body);
    }
    reason
}

/// The delay a `Retry-After` header asks for, in seconds or as an HTTP date
/// (a past date means now), at most [`MAX_RETRY_AFTER`].
pub(super) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let date = httpdate::parse_http_date(value).ok()?;
            date.duration_since(now).unwrap_or_default()
        }
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// Up to `limit` bytes of the body; the rest is never read.
pub(super) async fn read_bounded(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit.saturating_sub(body.len());
        if chunk.len() > room {
            // One byte past the limit tells the caller the body was cut.
            body.extend_from_slice(&chunk[..=room]);
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The body as stored: text, at most [`MAX_OUTPUT_BYTES`], ending in `…` when
/// cut; `None` when empty. NULs become U+FFFD (PostgreSQL refuses them).
pub(super) fn recorded_output(body: &[u8]) -> Option<String> {
    if body.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(body).replace('\0', "\u{fffd}");
    Some(truncated(&text, MAX_OUTPUT_BYTES))
}

/// A body quoted in a reason: one line, at most [`MAX_REASON_BODY_BYTES`].
pub(super) fn one_line(text: &str) -> String {
    let flat: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncated(&flat, MAX_REASON_BODY_BYTES)
}

/// `text` cut on a character boundary so that it, with a `…` when cut, fits
/// in `limit` bytes.
pub(super) fn truncated(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    const ELLIPSIS: &str = "…";
    let end = text.floor_char_boundary(limit - ELLIPSIS.len());
    format!("{}{ELLIPSIS}", &text[..end])
}
