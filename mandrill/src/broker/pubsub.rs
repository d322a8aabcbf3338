//! Google Cloud Pub/Sub: one subscription shared by every instance. The
//! only module that imports the `gcloud_*` crates.
//!
//! Pub/Sub's calls map onto our lease semantics: pull = `Pull` (or
//! `StreamingPull`), extend = `ModifyAckDeadline` to one ack deadline, nack
//! with a delay = `ModifyAckDeadline` to that delay (Pub/Sub has no
//! per-message delay: the message simply stays leased until then, rounded up
//! to whole seconds, at most 600 s), immediate nack = deadline 0, ack =
//! `Acknowledge`. Acks and deadline changes are batched (see `settle.rs`) and
//! each caller waits for the call that carried its id.
//!
//! Pub/Sub cannot fetch a message by ack id, so each lease keeps its
//! payload here until settled, for the dead-letter copy (published to
//! `dead_letter_topic` with the reason as an attribute, then acked). A lease
//! also keeps its deadline as this process computed it (from when the pull or
//! extension was *sent*, so never later than the service's): an ack or
//! extension after it is refused as a lost lease. The service itself would
//! accept it silently on an at-least-once subscription (a stale ack id is
//! acknowledged with no error, and the message may still be redelivered); on
//! an exactly-once subscription it refuses, which is also a lost lease.
//!
//! Attempts: a subscription with a dead-letter policy reports
//! `delivery_attempt`, which is used as is. Without one, Pub/Sub reports
//! nothing, so this process counts the deliveries of each message id it
//! sees: exact on one instance, a lower bound across several (another
//! instance's deliveries are not seen). That is enough, since the worker
//! counts restart attempts in the store (claims), which is what bounds
//! restarts whatever the broker reports.
//!
//! There is no backlog count in the API (only Cloud Monitoring has one), so
//! [`Consumer::backlog`] is `None` and `mandrill run --until-idle` is refused.

pub mod settings;
mod settle;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use gcloud_gax::conn::{ConnectionOptions, Environment};
use gcloud_gax::grpc::{Code, Status};
use gcloud_gax::retry::RetrySetting;
use gcloud_googleapis::pubsub::v1::{
    AcknowledgeRequest, DeadLetterPolicy, ExpirationPolicy, GetSubscriptionRequest,
    ModifyAckDeadlineRequest, PubsubMessage, PullRequest, ReceivedMessage, Subscription,
};
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use gcloud_pubsub::client::google_cloud_auth::credentials::CredentialsFile;
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::publisher::{Publisher as TopicPublisher, PublisherConfig};
use gcloud_pubsub::subscriber::SubscriberConfig;
use gcloud_pubsub::subscription::{
    MessageStream, SubscribeConfig, Subscription as SubscriptionHandle,
};
use gcloud_pubsub::topic::Topic;
use token_source::NoopTokenSourceProvider;
use tokio::time::Instant;
use tracing::{info, warn};

pub use self::settings::{Endpoint, PubSubSettings, PullMode};
use self::settle::{Settlement, Settler};
use super::{
    BrokerError, Close, Consumer, DeadLetterAdmin, DeadLetterEntry, DeadLetterId, Delivery,
    DeliveryTag, Publisher, bounded_reason,
};

/// The attribute carrying a dead letter's reason (at most
/// [`MAX_REASON_BYTES`](super::MAX_REASON_BYTES), which is also Pub/Sub's
/// limit for an attribute value).
pub const DEAD_LETTER_REASON_ATTRIBUTE: &str = "mandrill-dead-letter-reason";
/// The attribute carrying the original message's Pub/Sub id.
pub const ORIGINAL_ID_ATTRIBUTE: &str = "mandrill-original-message-id";
/// The attribute carrying the request's `message_id` when the payload has one.
pub const MESSAGE_ID_ATTRIBUTE: &str = "mandrill-message-id";

/// Pub/Sub's longest ack deadline, per call and per subscription.
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(600);
/// Pub/Sub's shortest subscription ack deadline.
pub const MIN_ACK_DEADLINE: Duration = Duration::from_secs(10);
/// Most messages one `Pull` returns, and one `Publish` carries.
pub const MAX_MESSAGES_PER_CALL: usize = 1000;
/// Most bytes of payload one `Publish` carries (the service allows 10 MB
/// per request, attributes included).
const MAX_PUBLISH_BYTES: usize = 9 * 1024 * 1024;
/// How much longer than the poll wait a pull may take before the service
/// is considered unreachable.
const PULL_MARGIN: Duration = Duration::from_secs(5);
/// Message ids whose deliveries are counted here at most (see the module
/// docs); beyond it, the oldest are forgotten and counting starts again.
const MAX_COUNTED_MESSAGES: usize = 100_000;

/// Everything [`PubSubBroker`] needs: the adapter's section and the
/// generic broker settings that shape the subscription.
#[derive(Debug, Clone)]
pub struct PubSubOptions {
    /// The project id.
    pub project: String,
    /// The subscription every instance shares.
    pub subscription: String,
    /// `[broker.pubsub]`.
    pub settings: PubSubSettings,
    /// The subscription's ack deadline: a delivery's lease.
    pub ack_deadline: Duration,
    /// How long a pull waits for a first message.
    pub poll_wait: Duration,
    /// How often a waiting pull asks again.
    pub poll_interval: Duration,
    /// The worker's delivery limit: a dead-letter policy must allow more.
    pub max_deliveries: u32,
    /// Deliveries held at once (streaming flow control).
    pub max_in_flight: usize,
}

/// A connection that publishes and administers dead letters: it checks
/// that the topic and the subscription exist and changes neither.
pub struct PubSubPublisher {
    /// Publishes requests (one call each, never the crate's batching).
    publisher: TopicPublisher,
    /// Publishes dead-letter copies.
    dead_letter_publisher: TopicPublisher,
    requests: Topic,
    dead_letters: Topic,
    subscriber: SubscriberClient,
    /// The request subscription, for streaming pulls.
    handle: SubscriptionHandle,
    options: PubSubOptions,
    /// The subscription's full name.
    subscription: String,
}

/// The consumer: see the module docs. It publishes too (into the topic it
/// consumes, and dead-letter copies).
pub struct PubSubBroker {
    publisher: PubSubPublisher,
    consumer: Leases,
}

/// What a consumer keeps: its leases and how it settles them.
struct Leases {
    settler: Settler,
    /// The leases this process holds, by ack id. A `std` mutex: held for a
    /// map operation, never across an await.
    leases: Mutex<HashMap<Arc<str>, Lease>>,
    /// Deliveries seen per message id, when the service does not count them.
    counted: Option<Mutex<DeliveryCounts>>,
    /// With `pull = "streaming"`: the open stream (`None` until opened, and
    /// again after it ended). Locked by the one pull running at a time.
    stream: Option<tokio::sync::Mutex<Option<MessageStream>>>,
}

struct Lease {
    /// When the lease runs out, as far as this process can tell.
    deadline: Instant,
    message_id: String,
    payload: Bytes,
}

#[derive(Default)]
struct DeliveryCounts {
    counts: HashMap<String, (u32, Instant)>,
}

impl DeliveryCounts {
    fn record(&mut self, message_id: &str, now: Instant, forget_after: Duration) -> u32 {
        if self.counts.len() >= MAX_COUNTED_MESSAGES && !self.counts.contains_key(message_id) {
            self.counts
                .retain(|_, (_, seen)| now.duration_since(*seen) < forget_after);
            if self.counts.len() >= MAX_COUNTED_MESSAGES {
                self.counts.clear();
            }
        }
        let entry = self.counts.entry(message_id.to_owned()).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        entry.0
    }
}

impl fmt::Debug for PubSubBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubBroker")
            .field("subscription", &self.publisher.subscription)
            .field("topic", &self.publisher.requests.fully_qualified_name())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for PubSubPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubPublisher")
            .field("subscription", &self.subscription)
            .field("topic", &self.requests.fully_qualified_name())
            .finish_non_exhaustive()
    }
}

fn unavailable(what: &str, status: &Status) -> BrokerError {
    BrokerError::Unavailable(format!("{what}: {}", describe(status)))
}

fn fatal(what: &str, status: &Status) -> BrokerError {
    BrokerError::Fatal(format!("{what}: {}", describe(status)))
}

/// A status as `code: message`, without its metadata (which may carry
/// request headers).
fn describe(status: &Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Whether retrying a call that failed so may help.
fn is_transient(status: &Status) -> bool {
    !matches!(
        status.code(),
        Code::NotFound
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unimplemented
    )
}

fn classify(what: &str, status: &Status) -> BrokerError {
    if is_transient(status) {
        unavailable(what, status)
    } else {
        fatal(what, status)
    }
}

/// Retries of calls that settle or publish: a few, quickly, for codes that
/// say the call did not happen.
fn quick_retry() -> Option<RetrySetting> {
    Some(RetrySetting::default())
}

/// No retries: the caller bounds the call and the worker retries it.
fn no_retry() -> Option<RetrySetting> {
    Some(RetrySetting {
        take: 0,
        ..RetrySetting::default()
    })
}

/// Whole seconds for a deadline, rounded up and within Pub/Sub's bounds.
fn deadline_seconds(duration: Duration) -> i32 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    // At most 600, which fits.
    seconds.min(MAX_ACK_DEADLINE.as_secs()) as i32
}

/// Installs the TLS crypto provider (ring) once per process: the client is
/// built without one, and without one installed its TLS connections panic.
fn install_crypto_provider() {
    // An error only says one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl PubSubBroker {
    /// Connects as a consumer: creates the topics and subscriptions if
    /// missing, and refuses an existing subscription whose settings differ
    /// from ours, naming each difference.
    pub async fn connect(options: PubSubOptions) -> Result<Self, BrokerError> {
        let broker = PubSubPublisher::connect_clients(options).await?;
        ensure_topic(&broker.requests).await?;
        ensure_topic(&broker.dead_letters).await?;
        let dead = broker.dead_letter_subscription();
        broker
            .ensure_subscription(&dead, broker.dead_letters.fully_qualified_name(), true)
            .await?;
        let existing = broker
            .ensure_subscription(
                &broker.subscription,
                broker.requests.fully_qualified_name(),
                false,
            )
            .await?;
        let uses_delivery_attempt = existing.dead_letter_policy.is_some();
        let consumer = Leases {
            settler: Settler::start(broker.subscriber.clone(), broker.subscription.clone()),
            leases: Mutex::new(HashMap::new()),
            counted: (!uses_delivery_attempt).then(|| Mutex::new(DeliveryCounts::default())),
            stream: (broker.options.settings.pull == PullMode::Streaming)
                .then(|| tokio::sync::Mutex::new(None)),
        };
        info!(
            subscription = %broker.subscription,
            exactly_once = existing.enable_exactly_once_delivery,
            counts_deliveries = !uses_delivery_attempt,
            "pubsub subscription ready"
        );
        Ok(Self {
            publisher: broker,
            consumer,
        })
    }
}

impl PubSubPublisher {
    /// Connects as a publisher: checks that the topic and the subscription
    /// exist (a topic without a subscription drops what is published to it)
    /// and changes neither.
    pub async fn connect(options: PubSubOptions) -> Result<Self, BrokerError> {
        let broker = Self::connect_clients(options).await?;
        let request = GetSubscriptionRequest {
            subscription: broker.subscription.clone(),
        };
        match broker
            .subscriber
            .get_subscription(request, no_retry())
            .await
        {
            Ok(existing) if existing.get_ref().topic == broker.requests.fully_qualified_name() => {
                Ok(broker)
            }
            Ok(existing) => Err(BrokerError::Fatal(format!(
                "subscription {} reads topic {}, not {}: check broker.pubsub.topic",
                broker.subscription,
                existing.get_ref().topic,
                broker.requests.fully_qualified_name()
            ))),
            Err(status) if status.code() == Code::NotFound => Err(BrokerError::Fatal(format!(
                "subscription {} does not exist, and Pub/Sub drops messages published to a \
                 topic no subscription reads: start a consumer (`mandrill run`) once to create it",
                broker.subscription
            ))),
            Err(status) => Err(classify(
                &format!("cannot read subscription {}", broker.subscription),
                &status,
            )),
        }
    }

    async fn connect_clients(options: PubSubOptions) -> Result<Self, BrokerError> {
        install_crypto_provider();
        let endpoint = match &options.settings.endpoint {
            Some(endpoint) => settings::parse_endpoint(endpoint).map_err(BrokerError::Fatal)?,
            None => match std::env::var("PUBSUB_EMULATOR_HOST") {
                Ok(host) if !host.is_empty() => Endpoint::Emulator(host),
                _ => Endpoint::Google("pubsub.googleapis.com".into()),
            },
        };
        let connection_option = ConnectionOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            // Notices a service that stopped answering on an open connection.
            http2_keep_alive_interval: Some(Duration::from_secs(10)),
            keep_alive_timeout: Some(Duration::from_secs(5)),
            keep_alive_while_idle: Some(true),
            ..ConnectionOptions::default()
        };
        let mut config = ClientConfig {
            project_id: Some(options.project.clone()),
            connection_option,
            ..ClientConfig::default()
        };
        let shown = match &endpoint {
            Endpoint::Emulator(host) => {
                config.environment = Environment::Emulator(host.clone());
                format!("emulator at {host}")
            }
            Endpoint::Google(host) => {
                config.endpoint = host.clone();
                // The default environment reads PUBSUB_EMULATOR_HOST; an
                // explicit endpoint wins over it.
                config.environment = Environment::GoogleCloud(Box::new(NoopTokenSourceProvider {}));
                config = match &options.settings.credentials_file {
                    Some(path) => {
                        let file = CredentialsFile::new_from_file(path.display().to_string())
                            .await
                            .map_err(|e| {
                                BrokerError::Fatal(format!(
                                    "cannot read broker.pubsub.credentials_file {}: {e}",
                                    path.display()
                                ))
                            })?;
                        config.with_credentials(file).await
                    }
                    None => config.with_auth().await,
                }
                .map_err(|e| {
                    BrokerError::Fatal(format!(
                        "no Google credentials ({e}): set GOOGLE_APPLICATION_CREDENTIALS or \
                         broker.pubsub.credentials_file, or point broker.pubsub.endpoint or \
                         PUBSUB_EMULATOR_HOST at an emulator"
                    ))
                })?;
                host.clone()
            }
        };
        let client = Client::new(config).await.map_err(|e| {
            BrokerError::Unavailable(format!("cannot connect to pubsub ({shown}): {e}"))
        })?;
        let handle = client.subscription(&options.subscription);
        let subscriber = handle.get_client();
        // Only `publish_immediately` is used: the crate's batching publisher
        // waits for company (~100 ms) before each call.
        let publisher_config = PublisherConfig {
            workers: 1,
            ..PublisherConfig::default()
        };
        let requests = client.topic(&options.settings.topic);
        let dead_letters = client.topic(&options.settings.dead_letter_topic);
        let subscription = client.fully_qualified_subscription_name(&options.subscription);
        Ok(Self {
            publisher: requests.new_publisher(Some(publisher_config.clone())),
            dead_letter_publisher: dead_letters.new_publisher(Some(publisher_config)),
            requests,
            dead_letters,
            subscriber,
            handle,
            options,
            subscription,
        })
    }

    /// The subscription we want: pull, our ack deadline, every message, no
    /// expiry, no ordering, no dead-letter policy (the worker gives up and
    /// dead-letters with a reason itself).
    fn wanted(&self, name: &str, topic: &str) -> Subscription {
        Subscription {
            name: name.to_owned(),
            topic: topic.to_owned(),
            ack_deadline_seconds: deadline_seconds(self.options.ack_deadline),
            expiration_policy: Some(ExpirationPolicy { ttl: None }),
            ..Subscription::default()
        }
    }

    /// Creates the subscription if missing; else checks it (unless
    /// `lenient`, for the dead-letter subscription: only its topic matters).
    async fn ensure_subscription(
        &self,
        name: &str,
        topic: &str,
        lenient: bool,
    ) -> Result<Subscription, BrokerError> {
        let wanted = self.wanted(name, topic);
        let get = || {
            self.subscriber.get_subscription(
                GetSubscriptionRequest {
                    subscription: name.to_owned(),
                },
                no_retry(),
            )
        };
        let existing = match get().await {
            Ok(existing) => existing.into_inner(),
            Err(status) if status.code() == Code::NotFound => {
                match self
                    .subscriber
                    .create_subscription(wanted.clone(), no_retry())
                    .await
                {
                    Ok(created) => {
                        info!(subscription = name, topic, "pubsub subscription created");
                        return Ok(created.into_inner());
                    }
                    // Another instance was first: check what it made.
                    Err(status) if status.code() == Code::AlreadyExists => get()
                        .await
                        .map_err(|s| classify(&format!("cannot read subscription {name}"), &s))?
                        .into_inner(),
                    Err(status) => {
                        return Err(classify(
                            &format!("cannot create subscription {name}"),
                            &status,
                        ));
                    }
                }
            }
            Err(status) => {
                return Err(classify(
                    &format!("cannot read subscription {name}"),
                    &status,
                ));
            }
        };
        let differences = if lenient {
            mismatches_of_topic(&existing, &wanted)
        } else {
            mismatches(&existing, &wanted, self.options.max_deliveries)
        };
        if !differences.is_empty() {
            return Err(BrokerError::Fatal(format!(
                "subscription {name} exists with other settings: {}; \
                 delete the subscription (it is created again; its unacknowledged messages \
                 are lost) or change the configuration to match",
                differences.join(", ")
            )));
        }
        Ok(existing)
    }

    fn dead_letter_subscription(&self) -> String {
        format!(
            "projects/{}/subscriptions/{}",
            self.options.project, self.options.settings.dead_letter_subscription
        )
    }

    /// Publishes messages in as few calls as the service allows, waiting
    /// for each call's confirmation.
    async fn publish_messages(
        publisher: &TopicPublisher,
        messages: Vec<PubsubMessage>,
    ) -> Result<(), BrokerError> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        for message in messages {
            let size = message.data.len();
            if !batch.is_empty()
                && (batch.len() == MAX_MESSAGES_PER_CALL || bytes + size > MAX_PUBLISH_BYTES)
            {
                Self::publish_call(publisher, std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += size;
            batch.push(message);
        }
        if !batch.is_empty() {
            Self::publish_call(publisher, batch).await?;
        }
        Ok(())
    }

    async fn publish_call(
        publisher: &TopicPublisher,
        messages: Vec<PubsubMessage>,
    ) -> Result<(), BrokerError> {
        publisher
            .publish_immediately(messages, None)
            .await
            .map(drop)
            .map_err(|status| classify("cannot publish", &status))
    }

    /// Publishes many payloads, up to 1000 per call, each with its request's
    /// message id as an attribute when it has one.
    pub async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        let messages = payloads.into_iter().map(request_message).collect();
        Self::publish_messages(&self.publisher, messages).await
    }
}

impl PubSubBroker {
    /// Publishes many payloads, as [`PubSubPublisher::publish_all`].
    pub async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        self.publisher.publish_all(payloads).await
    }

    /// One `Pull` call that returns at once, its deliveries leased here.
    async fn pull_once(&self, consumer: &Leases, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        // Deprecated because a waiting pull is cheaper for the service; but
        // one cannot be abandoned safely (see `pull`).
        #[allow(deprecated)]
        let request = PullRequest {
            subscription: self.publisher.subscription.clone(),
            return_immediately: true,
            max_messages: max.clamp(1, MAX_MESSAGES_PER_CALL) as i32,
        };
        let sent = Instant::now();
        let received = self
            .publisher
            .subscriber
            .pull(request, no_retry())
            .await
            .map_err(|status| {
                classify(
                    &format!("cannot pull from {}", self.publisher.subscription),
                    &status,
                )
            })?
            .into_inner()
            .received_messages;
        Ok(consumer.lease(
            received,
            sent + self.publisher.options.ack_deadline,
            self.publisher.options.ack_deadline,
        ))
    }

    /// Takes up to `max` deliveries from the stream, waiting up to the poll
    /// wait for the first; opens the stream first if needed.
    async fn pull_streaming(
        &self,
        consumer: &Leases,
        stream: &tokio::sync::Mutex<Option<MessageStream>>,
        max: usize,
    ) -> Result<Vec<Delivery>, BrokerError> {
        use futures::{FutureExt as _, StreamExt as _};
        let mut open = stream.lock().await;
        if open.is_none() {
            let config = SubscribeConfig::default()
                .with_channel_capacity(self.publisher.options.max_in_flight.clamp(1, 10_000))
                .with_subscriber_config(SubscriberConfig {
                    // The service's bounds (refused otherwise, ending the
                    // stream); each delivery gets our own deadline below.
                    stream_ack_deadline_seconds: deadline_seconds(
                        self.publisher.options.ack_deadline,
                    )
                    .clamp(10, 600),
                    // Flow control: never more outstanding than the worker
                    // handles at once.
                    max_outstanding_messages: self.publisher.options.max_in_flight.max(1) as i64,
                    ..SubscriberConfig::default()
                });
            let opened = self
                .publisher
                .handle
                .subscribe(Some(config))
                .await
                .map_err(|status| {
                    classify(
                        &format!("cannot open a stream on {}", self.publisher.subscription),
                        &status,
                    )
                })?;
            *open = Some(opened);
        }
        // Just set if it was empty.
        let Some(messages) = open.as_mut() else {
            unreachable!("the stream was opened above");
        };
        let first =
            match tokio::time::timeout(self.publisher.options.poll_wait, messages.next()).await {
                Err(_elapsed) => return Ok(Vec::new()),
                Ok(Some(message)) => message,
                Ok(None) => {
                    // Ended (the crate gave up reconnecting): opened again on
                    // the next pull.
                    if let Some(ended) = open.take() {
                        ended.dispose().await;
                    }
                    return Err(BrokerError::Unavailable(format!(
                        "the stream on {} ended",
                        self.publisher.subscription
                    )));
                }
            };
        let mut taken = vec![first];
        while taken.len() < max {
            match messages.next().now_or_never() {
                Some(Some(message)) => taken.push(message),
                _ => break,
            }
        }
        drop(open);
        // Each is extended as it is handed out: it may have waited in the
        // stream's buffer, and its lease here must not be longer than the
        // service's. One that cannot be extended is left to redelivery.
        let sent = Instant::now();
        let deadline = Settlement::Deadline(deadline_seconds(self.publisher.options.ack_deadline));
        let extended = futures::future::join_all(
            taken
                .iter()
                .map(|message| consumer.settler.settle(deadline, message.ack_id.clone())),
        )
        .await;
        let received = taken
            .into_iter()
            .zip(extended)
            .filter_map(|(message, extended)| {
                extended.ok()?;
                Some(ReceivedMessage {
                    ack_id: message.ack_id,
                    delivery_attempt: message
                        .delivery_attempt
                        .map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX)),
                    message: Some(message.message),
                })
            })
            .collect();
        Ok(consumer.lease(
            received,
            sent + self.publisher.options.ack_deadline,
            self.publisher.options.ack_deadline,
        ))
    }

    /// The lease of `tag` if this process still holds it; a lease that ran
    /// out is forgotten and reported lost.
    fn held(&self, tag: &DeliveryTag) -> Result<(&Leases, Arc<str>), BrokerError> {
        let consumer = &self.consumer;
        let ack_id = tag
            .as_text()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        let mut leases = consumer.leases.lock().unwrap_or_else(|e| e.into_inner());
        let Some((key, lease)) = leases.get_key_value(ack_id) else {
            return Err(BrokerError::LeaseLost(tag.clone()));
        };
        if lease.deadline <= Instant::now() {
            let key = key.clone();
            leases.remove(&key);
            return Err(BrokerError::LeaseLost(tag.clone()));
        }
        Ok((consumer, key.clone()))
    }

    async fn settle(
        &self,
        tag: &DeliveryTag,
        consumer: &Leases,
        ack_id: &str,
        settlement: Settlement,
    ) -> Result<(), BrokerError> {
        consumer
            .settler
            .settle(settlement, ack_id.to_owned())
            .await
            .map_err(|status| {
                if settle::refused_ids(&status) {
                    // Exactly-once subscriptions refuse an expired ack id.
                    consumer.forget(ack_id);
                    BrokerError::LeaseLost(tag.clone())
                } else {
                    unavailable(&format!("cannot settle {}", short(tag)), &status)
                }
            })
    }
}

impl PubSubPublisher {
    /// Pulls from the dead-letter subscription: each dead letter's payload,
    /// reason and ack id (to acknowledge with [`Self::forget_dead_letters`]
    /// once handled). The messages stay leased for one ack deadline.
    pub async fn pull_dead_letters(&self, max: usize) -> Result<Vec<DeadLetter>, BrokerError> {
        let subscription = self.dead_letter_subscription();
        let mut found = Vec::new();
        while found.len() < max {
            #[allow(deprecated)] // return immediately: the list is what is there now.
            let request = PullRequest {
                subscription: subscription.clone(),
                return_immediately: true,
                max_messages: (max - found.len()).min(MAX_MESSAGES_PER_CALL) as i32,
            };
            let received = self
                .subscriber
                .pull(request, no_retry())
                .await
                .map_err(|s| classify(&format!("cannot pull from {subscription}"), &s))?
                .into_inner()
                .received_messages;
            if received.is_empty() {
                break;
            }
            found.extend(received.into_iter().filter_map(|received| {
                let message = received.message?;
                Some(DeadLetter {
                    ack_id: received.ack_id,
                    reason: message
                        .attributes
                        .get(DEAD_LETTER_REASON_ATTRIBUTE)
                        .cloned()
                        .unwrap_or_default(),
                    message_id: message.message_id,
                    payload: Bytes::from(message.data),
                })
            }));
        }
        Ok(found)
    }

    /// Acknowledges dead letters pulled by [`Self::pull_dead_letters`].
    pub async fn forget_dead_letters(&self, ack_ids: Vec<String>) -> Result<(), BrokerError> {
        let subscription = self.dead_letter_subscription();
        for chunk in ack_ids.chunks(MAX_MESSAGES_PER_CALL) {
            self.subscriber
                .acknowledge(
                    AcknowledgeRequest {
                        subscription: subscription.clone(),
                        ack_ids: chunk.to_vec(),
                    },
                    quick_retry(),
                )
                .await
                .map_err(|s| classify(&format!("cannot acknowledge on {subscription}"), &s))?;
        }
        Ok(())
    }

    /// Makes dead letters pulled by [`Self::pull_dead_letters`] visible
    /// again at once (they were only listed).
    pub async fn release_dead_letters(&self, ack_ids: Vec<String>) -> Result<(), BrokerError> {
        let subscription = self.dead_letter_subscription();
        for chunk in ack_ids.chunks(MAX_MESSAGES_PER_CALL) {
            self.subscriber
                .modify_ack_deadline(
                    ModifyAckDeadlineRequest {
                        subscription: subscription.clone(),
                        ack_ids: chunk.to_vec(),
                        ack_deadline_seconds: 0,
                    },
                    quick_retry(),
                )
                .await
                .map_err(|s| classify(&format!("cannot release on {subscription}"), &s))?;
        }
        Ok(())
    }
}

/// A message on the dead-letter subscription.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// To acknowledge it once requeued or handled.
    pub ack_id: String,
    /// The dead-letter copy's Pub/Sub id.
    pub message_id: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// The original payload.
    pub payload: Bytes,
}

impl Leases {
    fn lease(
        &self,
        received: Vec<ReceivedMessage>,
        deadline: Instant,
        ack_deadline: Duration,
    ) -> Vec<Delivery> {
        let now = Instant::now();
        let mut deliveries = Vec::with_capacity(received.len());
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let mut counted = self
            .counted
            .as_ref()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()));
        for received in received {
            let Some(message) = received.message else {
                warn!(ack_id = %received.ack_id, "pubsub delivery without a message; skipped");
                continue;
            };
            let attempt = match counted.as_mut() {
                // Forgotten after many leases' worth of silence.
                Some(counts) => counts.record(&message.message_id, now, ack_deadline * 60),
                None => u32::try_from(received.delivery_attempt.max(1)).unwrap_or(u32::MAX),
            };
            let payload = Bytes::from(message.data);
            let ack_id: Arc<str> = received.ack_id.into();
            leases.insert(
                ack_id.clone(),
                Lease {
                    deadline,
                    message_id: message.message_id,
                    payload: payload.clone(),
                },
            );
            deliveries.push(Delivery::new(DeliveryTag::text(ack_id), payload, attempt));
        }
        deliveries
    }

    /// Drops the lease; with `settled`, the message is done with, so its
    /// delivery count goes too.
    fn release(&self, ack_id: &str, settled: bool) -> Option<Lease> {
        let lease = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(ack_id);
        if settled && let (Some(lease), Some(counted)) = (&lease, &self.counted) {
            counted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .counts
                .remove(&lease.message_id);
        }
        lease
    }

    fn forget(&self, ack_id: &str) {
        self.release(ack_id, false);
    }
}

/// An ack id is long; logs get its end, which identifies it.
fn short(tag: &DeliveryTag) -> String {
    let text = tag.to_string();
    let start = text.floor_char_boundary(text.len().saturating_sub(24));
    format!("…{}", &text[start..])
}

/// A request message, with the request's id as an attribute when it has one.
fn request_message(payload: Bytes) -> PubsubMessage {
    let mut attributes = HashMap::new();
    if let Some(id) = crate::domain::salvage_message_id(&payload) {
        attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_string());
    }
    PubsubMessage {
        data: payload.to_vec(),
        attributes,
        ..PubsubMessage::default()
    }
}

/// Creates the topic if missing.
async fn ensure_topic(topic: &Topic) -> Result<(), BrokerError> {
    let name = topic.fully_qualified_name();
    match topic.exists(no_retry()).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(status) => return Err(classify(&format!("cannot read topic {name}"), &status)),
    }
    match topic.create(None, no_retry()).await {
        Ok(()) => {
            info!(topic = name, "pubsub topic created");
            Ok(())
        }
        // Another instance was first.
        Err(status) if status.code() == Code::AlreadyExists => Ok(()),
        Err(status) => Err(classify(&format!("cannot create topic {name}"), &status)),
    }
}

/// The settings of an existing subscription that differ from ours.
fn mismatches(existing: &Subscription, wanted: &Subscription, max_deliveries: u32) -> Vec<String> {
    let mut found = mismatches_of_topic(existing, wanted);
    if existing.ack_deadline_seconds != wanted.ack_deadline_seconds {
        found.push(format!(
            "ack_deadline is {}s (configured broker.ack_deadline {}s)",
            existing.ack_deadline_seconds, wanted.ack_deadline_seconds
        ));
    }
    if let Some(push) = &existing.push_config
        && !push.push_endpoint.is_empty()
    {
        found.push(format!(
            "it pushes to {} (mandrill pulls)",
            push.push_endpoint
        ));
    }
    if existing.bigquery_config.is_some() || existing.cloud_storage_config.is_some() {
        found.push("it exports to BigQuery or Cloud Storage (mandrill pulls)".into());
    }
    if !existing.filter.is_empty() {
        found.push(format!(
            "it filters messages ({:?}; mandrill reads every message)",
            existing.filter
        ));
    }
    if existing.detached {
        found.push("it is detached from its topic".into());
    }
    if let Some(DeadLetterPolicy {
        max_delivery_attempts,
        dead_letter_topic,
    }) = &existing.dead_letter_policy
        && i64::from(*max_delivery_attempts) <= i64::from(max_deliveries)
    {
        found.push(format!(
            "its dead-letter policy forwards to {dead_letter_topic} after \
             {max_delivery_attempts} deliveries, not above broker.max_deliveries \
             ({max_deliveries}): messages would leave unrecorded before the worker gives up"
        ));
    }
    found
}

fn mismatches_of_topic(existing: &Subscription, wanted: &Subscription) -> Vec<String> {
    if existing.topic == wanted.topic {
        return Vec::new();
    }
    vec![format!(
        "topic is {} (configured {})",
        existing.topic, wanted.topic
    )]
}

#[async_trait]
impl Close for PubSubPublisher {
    async fn close(&self) {
        // Clones share the publishers' tasks, which this stops.
        self.publisher.clone().shutdown().await;
        self.dead_letter_publisher.clone().shutdown().await;
    }
}

#[async_trait]
impl Publisher for PubSubPublisher {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        // Immediately, one call: the crate's batching publisher would wait
        // for company first.
        Self::publish_call(&self.publisher, vec![request_message(payload)]).await
    }
}

#[async_trait]
impl DeadLetterAdmin for PubSubPublisher {
    /// What the dead-letter subscription holds: pulled, then released at
    /// once (it stays there).
    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError> {
        let dead = self.pull_dead_letters(usize::MAX).await?;
        let ack_ids = dead.iter().map(|d| d.ack_id.clone()).collect();
        self.release_dead_letters(ack_ids).await.map_err(|error| {
            BrokerError::Unavailable(format!(
                "cannot release the dead letters after listing them: {error}"
            ))
        })?;
        Ok(dead
            .into_iter()
            .map(|d| DeadLetterEntry {
                id: DeadLetterId::Message(d.message_id),
                reason: d.reason,
                payload: d.payload,
                record: None,
            })
            .collect())
    }

    /// Publishes the chosen dead letters (by the id they are listed with,
    /// or all) to the request topic again, then acknowledges them; the rest
    /// are released. Returns the ids requeued.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError> {
        let dead = self.pull_dead_letters(usize::MAX).await?;
        let (chosen, others): (Vec<DeadLetter>, Vec<DeadLetter>) = dead
            .into_iter()
            .partition(|d| ids.is_none_or(|ids| ids.contains(&d.message_id)));
        self.release_dead_letters(others.into_iter().map(|d| d.ack_id).collect())
            .await?;
        let payloads = chosen.iter().map(|d| d.payload.clone()).collect();
        // Published before acknowledged: a failure leaves the dead letter,
        // never loses it (at worst a request is queued twice, and the store
        // settles the second at once).
        self.publish_all(payloads).await?;
        let requeued = chosen
            .iter()
            .map(|d| DeadLetterId::Message(d.message_id.clone()))
            .collect();
        self.forget_dead_letters(chosen.into_iter().map(|d| d.ack_id).collect())
            .await?;
        Ok(requeued)
    }
}

#[async_trait]
impl Publisher for PubSubBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.publisher.publish(payload).await
    }
}

#[async_trait]
impl Consumer for PubSubBroker {
    fn lease(&self) -> Option<Duration> {
        Some(self.publisher.options.ack_deadline)
    }

    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        let consumer = &self.consumer;
        if let Some(stream) = &consumer.stream {
            return self.pull_streaming(consumer, stream, max).await;
        }
        // What is there now, at once: the busy case, and the only call that
        // must answer (a service that does not is unreachable).
        let limit = self.publisher.options.poll_wait + PULL_MARGIN;
        let available = tokio::time::timeout(limit, self.pull_once(consumer, max))
            .await
            .unwrap_or_else(|_elapsed| {
                Err(BrokerError::Unavailable(format!(
                    "no answer to a pull within {limit:?}; is the service reachable?"
                )))
            })?;
        if !available.is_empty() {
            return Ok(available);
        }
        // Then poll until the poll wait is over. Not a waiting pull ended
        // by us: the service (the emulator, measurably) keeps handing
        // messages to a pull its client gave up on, and each one then sits
        // out a whole ack deadline, again and again.
        let until = Instant::now() + self.publisher.options.poll_wait;
        loop {
            let now = Instant::now();
            if now >= until {
                return Ok(Vec::new());
            }
            tokio::time::sleep(self.publisher.options.poll_interval.min(until - now)).await;
            let pulled = tokio::time::timeout(limit, self.pull_once(consumer, max))
                .await
                .unwrap_or_else(|_elapsed| {
                    Err(BrokerError::Unavailable(format!(
                        "no answer to a pull within {limit:?}; is the service reachable?"
                    )))
                })?;
            if !pulled.is_empty() {
                return Ok(pulled);
            }
        }
    }

    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        let (consumer, ack_id) = self.held(tag)?;
        self.settle(tag, consumer, &ack_id, Settlement::Ack).await?;
        consumer.release(&ack_id, true);
        Ok(())
    }

    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        let (consumer, ack_id) = self.held(tag)?;
        let deadline = Settlement::Deadline(deadline_seconds(delay));
        self.settle(tag, consumer, &ack_id, deadline).await?;
        consumer.release(&ack_id, false);
        Ok(())
    }

    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        let (consumer, ack_id) = self.held(tag)?;
        let sent = Instant::now();
        let deadline = Settlement::Deadline(deadline_seconds(self.publisher.options.ack_deadline));
        self.settle(tag, consumer, &ack_id, deadline).await?;
        if let Some(lease) = consumer
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&ack_id)
        {
            lease.deadline = sent + self.publisher.options.ack_deadline.min(MAX_ACK_DEADLINE);
        }
        Ok(())
    }

    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        // The copy first: if it fails, the delivery stays leased and is
        // redelivered, not lost. If the ack then fails, a redelivery may be
        // dead-lettered again: a duplicate copy, never a lost one.
        let (consumer, ack_id) = self.held(tag)?;
        let (message_id, payload) = {
            let leases = consumer.leases.lock().unwrap_or_else(|e| e.into_inner());
            let lease = leases
                .get(&ack_id)
                .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
            (lease.message_id.clone(), lease.payload.clone())
        };
        let mut attributes = HashMap::from([
            (
                DEAD_LETTER_REASON_ATTRIBUTE.to_owned(),
                bounded_reason(reason).into_owned(),
            ),
            (ORIGINAL_ID_ATTRIBUTE.to_owned(), message_id),
        ]);
        if let Some(id) = crate::domain::salvage_message_id(&payload) {
            attributes.insert(MESSAGE_ID_ATTRIBUTE.to_owned(), id.to_string());
        }
        let copy = PubsubMessage {
            data: payload.to_vec(),
            attributes,
            ..PubsubMessage::default()
        };
        PubSubPublisher::publish_messages(&self.publisher.dead_letter_publisher, vec![copy])
            .await?;
        self.settle(tag, consumer, &ack_id, Settlement::Ack).await?;
        consumer.release(&ack_id, true);
        Ok(())
    }
}

#[async_trait]
impl Close for PubSubBroker {
    async fn close(&self) {
        let consumer = &self.consumer;
        // Buffered deliveries go back at once (nacked), then settlements
        // still queued are sent.
        if let Some(stream) = &consumer.stream
            && let Some(stream) = stream.lock().await.take()
        {
            stream.dispose().await;
        }
        consumer.settler.close().await;
        self.publisher.close().await;
    }
}

#[cfg(test)]
pub(crate) mod emulator;
#[cfg(test)]
mod tests;
