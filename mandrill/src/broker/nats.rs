//! The scale-out broker: NATS JetStream, one durable pull consumer shared by
//! every instance. The only module that imports `async_nats`.
//!
//! JetStream's acknowledgements map one to one onto our lease semantics:
//! extend is an in-progress ack (`+WPI`), nack is `-NAK` with a delay,
//! dead-letter is `+TERM` plus a copy of the message and its reason on the
//! dead-letter subject (kept by the `{stream}_DEAD` stream, listed and
//! requeued by `dead_letters.rs`), and ack is `+ACK` confirmed by the server (a double
//! ack), since it follows a recorded outcome. A delivery's tag is its reply
//! subject, so settling needs no state here. The client reconnects by itself;
//! while it is away, pulls fail (the worker's supervisor retries them) and
//! leases run out (the messages are redelivered).
//!
//! The consumer redelivers without limit (`max_deliver = -1`): JetStream
//! stopping at its own limit would leave a message in the stream, neither
//! dead-lettered nor recorded, so the worker keeps `broker.max_deliveries`
//! and gives up itself. A dead-letter copy always fits the server's
//! `max_payload`: its reason is bounded, and a payload too large to go with
//! its headers is truncated, which a header says.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::RawMessageErrorKind;
use async_nats::jetstream::{self, AckKind, stream};
use async_nats::{ConnectOptions, Event, HeaderMap, RequestErrorKind};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tracing::{info, warn};

use super::{
    BrokerError, Cause, Close, Consumer, DeadLetterAdmin, DeadLetterEntry, DeadLetterId, Delivery,
    DeliveryTag, Publisher, bounded_reason, choose,
};

mod consumer;
mod dead_letter;
mod dead_letters;
mod publisher;
mod settings;

pub(crate) use consumer::NatsBroker;
pub(crate) use publisher::NatsPublisher;
pub(crate) use settings::NatsSettings;

use crate::settings::{Secret, redact_url};

/// How to authenticate to the server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Credentials {
    /// No credentials.
    #[default]
    None,
    /// A user and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// A token.
    Token(Secret),
    /// A `.creds` file (JWT and nkey seed).
    CredsFile(PathBuf),
}

/// Takes the credentials out of `nats://user:password@host` or
/// `nats://token@host` (async-nats would ignore them there): returns the
/// URL without them, and them. With several comma-separated servers, the
/// first that has credentials gives them.
pub(crate) fn split_url_credentials(url: &str) -> (String, Credentials) {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut credentials = Credentials::None;
    let servers: Vec<String> = url
        .split(',')
        .map(|server| {
            let Ok(mut parsed) = url::Url::parse(server.trim()) else {
                return server.to_owned();
            };
            if parsed.username().is_empty() {
                return server.to_owned();
            }
            let found = match parsed.password() {
                Some(password) => Credentials::UserPassword {
                    user: decode(parsed.username()),
                    password: Secret(decode(password)),
                },
                None => Credentials::Token(Secret(decode(parsed.username()))),
            };
            if credentials == Credentials::None {
                credentials = found;
            }
            // Only URLs that can have credentials get here: these cannot fail.
            let _ = parsed.set_password(None);
            let _ = parsed.set_username("");
            parsed.into()
        })
        .collect();
    (servers.join(","), credentials)
}

/// Everything [`NatsBroker`] and [`NatsPublisher`] need: where the queue
/// lives and how the shared consumer is set up, from `[broker.nats]` and the
/// generic broker settings.
#[derive(Debug, Clone)]
pub(crate) struct NatsOptions {
    /// `nats://host:port`, maybe with `user:password@` or `token@`, which
    /// are used unless `credentials` says otherwise.
    pub url: String,
    /// The stream holding requests (created if missing, work-queue retention).
    pub stream: String,
    /// The subject requests are published on.
    pub subject: String,
    /// The durable pull consumer every instance shares.
    pub consumer: String,
    /// Where dead letters are copied, with their reason (a stream named
    /// `{stream}_DEAD` keeps them).
    pub dead_letter_subject: String,
    /// The consumer's ack wait: a delivery's lease.
    pub ack_wait: Duration,
    /// Unacknowledged deliveries the consumer allows across all instances.
    pub max_ack_pending: i64,
    /// How long a pull waits for a first message.
    pub poll_wait: Duration,
    /// Authentication.
    pub credentials: Credentials,
    /// Require TLS.
    pub tls: bool,
    /// Extra root certificates (PEM) for TLS.
    pub tls_ca_file: Option<PathBuf>,
}

/// How much longer than the poll wait a pull may take before it is
/// considered lost.
pub(super) const PULL_MARGIN: Duration = Duration::from_secs(5);

/// The consumer's `max_deliver`: unlimited, since the worker keeps the
/// delivery limit (see the module docs).
pub(super) const MAX_DELIVER: i64 = -1;

/// The header carrying a dead letter's reason (at most
/// [`MAX_REASON_BYTES`](super::MAX_REASON_BYTES), on one line).
pub const DEAD_LETTER_REASON_HEADER: &str = "Mandrill-Dead-Letter-Reason";
/// The header carrying the original message's sequence in the request
/// stream, to match the copy with log lines (a work-queue stream drops the
/// original once it is terminated).
pub(crate) const DEAD_LETTER_SEQUENCE_HEADER: &str = "Mandrill-Stream-Sequence";
/// The header carrying the `message_id` the original payload carried, if
/// any (unverified: what the payload said).
pub(crate) const DEAD_LETTER_MESSAGE_ID_HEADER: &str = "Mandrill-Message-Id";
/// The header carrying the original payload's size in bytes.
pub(crate) const DEAD_LETTER_SIZE_HEADER: &str = "Mandrill-Original-Size";
/// Present (`true`) when the copy's payload is only a prefix of the original,
/// because the whole would not fit the server's `max_payload`.
pub(crate) const DEAD_LETTER_TRUNCATED_HEADER: &str = "Mandrill-Payload-Truncated";

pub(super) fn unavailable(
    what: &str,
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BrokerError {
    BrokerError::Unavailable(Cause::new(what, error))
}

pub(super) fn fatal(
    what: &str,
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BrokerError {
    BrokerError::Fatal(Cause::new(what, error))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod url_credentials {
    use super::*;

    #[test]
    fn credentials_in_the_url_are_taken_out_and_used() {
        let (url, credentials) = split_url_credentials("nats://app:p%40ss@h:4222");
        assert_eq!(url, "nats://h:4222");
        assert_eq!(
            credentials,
            Credentials::UserPassword {
                user: "app".into(),
                password: Secret("p@ss".into()),
            }
        );
        let (url, credentials) = split_url_credentials("nats://t0k@a:1,nats://b:2");
        assert_eq!(url, "nats://a:1,nats://b:2");
        assert_eq!(credentials, Credentials::Token(Secret("t0k".into())));
        let (url, credentials) = split_url_credentials("nats://h:4222");
        assert_eq!(url, "nats://h:4222");
        assert_eq!(credentials, Credentials::None);
    }
}
