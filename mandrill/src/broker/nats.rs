//! The scale-out broker: NATS JetStream, one durable pull consumer shared by
//! every instance. The only module that imports `async_nats`.
//!
//! JetStream's acknowledgements map one to one onto our lease semantics:
//! extend is an in-progress ack (`+WPI`), nack is `-NAK` with a delay,
//! dead-letter is `+TERM` plus a copy of the message and its reason on the
//! dead-letter subject, and ack is `+ACK` confirmed by the server (a double
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

use super::{BrokerError, Close, Consumer, Delivery, DeliveryTag, Publisher, bounded_reason};

pub use crate::config::Secret;
use crate::config::redact_url;

/// How to authenticate to the server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Credentials {
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
pub fn split_url_credentials(url: &str) -> (String, Credentials) {
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

/// Where the queue lives and how the shared consumer is set up.
#[derive(Debug, Clone)]
pub struct NatsSettings {
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
const PULL_MARGIN: Duration = Duration::from_secs(5);

/// The consumer's `max_deliver`: unlimited, since the worker keeps the
/// delivery limit (see the module docs).
const MAX_DELIVER: i64 = -1;

/// The header carrying a dead letter's reason (at most
/// [`MAX_REASON_BYTES`](super::MAX_REASON_BYTES), on one line).
pub const DEAD_LETTER_REASON_HEADER: &str = "Mandrill-Dead-Letter-Reason";
/// The header carrying the original message's sequence in the request
/// stream, to match the copy with log lines (a work-queue stream drops the
/// original once it is terminated).
pub const DEAD_LETTER_SEQUENCE_HEADER: &str = "Mandrill-Stream-Sequence";
/// The header carrying the original payload's size in bytes.
pub const DEAD_LETTER_SIZE_HEADER: &str = "Mandrill-Original-Size";
/// Present (`true`) when the copy's payload is only a prefix of the original,
/// because the whole would not fit the server's `max_payload`.
pub const DEAD_LETTER_TRUNCATED_HEADER: &str = "Mandrill-Payload-Truncated";

/// A connection that only publishes: it creates the streams if missing and
/// never creates or alters the consumer.
pub struct NatsPublisher {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    settings: NatsSettings,
}

/// The consumer: see the module docs. It publishes too (into the stream it
/// consumes, and dead-letter copies).
pub struct NatsBroker {
    publisher: NatsPublisher,
    consumer: PullConsumer,
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("stream", &self.settings.stream)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBroker")
            .field("stream", &self.publisher.settings.stream)
            .field("consumer", &self.publisher.settings.consumer)
            .finish_non_exhaustive()
    }
}

fn unavailable(what: &str, error: impl fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("{what}: {error}"))
}

fn fatal(what: &str, error: impl fmt::Display) -> BrokerError {
    BrokerError::Fatal(format!("{what}: {error}"))
}

impl NatsBroker {
    /// Connects as a consumer: creates the stream, the dead-letter stream and
    /// the consumer if missing, and checks an existing consumer's settings
    /// against ours.
    pub async fn connect(settings: NatsSettings) -> Result<Self, BrokerError> {
        let publisher = NatsPublisher::connect(settings).await?;
        let consumer = publisher.open_consumer().await?;
        Ok(Self {
            publisher,
            consumer,
        })
    }
}

impl NatsPublisher {
    /// Connects as a publisher: creates the streams if missing, leaves the
    /// consumer alone.
    pub async fn connect(settings: NatsSettings) -> Result<Self, BrokerError> {
        let mut options = ConnectOptions::new()
            .name("mandrill")
            .connection_timeout(Duration::from_secs(5))
            .event_callback(|event| async move {
                match event {
                    Event::Connected => info!("nats connected"),
                    Event::Disconnected => warn!("nats disconnected; reconnecting"),
                    other => info!(event = %other, "nats event"),
                }
            });
        let (url, from_url) = split_url_credentials(&settings.url);
        let credentials = match &settings.credentials {
            Credentials::None => &from_url,
            given => given,
        };
        options = match credentials {
            Credentials::None => options,
            Credentials::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.0.clone())
            }
            Credentials::Token(token) => options.token(token.0.clone()),
            Credentials::CredsFile(path) => options.credentials_file(path).await.map_err(|e| {
                fatal(
                    &format!("cannot read nats creds file {}", path.display()),
                    e,
                )
            })?,
        };
        if settings.tls {
            options = options.require_tls(true);
        }
        if let Some(ca) = &settings.tls_ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        let client = options.connect(url.as_str()).await.map_err(|e| {
            unavailable(
                &format!("cannot connect to nats at {}", redact_url(&settings.url)),
                e,
            )
        })?;
        let jetstream = jetstream::new(client.clone());

        let requests = jetstream
            .get_or_create_stream(stream::Config {
                name: settings.stream.clone(),
                subjects: vec![settings.subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| fatal(&format!("cannot open stream {}", settings.stream), e))?;
        if !requests
            .cached_info()
            .config
            .subjects
            .contains(&settings.subject)
        {
            return Err(BrokerError::Fatal(format!(
                "stream {} exists but does not capture subject {} (it captures {:?})",
                settings.stream,
                settings.subject,
                requests.cached_info().config.subjects
            )));
        }
        jetstream
            .get_or_create_stream(stream::Config {
                name: format!("{}_DEAD", settings.stream),
                subjects: vec![settings.dead_letter_subject.clone()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| fatal("cannot open the dead-letter stream", e))?;

        Ok(Self {
            client,
            jetstream,
            settings,
        })
    }

    async fn open_consumer(&self) -> Result<PullConsumer, BrokerError> {
        let settings = &self.settings;
        let requests = self
            .jetstream
            .get_stream(&settings.stream)
            .await
            .map_err(|e| fatal(&format!("cannot open stream {}", settings.stream), e))?;
        let wanted = pull::Config {
            durable_name: Some(settings.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: MAX_DELIVER,
            max_ack_pending: settings.max_ack_pending,
            filter_subject: settings.subject.clone(),
            ..Default::default()
        };
        let consumer: PullConsumer = requests
            .get_or_create_consumer(&settings.consumer, wanted.clone())
            .await
            .map_err(|e| fatal(&format!("cannot open consumer {}", settings.consumer), e))?;
        let mismatches = mismatches(&consumer.cached_info().config, &wanted);
        if !mismatches.is_empty() {
            return Err(BrokerError::Fatal(format!(
                "consumer {} on stream {} exists with other settings: {}; \
                 delete the consumer (it is created again) or change the configuration to match",
                settings.consumer,
                settings.stream,
                mismatches.join(", ")
            )));
        }
        Ok(consumer)
    }

    /// Publishes a request with its message id as JetStream's de-duplication
    /// id, and waits for the stream to confirm it.
    pub async fn publish_with_id(
        &self,
        message_id: &str,
        payload: Bytes,
    ) -> Result<(), BrokerError> {
        let message = PublishMessage::build()
            .payload(payload)
            .message_id(message_id);
        self.publish_confirmed(self.settings.subject.clone(), message)
            .await
    }

    /// Publishes and waits for the stream to confirm it stored the message.
    async fn publish_confirmed(
        &self,
        subject: String,
        message: PublishMessage,
    ) -> Result<(), BrokerError> {
        let confirmation = self
            .jetstream
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| unavailable(&format!("cannot publish to {subject}"), e))?;
        confirmation
            .await
            .map_err(|e| unavailable(&format!("publish to {subject} not confirmed"), e))?;
        Ok(())
    }

    /// Publishes a request, with its own id for de-duplication when it has one.
    async fn publish_request(&self, payload: Bytes) -> Result<(), BrokerError> {
        match crate::domain::salvage_message_id(&payload) {
            Some(id) => self.publish_with_id(&id.to_string(), payload).await,
            None => {
                let message = PublishMessage::build().payload(payload);
                self.publish_confirmed(self.settings.subject.clone(), message)
                    .await
            }
        }
    }

    /// Flushes what is buffered.
    async fn flush(&self) {
        if let Err(error) = self.client.flush().await {
            warn!(%error, "could not flush nats before closing");
        }
    }
}

impl NatsBroker {
    /// The consumer, as JetStream describes it.
    #[cfg(test)]
    fn consumer(&self) -> Result<&PullConsumer, BrokerError> {
        Ok(&self.consumer)
    }

    /// Leases what is available now, up to `max`, without waiting.
    async fn fetch_available(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        let batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| unavailable("cannot fetch", e))?;
        collect(batch).await
    }

    /// Waits up to the poll wait for one message.
    async fn wait_for_one(&self) -> Result<Vec<Delivery>, BrokerError> {
        let batch = self
            .consumer
            .batch()
            .max_messages(1)
            .expires(self.publisher.settings.poll_wait)
            .messages()
            .await
            .map_err(|e| unavailable("cannot pull", e))?;
        collect(batch).await
    }

    fn reply<'a>(&self, tag: &'a DeliveryTag) -> Result<&'a str, BrokerError> {
        tag.as_text()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))
    }

    async fn send(&self, tag: &DeliveryTag, kind: AckKind) -> Result<(), BrokerError> {
        let reply = self.reply(tag)?.to_owned();
        self.publisher
            .client
            .publish(reply, kind.into())
            .await
            .map_err(|e| unavailable(&format!("cannot settle {tag}"), e))
    }

    /// Sends an acknowledgement and waits for the server to confirm it.
    async fn send_confirmed(&self, tag: &DeliveryTag, kind: AckKind) -> Result<(), BrokerError> {
        let reply = self.reply(tag)?.to_owned();
        match self.publisher.client.request(reply, kind.into()).await {
            Ok(_) => Ok(()),
            // Nobody serves the delivery's consumer (it was deleted, say):
            // retrying cannot settle it, and if the consumer comes back the
            // message is redelivered, which is what a lost lease says.
            Err(error) if error.kind() == RequestErrorKind::NoResponders => {
                Err(BrokerError::LeaseLost(tag.clone()))
            }
            Err(error) => Err(unavailable(&format!("settling {tag} not confirmed"), error)),
        }
    }
}

/// The settings of an existing consumer that differ from ours.
fn mismatches(existing: &jetstream::consumer::Config, wanted: &pull::Config) -> Vec<String> {
    let mut found = Vec::new();
    let mut check = |name: &str, have: String, want: String| {
        if have != want {
            found.push(format!("{name} is {have} (configured {want})"));
        }
    };
    check(
        "ack_wait",
        format!("{:?}", existing.ack_wait),
        format!("{:?}", wanted.ack_wait),
    );
    check(
        "max_deliver",
        existing.max_deliver.to_string(),
        wanted.max_deliver.to_string(),
    );
    check(
        "max_ack_pending",
        existing.max_ack_pending.to_string(),
        wanted.max_ack_pending.to_string(),
    );
    check(
        "filter_subject",
        existing.filter_subject.clone(),
        wanted.filter_subject.clone(),
    );
    check(
        "ack_policy",
        format!("{:?}", existing.ack_policy),
        format!("{:?}", wanted.ack_policy),
    );
    found
}

async fn collect(mut batch: pull::Batch) -> Result<Vec<Delivery>, BrokerError> {
    let mut deliveries = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.map_err(|e| unavailable("pull interrupted", e))?;
        let Some(reply) = message.reply.as_ref() else {
            warn!("message without a reply subject; not a jetstream delivery, skipped");
            continue;
        };
        let attempt = message
            .info()
            .map(|info| u32::try_from(info.delivered).unwrap_or(u32::MAX))
            .unwrap_or(1);
        deliveries.push(Delivery::new(
            DeliveryTag::text(reply.as_str()),
            message.payload.clone(),
            attempt,
        ));
    }
    Ok(deliveries)
}

#[async_trait]
impl Close for NatsPublisher {
    async fn close(&self) {
        self.flush().await;
    }
}

#[async_trait]
impl Publisher for NatsPublisher {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.publish_request(payload).await
    }
}

#[async_trait]
impl Close for NatsBroker {
    async fn close(&self) {
        self.publisher.flush().await;
    }
}

#[async_trait]
impl Publisher for NatsBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.publisher.publish_request(payload).await
    }
}

#[async_trait]
impl Consumer for NatsBroker {
    fn lease(&self) -> Option<Duration> {
        Some(self.publisher.settings.ack_wait)
    }

    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        // Bounded: while the server is away a pull request gets no answer at
        // all, and an unbounded wait would hide the outage from the
        // supervisor instead of failing (and retrying) the pull.
        let limit = self.publisher.settings.poll_wait + PULL_MARGIN;
        let pulled = tokio::time::timeout(limit, async {
            let available = self.fetch_available(max).await?;
            if !available.is_empty() {
                return Ok(available);
            }
            self.wait_for_one().await
        })
        .await;
        pulled.unwrap_or_else(|_elapsed| {
            Err(BrokerError::Unavailable(format!(
                "no answer to a pull within {limit:?}; is the server reachable?"
            )))
        })
    }

    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.send_confirmed(tag, AckKind::Ack).await
    }

    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.send(tag, AckKind::Nak(delay)).await
    }

    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.send(tag, AckKind::Progress).await
    }

    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        // The copy first: once terminated, the original is gone. If the copy
        // fails, the delivery stays leased and is redelivered, not lost.
        let sequence =
            stream_sequence(self.reply(tag)?).ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        let payload = self.original_payload(tag, sequence).await?;
        let publisher = &self.publisher;
        let (headers, payload) =
            dead_letter_copy(payload, reason, sequence, publisher.client.max_payload());
        let message = PublishMessage::build().payload(payload).headers(headers);
        publisher
            .publish_confirmed(publisher.settings.dead_letter_subject.clone(), message)
            .await?;
        self.send_confirmed(tag, AckKind::Term).await
    }
}

impl NatsBroker {
    /// The payload of a delivery, read back from the stream by its sequence
    /// (in the reply subject), so that dead-lettering needs no cached copy.
    async fn original_payload(
        &self,
        tag: &DeliveryTag,
        sequence: u64,
    ) -> Result<Bytes, BrokerError> {
        let settings = &self.publisher.settings;
        let stream = self
            .publisher
            .jetstream
            .get_stream(&settings.stream)
            .await
            .map_err(|e| unavailable("cannot open stream", e))?;
        match stream.get_raw_message(sequence).await {
            Ok(message) => Ok(message.payload),
            // Gone from a work-queue stream: settled, by us or by whoever
            // holds its redelivery.
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => {
                Err(BrokerError::LeaseLost(tag.clone()))
            }
            Err(error) => Err(unavailable(
                &format!(
                    "cannot read message {sequence} of stream {}",
                    settings.stream
                ),
                error,
            )),
        }
    }
}

/// The headers and payload of a dead-letter copy that fits `max_payload`
/// (headers included, as the server counts): the reason bounded and on one
/// line, the original's sequence and size, and, if the whole payload would
/// not fit beside them, as much of it as does, marked as truncated. On a
/// server whose `max_payload` is smaller than the headers, the reason is cut
/// further.
fn dead_letter_copy(
    payload: Bytes,
    reason: &str,
    sequence: u64,
    max_payload: usize,
) -> (HeaderMap, Bytes) {
    // Control characters cannot travel in a header value.
    let mut reason: String = bounded_reason(reason)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let build = |reason: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(DEAD_LETTER_REASON_HEADER, reason);
        headers.insert(DEAD_LETTER_SEQUENCE_HEADER, sequence.to_string().as_str());
        headers.insert(DEAD_LETTER_SIZE_HEADER, payload.len().to_string().as_str());
        headers
    };
    let truncated_header = header_len(DEAD_LETTER_TRUNCATED_HEADER, "true");
    let mut headers = build(&reason);
    let over = (headers_len(&headers) + truncated_header).saturating_sub(max_payload);
    if over > 0 {
        let keep = reason.floor_char_boundary(reason.len().saturating_sub(over));
        reason.truncate(keep);
        headers = build(&reason);
    }
    let room = max_payload.saturating_sub(headers_len(&headers));
    if payload.len() <= room {
        return (headers, payload);
    }
    headers.insert(DEAD_LETTER_TRUNCATED_HEADER, "true");
    let payload = payload.slice(..room.saturating_sub(truncated_header));
    (headers, payload)
}

/// The size of a header block on the wire: `NATS/1.0\r\n`, a line per
/// value, and a blank line.
fn headers_len(headers: &HeaderMap) -> usize {
    let lines: usize = headers
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |value| header_len(name.as_ref(), value.as_str()))
        })
        .sum();
    "NATS/1.0\r\n".len() + lines + "\r\n".len()
}

/// The size of one header line on the wire: `name: value\r\n`.
fn header_len(name: &str, value: &str) -> usize {
    name.len() + ": ".len() + value.len() + "\r\n".len()
}

/// The stream sequence in a JetStream reply subject:
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>`
/// (with an optional domain and account hash after `ACK` on newer servers).
fn stream_sequence(reply: &str) -> Option<u64> {
    let tokens: Vec<&str> = reply.split('.').collect();
    let first = match tokens.len() {
        9 => 5,
        n if n >= 12 => 7,
        _ => return None,
    };
    tokens.get(first)?.parse().ok()
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
