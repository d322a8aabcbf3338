//! Against the NATS server on this machine (`MANDRILL_TEST_NATS` overrides
//! the address). Every test uses its own stream, subjects and consumer, and
//! deletes its streams afterwards. The fixtures and the broker contract's
//! harness are here; the tests, by behaviour, in `tests/`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use uuid::Uuid;

use super::consumer::delivery;
use super::*;

pub(crate) fn server_url() -> String {
    std::env::var("MANDRILL_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// Names unique to one test; the streams are deleted on drop.
pub(crate) struct TestStreams {
    pub settings: NatsOptions,
    /// Deletes the streams when dropped.
    _names: nats_names::StreamNames,
}

impl TestStreams {
    pub(crate) fn new(ack_wait: Duration) -> Self {
        let names = nats_names::StreamNames::new(&server_url(), "test");
        Self {
            settings: NatsOptions {
                url: names.url.clone(),
                stream: names.stream.clone(),
                subject: names.subject.clone(),
                consumer: names.consumer.clone(),
                dead_letter_subject: names.dead_letter_subject.clone(),
                ack_wait,
                max_ack_pending: 1000,
                poll_wait: Duration::from_millis(200),
                credentials: Credentials::None,
                tls: false,
                tls_ca_file: None,
            },
            _names: names,
        }
    }
}

/// NATS names of a test's own, one file shared with the integration tests
/// and the benchmark. Included by path, the one exception to the test
/// layout: those build against the library without `cfg(test)`, so they
/// cannot reach a test-only module of it.
#[path = "../../../tests/services/nats_names.rs"]
mod nats_names;

async fn pull_within(broker: &NatsBroker, deadline: Duration) -> Vec<Delivery> {
    let until = Instant::now() + deadline;
    loop {
        let batch = broker.pull(10).await.unwrap();
        if !batch.is_empty() || Instant::now() >= until {
            return batch;
        }
    }
}

/// The dead-letter stream's messages: payload and reason.
pub(crate) async fn dead_letters(settings: &NatsOptions) -> Vec<(Bytes, String)> {
    dead_letter_messages(settings)
        .await
        .into_iter()
        .map(|(payload, headers)| {
            let reason = headers
                .get(DEAD_LETTER_REASON_HEADER)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            (payload, reason)
        })
        .collect()
}

/// The dead-letter stream's messages: payload and headers.
async fn dead_letter_messages(settings: &NatsOptions) -> Vec<(Bytes, HeaderMap)> {
    let client = async_nats::connect(settings.url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    let stream = js
        .get_stream(format!("{}_DEAD", settings.stream))
        .await
        .unwrap();
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config::default())
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1000)
        .messages()
        .await
        .unwrap();
    let mut found = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.unwrap();
        found.push((
            message.payload.clone(),
            message.headers.clone().unwrap_or_default(),
        ));
    }
    found
}

mod contract_harness {
    use std::sync::Arc;

    use super::*;
    use crate::broker::contract::{Harness, Queue, StaleAck, Tolerance, broker_contract};

    const POLL_WAIT: Duration = Duration::from_millis(200);

    struct Nats;

    #[async_trait]
    impl Harness for Nats {
        fn tolerance(&self) -> Tolerance {
            Tolerance {
                ack_deadline: Duration::from_secs(1),
                nack_early: Duration::ZERO,
                counts_attempts: true,
                // The server answers a late ack of a redelivered message
                // without acting on it.
                stale_ack: StaleAck::Harmless,
                pull_bound: PULL_MARGIN,
            }
        }

        /// The shared server is not stopped here: `tests/scale_out.rs`
        /// stops and restarts a private one mid-run.
        async fn open(&self, _stoppable: bool) -> Queue {
            let streams = TestStreams::new(Duration::from_secs(1));
            let mut settings = streams.settings.clone();
            settings.poll_wait = POLL_WAIT;
            let consumer = Arc::new(NatsBroker::connect(settings.clone()).await.unwrap());
            let other = Arc::new(NatsBroker::connect(settings.clone()).await.unwrap());
            let admin = Arc::new(NatsPublisher::connect(settings.clone()).await.unwrap());
            Queue {
                consumer,
                other,
                dead_letters: Box::new(move || {
                    let settings = settings.clone();
                    Box::pin(async move { dead_letters(&settings).await })
                }),
                admin: Some(admin),
                stop_server: None,
                keep: Box::new(streams),
            }
        }
    }

    broker_contract!(Nats, POLL_WAIT);
}

mod consumers;
mod dead_lettering;
mod leases;
