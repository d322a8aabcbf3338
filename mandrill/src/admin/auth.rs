//! Bearer-token checks for the protected endpoints.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
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

#[cfg(test)]
mod tests {
    use super::*;

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
