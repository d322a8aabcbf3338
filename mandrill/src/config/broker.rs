//! `[broker]` (what every broker reads, and the adapters' own sections) and
//! `[store]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::broker::nats::NatsSettings;
use crate::broker::pubsub::PubSubSettings;
use crate::settings::{duration, settings};
use crate::sqlite::SqliteSettings;

settings! {
    /// `[broker]`: the settings every broker reads. What only one adapter
    /// reads is in its own section, owned by the adapter.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct BrokerSettings {
        /// `sqlite:PATH` (durable queue, by default in the store's file),
        /// `nats://[USER:PASSWORD@]HOST:PORT` (JetStream),
        /// `pubsub://PROJECT/SUBSCRIPTION` (Google Cloud Pub/Sub) or
        /// `memory` (in-process, nothing survives the process).
        pub url: String = "sqlite:mandrill.db".into(),
        /// How long a delivery stays leased without an extension (at least 1s).
        #[serde(with = "duration")]
        pub ack_deadline: Duration = Duration::from_secs(10),
        /// How long one pull waits for a first message.
        #[serde(with = "duration")]
        pub poll_wait: Duration = Duration::from_secs(1),
        /// Deliveries of a message before the worker records it as failed
        /// and dead-letters it, on every broker.
        ///
        /// The backstop for a message whose handler keeps crashing, losing
        /// its lease or being deferred. Brokers never give up by themselves
        /// (the JetStream consumer is created with `max_deliver = -1`).
        pub max_deliveries: u32 = 10,
        /// Where a request may ask for its final verdict to be published
        /// (its `reply_to`): glob patterns over NATS subjects or Pub/Sub
        /// topic ids (`*` spans dots), e.g. `["chaos.verdicts.*"]`.
        ///
        /// Empty (the default): a request naming a `reply_to` is denied. A
        /// request naming one no pattern admits is denied too, before
        /// anything counts. NATS and Pub/Sub only: the SQLite and in-process
        /// queues cannot carry replies, and refuse patterns at start-up.
        pub reply_to_allowed: Vec<String> = Vec::new(),
        /// `[broker.sqlite]`, when `url` is `sqlite:PATH`.
        pub sqlite: SqliteSettings = SqliteSettings::default(),
        /// `[broker.nats]`, when `url` is `nats://…`.
        pub nats: NatsSettings = NatsSettings::default(),
        /// `[broker.pubsub]`, when `url` is `pubsub://PROJECT/SUBSCRIPTION`.
        pub pubsub: PubSubSettings = PubSubSettings::default(),
    }
}

settings! {
    /// `[store]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct StoreSettings {
        /// `sqlite:PATH`, `postgres://…` or `memory`.
        pub url: String = "sqlite:mandrill.db".into(),
        /// Database pool size (1-1000; at least 2 with PostgreSQL).
        pub max_connections: u32 = 4,
        /// PostgreSQL: tasks committing claims and outcomes in groups (1-64;
        /// at most `max_connections - 1` run).
        ///
        /// Each keeps one pooled connection of its own.
        pub writers: u32 = crate::store::postgres::DEFAULT_WRITERS,
        /// How long finished requests stay in the history (0s: forever; at
        /// most 100 years).
        ///
        /// Older ones are pruned in the background, a bounded number of
        /// rows per pass; never sooner than a day and two minutes after
        /// they finished (a signed token is valid that long), nor while a
        /// guard still counts them.
        #[serde(with = "duration::long")]
        pub retention: Duration = Duration::from_secs(90 * 24 * 3600),
        /// The most one store call may take (1s-1h): past it the call
        /// fails as "timed out, outcome unknown" and is retried.
        ///
        /// Bounds a database that hangs rather than fails (stopped, or
        /// behind a network black hole): shutdown then takes at most
        /// `worker.shutdown_grace` plus three of these, and the admin API
        /// answers within one. PostgreSQL also cancels a statement or a lock
        /// wait at half of it and ends a session idle in a transaction at
        /// it.
        #[serde(with = "duration")]
        pub timeout: Duration = crate::store::DEFAULT_TIMEOUT,
    }
}
