//! The consumer: pulls (unary or streaming), leases kept here, settlements
//! batched through the settler.
//!
//! Pulling and the leases it takes are one state (a lease is kept from
//! the pull that made it to its settlement), so one file past 400 lines.

use super::leases::{DeliveryCounts, Leases};
use super::publisher::ensure_topic;
use super::*;

/// The consumer: see the module docs. It publishes too (into the topic it
/// consumes, and dead-letter copies).
pub(crate) struct PubSubBroker {
    pub(super) publisher: PubSubPublisher,
    pub(super) consumer: Leases,
}

impl fmt::Debug for PubSubBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubBroker")
            .field("subscription", &self.publisher.subscription)
            .field("topic", &self.publisher.requests.fully_qualified_name())
            .finish_non_exhaustive()
    }
}

impl PubSubBroker {
    /// Connects as a consumer: creates the topics and subscriptions if
    /// missing, and refuses an existing subscription whose settings differ
    /// from ours, naming each difference.
    pub(crate) async fn connect(options: PubSubOptions) -> Result<Self, BrokerError> {
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

impl PubSubBroker {
    #[cfg(feature = "bench")]
    /// Publishes many payloads, as [`PubSubPublisher::publish_all`].
    pub(crate) async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        self.publisher.publish_all(payloads).await
    }

    /// [`pull_once`](Self::pull_once), failed as unreachable if the service
    /// does not answer within `limit`.
    pub(super) async fn pull_once_within(
        &self,
        consumer: &Leases,
        max: usize,
        limit: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        tokio::time::timeout(limit, self.pull_once(consumer, max))
            .await
            .unwrap_or_else(|_elapsed| {
                Err(BrokerError::Unavailable(
                    format!("no answer to a pull within {limit:?}; is the service reachable?")
                        .into(),
                ))
            })
    }

    /// One `Pull` call that returns at once, its deliveries leased here.
    pub(super) async fn pull_once(
        &self,
        consumer: &Leases,
        max: usize,
    ) -> Result<Vec<Delivery>, BrokerError> {
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
    pub(super) async fn pull_streaming(
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
                    return Err(BrokerError::Unavailable(
                        format!("the stream on {} ended", self.publisher.subscription).into(),
                    ));
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
    pub(super) fn held(&self, tag: &DeliveryTag) -> Result<(&Leases, Arc<str>), BrokerError> {
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

    pub(super) async fn settle(
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

/// An ack id is long; logs get its end, which identifies it.
pub(super) fn short(tag: &DeliveryTag) -> String {
    let text = tag.to_string();
    let start = text.floor_char_boundary(text.len().saturating_sub(24));
    format!("…{}", &text[start..])
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
        let available = self.pull_once_within(consumer, max, limit).await?;
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
            tokio::time::sleep(
                self.publisher
                    .options
                    .settings
                    .poll_interval
                    .min(until - now),
            )
            .await;
            let pulled = self.pull_once_within(consumer, max, limit).await?;
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

    /// One `Publish` to the topic `destination` of the broker's project.
    async fn reply(&self, destination: &str, verdict: Bytes) -> Result<(), BrokerError> {
        let message = PubsubMessage {
            data: verdict.to_vec(),
            ..PubsubMessage::default()
        };
        let publisher =
            self.publisher
                .client
                .topic(destination)
                .new_publisher(Some(PublisherConfig {
                    workers: 1,
                    ..PublisherConfig::default()
                }));
        let published = publisher
            .publish_immediately(vec![message], quick_retry())
            .await;
        let mut publisher = publisher;
        publisher.shutdown().await;
        published.map(drop).map_err(|status| {
            classify(&format!("cannot publish a reply to {destination}"), &status)
        })
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
