//! Dead-letter administration: listing and requeueing what the worker gave
//! up on, on every broker that keeps its dead letters where a process can
//! read them back: the SQLite table, the NATS `{stream}_DEAD` stream, the
//! Pub/Sub dead-letter subscription. Each adapter implements
//! [`DeadLetterAdmin`] with its own I/O; which dead letters a requeue takes
//! is decided once, here ([`choose`]).
//!
//! A requeue publishes a dead letter again and forgets it only once the
//! broker confirmed the publish (SQLite: both in one transaction). A crash
//! between the two leaves the dead letter where it was, to be requeued
//! again: a request may then be queued twice (the store settles the second
//! as the request it is), but a dead letter is never lost.

use std::collections::HashSet;
use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

use super::{BrokerError, Close};
use crate::domain::Timestamp;

/// How a dead letter is named to [`DeadLetterAdmin::requeue`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub(crate) enum DeadLetterId {
    /// A row of the dead-letter table (SQLite), or a sequence of the
    /// dead-letter stream (NATS).
    Number(u64),
    /// A message id (Pub/Sub: the dead-letter copy's id).
    Message(String),
}

impl fmt::Display for DeadLetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(id) => write!(f, "{id}"),
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
    /// The `message_id` its payload carried (unverified: what the payload
    /// said), if it carried one.
    pub message_id: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: Timestamp,
    /// When it was first published, where the broker keeps it (SQLite).
    pub published_at: Option<Timestamp>,
    /// Deliveries before it was given up on, where the broker keeps them
    /// (SQLite; the others leave counting to the worker).
    pub deliveries: Option<u64>,
    /// The payload, or its first bytes when the listing is bounded.
    pub payload: Bytes,
    /// The whole payload's size in bytes.
    pub payload_size: u64,
    /// The broker kept only the first bytes of the payload (a NATS copy cut
    /// to fit the server's `max_payload`): it cannot be requeued.
    pub truncated: bool,
}

/// Lists and requeues dead letters. See the module docs.
#[async_trait]
pub(crate) trait DeadLetterAdmin: Close {
    /// The dead letters, oldest first where the broker knows the order. They
    /// stay dead letters.
    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError>;

    /// Puts dead letters back into the queue as new messages, as
    /// [`choose`] picks them from `ids` (as
    /// [`dead_letters`](Self::dead_letters) shows them; `None`: all), each
    /// removed from the dead letters only once its publish is confirmed.
    /// Returns the ids requeued.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError>;
}

/// The one rule of which dead letters a requeue takes, from those listed
/// (each an id and whether its payload was kept truncated): with `ids`,
/// exactly those, each once, in the listed order, and nothing at all if
/// one of them is not listed or is truncated; without, every one whose
/// payload is whole (a truncated one stays listed: requeueing its first
/// bytes would only dead-letter them again).
pub(crate) fn choose<'a>(
    ids: Option<&[String]>,
    listed: impl IntoIterator<Item = (&'a DeadLetterId, bool)>,
) -> Result<Vec<DeadLetterId>, BrokerError> {
    let listed: Vec<(&DeadLetterId, bool)> = listed.into_iter().collect();
    let Some(ids) = ids else {
        return Ok(listed
            .into_iter()
            .filter(|(_, truncated)| !truncated)
            .map(|(id, _)| id.clone())
            .collect());
    };
    let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let known: HashSet<String> = listed.iter().map(|(id, _)| id.to_string()).collect();
    let mut named = HashSet::new();
    let missing: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| !known.contains(*id) && named.insert(*id))
        .collect();
    if !missing.is_empty() {
        return Err(BrokerError::Fatal(
            format!(
                "no dead letter with id {}; nothing requeued",
                missing.join(", ")
            )
            .into(),
        ));
    }
    let chosen: Vec<(&DeadLetterId, bool)> = listed
        .into_iter()
        .filter(|(id, _)| wanted.contains(id.to_string().as_str()))
        .collect();
    let truncated: Vec<String> = chosen
        .iter()
        .filter(|(_, truncated)| *truncated)
        .map(|(id, _)| id.to_string())
        .collect();
    if !truncated.is_empty() {
        return Err(BrokerError::Fatal(
            format!(
                "dead letter {} kept only the first bytes of its payload and cannot be \
                 requeued; nothing requeued",
                truncated.join(", ")
            )
            .into(),
        ));
    }
    Ok(chosen.into_iter().map(|(id, _)| id.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(texts: &[&str]) -> Vec<String> {
        texts.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn a_requeue_takes_exactly_the_ids_named_or_every_whole_one() {
        let listed = [
            (DeadLetterId::Number(3), false),
            (DeadLetterId::Number(5), true),
            (DeadLetterId::Number(8), false),
        ];
        let each = || listed.iter().map(|(id, truncated)| (id, *truncated));
        // All: the whole ones; the truncated one stays.
        assert_eq!(
            choose(None, each()).unwrap(),
            [DeadLetterId::Number(3), DeadLetterId::Number(8)]
        );
        // Named: each once, in the listed order.
        assert_eq!(
            choose(Some(&ids(&["8", "3", "8"])), each()).unwrap(),
            [DeadLetterId::Number(3), DeadLetterId::Number(8)]
        );
        // One unknown (or not a number) id: nothing, the unknown named.
        let error = choose(Some(&ids(&["3", "99", "x"])), each())
            .unwrap_err()
            .to_string();
        assert!(error.contains("99, x; nothing requeued"), "{error}");
        // A truncated one named: nothing.
        let error = choose(Some(&ids(&["3", "5"])), each())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("dead letter 5 kept only the first bytes"),
            "{error}"
        );
        let messages = [(DeadLetterId::Message("1234".into()), false)];
        let chosen = choose(
            Some(&ids(&["1234"])),
            messages.iter().map(|(id, t)| (id, *t)),
        );
        assert_eq!(chosen.unwrap(), [DeadLetterId::Message("1234".into())]);
    }
}
