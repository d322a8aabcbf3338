//! An in-process broker with real lease semantics, for demos, tests and the
//! pipeline benchmark. Nothing survives the process.
//!
//! Time is `tokio::time`, so tests with paused time drive lease expiry and
//! redelivery delays deterministically.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
// Keys are this broker's own sequence numbers, never chosen by a sender: a
// fast hash needs no protection from collisions (SipHash's reason to be).
use foldhash::HashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{BrokerError, Close, Consumer, Delivery, DeliveryTag, Publisher, bounded_reason};

/// A message kept for dead-letter inspection (by tests).
#[derive(Debug, Clone)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct DeadLetter {
    /// The payload as delivered.
    pub payload: Bytes,
    /// Why it was dead-lettered.
    pub reason: String,
}

/// Counts of where messages are, for tests and `--until-idle`-style checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Depth {
    /// Visible now.
    pub ready: usize,
    /// Nacked with a delay that has not passed yet.
    pub delayed: usize,
    /// Leased to a consumer.
    pub leased: usize,
    /// Dead-lettered.
    pub dead: usize,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct MemoryBroker {
    ack_deadline: Duration,
    poll_wait: Duration,
    /// A `std::sync::Mutex` because every critical section is short and never
    /// awaits; an async mutex would only add overhead.
    state: Mutex<State>,
    /// Woken on publish and nack, so a long-polling pull returns promptly.
    available: Notify,
}

#[derive(Debug)]
struct Message {
    payload: Bytes,
    deliveries: u32,
}

#[derive(Debug)]
struct Lease {
    message: Message,
    deadline: Instant,
}

#[derive(Debug, Default)]
struct State {
    next_tag: u64,
    ready: VecDeque<Message>,
    /// Nacked messages by the time they become visible; `seq` breaks ties and
    /// keeps the heap from comparing payloads.
    delayed: BinaryHeap<Reverse<(Instant, u64)>>,
    delayed_messages: HashMap<u64, Message>,
    leased: HashMap<u64, Lease>,
    /// Lease deadlines, possibly stale: an entry counts only if the lease
    /// still exists with that same deadline. Stale entries are dropped lazily.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    dead: Vec<DeadLetter>,
}

impl MemoryBroker {
    /// A broker whose leases last `ack_deadline` and whose pulls wait up to
    /// `poll_wait` for a first message.
    pub(crate) fn new(ack_deadline: Duration, poll_wait: Duration) -> Self {
        Self {
            ack_deadline,
            poll_wait,
            state: Mutex::new(State::default()),
            available: Notify::new(),
        }
    }

    #[cfg(feature = "bench")]
    /// As [`Self::new`], with room for `messages` waiting messages before
    /// its queue grows: growing a queue of a million copies it while every
    /// publish and pull waits on the lock (the benchmark publishes all its
    /// messages ahead of the worker).
    pub(crate) fn with_capacity(
        ack_deadline: Duration,
        poll_wait: Duration,
        messages: usize,
    ) -> Self {
        let broker = Self::new(ack_deadline, poll_wait);
        broker.lock().ready.reserve(messages);
        broker
    }

    /// Where the messages are now.
    pub(crate) fn depth(&self) -> Depth {
        let state = self.lock();
        Depth {
            ready: state.ready.len(),
            delayed: state.delayed_messages.len(),
            leased: state.leased.len(),
            dead: state.dead.len(),
        }
    }

    /// The dead-lettered messages so far.
    #[cfg(test)]
    pub(crate) fn dead_letters(&self) -> Vec<DeadLetter> {
        self.lock().dead.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock would be a bug in this file; there
        // is no state worth saving after one, so propagate it.
        self.state.lock().expect("memory broker state poisoned")
    }

    fn settle(&self, tag: &DeliveryTag) -> Result<Message, BrokerError> {
        let lease = tag
            .as_number()
            .and_then(|n| {
                let mut state = self.lock();
                let lease = state.leased.remove(&n);
                state.prune_deadlines();
                lease
            })
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        Ok(lease.message)
    }
}

impl State {
    /// Moves due delayed messages and expired leases to `ready`; returns when
    /// the next of either falls due.
    fn release_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(Reverse((at, seq))) = self.delayed.peek().copied() {
            if at > now {
                break;
            }
            self.delayed.pop();
            if let Some(message) = self.delayed_messages.remove(&seq) {
                self.ready.push_back(message);
            }
        }
        while let Some(Reverse((deadline, tag))) = self.deadlines.peek().copied() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            if self
                .leased
                .get(&tag)
                .is_some_and(|l| l.deadline == deadline)
            {
                // Expired: redeliver, as a real broker would.
                let lease = self.leased.remove(&tag).expect("checked just above");
                tracing::debug!(tag, "lease expired; message redelivered");
                self.ready.push_back(lease.message);
            }
        }
        let next_delayed = self.delayed.peek().map(|Reverse((at, _))| *at);
        let next_deadline = self.deadlines.peek().map(|Reverse((at, _))| *at);
        next_delayed.into_iter().chain(next_deadline).min()
    }

    /// Drops stale deadline entries once they far outnumber live leases, so
    /// that the heap stays proportional to what is in flight rather than to
    /// everything delivered within one ack deadline.
    fn prune_deadlines(&mut self) {
        if self.deadlines.len() > 1024 && self.deadlines.len() > 4 * self.leased.len() {
            let leased = &self.leased;
            self.deadlines.retain(|Reverse((deadline, tag))| {
                leased.get(tag).is_some_and(|l| l.deadline == *deadline)
            });
        }
    }

    fn lease_batch(&mut self, max: usize, now: Instant, ack_deadline: Duration) -> Vec<Delivery> {
        let count = max.min(self.ready.len());
        let deadline = now + ack_deadline;
        let mut batch = Vec::with_capacity(count);
        for mut message in self.ready.drain(..count) {
            self.next_tag += 1;
            let tag = self.next_tag;
            message.deliveries += 1;
            batch.push(Delivery::new(
                DeliveryTag::number(tag),
                message.payload.clone(),
                message.deliveries,
            ));
            self.leased.insert(tag, Lease { message, deadline });
            self.deadlines.push(Reverse((deadline, tag)));
        }
        batch
    }
}

impl Close for MemoryBroker {}

#[async_trait]
impl Publisher for MemoryBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.lock().ready.push_back(Message {
            payload,
            deliveries: 0,
        });
        self.available.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl Consumer for MemoryBroker {
    fn lease(&self) -> Option<Duration> {
        Some(self.ack_deadline)
    }

    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        let give_up_at = Instant::now() + self.poll_wait;
        loop {
            // Armed before looking at the state, so that a publish between the
            // look and the wait still wakes us.
            let notified = self.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = Instant::now();
            let next_due = {
                let mut state = self.lock();
                let next_due = state.release_due(now);
                if !state.ready.is_empty() {
                    return Ok(state.lease_batch(max, now, self.ack_deadline));
                }
                next_due
            };
            if now >= give_up_at {
                return Ok(Vec::new());
            }
            let wake_at = next_due.map_or(give_up_at, |due| due.min(give_up_at));
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.settle(tag).map(drop)
    }

    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        let message = self.settle(tag)?;
        {
            let mut state = self.lock();
            if delay.is_zero() {
                state.ready.push_back(message);
            } else {
                state.next_tag += 1;
                let seq = state.next_tag;
                state.delayed.push(Reverse((Instant::now() + delay, seq)));
                state.delayed_messages.insert(seq, message);
            }
        }
        self.available.notify_waiters();
        Ok(())
    }

    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        let deadline = Instant::now() + self.ack_deadline;
        let mut state = self.lock();
        let number = tag
            .as_number()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        let lease = state
            .leased
            .get_mut(&number)
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        lease.deadline = deadline;
        state.deadlines.push(Reverse((deadline, number)));
        Ok(())
    }

    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        let message = self.settle(tag)?;
        self.lock().dead.push(DeadLetter {
            payload: message.payload,
            // Bounded as every broker bounds it, so that tests on this broker
            // see what the others keep.
            reason: bounded_reason(reason).into_owned(),
        });
        Ok(())
    }

    async fn backlog(&self) -> Result<Option<u64>, BrokerError> {
        let depth = self.depth();
        Ok(Some((depth.ready + depth.delayed + depth.leased) as u64))
    }
}

#[cfg(test)]
mod tests;
