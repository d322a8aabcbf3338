//! Leases on JetStream (an extended one is the broker contract's
//! `extended_lease_keeps_a_slow_message`): unextended, a slow message is
//! redelivered; a nack's delay is honoured; settling a delivery that
//! is gone (or whose consumer is) is a lost lease; and the tag's stream
//! sequence is read from both reply formats.

use super::*;

#[tokio::test]
async fn unextended_lease_expires_and_the_message_is_redelivered() {
    let streams = TestStreams::new(Duration::from_secs(1));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let first = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    let again = pull_within(&broker, Duration::from_secs(10)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    assert_eq!(again[0].payload, first.payload);
}

#[tokio::test]
async fn nack_delay_is_honoured() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    broker
        .nack(&delivery.tag, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        broker.pull(10).await.unwrap().is_empty(),
        "redelivered before its delay"
    );
    let again = pull_within(&broker, Duration::from_secs(20)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
}

#[tokio::test]
async fn settling_a_delivery_that_is_gone_is_a_lost_lease() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    broker.ack(&delivery.tag).await.unwrap();
    // Acked (by us here; by another consumer after our lease ran out, in
    // real life): the message is gone from the work queue.
    let late = broker.dead_letter(&delivery.tag, "too late").await;
    assert!(matches!(late, Err(BrokerError::LeaseLost(_))), "{late:?}");
    assert!(dead_letters(&streams.settings).await.is_empty());
    // A tag that is no JetStream reply names no lease either.
    let foreign = DeliveryTag::text("not.a.reply");
    let refused = broker.dead_letter(&foreign, "x").await;
    assert!(
        matches!(refused, Err(BrokerError::LeaseLost(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn settling_after_the_consumer_is_deleted_is_a_lost_lease() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = pull_within(&broker, Duration::from_secs(10))
        .await
        .remove(0);
    let client = async_nats::connect(streams.settings.url.as_str())
        .await
        .unwrap();
    jetstream::new(client)
        .get_stream(&streams.settings.stream)
        .await
        .unwrap()
        .delete_consumer(&streams.settings.consumer)
        .await
        .unwrap();
    // Nobody answers for the consumer any more: retrying cannot help.
    let acked = broker.ack(&delivery.tag).await;
    assert!(matches!(acked, Err(BrokerError::LeaseLost(_))), "{acked:?}");
}

#[tokio::test]
async fn stream_sequence_is_read_from_both_reply_formats() {
    let settings = TestStreams::new(Duration::from_secs(30)).settings.clone();
    let client = async_nats::connect(settings.url.as_str()).await.unwrap();
    let context = jetstream::new(client);
    let stream_sequence = |reply: &str| {
        let message = jetstream::Message {
            message: async_nats::Message {
                subject: "s".into(),
                reply: Some(reply.into()),
                payload: Bytes::new(),
                headers: None,
                status: None,
                description: None,
                length: 0,
            },
            context: context.clone(),
        };
        delivery(&message)
            .unwrap()
            .tag
            .as_text_and_number()
            .map(|(_, sequence)| sequence)
    };
    assert_eq!(stream_sequence("$JS.ACK.S.C.1.42.7.1700000000.0"), Some(42));
    assert_eq!(
        stream_sequence("$JS.ACK.domain.hash.S.C.1.42.7.1700000000.0.token"),
        Some(42)
    );
    assert_eq!(stream_sequence("not.a.reply"), None);
}
