//! The `Broker` seam: where restart requests come from.
//!
//! Three traits, so that each caller asks only for what it uses: a
//! [`Publisher`] appends messages (`mandrill publish`, the demo publisher); a
//! [`Consumer`] hands out *deliveries* (the worker); a [`DeadLetterAdmin`]
//! lists and requeues what was given up on (`mandrill dead-letters`,
//! `requeue`), on every broker but the in-process one.
//! [`Broker`] is a consumer that can also be published into.
//!
//! A delivery is a payload leased to this consumer until its ack deadline.
//! The worker settles every delivery exactly once, by [`Consumer::ack`],
//! [`Consumer::nack`] (redeliver after a delay) or [`Consumer::dead_letter`];
//! while work runs it keeps the lease with [`Consumer::extend`]. A delivery
//! that is neither settled nor extended before its deadline is redelivered,
//! possibly to another consumer.

#[cfg(test)]
pub(crate) mod contract;
mod dead_letters;
pub(crate) mod memory;
pub(crate) mod nats;
pub(crate) mod pubsub;
mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::domain::JointAck;
pub(crate) use dead_letters::{DeadLetterAdmin, DeadLetterEntry, DeadLetterId, choose};
pub(crate) use memory::MemoryBroker;
pub(crate) use url::{BrokerUrl, BrokerUrlError};

/// Identifies one delivery to the broker that made it. Opaque to the worker:
/// each broker puts in what it needs to find the delivery again.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DeliveryTag(TagRepr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum TagRepr {
    Number(u64),
    Pair(u64, u64),
    Text(Arc<str>),
    TextAndNumber(Arc<str>, u64),
}

impl DeliveryTag {
    /// A tag that is a number, e.g. a lease sequence.
    pub fn number(n: u64) -> Self {
        Self(TagRepr::Number(n))
    }

    /// A tag that is two numbers, e.g. a message id and its delivery number.
    pub fn pair(first: u64, second: u64) -> Self {
        Self(TagRepr::Pair(first, second))
    }

    /// The two numbers, if this tag is a pair.
    pub fn as_pair(&self) -> Option<(u64, u64)> {
        match &self.0 {
            TagRepr::Pair(first, second) => Some((*first, *second)),
            _ => None,
        }
    }

    /// A tag that is text, e.g. a reply subject.
    pub fn text(text: impl Into<Arc<str>>) -> Self {
        Self(TagRepr::Text(text.into()))
    }

    /// A tag that is text with a number beside it, e.g. a reply subject and
    /// the message's sequence. Shown as the text.
    pub fn text_and_number(text: impl Into<Arc<str>>, number: u64) -> Self {
        Self(TagRepr::TextAndNumber(text.into(), number))
    }

    /// The number, if this tag is one.
    pub fn as_number(&self) -> Option<u64> {
        match &self.0 {
            TagRepr::Number(n) => Some(*n),
            TagRepr::Pair(..) | TagRepr::Text(_) | TagRepr::TextAndNumber(..) => None,
        }
    }

    /// The text, if this tag is text (with or without a number).
    pub fn as_text(&self) -> Option<&str> {
        match &self.0 {
            TagRepr::Number(_) | TagRepr::Pair(..) => None,
            TagRepr::Text(text) | TagRepr::TextAndNumber(text, _) => Some(text),
        }
    }

    /// The text and the number, if this tag is text with a number.
    pub fn as_text_and_number(&self) -> Option<(&str, u64)> {
        match &self.0 {
            TagRepr::TextAndNumber(text, number) => Some((text, *number)),
            TagRepr::Number(_) | TagRepr::Pair(..) | TagRepr::Text(_) => None,
        }
    }
}

impl fmt::Debug for DeliveryTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for DeliveryTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            TagRepr::Number(n) => write!(f, "#{n}"),
            TagRepr::Pair(first, second) => write!(f, "#{first}.{second}"),
            TagRepr::Text(text) | TagRepr::TextAndNumber(text, _) => f.write_str(text),
        }
    }
}

/// A payload leased to this consumer.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    /// How to settle or extend this delivery.
    pub tag: DeliveryTag,
    /// The message body, not yet validated.
    pub payload: Bytes,
    /// 1 for the first delivery of a message, 2 for its first redelivery, …
    pub attempt: u32,
    /// Size of the whole payload as the broker holds it. Larger than
    /// `payload.len()` when the broker read only a prefix of a payload over
    /// the limit (so that an oversized message is rejected without loading it).
    pub full_size: usize,
}

impl Delivery {
    /// A delivery of a payload read whole.
    pub(crate) fn new(tag: DeliveryTag, payload: Bytes, attempt: u32) -> Self {
        let full_size = payload.len();
        Self {
            tag,
            payload,
            attempt,
            full_size,
        }
    }
}

/// What went wrong talking to a broker. The worker branches on the kind.
#[derive(Debug)]
#[non_exhaustive]
pub enum BrokerError {
    /// The delivery is no longer leased to us: it was settled already, or its
    /// lease expired and it may have been redelivered.
    LeaseLost(DeliveryTag),
    /// The broker could not be reached or refused the operation; retrying may help.
    Unavailable(Cause),
    /// The broker is closed or misconfigured; retrying will not help.
    Fatal(Cause),
}

impl fmt::Display for BrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeaseLost(tag) => {
                write!(f, "delivery {tag} is no longer leased to this consumer")
            }
            Self::Unavailable(cause) => write!(f, "broker unavailable: {cause}"),
            Self::Fatal(cause) => write!(f, "broker failed: {cause}"),
        }
    }
}

impl BrokerError {
    /// The error followed by its causes (`error: cause: cause's cause`),
    /// for a log line or a message that must stand alone.
    pub fn with_causes(&self) -> impl fmt::Display + '_ {
        crate::causes::WithCauses(self)
    }
}

impl std::error::Error for BrokerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::LeaseLost(_) => None,
            Self::Unavailable(cause) | Self::Fatal(cause) => cause.source(),
        }
    }
}

pub(crate) use crate::causes::Cause;

/// Releases a broker connection: shared by [`Publisher`], [`Consumer`] and
/// [`DeadLetterAdmin`], so that a type that is several of them closes once
/// and `close` is never ambiguous.
#[async_trait]
pub trait Close: Send + Sync + 'static {
    /// Releases connections; called once, after the last settlement.
    async fn close(&self) {}
}

/// Where restart requests go: appends messages.
#[async_trait]
pub(crate) trait Publisher: Close {
    /// Appends a message.
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError>;

    /// Appends many, in as few calls (or transactions) as the broker allows.
    /// By default one by one: on a failure, those before it stay published.
    async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        for payload in payloads {
            self.publish(payload).await?;
        }
        Ok(())
    }
}

/// Where restart requests come from, with lease semantics. See the module docs.
#[async_trait]
pub(crate) trait Consumer: Close {
    /// How long a delivery stays leased without an extension; `None` for a
    /// broker without leases, whose deliveries stay with this consumer until
    /// settled (nothing needs extending).
    fn lease(&self) -> Option<Duration>;

    /// Leases up to `max` deliveries, waiting a bounded time for the first.
    /// Returns an empty batch when nothing arrived in that time.
    ///
    /// Must be cancel-safe: a pull dropped before it returns loses nothing;
    /// at worst its deliveries are redelivered once their leases expire.
    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError>;

    /// Settles a delivery as done.
    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError>;

    /// Gives a delivery back, to be redelivered after `delay`.
    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError>;

    /// Pushes a delivery's deadline one lease into the future.
    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError>;

    /// Settles a delivery as undeliverable, keeping it with `reason`.
    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError>;

    /// An ack of `tag` that the store can commit in the transaction that
    /// records the outcome (the store seam's `Store::record_outcome_acking`),
    /// when both live in one database; `None` (the default) when this broker
    /// cannot, and the caller acks after recording as usual.
    fn joint_ack(&self, _tag: &DeliveryTag) -> Option<JointAck> {
        None
    }

    /// Publishes a request's final verdict on `destination` (its
    /// `reply_to`, admitted by the operator's patterns): once, without
    /// confirmation that anyone heard it. By default the broker cannot
    /// carry replies (the SQLite and in-process queues), which the
    /// configuration refuses at start-up.
    async fn reply(&self, destination: &str, _verdict: Bytes) -> Result<(), BrokerError> {
        Err(BrokerError::Fatal(
            format!("this broker cannot carry a reply (to {destination})").into(),
        ))
    }

    /// Messages not yet settled: visible, delayed or leased. `None` when the
    /// broker cannot tell (e.g. a remote broker without that statistic);
    /// `mandrill run --until-idle` stops once this is `Some(0)`.
    async fn backlog(&self) -> Result<Option<u64>, BrokerError> {
        Ok(None)
    }
}

/// A consuming connection that can also be published into: what `mandrill
/// run` opens (its demo publisher and tests publish into the queue it
/// consumes). Every type that is both is one.
pub(crate) trait Broker: Consumer + Publisher {}

impl<T: Consumer + Publisher + ?Sized> Broker for T {}

/// Most bytes of a dead-letter reason a broker keeps. A reason is a sentence;
/// bounded, it can never push a dead letter over the broker's size limit nor
/// flood a log line.
pub(crate) const MAX_REASON_BYTES: usize = 1024;

/// `reason`, cut on a character boundary to at most [`MAX_REASON_BYTES`],
/// ending in `…` when cut.
pub(crate) fn bounded_reason(reason: &str) -> std::borrow::Cow<'_, str> {
    if reason.len() <= MAX_REASON_BYTES {
        return reason.into();
    }
    const ELLIPSIS: &str = "…";
    let end = reason.floor_char_boundary(MAX_REASON_BYTES - ELLIPSIS.len());
    format!("{}{ELLIPSIS}", &reason[..end]).into()
}

#[cfg(test)]
mod tests;
