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

mod consumer;
mod dead_letters;
mod leases;
mod publisher;
pub(crate) mod settings;
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

pub(crate) use self::consumer::PubSubBroker;
pub(crate) use self::publisher::PubSubPublisher;
pub(crate) use self::settings::{Endpoint, PubSubSettings, PullMode};
use self::settle::{Settlement, Settler};
use super::{
    BrokerError, Cause, Close, Consumer, DeadLetterAdmin, DeadLetterEntry, DeadLetterId, Delivery,
    DeliveryTag, Publisher, bounded_reason, choose,
};

/// The attribute carrying a dead letter's reason (at most
/// [`MAX_REASON_BYTES`](super::MAX_REASON_BYTES), which is also Pub/Sub's
/// limit for an attribute value).
pub(crate) const DEAD_LETTER_REASON_ATTRIBUTE: &str = "mandrill-dead-letter-reason";
/// The attribute carrying the original message's Pub/Sub id.
pub(crate) const ORIGINAL_ID_ATTRIBUTE: &str = "mandrill-original-message-id";
/// The attribute carrying the request's `message_id` when the payload has one.
pub(crate) const MESSAGE_ID_ATTRIBUTE: &str = "mandrill-message-id";

/// Pub/Sub's longest ack deadline, per call and per subscription.
pub(crate) const MAX_ACK_DEADLINE: Duration = Duration::from_secs(600);
/// Pub/Sub's shortest subscription ack deadline.
pub(crate) const MIN_ACK_DEADLINE: Duration = Duration::from_secs(10);
/// Most messages one `Pull` returns, and one `Publish` carries.
pub(crate) const MAX_MESSAGES_PER_CALL: usize = 1000;
/// Most bytes of payload one `Publish` carries (the service allows 10 MB
/// per request, attributes included).
pub(super) const MAX_PUBLISH_BYTES: usize = 9 * 1024 * 1024;
/// How much longer than the poll wait a pull may take before the service
/// is considered unreachable.
pub(super) const PULL_MARGIN: Duration = Duration::from_secs(5);
/// Message ids whose deliveries are counted here at most (see the module
/// docs); beyond it, the oldest are forgotten and counting starts again.
pub(super) const MAX_COUNTED_MESSAGES: usize = 100_000;

/// Everything [`PubSubBroker`] needs: the adapter's section and the
/// generic broker settings that shape the subscription.
#[derive(Debug, Clone)]
pub(crate) struct PubSubOptions {
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
    /// The worker's delivery limit: a dead-letter policy must allow more.
    pub max_deliveries: u32,
    /// Deliveries held at once (streaming flow control).
    pub max_in_flight: usize,
}

pub(super) fn unavailable(what: &str, status: &Status) -> BrokerError {
    BrokerError::Unavailable(Cause::new(what, describe(status)))
}

pub(super) fn fatal(what: &str, status: &Status) -> BrokerError {
    BrokerError::Fatal(Cause::new(what, describe(status)))
}

/// A failed call's status as `code: message`, without its metadata (which
/// may carry request headers), for a [`BrokerError`]'s source.
#[derive(Debug, thiserror::Error)]
#[error("{code:?}: {message}")]
pub(super) struct CallFailed {
    code: Code,
    message: String,
}

pub(super) fn describe(status: &Status) -> CallFailed {
    CallFailed {
        code: status.code(),
        message: status.message().to_owned(),
    }
}

/// Whether retrying a call that failed so may help.
pub(super) fn is_transient(status: &Status) -> bool {
    !matches!(
        status.code(),
        Code::NotFound
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unimplemented
    )
}

pub(super) fn classify(what: &str, status: &Status) -> BrokerError {
    if is_transient(status) {
        unavailable(what, status)
    } else {
        fatal(what, status)
    }
}

/// Retries of calls that settle or publish: a few, quickly, for codes that
/// say the call did not happen.
pub(super) fn quick_retry() -> Option<RetrySetting> {
    Some(RetrySetting::default())
}

/// No retries: the caller bounds the call and the worker retries it.
pub(super) fn no_retry() -> Option<RetrySetting> {
    Some(RetrySetting {
        take: 0,
        ..RetrySetting::default()
    })
}

/// Whole seconds for a deadline, rounded up and within Pub/Sub's bounds.
pub(super) fn deadline_seconds(duration: Duration) -> i32 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    // At most 600, which fits.
    seconds.min(MAX_ACK_DEADLINE.as_secs()) as i32
}

/// Installs the TLS crypto provider (ring) once per process: the client is
/// built without one, and without one installed its TLS connections panic.
pub(super) fn install_crypto_provider() {
    // An error only says one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A request message, with the request's id as an attribute when it has one.
pub(super) fn request_message(payload: Bytes) -> PubsubMessage {
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

#[cfg(test)]
pub(crate) mod emulator;
#[cfg(test)]
mod tests;
