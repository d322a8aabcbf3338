//! What a consumer keeps of each delivery: its lease (deadline, message id,
//! payload for a dead-letter copy) and, when the subscription does not
//! count deliveries, the count this process saw.

use super::*;

/// What a consumer keeps: its leases and how it settles them.
pub(super) struct Leases {
    pub(super) settler: Settler,
    /// The leases this process holds, by ack id. A `std` mutex: held for a
    /// map operation, never across an await.
    pub(super) leases: Mutex<HashMap<Arc<str>, Lease>>,
    /// Deliveries seen per message id, when the service does not count them.
    pub(super) counted: Option<Mutex<DeliveryCounts>>,
    /// With `pull = "streaming"`: the open stream (`None` until opened, and
    /// again after it ended). Locked by the one pull running at a time.
    pub(super) stream: Option<tokio::sync::Mutex<Option<MessageStream>>>,
}

pub(super) struct Lease {
    /// When the lease runs out, as far as this process can tell.
    pub(super) deadline: Instant,
    pub(super) message_id: String,
    pub(super) payload: Bytes,
}

#[derive(Default)]
pub(super) struct DeliveryCounts {
    pub(super) counts: HashMap<String, (u32, Instant)>,
}

impl DeliveryCounts {
    pub(super) fn record(&mut self, message_id: &str, now: Instant, forget_after: Duration) -> u32 {
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

impl Leases {
    pub(super) fn lease(
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
    pub(super) fn release(&self, ack_id: &str, settled: bool) -> Option<Lease> {
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

    pub(super) fn forget(&self, ack_id: &str) {
        self.release(ack_id, false);
    }
}
