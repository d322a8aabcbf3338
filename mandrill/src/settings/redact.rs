//! Secrets never printed: URLs with their credentials masked, and a
//! [`Redactor`] that masks every secret of a configuration in any text about
//! to be printed (log lines, error chains whose sources quote a URL).

use std::borrow::Cow;

use percent_encoding::percent_decode_str;
use url::Url;

/// What a secret is replaced with.
pub(crate) const MASK: &str = "****";

/// Whether a query parameter of a connection URL holds a secret
/// (`password`, `sslpassword`, `token`, `client_secret`, …).
fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token", "key"]
        .iter()
        .any(|word| name.contains(word))
}

/// Whether the user part of this URL is itself a secret: NATS reads
/// `nats://TOKEN@host` as a token.
fn user_is_secret(url: &Url) -> bool {
    matches!(url.scheme(), "nats" | "tls" | "ws" | "wss") && url.password().is_none()
}

/// `url` with its password, NATS token and secret query parameters replaced
/// by `****`, for logs and errors. A comma-separated list of NATS servers is
/// redacted server by server; text that is not a URL but has credentials in
/// it (`scheme://…@`) loses everything before the `@`.
pub(crate) fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => redact_parsed(parsed),
        Err(_) if url.contains(',') => url.split(',').map(redact_url).collect::<Vec<_>>().join(","),
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end => {
                format!("{}://{MASK}{}", &url[..scheme_end], &url[at..])
            }
            _ => url.to_owned(),
        },
    }
}

fn redact_parsed(mut url: Url) -> String {
    if url.password().is_some() {
        // Only URLs that can have credentials parse with a password.
        let _ = url.set_password(Some(MASK));
    } else if user_is_secret(&url) && !url.username().is_empty() {
        let _ = url.set_username(MASK);
    }
    if url
        .query_pairs()
        .any(|(name, _)| is_secret_parameter(&name))
    {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if is_secret_parameter(&name) {
                    MASK.to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.into()
}

/// The secrets a URL carries, as written and decoded: its password, a NATS
/// token, secret query parameters.
pub(crate) fn url_secrets(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    for part in url.split(',') {
        let Ok(parsed) = Url::parse(part) else {
            continue;
        };
        let mut add = |encoded: &str| {
            secrets.push(encoded.to_owned());
            if let Ok(decoded) = percent_decode_str(encoded).decode_utf8() {
                secrets.push(decoded.into_owned());
            }
        };
        if let Some(password) = parsed.password() {
            add(password);
        } else if user_is_secret(&parsed) && !parsed.username().is_empty() {
            add(parsed.username());
        }
        for (name, value) in parsed.query_pairs() {
            if is_secret_parameter(&name) {
                secrets.push(value.into_owned());
            }
        }
        // The query as written, for values whose encoding differs.
        for pair in parsed.query().unwrap_or_default().split('&') {
            if let Some((name, value)) = pair.split_once('=')
                && is_secret_parameter(name)
            {
                secrets.push(value.to_owned());
            }
        }
    }
    secrets
}

/// The secrets of a webhook URL: the whole URL, its credentials, and its
/// path and query, which often are the key (Slack's
/// `/services/T…/B…/XXXX`). Paths shorter than 8 characters (`/hook`) are
/// left alone: masking them everywhere would mask ordinary words.
pub(crate) fn webhook_secrets(url: &str) -> Vec<String> {
    let mut secrets = url_secrets(url);
    secrets.push(url.to_owned());
    if let Ok(parsed) = Url::parse(url) {
        if parsed.path().len() >= 8 {
            secrets.push(parsed.path().to_owned());
        }
        if let Some(query) = parsed.query().filter(|query| query.len() >= 8) {
            secrets.push(query.to_owned());
        }
    }
    secrets
}

/// Masks a fixed set of secrets wherever they occur in a text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Redactor {
    /// Longest first, so that a secret containing another is masked whole.
    secrets: Vec<String>,
}

impl Redactor {
    /// Masks these secrets (empty ones and the mask itself are ignored), also
    /// as they appear quoted by `{:?}` or in a JSON log line.
    pub(crate) fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .flat_map(|secret| {
                let debug = format!("{secret:?}");
                let json = serde_json::to_string(&secret).unwrap_or_default();
                let unquote = |quoted: &str| {
                    quoted
                        .strip_prefix('"')
                        .and_then(|q| q.strip_suffix('"'))
                        .unwrap_or_default()
                        .to_owned()
                };
                [unquote(&debug), unquote(&json), secret]
            })
            .filter(|secret| !secret.is_empty() && secret != MASK)
            .collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Self { secrets }
    }

    /// Masks the secrets of both.
    pub(crate) fn union(&self, other: &Redactor) -> Redactor {
        Redactor::new(self.secrets.iter().chain(&other.secrets).cloned())
    }

    /// Whether there is nothing to mask.
    pub(crate) fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret replaced by `****`.
    pub(crate) fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = Cow::Owned(text.replace(secret.as_str(), MASK));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_passwords_tokens_and_secret_parameters() {
        let cases = [
            (
                "postgres://app:s3cret@db:5432/x",
                "postgres://app:****@db:5432/x",
            ),
            (
                "postgres://app@db/x?sslmode=require&password=s3cret&sslpassword=k3y",
                "postgres://app@db/x?sslmode=require&password=****&sslpassword=****",
            ),
            ("nats://user:s3cret@h:4222", "nats://user:****@h:4222"),
            ("nats://t0ken@h:4222", "nats://****@h:4222"),
            (
                "nats://u:a@h:1,nats://u:b@k:2",
                "nats://u:****@h:1,nats://u:****@k:2",
            ),
            ("sqlite:mandrill.db", "sqlite:mandrill.db"),
            ("memory", "memory"),
            ("postgres://u:p@[::1", "postgres://****@[::1"),
        ];
        for (url, expected) in cases {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }

    #[test]
    fn url_secrets_are_found_encoded_and_decoded() {
        let secrets = url_secrets("postgres://app:s%40cret@db/x?password=a%20b&sslmode=off");
        for expected in ["s%40cret", "s@cret", "a b", "a%20b"] {
            assert!(secrets.iter().any(|s| s == expected), "{secrets:?}");
        }
        assert!(!secrets.iter().any(|s| s == "off"), "{secrets:?}");
        assert_eq!(url_secrets("nats://t0ken@h"), ["t0ken", "t0ken"]);
        assert!(url_secrets("postgres://app@db/x").is_empty());
    }

    #[test]
    fn scrub_masks_every_occurrence_longest_first() {
        let redactor = Redactor::new(["abc".to_owned(), "abcdef".to_owned(), String::new()]);
        assert_eq!(redactor.scrub("x abcdef y abc z"), "x **** y **** z");
        assert!(matches!(redactor.scrub("nothing"), Cow::Borrowed(_)));
        assert!(Redactor::new([String::new()]).is_empty());
        let quoted = Redactor::new([r#"p"a\ss"#.to_owned()]);
        assert_eq!(quoted.scrub(r#"x "p\"a\\ss" y"#), r#"x "****" y"#);
    }
}
