//! The `{stream}_DEAD` stream: dead letters listed (by an ephemeral
//! consumer that acknowledges nothing, so listing changes nothing) and
//! requeued (published to the request subject, then deleted from the
//! dead-letter stream once the request stream confirmed it).

use std::collections::HashSet;

use super::publisher::dedup_id;
use super::*;
use crate::domain::Timestamp;

/// How long an empty batch of the listing waits for a first message, once
/// the stream said it holds some.
const LIST_WAIT: Duration = Duration::from_secs(2);
/// Messages asked for per batch of the listing.
const LIST_BATCH: usize = 1000;

/// A message of the dead-letter stream: its sequence there, when it was
/// stored, its headers and payload.
struct Stored {
    sequence: u64,
    dead_at: Timestamp,
    headers: HeaderMap,
    payload: Bytes,
}

impl NatsPublisher {
    /// The dead-letter stream's name.
    fn dead_letter_stream(&self) -> String {
        format!("{}_DEAD", self.settings.stream)
    }

    /// Every message the dead-letter stream holds, in order.
    async fn stored_dead_letters(&self) -> Result<Vec<Stored>, BrokerError> {
        let name = self.dead_letter_stream();
        let mut stream = self
            .jetstream
            .get_stream(&name)
            .await
            .map_err(|e| unavailable(&format!("cannot open stream {name}"), e))?;
        let held = stream
            .info()
            .await
            .map_err(|e| unavailable(&format!("cannot read stream {name}"), e))?
            .state
            .messages;
        if held == 0 {
            return Ok(Vec::new());
        }
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(&format!("cannot read stream {name}"), e))?;
        let read = read_all(&consumer).await;
        // Ephemeral: the server removes it after its inactive threshold
        // anyway, so a failed delete costs nothing.
        let _ = stream.delete_consumer(&consumer.cached_info().name).await;
        read.map_err(|e| unavailable(&format!("cannot read stream {name}"), e))
    }

    /// Publishes a dead letter's payload on the request subject again and
    /// waits for the stream to confirm it. Its de-duplication id is the
    /// digest of the bytes with the dead letter's sequence: distinct from
    /// the original's (which JetStream may still remember), the same for a
    /// second requeue of the same dead letter after a crash between publish
    /// and delete (stored once within the window), and, like every request's,
    /// never from a field a publisher chose.
    async fn publish_requeued(&self, payload: Bytes, sequence: u64) -> Result<(), BrokerError> {
        let message = PublishMessage::build()
            .message_id(format!("{}-requeued-{sequence}", dedup_id(&payload)))
            .payload(payload);
        self.publish_confirmed(self.settings.subject.clone(), message)
            .await
    }
}

/// Reads the consumer until it says nothing is pending.
async fn read_all(consumer: &PullConsumer) -> Result<Vec<Stored>, async_nats::Error> {
    let mut found = Vec::new();
    loop {
        let mut batch = consumer
            .batch()
            .max_messages(LIST_BATCH)
            .expires(LIST_WAIT)
            .messages()
            .await?;
        let mut pending = None;
        while let Some(message) = batch.next().await {
            let message = message?;
            let info = message.info()?;
            pending = Some(info.pending);
            let nanos = info.published.unix_timestamp_nanos() / 1_000_000;
            found.push(Stored {
                sequence: info.stream_sequence,
                dead_at: Timestamp::from_millis(i64::try_from(nanos).unwrap_or(0)),
                headers: message.headers.clone().unwrap_or_default(),
                payload: message.payload.clone(),
            });
        }
        // An empty batch: whatever was there was read (or deleted meanwhile).
        if matches!(pending, None | Some(0)) {
            return Ok(found);
        }
    }
}

/// A stored dead letter as listed: what its headers say.
fn entry(stored: Stored) -> DeadLetterEntry {
    let header = |name: &str| stored.headers.get(name).map(|v| v.as_str().to_owned());
    DeadLetterEntry {
        id: DeadLetterId::Number(stored.sequence),
        reason: header(DEAD_LETTER_REASON_HEADER).unwrap_or_default(),
        message_id: header(DEAD_LETTER_MESSAGE_ID_HEADER),
        dead_at: stored.dead_at,
        published_at: None,
        deliveries: None,
        payload_size: header(DEAD_LETTER_SIZE_HEADER)
            .and_then(|size| size.parse().ok())
            .unwrap_or(stored.payload.len() as u64),
        truncated: header(DEAD_LETTER_TRUNCATED_HEADER).as_deref() == Some("true"),
        payload: stored.payload,
    }
}

#[async_trait]
impl DeadLetterAdmin for NatsPublisher {
    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError> {
        Ok(self
            .stored_dead_letters()
            .await?
            .into_iter()
            .map(entry)
            .collect())
    }

    /// Each chosen dead letter published again, then deleted from the
    /// dead-letter stream, one at a time: a failure stops there, leaving it
    /// and the rest dead letters (those before it are requeued).
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError> {
        let listed: Vec<DeadLetterEntry> = self.dead_letters().await?;
        let chosen = choose(ids, listed.iter().map(|e| (&e.id, e.truncated)))?;
        let taken: HashSet<&DeadLetterId> = chosen.iter().collect();
        let name = self.dead_letter_stream();
        let stream = self
            .jetstream
            .get_stream(&name)
            .await
            .map_err(|e| unavailable(&format!("cannot open stream {name}"), e))?;
        for entry in listed.iter().filter(|e| taken.contains(&e.id)) {
            let DeadLetterId::Number(sequence) = entry.id else {
                continue;
            };
            self.publish_requeued(entry.payload.clone(), sequence)
                .await?;
            stream.delete_message(sequence).await.map_err(|e| {
                unavailable(
                    &format!(
                        "dead letter {sequence} was requeued but not deleted from {name} \
                         (requeued again after the stream's duplicate window, it is queued twice)"
                    ),
                    e,
                )
            })?;
        }
        Ok(chosen)
    }
}
