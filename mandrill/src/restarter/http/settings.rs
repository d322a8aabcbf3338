//! `[restarter.http]`: what the webhook restarter sends, and where.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::domain::{Domain, ParseRules, RestartRequest};
use crate::restarter::template::{Template, Values};
use crate::settings::{duration, settings};

/// The header that always carries the request's message id, so that the
/// receiver can drop a restart it has already done.
pub(crate) const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Headers the client or this backend sets itself; configuring them would
/// break the request or its guarantees.
const RESERVED_HEADERS: [&str; 5] = [
    IDEMPOTENCY_HEADER,
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
];

settings! {
    /// `[restarter.http]`: the webhook restarter's settings. `Debug` masks
    /// header values and the URL's credentials and query: tokens live there.
    #[derive(Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct HttpSettings {
        /// HTTP method of the restart call.
        pub method: String = "POST".into(),
        /// URL template, e.g. `https://chaos.internal/restart/{instance_name}`;
        /// required.
        ///
        /// Values are percent-encoded (an IPv6 address goes in brackets), so
        /// none can change the URL's host, path, query or fragment.
        pub url: String = String::new(),
        /// Body template, values JSON-escaped; "" for none.
        ///
        /// Values are escaped as JSON string contents (the template supplies
        /// the quotes).
        pub body: String = concat!(
            r#"{{"message_id": "{message_id}", "instance_name": "{instance_name}", "#,
            r#""host": "{host}", "group": "{group}"}}"#
        )
        .into(),
        /// Extra headers, name → value template, e.g. `Authorization = "Bearer …"`.
        ///
        /// `Idempotency-Key` is always the message id and cannot be set here.
        pub headers: BTreeMap<String, String> = BTreeMap::new(),
        /// File holding the HMAC-SHA256 key that signs each body (never
        /// printed).
        ///
        /// One trailing newline is ignored. Set this or `hmac_secret_env`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub hmac_secret_file: Option<PathBuf> = None,
        /// Environment variable holding the HMAC-SHA256 key instead (never
        /// printed).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub hmac_secret_env: Option<String> = None,
        /// Signature header: `t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`.
        ///
        /// The HMAC covers the time, a `.`, and the exact body bytes. The
        /// receiver recomputes it and refuses a time more than five minutes
        /// away from its own clock, so that a captured request cannot be
        /// replayed later (docs/backends.md shows the check).
        pub hmac_header: String = "X-Mandrill-Signature".into(),
        /// Allow plain `http://` to an address that is not loopback.
        ///
        /// Loopback is `127.0.0.0/8`, `::1` and `localhost`. Off by default:
        /// the body, its signature and any token in the URL or headers would
        /// cross the network unencrypted. A placeholder in the URL's host
        /// counts as not loopback.
        pub allow_plain_http: bool = false,
        /// Limit on the whole call, connecting and reading the answer
        /// included; keep it below `worker.restart_timeout`.
        ///
        /// The default is below `worker.restart_timeout`'s, so that a slow
        /// webhook is reported by this backend, with its own reason.
        #[serde(with = "duration")]
        pub timeout: Duration = Duration::from_secs(20),
        /// Extra PEM CA certificates to trust, for an internal CA.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub ca_file: Option<PathBuf> = None,
    }
}

impl fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: BTreeMap<&str, &str> = self
            .headers
            .keys()
            .map(|name| (name.as_str(), "****"))
            .collect();
        f.debug_struct("HttpSettings")
            .field("method", &self.method)
            .field("url", &masked_url(&self.url))
            .field("body", &self.body)
            .field("headers", &headers)
            .field("hmac_secret_file", &self.hmac_secret_file)
            .field("hmac_secret_env", &self.hmac_secret_env)
            .field("hmac_header", &self.hmac_header)
            .field("allow_plain_http", &self.allow_plain_http)
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// A URL template with its user info and query replaced by `****`. Textual,
/// since a template with placeholders is not yet a URL.
pub(super) fn masked_url(template: &str) -> String {
    let (before_query, query) = match template.split_once('?') {
        Some((before, _)) => (before, "?****"),
        None => (template, ""),
    };
    let (scheme, rest) = before_query.split_once("://").unwrap_or(("", before_query));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => format!("****@{}", &rest[at + 1..]),
        None => rest.to_owned(),
    };
    let separator = if scheme.is_empty() { "" } else { "://" };
    format!("{scheme}{separator}{rest}{query}")
}

/// The settings, parsed: what the restarter keeps.
#[derive(Debug, Clone)]
pub(super) struct Parsed {
    pub(super) method: Method,
    pub(super) url: Template,
    pub(super) body: Template,
    pub(super) headers: Vec<(HeaderName, Template)>,
    pub(super) hmac_header: HeaderName,
    pub(super) allow_plain_http: bool,
}

impl HttpSettings {
    /// Checks everything that can be checked without reading files or the
    /// environment. The key is relative to `[restarter.http]`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        self.parse().map(drop)
    }

    pub(super) fn parse(&self) -> Result<Parsed, (&'static str, String)> {
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|_| ("method", format!("{:?} is not an http method", self.method)))?;
        if self.url.is_empty() {
            return Err((
                "url",
                "is empty: set the webhook's address, e.g. \
                 https://chaos.internal/restart/{instance_name}"
                    .into(),
            ));
        }
        let url = Template::parse(&self.url).map_err(|why| ("url", why))?;
        let sample = sample_request();
        let values = Values {
            host: "host.example.net",
            request: &sample,
        };
        // Checked on a sample request so that a typo fails at load, not at
        // the first restart. The text is not echoed: it may hold a token.
        let sample_url = super::parse_url(&url.render_url(&values)).map_err(|why| ("url", why))?;
        super::check_plain_http(&sample_url, self.allow_plain_http).map_err(|why| ("url", why))?;
        let body = Template::parse(&self.body).map_err(|why| ("body", why))?;
        let hmac_header = HeaderName::from_bytes(self.hmac_header.as_bytes()).map_err(|_| {
            (
                "hmac_header",
                format!("{:?} is not a header name", self.hmac_header),
            )
        })?;
        let signs = self.hmac_secret_file.is_some() || self.hmac_secret_env.is_some();
        if self.hmac_secret_file.is_some() && self.hmac_secret_env.is_some() {
            return Err((
                "hmac_secret_env",
                "set either hmac_secret_file or hmac_secret_env, not both".into(),
            ));
        }
        if self.hmac_secret_env.as_deref() == Some("") {
            return Err(("hmac_secret_env", "is empty: name a variable".into()));
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ("headers", format!("{name:?} is not a header name")))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(("headers", format!("{name} is set by mandrill itself")));
            }
            if signs && header == hmac_header {
                return Err((
                    "headers",
                    format!("{name} carries the signature (hmac_header)"),
                ));
            }
            let template = Template::parse(value).map_err(|why| ("headers", why))?;
            HeaderValue::from_str(&template.render(&values)).map_err(|_| {
                (
                    "headers",
                    format!("the value of {name} is not a valid header value"),
                )
            })?;
            headers.push((header, template));
        }
        if self.timeout.is_zero() {
            return Err(("timeout", "must be more than zero".into()));
        }
        Ok(Parsed {
            method,
            url,
            body,
            headers,
            hmac_header,
            allow_plain_http: self.allow_plain_http,
        })
    }
}

fn sample_request() -> RestartRequest {
    let rules = ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 1024,
    };
    let payload =
        br#"{"message_id":"00000000-0000-4000-8000-000000000000","instance_name":"cattle-ab12"}"#;
    // A fixed, valid payload: parsing it cannot fail.
    RestartRequest::parse(payload, &rules).expect("the sample request parses")
}
