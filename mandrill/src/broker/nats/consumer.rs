//! The consumer: pulls from the shared durable consumer, settles by reply
//! subject, dead-letters by copy then `+TERM`.

use super::dead_letter::dead_letter_copy;
use super::*;

/// The consumer: see the module docs. It publishes too (into the stream it
/// consumes, and dead-letter copies).
pub(crate) struct NatsBroker {
    pub(super) publisher: NatsPublisher,
    pub(super) consumer: PullConsumer,
}

impl fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsBroker")
            .field("stream", &self.publisher.settings.stream)
            .field("consumer", &self.publisher.settings.consumer)
            .finish_non_exhaustive()
    }
}

impl NatsBroker {
    /// Connects as a consumer: creates the stream, the dead-letter stream and
    /// the consumer if missing, and checks an existing consumer's settings
    /// against ours.
    pub(crate) async fn connect(settings: NatsOptions) -> Result<Self, BrokerError> {
        let publisher = NatsPublisher::connect(settings).await?;
        let consumer = publisher.open_consumer().await?;
        Ok(Self {
            publisher,
            consumer,
        })
    }
}

impl NatsBroker {
    /// The consumer, as JetStream describes it.
    #[cfg(test)]
    pub(super) fn consumer(&self) -> Result<&PullConsumer, BrokerError> {
        Ok(&self.consumer)
    }

    /// Leases what is available now, up to `max`, without waiting.
    pub(super) async fn fetch_available(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
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
    pub(super) async fn wait_for_one(&self) -> Result<Vec<Delivery>, BrokerError> {
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

    pub(super) fn reply<'a>(&self, tag: &'a DeliveryTag) -> Result<&'a str, BrokerError> {
        tag.as_text()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))
    }

    pub(super) async fn send(&self, tag: &DeliveryTag, kind: AckKind) -> Result<(), BrokerError> {
        let reply = self.reply(tag)?.to_owned();
        self.publisher
            .client
            .publish(reply, kind.into())
            .await
            .map_err(|e| unavailable(&format!("cannot settle {tag}"), e))
    }

    /// Sends an acknowledgement and waits for the server to confirm it.
    pub(super) async fn send_confirmed(
        &self,
        tag: &DeliveryTag,
        kind: AckKind,
    ) -> Result<(), BrokerError> {
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
pub(super) fn mismatches(
    existing: &jetstream::consumer::Config,
    wanted: &pull::Config,
) -> Vec<String> {
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

pub(super) async fn collect(mut batch: pull::Batch) -> Result<Vec<Delivery>, BrokerError> {
    let mut deliveries = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.map_err(|e| unavailable("pull interrupted", e))?;
        let Some(delivery) = delivery(&message) else {
            warn!("message without a reply subject; not a jetstream delivery, skipped");
            continue;
        };
        deliveries.push(delivery);
    }
    Ok(deliveries)
}

/// A pulled message as a delivery: tagged with its reply subject (to settle
/// it by) and its stream sequence (to read it back for a dead-letter copy),
/// both as JetStream's reply subject carries them (`message.info()`). A
/// reply that is not JetStream's gets a tag without a sequence: it can be
/// settled, and a dead letter of it is a lost lease. `None` without a reply.
pub(super) fn delivery(message: &jetstream::Message) -> Option<Delivery> {
    let reply = message.reply.as_ref()?;
    let (tag, attempt) = match message.info() {
        Ok(info) => (
            DeliveryTag::text_and_number(reply.as_str(), info.stream_sequence),
            u32::try_from(info.delivered).unwrap_or(u32::MAX),
        ),
        Err(_) => (DeliveryTag::text(reply.as_str()), 1),
    };
    Some(Delivery::new(tag, message.payload.clone(), attempt))
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
            Err(BrokerError::Unavailable(
                format!("no answer to a pull within {limit:?}; is the server reachable?").into(),
            ))
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
        let (_, sequence) = tag
            .as_text_and_number()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
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

    /// A core NATS publish, flushed: a subscriber on the subject hears it,
    /// and a stream that captures the subject keeps it.
    async fn reply(&self, destination: &str, verdict: Bytes) -> Result<(), BrokerError> {
        let client = &self.publisher.client;
        client
            .publish(destination.to_owned(), verdict)
            .await
            .map_err(|e| unavailable(&format!("cannot publish a reply to {destination}"), e))?;
        client
            .flush()
            .await
            .map_err(|e| unavailable(&format!("reply to {destination} not flushed"), e))
    }
}

impl NatsBroker {
    /// The payload of a delivery, read back from the stream by its sequence
    /// (in the reply subject), so that dead-lettering needs no cached copy.
    pub(super) async fn original_payload(
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
