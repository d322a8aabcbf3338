//! Pub/Sub: this run's own topic and subscription, and the bare loops
//! measured against it.

use std::time::{Duration, Instant};

use crate::broker::pubsub::{PubSubOptions, PubSubSettings, PullMode};
use crate::demo::random_request;
use bytes::Bytes;
use futures::StreamExt;
use uuid::Uuid;

/// Private topic and subscription names for one run on
/// `pubsub://PROJECT/PREFIX`.
pub(super) fn pubsub_options(url: &str, pull: &str, n: usize) -> PubSubOptions {
    let (project, prefix) = crate::broker::pubsub::settings::parse_url(url).expect("pubsub url");
    let id = &Uuid::new_v4().simple().to_string()[..12];
    PubSubOptions {
        project,
        subscription: format!("{prefix}-{id}"),
        settings: PubSubSettings {
            topic: format!("{prefix}-{id}-requests"),
            dead_letter_topic: format!("{prefix}-{id}-dead"),
            dead_letter_subscription: format!("{prefix}-{id}-dead"),
            pull: match pull {
                "unary" => PullMode::Unary,
                "streaming" => PullMode::Streaming,
                other => panic!("--pull {other:?}: expected unary or streaming"),
            },
            poll_interval: Duration::from_millis(10),
            ..PubSubSettings::default()
        },
        ack_deadline: Duration::from_secs(60),
        poll_wait: Duration::from_millis(100),
        max_deliveries: 10,
        max_in_flight: n.max(1),
    }
}

/// The ceilings: bare loops on subscriptions of their own, each taking `n`
/// messages and acking them in batches, with no other work. Returns
/// (streaming, unary) in messages per second.
pub(super) async fn bare_pubsub_rates(options: &PubSubOptions, n: usize) -> (f64, f64) {
    use gcloud_pubsub::client::{Client, ClientConfig};
    use gcloud_pubsub::subscriber::SubscriberConfig;
    use gcloud_pubsub::subscription::{SubscribeConfig, SubscriptionConfig};

    let config = ClientConfig {
        project_id: Some(options.project.clone()),
        ..ClientConfig::default()
    };
    let client = Client::new(config).await.expect("pubsub client");
    let mut rng = rand::rng();
    let payloads: Vec<Bytes> = (0..n)
        .map(|_| Bytes::from(random_request(&mut rng).to_wire()))
        .collect();
    let mut rates = Vec::new();
    for mode in ["streaming", "unary"] {
        let topic_id = format!("{}-bare-{mode}", options.subscription);
        let topic = client
            .create_topic(&topic_id, None, None)
            .await
            .expect("bare topic");
        let subscription = client
            .create_subscription(
                &topic_id,
                &topic_id,
                SubscriptionConfig {
                    ack_deadline_seconds: 60,
                    ..SubscriptionConfig::default()
                },
                None,
            )
            .await
            .expect("bare subscription");
        let publisher = topic.new_publisher(None);
        for chunk in payloads.chunks(1000) {
            let messages = chunk
                .iter()
                .map(|payload| gcloud_googleapis::pubsub::v1::PubsubMessage {
                    data: payload.to_vec(),
                    ..Default::default()
                })
                .collect();
            publisher
                .publish_immediately(messages, None)
                .await
                .expect("bare publish");
        }
        let started = Instant::now();
        let mut acked = 0;
        if mode == "streaming" {
            let config = SubscribeConfig::default().with_subscriber_config(SubscriberConfig {
                max_outstanding_messages: 1000,
                ..SubscriberConfig::default()
            });
            let mut stream = subscription
                .subscribe(Some(config))
                .await
                .expect("bare stream")
                .ready_chunks(1000);
            while acked < n {
                let chunk = stream.next().await.expect("stream open");
                acked += chunk.len();
                let ids = chunk.into_iter().map(|m| m.ack_id).collect();
                subscription.ack(ids).await.expect("bare ack");
            }
            stream.into_inner().dispose().await;
        } else {
            while acked < n {
                let batch = subscription.pull(1000, None).await.expect("bare pull");
                acked += batch.len();
                let ids = batch.into_iter().map(|m| m.ack_id).collect();
                subscription.ack(ids).await.expect("bare ack");
            }
        }
        rates.push(n as f64 / started.elapsed().as_secs_f64());
        let _ = subscription.delete(None).await;
        let _ = topic.delete(None).await;
    }
    (rates[0], rates[1])
}
