//! The stream and the shared consumer: a message id published twice is
//! stored once; a consumer whose settings differ, or that limits
//! deliveries, is reported; the old delivery limit is lifted; and no secret
//! shows in the settings' debug output.

use super::*;

/// A retried publish of the same bytes is stored once: the de-duplication
/// id is their digest.
#[tokio::test]
async fn publishing_the_same_bytes_twice_stores_them_once() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let payload = Bytes::from(format!(
        r#"{{"message_id":"{}","instance_name":"cattle-dupe"}}"#,
        Uuid::new_v4()
    ));
    broker.publish(payload.clone()).await.unwrap();
    broker.publish(payload).await.unwrap();
    let first = pull_within(&broker, Duration::from_secs(10)).await;
    assert_eq!(first.len(), 1);
    broker.ack(&first[0].tag).await.unwrap();
    assert!(broker.pull(10).await.unwrap().is_empty());
}

/// A client allowed to publish on the subject, holding no key, sends garbage
/// with the real request's `message_id` as its `Nats-Msg-Id`: the real
/// request, published next through mandrill, is still stored and delivered.
#[tokio::test]
async fn garbage_under_a_requests_message_id_does_not_suppress_it() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let id = Uuid::new_v4();
    let real = Bytes::from(format!(
        r#"{{"message_id":"{id}","instance_name":"cattle-real"}}"#
    ));
    let forger = async_nats::connect(streams.settings.url.as_str())
        .await
        .unwrap();
    let forged = PublishMessage::build()
        .message_id(id.to_string())
        .payload(Bytes::from_static(b"garbage"));
    jetstream::new(forger)
        .send_publish(streams.settings.subject.clone(), forged)
        .await
        .unwrap()
        .await
        .unwrap();

    broker.publish(real.clone()).await.unwrap();

    let mut payloads = Vec::new();
    while payloads.len() < 2 {
        let batch = pull_within(&broker, Duration::from_secs(10)).await;
        assert!(!batch.is_empty(), "only {payloads:?} was delivered");
        for delivery in batch {
            broker.ack(&delivery.tag).await.unwrap();
            payloads.push(delivery.payload);
        }
    }
    assert!(payloads.contains(&real), "{payloads:?}");
}

#[tokio::test]
async fn existing_consumer_with_other_settings_is_reported() {
    let streams = TestStreams::new(Duration::from_secs(30));
    NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let mut changed = streams.settings.clone();
    changed.ack_wait = Duration::from_secs(10);
    let error = NatsBroker::connect(changed).await.unwrap_err().to_string();
    assert!(
        error.contains("ack_wait is 30s (configured 10s)"),
        "{error}"
    );
}

#[tokio::test]
async fn consumer_with_a_delivery_limit_is_reported() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let settings = &streams.settings;
    NatsPublisher::connect(settings.clone()).await.unwrap();
    // As an older mandrill created it: JetStream's own delivery limit.
    let client = async_nats::connect(settings.url.as_str()).await.unwrap();
    let stream = jetstream::new(client)
        .get_stream(&settings.stream)
        .await
        .unwrap();
    stream
        .create_consumer(pull::Config {
            durable_name: Some(settings.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: 10,
            max_ack_pending: settings.max_ack_pending,
            filter_subject: settings.subject.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let error = NatsBroker::connect(settings.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("max_deliver is 10 (configured -1)"),
        "{error}"
    );
}

#[tokio::test]
async fn consumer_redelivers_past_the_old_delivery_limit() {
    let streams = TestStreams::new(Duration::from_secs(30));
    let broker = NatsBroker::connect(streams.settings.clone()).await.unwrap();
    let info = broker.consumer().unwrap().cached_info();
    assert_eq!(info.config.max_deliver, -1);
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    // JetStream must not stop at broker.max_deliveries (10 by default) and
    // leave the message in the stream: the worker decides.
    for attempt in 1..=12 {
        let delivery = pull_within(&broker, Duration::from_secs(10))
            .await
            .remove(0);
        assert_eq!(delivery.attempt, attempt);
        broker.nack(&delivery.tag, Duration::ZERO).await.unwrap();
    }
}

#[test]
fn secrets_never_show_in_debug_output() {
    let credentials = Credentials::UserPassword {
        user: "mandrill".into(),
        password: Secret("hunter2".into()),
    };
    let printed = format!("{credentials:?}");
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("****"));
}
