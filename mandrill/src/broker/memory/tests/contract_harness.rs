use std::sync::Arc;

use super::*;
use crate::broker::contract::{Harness, Queue, StaleAck, Tolerance, broker_contract};

const POLL_WAIT: Duration = Duration::from_millis(50);

struct Memory;

#[async_trait]
impl Harness for Memory {
    fn tolerance(&self) -> Tolerance {
        Tolerance {
            ack_deadline: Duration::from_secs(1),
            nack_early: Duration::ZERO,
            counts_attempts: true,
            stale_ack: StaleAck::Refused,
            pull_bound: Duration::ZERO,
        }
    }

    async fn open(&self, _stoppable: bool) -> Queue {
        let broker = Arc::new(MemoryBroker::new(Duration::from_secs(1), POLL_WAIT));
        let reader = broker.clone();
        Queue {
            consumer: broker.clone(),
            // One process's broker: both consumers share it.
            other: broker,
            dead_letters: Box::new(move || {
                let dead = reader
                    .dead_letters()
                    .into_iter()
                    .map(|d| (d.payload, d.reason))
                    .collect();
                Box::pin(async move { dead })
            }),
            admin: None,
            stop_server: None,
            keep: Box::new(()),
        }
    }
}

broker_contract!(Memory, POLL_WAIT);
