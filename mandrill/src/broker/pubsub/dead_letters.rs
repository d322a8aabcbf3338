//! The dead-letter subscription: listed, released, requeued.

use std::collections::HashSet;

use super::*;
use crate::domain::Timestamp;

impl PubSubPublisher {
    /// Pulls from the dead-letter subscription: each dead letter's payload,
    /// reason and ack id (to acknowledge with [`Self::forget_dead_letters`]
    /// once handled). The messages stay leased for one ack deadline.
    pub(crate) async fn pull_dead_letters(
        &self,
        max: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
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
                let attribute = |name: &str| message.attributes.get(name).cloned();
                let dead_at = message.publish_time.map_or(0, |time| {
                    time.seconds.saturating_mul(1000) + i64::from(time.nanos / 1_000_000)
                });
                Some(DeadLetter {
                    ack_id: received.ack_id,
                    reason: attribute(DEAD_LETTER_REASON_ATTRIBUTE).unwrap_or_default(),
                    request_id: attribute(MESSAGE_ID_ATTRIBUTE),
                    dead_at: Timestamp::from_millis(dead_at),
                    message_id: message.message_id,
                    payload: Bytes::from(message.data),
                })
            }));
        }
        Ok(found)
    }

    /// Acknowledges dead letters pulled by [`Self::pull_dead_letters`].
    pub(crate) async fn forget_dead_letters(
        &self,
        ack_ids: Vec<String>,
    ) -> Result<(), BrokerError> {
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
    pub(crate) async fn release_dead_letters(
        &self,
        ack_ids: Vec<String>,
    ) -> Result<(), BrokerError> {
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
pub(crate) struct DeadLetter {
    /// To acknowledge it once requeued or handled.
    pub ack_id: String,
    /// The dead-letter copy's Pub/Sub id.
    pub message_id: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// The `message_id` the payload carried, if any (unverified).
    pub request_id: Option<String>,
    /// When the copy was published: when it was dead-lettered.
    pub dead_at: Timestamp,
    /// The original payload.
    pub payload: Bytes,
}

#[async_trait]
impl DeadLetterAdmin for PubSubPublisher {
    /// What the dead-letter subscription holds: pulled, then released at
    /// once (it stays there).
    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError> {
        let dead = self.pull_dead_letters(usize::MAX).await?;
        let ack_ids = dead.iter().map(|d| d.ack_id.clone()).collect();
        self.release_dead_letters(ack_ids).await.map_err(|error| {
            BrokerError::Unavailable(
                format!("cannot release the dead letters after listing them: {error}").into(),
            )
        })?;
        Ok(dead
            .into_iter()
            .map(|d| DeadLetterEntry {
                id: DeadLetterId::Message(d.message_id),
                reason: d.reason,
                message_id: d.request_id,
                dead_at: d.dead_at,
                published_at: None,
                deliveries: None,
                payload_size: d.payload.len() as u64,
                payload: d.payload,
                truncated: false,
            })
            .collect())
    }

    /// Publishes the chosen dead letters (by the id they are listed with,
    /// or all) to the request topic again, then acknowledges them; the rest
    /// are released. Returns the ids requeued.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError> {
        let dead = self.pull_dead_letters(usize::MAX).await?;
        let listed: Vec<DeadLetterId> = dead
            .iter()
            .map(|d| DeadLetterId::Message(d.message_id.clone()))
            .collect();
        let taken: HashSet<DeadLetterId> = match choose(ids, listed.iter().map(|id| (id, false))) {
            Ok(chosen) => chosen.into_iter().collect(),
            Err(error) => {
                // Nothing requeued: what was pulled is visible again at once.
                let _ = self
                    .release_dead_letters(dead.into_iter().map(|d| d.ack_id).collect())
                    .await;
                return Err(error);
            }
        };
        let (chosen, others): (Vec<DeadLetter>, Vec<DeadLetter>) = dead
            .into_iter()
            .partition(|d| taken.contains(&DeadLetterId::Message(d.message_id.clone())));
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
