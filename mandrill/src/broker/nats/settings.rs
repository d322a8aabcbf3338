//! `[broker.nats]`: the NATS adapter's own settings (configuration depends
//! on them, never the reverse).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Credentials;
use crate::settings::{Secret, settings};

settings! {
    /// `[broker.nats]`: the stream and durable consumer every instance
    /// shares, and how to reach the server. `broker.ack_deadline` is the
    /// consumer's ack wait; the consumer redelivers without limit
    /// (`max_deliver = -1`), since the worker keeps `broker.max_deliveries`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct NatsSettings {
        /// JetStream stream holding requests (created if missing, work-queue
        /// retention).
        pub stream: String = "MANDRILL".into(),
        /// Subject requests are published on.
        pub subject: String = "mandrill.requests".into(),
        /// Durable pull consumer shared by every instance.
        pub consumer: String = "mandrill".into(),
        /// Where dead letters are copied with their reason (stream
        /// `{stream}_DEAD`).
        pub dead_letter_subject: String = "mandrill.dead".into(),
        /// Unacknowledged deliveries allowed across all instances.
        pub max_ack_pending: i64 = 10_000,
        /// User name (with `password`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub user: Option<String> = None,
        /// Password (with `user`; never logged).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub password: Option<Secret> = None,
        /// Token authentication (never logged).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub token: Option<Secret> = None,
        /// A `.creds` file (JWT and nkey seed).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub creds_file: Option<PathBuf> = None,
        /// Require TLS.
        pub tls: bool = false,
        /// Extra root certificates (PEM) for TLS.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tls_ca_file: Option<PathBuf> = None,
    }
}

impl NatsSettings {
    /// Checks what types cannot; the key is relative to `[broker.nats]`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, value) in [
            ("stream", &self.stream),
            ("subject", &self.subject),
            ("consumer", &self.consumer),
            ("dead_letter_subject", &self.dead_letter_subject),
        ] {
            if value.trim().is_empty() || value.contains(char::is_whitespace) {
                return Err((key, "must be a non-empty name without spaces".into()));
            }
        }
        if self.subject == self.dead_letter_subject {
            return Err((
                "dead_letter_subject",
                "must differ from broker.nats.subject".into(),
            ));
        }
        if self.max_ack_pending < 1 {
            return Err(("max_ack_pending", "must be at least 1".into()));
        }
        if self.user.is_some() != self.password.is_some() {
            return Err((
                "password",
                "broker.nats.user and broker.nats.password go together".into(),
            ));
        }
        if self.credentials_methods() > 1 {
            return Err((
                "token",
                "choose one of broker.nats.user/password, broker.nats.token and \
                 broker.nats.creds_file"
                    .into(),
            ));
        }
        Ok(())
    }

    /// How many ways to authenticate are set (at most one may be).
    fn credentials_methods(&self) -> usize {
        [
            self.user.is_some(),
            self.token.is_some(),
            self.creds_file.is_some(),
        ]
        .into_iter()
        .filter(|&set| set)
        .count()
    }

    /// Whether these settings authenticate, so that a `broker.url` with
    /// credentials of its own would be a second way.
    pub(crate) fn has_credentials(&self) -> bool {
        self.credentials_methods() > 0
    }

    /// The credentials these settings give; [`Credentials::None`] leaves
    /// those of the URL, if any.
    pub(crate) fn credentials(&self) -> Credentials {
        match (&self.user, &self.password, &self.token, &self.creds_file) {
            (Some(user), Some(password), _, _) => Credentials::UserPassword {
                user: user.clone(),
                password: password.clone(),
            },
            (_, _, Some(token), _) => Credentials::Token(token.clone()),
            (_, _, _, Some(path)) => Credentials::CredsFile(path.clone()),
            _ => Credentials::None,
        }
    }
}
