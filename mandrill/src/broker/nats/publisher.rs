//! The publishing connection: connects, creates the streams (and, for a
//! consumer, the consumer), publishes with confirmation.

use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};

use super::consumer::mismatches;
use super::*;

/// A connection that only publishes: it creates the streams if missing and
/// never creates or alters the consumer.
pub(crate) struct NatsPublisher {
    pub(super) client: async_nats::Client,
    pub(super) jetstream: jetstream::Context,
    pub(super) settings: NatsOptions,
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("stream", &self.settings.stream)
            .finish_non_exhaustive()
    }
}

impl NatsPublisher {
    /// Connects as a publisher: creates the streams if missing, leaves the
    /// consumer alone.
    pub(crate) async fn connect(settings: NatsOptions) -> Result<Self, BrokerError> {
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
            return Err(BrokerError::Fatal(
                format!(
                    "stream {} exists but does not capture subject {} (it captures {:?})",
                    settings.stream,
                    settings.subject,
                    requests.cached_info().config.subjects
                )
                .into(),
            ));
        }
        jetstream
            .get_or_create_stream(stream::Config {
                name: format!("{}_DEAD", settings.stream),
                subjects: vec![settings.dead_letter_subject.clone()],
                storage: stream::StorageType::File,
                // Copies of one original are kept once (`Nats-Msg-Id`).
                duplicate_window: Duration::from_secs(120),
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

    pub(super) async fn open_consumer(&self) -> Result<PullConsumer, BrokerError> {
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
        let consumer: PullConsumer = match requests
            .get_or_create_consumer(&settings.consumer, wanted.clone())
            .await
        {
            Ok(consumer) => consumer,
            Err(error) if another_consumer_reads(&error) => {
                return Err(another_consumer(&requests, settings).await);
            }
            Err(error) => {
                return Err(fatal(
                    &format!("cannot open consumer {}", settings.consumer),
                    error,
                ));
            }
        };
        let mismatches = mismatches(&consumer.cached_info().config, &wanted);
        if !mismatches.is_empty() {
            return Err(BrokerError::Fatal(
                format!(
                    "consumer {} on stream {} exists with other settings: {}; \
                 delete the consumer (it is created again) or change the configuration to match",
                    settings.consumer,
                    settings.stream,
                    mismatches.join(", ")
                )
                .into(),
            ));
        }
        Ok(consumer)
    }

    /// Publishes and waits for the stream to confirm it stored the message.
    pub(super) async fn publish_confirmed(
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

    /// Publishes a request with the digest of its bytes as JetStream's
    /// de-duplication id ([`dedup_id`]), and waits for the stream to confirm
    /// it.
    pub(super) async fn publish_request(&self, payload: Bytes) -> Result<(), BrokerError> {
        let message = PublishMessage::build()
            .message_id(dedup_id(&payload))
            .payload(payload);
        self.publish_confirmed(self.settings.subject.clone(), message)
            .await
    }

    /// Flushes what is buffered.
    pub(super) async fn flush(&self) {
        if let Err(error) = self.client.flush().await {
            warn!(%error, "could not flush nats before closing");
        }
    }
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

/// Whether JetStream refused the consumer because another one already
/// reads the work-queue stream's subject (the server's "filtered consumer
/// not unique on workqueue stream", or its unfiltered twin).
fn another_consumer_reads(error: &ConsumerError) -> bool {
    use async_nats::jetstream::ErrorCode;
    matches!(
        error.kind(),
        ConsumerErrorKind::JetStream(refusal)
            if [
                ErrorCode::CONSUMER_WQ_CONSUMER_NOT_UNIQUE,
                ErrorCode::CONSUMER_WQ_MULTIPLE_UNFILTERED,
            ]
            .contains(&refusal.error_code())
    )
}

/// Most consumer names the error lists.
const LISTED_CONSUMERS: usize = 5;

/// The error for a consumer JetStream refused because another one reads
/// the work-queue stream: what it means and what to do, naming the
/// consumers there (as far as they can be listed).
async fn another_consumer(requests: &stream::Stream, settings: &NatsOptions) -> BrokerError {
    let others: Vec<String> = requests
        .consumer_names()
        .take(LISTED_CONSUMERS)
        .filter_map(|name| async move { name.ok() })
        .filter(|name| std::future::ready(*name != settings.consumer))
        .collect()
        .await;
    let (stream, subject, consumer) = (&settings.stream, &settings.subject, &settings.consumer);
    let (named, remove) = match others.first() {
        Some(first) => (
            format!("another consumer already reads it ({})", others.join(", ")),
            format!("`nats consumer rm {stream} {first}`"),
        ),
        None => (
            "another consumer already reads it".to_owned(),
            format!("`nats consumer ls {stream}`, then `nats consumer rm`"),
        ),
    };
    BrokerError::Fatal(
        format!(
            "cannot open consumer {consumer}: stream {stream} is a work queue, where one \
             consumer only may read subject {subject}, and {named}; every mandrill instance \
             sharing this queue must name the same broker.nats.consumer (set it to the one \
             already there), or, if nothing uses that consumer any more, delete it ({remove}), \
             or give this deployment its own broker.nats.stream and broker.nats.subject"
        )
        .into(),
    )
}

/// The id JetStream de-duplicates a request on: the SHA-256 of its bytes, in
/// hex. A retried publish of the same bytes is stored once; the payload's own
/// `message_id` is never used, since any client allowed to publish on the
/// subject could send garbage under it first and have the real request
/// dropped as a duplicate for the stream's whole window. A forger needs
/// the real request's exact bytes before they are published (a signed
/// one's needs the requester's key). Consumers take a request's id from its
/// parsed payload, never from this header.
pub(super) fn dedup_id(payload: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(payload))
}
