use super::*;

const DEADLINE: Duration = Duration::from_secs(10);

fn broker() -> MemoryBroker {
    MemoryBroker::new(DEADLINE, Duration::from_secs(1))
}

#[tokio::test(start_paused = true)]
async fn unextended_lease_expires_and_message_is_redelivered() {
    let broker = broker();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let first = broker.pull(10).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].attempt, 1);
    tokio::time::advance(DEADLINE + Duration::from_millis(1)).await;
    let again = broker.pull(10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    // The first lease is gone: settling it is refused.
    assert!(matches!(
        broker.ack(&first[0].tag).await,
        Err(BrokerError::LeaseLost(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn extended_lease_is_not_redelivered() {
    let broker = broker();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = broker.pull(10).await.unwrap().remove(0);
    for _ in 0..5 {
        tokio::time::advance(DEADLINE / 2).await;
        broker.extend(&delivery.tag).await.unwrap();
    }
    assert!(broker.pull(10).await.unwrap().is_empty());
    broker.ack(&delivery.tag).await.unwrap();
    assert_eq!(broker.depth(), Depth::default());
}

#[tokio::test(start_paused = true)]
async fn nack_delay_is_honoured() {
    let broker = broker();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = broker.pull(10).await.unwrap().remove(0);
    broker
        .nack(&delivery.tag, Duration::from_secs(5))
        .await
        .unwrap();
    let started = Instant::now();
    // The pull waits (in paused time) for the delay to pass, in several polls.
    let again = loop {
        let batch = broker.pull(10).await.unwrap();
        if !batch.is_empty() {
            break batch;
        }
    };
    assert!(started.elapsed() >= Duration::from_secs(5));
    assert_eq!(again[0].attempt, 2);
}

#[tokio::test(start_paused = true)]
async fn pull_waits_for_a_publish() {
    let broker = std::sync::Arc::new(broker());
    let puller = tokio::spawn({
        let broker = broker.clone();
        async move { broker.pull(10).await.unwrap() }
    });
    tokio::task::yield_now().await;
    broker.publish(Bytes::from_static(b"late")).await.unwrap();
    assert_eq!(puller.await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn settled_leases_do_not_accumulate_and_live_ones_still_expire() {
    let broker = broker();
    for _ in 0..3000 {
        broker.publish(Bytes::from_static(b"m")).await.unwrap();
    }
    let batch = broker.pull(3000).await.unwrap();
    let (kept, settled) = batch.split_first().unwrap();
    for delivery in settled {
        broker.ack(&delivery.tag).await.unwrap();
    }
    assert!(
        broker.lock().deadlines.len() <= 1024,
        "stale deadlines kept"
    );
    tokio::time::advance(DEADLINE + Duration::from_millis(1)).await;
    let again = broker.pull(10).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    assert!(matches!(
        broker.ack(&kept.tag).await,
        Err(BrokerError::LeaseLost(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn dead_letter_keeps_reason() {
    let broker = broker();
    broker.publish(Bytes::from_static(b"bad")).await.unwrap();
    let delivery = broker.pull(1).await.unwrap().remove(0);
    broker
        .dead_letter(&delivery.tag, "malformed")
        .await
        .unwrap();
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "malformed");
    assert_eq!(broker.depth().dead, 1);
}

#[tokio::test(start_paused = true)]
async fn dead_letter_reason_is_bounded() {
    let broker = broker();
    broker.publish(Bytes::from_static(b"bad")).await.unwrap();
    let delivery = broker.pull(1).await.unwrap().remove(0);
    let reason = "é".repeat(super::super::MAX_REASON_BYTES);
    broker.dead_letter(&delivery.tag, &reason).await.unwrap();
    let kept = &broker.dead_letters()[0].reason;
    assert!(
        kept.len() <= super::super::MAX_REASON_BYTES,
        "{}",
        kept.len()
    );
    assert!(kept.starts_with("éé"));
}

/// The broker contract, run on this broker.
mod contract_harness;
