//! Bearer-token checks for the protected endpoints, and the guard every
//! request passes.

use std::sync::Arc;

use axum::extract::{Request, State as Shared};
use axum::http::header::{AUTHORIZATION, HOST};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use subtle::ConstantTimeEq as _;

use crate::settings::Secret;

/// Whether `headers` carry `Authorization: Bearer TOKEN` for `token`; always
/// true without a token. The comparison takes the same time wherever the
/// first difference is, so response times do not reveal a prefix.
pub(crate) fn authorized(token: Option<&Secret>, headers: &HeaderMap) -> bool {
    let Some(token) = token else {
        return true;
    };
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    // `subtle` compares without an early exit (only a length difference
    // shows in time, and a token's length is not the secret).
    bool::from(presented.as_bytes().ct_eq(token.0.as_bytes()))
}

/// Whether the `Host` a request names is a loopback one (`localhost`,
/// `127.0.0.1`, `[::1]`, any port). Without a token the admin server is
/// bound to loopback only, and a browser page can still reach it under a
/// name of its own that it re-resolves to 127.0.0.1 (DNS rebinding): the
/// request then names that page's host, which is refused, so the page can
/// neither read the API nor turn the kill switch.
pub(crate) fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(HOST).and_then(|value| value.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Every request: without a token, only a loopback `Host` is served
/// ([`loopback_host`]); every response forbids framing (so that no page can
/// frame the dashboard and lure a click on its buttons), the dashboard by
/// a Content-Security-Policy of its own that says so too.
pub(crate) async fn guard(
    Shared(state): Shared<Arc<super::State>>,
    request: Request,
    next: Next,
) -> Response {
    if state.token.is_none() && !loopback_host(request.headers()) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "without admin.token this server answers only to a loopback Host \
             (localhost, 127.0.0.1, [::1])\n",
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("frame-ancestors 'none'"),
        );
    }
    response
}

/// The routes that read what only `admin.token` may see: refused
/// ([`unauthorized`]) without it, when one is set.
pub(crate) async fn token_required(
    Shared(state): Shared<Arc<super::State>>,
    request: Request,
    next: Next,
) -> Response {
    if !authorized(state.token.as_ref(), request.headers()) {
        return unauthorized();
    }
    next.run(request).await
}

/// The answer to a request without the token it needs.
pub(crate) fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a token is required: Authorization: Bearer TOKEN (admin.token, or the \
         generated one in admin.token_file)\n",
    )
        .into_response()
}

/// Every answer in text (JSON, the dashboard, the metrics) with the
/// configured secrets masked, as every log line is: a recorded error, the
/// switch's reason or the inventory's last error may quote one (a store
/// URL's password in a driver's error, a backend's output).
pub(crate) async fn scrubbed(
    Shared(state): Shared<Arc<super::State>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let text = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|kind| kind.starts_with("text/") || kind.starts_with("application/json"));
    if !text || state.redactor.is_empty() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Answers are bounded (a page of history, a dashboard).
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let body = match std::str::from_utf8(&bytes).map(|text| state.redactor.scrub(text)) {
        Ok(std::borrow::Cow::Owned(masked)) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            axum::body::Body::from(masked)
        }
        _ => axum::body::Body::from(bytes),
    };
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loopback_host_is_loopback() {
        let with_host = |host: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(HOST, host.parse().unwrap());
            loopback_host(&headers)
        };
        for host in [
            "127.0.0.1:9730",
            "localhost:9730",
            "LOCALHOST",
            "[::1]:9730",
            "127.0.0.2",
        ] {
            assert!(with_host(host), "{host}");
        }
        for host in [
            "rebind.attacker.example:9730",
            "localhost.attacker.example",
            "10.0.0.1:9730",
            "[::2]:9730",
            "",
        ] {
            assert!(!with_host(host), "{host}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn only_the_exact_bearer_token_is_accepted() {
        let token = Secret("s3cret".into());
        let check = |h: &HeaderMap| authorized(Some(&token), h);
        assert!(check(&headers("Bearer s3cret")));
        for wrong in [
            "Bearer s3creT",
            "Bearer s3cre",
            "Bearer s3crets",
            "s3cret",
            "Basic s3cret",
            "Bearer ",
        ] {
            assert!(!check(&headers(wrong)), "{wrong}");
        }
        assert!(!check(&HeaderMap::new()));
        assert!(authorized(None, &HeaderMap::new()));
    }
}
