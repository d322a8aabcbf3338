//! The contract's dead-letter promises: a dead letter keeps its reason and
//! is not redelivered; where dead letters live outside the process, they
//! are listed and requeued as `mandrill dead-letters` and `requeue` do.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Harness, PATIENCE, pull_during, pull_n};
use crate::broker::{BrokerError, DeadLetterId};
use crate::domain::Timestamp;

pub(crate) async fn dead_letter_keeps_the_reason(harness: &dyn Harness) {
    let tolerance = harness.tolerance();
    let queue = harness.open(false).await;
    queue
        .consumer
        .publish(Bytes::from_static(b"poison"))
        .await
        .unwrap();
    let delivery = pull_n(&*queue.consumer, 1).await.remove(0);
    queue
        .consumer
        .dead_letter(&delivery.tag, "payload is not a valid request")
        .await
        .unwrap();
    let give_up = Instant::now() + PATIENCE;
    let dead = loop {
        let dead = (queue.dead_letters)().await;
        if !dead.is_empty() || Instant::now() > give_up {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        dead,
        vec![(
            Bytes::from_static(b"poison"),
            "payload is not a valid request".to_owned()
        )]
    );
    let again = pull_during(&*queue.other, tolerance.ack_deadline * 2).await;
    assert!(again.is_empty(), "redelivered after dead-letter: {again:?}");
    drop(queue.keep);
}

/// What `mandrill dead-letters` lists and `requeue` puts back, on every
/// broker that keeps its dead letters outside the process: a dead letter is
/// listed with its reason, the `message_id` its payload carried, when, and
/// its payload; an unknown id requeues nothing; a requeued one is delivered
/// again as a new message and listed no more.
pub(crate) async fn dead_letters_are_listed_and_requeued(harness: &dyn Harness) {
    let queue = harness.open(false).await;
    let Some(admin) = queue.admin.clone() else {
        return;
    };
    let message_id = "4a1b3c5d-0000-4000-8000-00000000dead";
    let payload = Bytes::from(format!(r#"{{"message_id":"{message_id}","junk":true}}"#));
    let before = Timestamp::from_millis(Timestamp::now().as_millis() - 60_000);
    queue.consumer.publish(payload.clone()).await.unwrap();
    let delivery = pull_n(&*queue.consumer, 1).await.remove(0);
    queue
        .consumer
        .dead_letter(&delivery.tag, "payload is not a valid request")
        .await
        .unwrap();
    let give_up = Instant::now() + PATIENCE;
    let listed = loop {
        let listed = admin.dead_letters().await.unwrap();
        if !listed.is_empty() || Instant::now() > give_up {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listed.len(), 1, "{listed:?}");
    let dead = &listed[0];
    assert_eq!(dead.reason, "payload is not a valid request");
    assert_eq!(dead.message_id.as_deref(), Some(message_id));
    assert_eq!(dead.payload, payload);
    assert_eq!(dead.payload_size, payload.len() as u64);
    assert!(!dead.truncated);
    assert!(dead.dead_at >= before, "dead at {}", dead.dead_at);

    let unknown = admin.requeue(Some(&["99999".to_owned()])).await;
    assert!(
        matches!(&unknown, Err(BrokerError::Fatal(cause)) if cause.to_string().contains("99999")),
        "{unknown:?}"
    );
    assert_eq!(
        admin.dead_letters().await.unwrap().len(),
        1,
        "an unknown id requeued something"
    );
    let id: DeadLetterId = dead.id.clone();
    let requeued = admin.requeue(Some(&[id.to_string()])).await.unwrap();
    assert_eq!(requeued, [id]);
    let again = pull_n(&*queue.other, 1).await.remove(0);
    assert_eq!(again.payload, payload);
    assert_eq!(again.attempt, 1, "a requeued dead letter is a new message");
    queue.other.ack(&again.tag).await.unwrap();
    assert!(admin.dead_letters().await.unwrap().is_empty());
    admin.close().await;
    drop(queue.keep);
}
