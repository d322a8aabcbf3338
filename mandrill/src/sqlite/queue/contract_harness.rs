use std::sync::Arc;

use super::*;
use crate::broker::contract::{Harness, Queue, StaleAck, Tolerance, broker_contract};

const POLL_WAIT: Duration = Duration::from_millis(50);

struct Sqlite;

#[async_trait]
impl Harness for Sqlite {
    fn tolerance(&self) -> Tolerance {
        Tolerance {
            ack_deadline: Duration::from_secs(1),
            // Deadlines are milliseconds in the table.
            nack_early: Duration::from_millis(1),
            counts_attempts: true,
            stale_ack: StaleAck::Refused,
            pull_bound: Duration::ZERO,
        }
    }

    async fn open(&self, _stoppable: bool) -> Queue {
        let dir = tempfile::tempdir().unwrap();
        let config = SqliteOptions {
            url: format!("sqlite:{}", dir.path().join("queue.db").display()),
            ack_deadline: Duration::from_secs(1),
            poll_wait: POLL_WAIT,
            poll_interval: Duration::from_millis(10),
        };
        let consumer = Arc::new(SqliteBroker::connect(&config).await.unwrap());
        // Another process on the same file.
        let other = Arc::new(SqliteBroker::connect(&config).await.unwrap());
        let reader = consumer.clone();
        let admin = Some(consumer.clone() as Arc<dyn DeadLetterAdmin>);
        Queue {
            consumer,
            other,
            dead_letters: Box::new(move || {
                let reader = reader.clone();
                Box::pin(async move {
                    reader
                        .dead_letters()
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|d| (d.payload, d.reason))
                        .collect()
                })
            }),
            admin,
            stop_server: None,
            keep: Box::new(dir),
        }
    }
}

broker_contract!(Sqlite, POLL_WAIT);
