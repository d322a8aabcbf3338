//! Dead-letter administration: listing and requeueing what the worker gave
//! up on. Optional: a broker implements [`DeadLetterAdmin`] when its dead
//! letters are kept where a process can read them back (the SQLite table,
//! the Pub/Sub dead-letter subscription).

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

use super::{BrokerError, Close};

/// How a dead letter is named to [`DeadLetterAdmin::requeue`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub(crate) enum DeadLetterId {
    /// A row of a dead-letter table (SQLite).
    Row(i64),
    /// A message id (Pub/Sub: the dead-letter copy's id).
    Message(String),
}

impl fmt::Display for DeadLetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Row(id) => write!(f, "{id}"),
            Self::Message(id) => f.write_str(id),
        }
    }
}

/// A dead-lettered message, as `mandrill dead-letters` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetterEntry {
    /// What [`DeadLetterAdmin::requeue`] takes to name it.
    pub id: DeadLetterId,
    /// Why the message was given up on.
    pub reason: String,
    /// The payload, or its first bytes when the broker bounds a listing.
    pub payload: Bytes,
    /// Deliveries and times, where the broker keeps them.
    pub record: Option<DeadLetterRecord>,
}

/// What a broker that keeps a dead letter's history knows of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadLetterRecord {
    /// Deliveries before it was given up on.
    pub deliveries: i64,
    /// When it was published (milliseconds since the epoch).
    pub published_at: i64,
    /// When it was dead-lettered (milliseconds since the epoch).
    pub dead_at: i64,
    /// The whole payload's size in bytes.
    pub payload_size: i64,
}

/// Lists and requeues dead letters. See the module docs.
#[async_trait]
pub(crate) trait DeadLetterAdmin: Close {
    /// Whether entries carry a [`DeadLetterRecord`] (a listing shows those
    /// columns).
    fn keeps_records(&self) -> bool {
        false
    }

    /// The dead letters, oldest first where the broker knows the order. They
    /// stay dead letters.
    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError>;

    /// Puts dead letters back into the queue as new messages: those whose
    /// ids (as [`dead_letters`](Self::dead_letters) shows them) are given,
    /// or all of them for `None`. Returns the ids requeued.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError>;
}
