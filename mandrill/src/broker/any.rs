//! [`AnyConsumer`]: the consumer the worker holds, dispatched statically.
//!
//! [`Consumer`] is an `#[async_trait]`, so every call through `dyn Consumer`
//! boxes its future: an allocation per pull, ack and lease extension. The worker's calls go through this enum instead: a `match`,
//! then the adapter's own unboxed `async fn`.
//!
//! The SQLite queue's settlements are boxed here all the same, for now:
//! each holds its operation across the writer channel's send, a future of
//! over 1 KB, which inline would make every handler's future that large
//! whichever broker is in use. Its pull, once a batch and outside the
//! handlers, is not.
//!
//! Only the in-process and SQLite queues have a variant. NATS and Pub/Sub
//! go through [`AnyConsumer::Other`], boxed as before: each of their calls
//! is a network round trip, next to which an allocation is noise, and their
//! futures are large (an ack's would grow every handler's future, which
//! each in-flight message holds, by its size).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{BrokerError, Consumer, Delivery, DeliveryTag, MemoryBroker};
use crate::domain::JointAck;
use crate::sqlite::SqliteBroker;

/// The in-process or SQLite queue, or any other consumer behind
/// `dyn Consumer`.
#[derive(Clone)]
pub enum AnyConsumer {
    /// The in-process broker.
    Memory(Arc<MemoryBroker>),
    /// The SQLite queue.
    Sqlite(Arc<SqliteBroker>),
    /// Anything else (NATS, Pub/Sub, test fakes): called through the trait,
    /// its futures boxed.
    Other(Arc<dyn Consumer>),
}

impl AnyConsumer {
    /// The same consumer as a trait object: no second indirection.
    pub fn as_dyn(&self) -> Arc<dyn Consumer> {
        match self {
            Self::Memory(broker) => broker.clone(),
            Self::Sqlite(broker) => broker.clone(),
            Self::Other(broker) => broker.clone(),
        }
    }

    /// As [`Consumer::lease`].
    pub fn lease(&self) -> Option<Duration> {
        match self {
            Self::Memory(broker) => broker.lease(),
            Self::Sqlite(broker) => broker.lease(),
            Self::Other(broker) => broker.lease(),
        }
    }

    /// As [`Consumer::pull`].
    pub async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        match self {
            Self::Memory(broker) => broker.pull(max).await,
            Self::Sqlite(broker) => broker.pull(max).await,
            Self::Other(broker) => broker.pull(max).await,
        }
    }

    /// As [`Consumer::ack`].
    pub async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        match self {
            Self::Memory(broker) => broker.ack(tag).await,
            Self::Sqlite(broker) => {
                let call = Box::pin(broker.ack(tag));
                call.await
            }
            Self::Other(broker) => broker.ack(tag).await,
        }
    }

    /// As [`Consumer::nack`].
    pub async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        match self {
            Self::Memory(broker) => broker.nack(tag, delay).await,
            Self::Sqlite(broker) => {
                let call = Box::pin(broker.nack(tag, delay));
                call.await
            }
            Self::Other(broker) => broker.nack(tag, delay).await,
        }
    }

    /// As [`Consumer::extend`].
    pub async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        match self {
            Self::Memory(broker) => broker.extend(tag).await,
            Self::Sqlite(broker) => {
                let call = Box::pin(broker.extend(tag));
                call.await
            }
            Self::Other(broker) => broker.extend(tag).await,
        }
    }

    /// As [`Consumer::dead_letter`].
    pub async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        match self {
            Self::Memory(broker) => broker.dead_letter(tag, reason).await,
            Self::Sqlite(broker) => {
                let call = Box::pin(broker.dead_letter(tag, reason));
                call.await
            }
            Self::Other(broker) => broker.dead_letter(tag, reason).await,
        }
    }

    /// As [`Consumer::reply`]: only a remote broker carries one.
    pub async fn reply(&self, destination: &str, verdict: Bytes) -> Result<(), BrokerError> {
        match self {
            Self::Memory(broker) => broker.reply(destination, verdict).await,
            Self::Sqlite(broker) => broker.reply(destination, verdict).await,
            Self::Other(broker) => broker.reply(destination, verdict).await,
        }
    }

    /// As [`Consumer::joint_ack`].
    pub fn joint_ack(&self, tag: &DeliveryTag) -> Option<JointAck> {
        match self {
            Self::Memory(_) => None,
            Self::Sqlite(broker) => broker.joint_ack(tag),
            Self::Other(broker) => broker.joint_ack(tag),
        }
    }
}

/// The typed variant for the in-process and SQLite queues,
/// [`AnyConsumer::Other`] for any other consumer: a caller passes its `Arc`
/// and gets static dispatch where there is one. (A `TypeId` check once,
/// when the worker is built.)
impl<C: Consumer> From<Arc<C>> for AnyConsumer {
    fn from(broker: Arc<C>) -> Self {
        let any: Arc<dyn Any + Send + Sync> = broker.clone();
        if let Ok(memory) = any.clone().downcast::<MemoryBroker>() {
            return Self::Memory(memory);
        }
        if let Ok(sqlite) = any.downcast::<SqliteBroker>() {
            return Self::Sqlite(sqlite);
        }
        Self::Other(broker)
    }
}

impl From<Arc<dyn Consumer>> for AnyConsumer {
    fn from(broker: Arc<dyn Consumer>) -> Self {
        Self::Other(broker)
    }
}

/// A broker is a consumer; `mandrill run` opens one.
impl From<Arc<dyn super::Broker>> for AnyConsumer {
    fn from(broker: Arc<dyn super::Broker>) -> Self {
        Self::Other(broker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteOptions;

    fn size<T>(_: &T) -> usize {
        std::mem::size_of::<T>()
    }

    /// Every in-flight message's handler holds the largest settlement
    /// future (the enum's is as large as its largest variant's): an unboxed
    /// SQLite settlement (over 1 KB) would more than double it.
    #[tokio::test]
    async fn any_consumers_settlements_stay_small_whichever_broker_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions {
            url: format!("sqlite:{}", dir.path().join("q.db").display()),
            ack_deadline: Duration::from_secs(1),
            poll_wait: Duration::from_secs(1),
            poll_interval: Duration::from_secs(1),
        };
        let sqlite = AnyConsumer::from(Arc::new(SqliteBroker::connect(&options).await.unwrap()));
        assert!(matches!(sqlite, AnyConsumer::Sqlite(_)));
        let tag = DeliveryTag::pair(1, 1);
        let sizes = [
            size(&sqlite.ack(&tag)),
            size(&sqlite.extend(&tag)),
            size(&sqlite.nack(&tag, Duration::ZERO)),
            size(&sqlite.dead_letter(&tag, "malformed")),
        ];
        // Debug build: 48, 48, 80, 80 bytes.
        assert!(sizes.iter().all(|&size| size <= 128), "{sizes:?}");
    }
}
