//! The publishing connection: clients, topics and subscriptions checked
//! or created, messages published in as few calls as the service allows.

use super::*;

/// A connection that publishes and administers dead letters: it checks
/// that the topic and the subscription exist and changes neither.
pub(crate) struct PubSubPublisher {
    /// Publishes requests (one call each, never the crate's batching).
    pub(super) publisher: TopicPublisher,
    /// Publishes dead-letter copies.
    pub(super) dead_letter_publisher: TopicPublisher,
    pub(super) requests: Topic,
    pub(super) dead_letters: Topic,
    pub(super) subscriber: SubscriberClient,
    /// The request subscription, for streaming pulls.
    pub(super) handle: SubscriptionHandle,
    pub(super) options: PubSubOptions,
    /// The subscription's full name.
    pub(super) subscription: String,
    /// The client, for a reply to a topic of the requester's choosing
    /// (admitted by the operator's patterns).
    pub(super) client: Client,
}

impl fmt::Debug for PubSubPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubPublisher")
            .field("subscription", &self.subscription)
            .field("topic", &self.requests.fully_qualified_name())
            .finish_non_exhaustive()
    }
}

impl PubSubPublisher {
    /// Connects as a publisher: checks that the topic and the subscription
    /// exist (a topic without a subscription drops what is published to it)
    /// and changes neither.
    pub(crate) async fn connect(options: PubSubOptions) -> Result<Self, BrokerError> {
        let broker = Self::connect_clients(options).await?;
        let request = GetSubscriptionRequest {
            subscription: broker.subscription.clone(),
        };
        match broker
            .subscriber
            .get_subscription(request, no_retry())
            .await
        {
            Ok(existing) if existing.get_ref().topic == broker.requests.fully_qualified_name() => {
                Ok(broker)
            }
            Ok(existing) => Err(BrokerError::Fatal(
                format!(
                    "subscription {} reads topic {}, not {}: check broker.pubsub.topic",
                    broker.subscription,
                    existing.get_ref().topic,
                    broker.requests.fully_qualified_name()
                )
                .into(),
            )),
            Err(status) if status.code() == Code::NotFound => Err(BrokerError::Fatal(
                format!(
                    "subscription {} does not exist, and Pub/Sub drops messages published to a \
                 topic no subscription reads: start a consumer (`mandrill run`) once to create it",
                    broker.subscription
                )
                .into(),
            )),
            Err(status) => Err(classify(
                &format!("cannot read subscription {}", broker.subscription),
                &status,
            )),
        }
    }

    pub(super) async fn connect_clients(options: PubSubOptions) -> Result<Self, BrokerError> {
        install_crypto_provider();
        let endpoint = match &options.settings.endpoint {
            Some(endpoint) => {
                settings::parse_endpoint(endpoint).map_err(|why| BrokerError::Fatal(why.into()))?
            }
            None => match std::env::var("PUBSUB_EMULATOR_HOST") {
                Ok(host) if !host.is_empty() => Endpoint::Emulator(host),
                _ => Endpoint::Google("pubsub.googleapis.com".into()),
            },
        };
        let connection_option = ConnectionOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            // Notices a service that stopped answering on an open connection.
            http2_keep_alive_interval: Some(Duration::from_secs(10)),
            keep_alive_timeout: Some(Duration::from_secs(5)),
            keep_alive_while_idle: Some(true),
            ..ConnectionOptions::default()
        };
        let mut config = ClientConfig {
            project_id: Some(options.project.clone()),
            connection_option,
            ..ClientConfig::default()
        };
        let shown = match &endpoint {
            Endpoint::Emulator(host) => {
                config.environment = Environment::Emulator(host.clone());
                format!("emulator at {host}")
            }
            Endpoint::Google(host) => {
                config.endpoint = host.clone();
                // The default environment reads PUBSUB_EMULATOR_HOST; an
                // explicit endpoint wins over it.
                config.environment = Environment::GoogleCloud(Box::new(NoopTokenSourceProvider {}));
                config =
                    match &options.settings.credentials_file {
                        Some(path) => {
                            let file = CredentialsFile::new_from_file(path.display().to_string())
                                .await
                                .map_err(|e| {
                                    BrokerError::Fatal(Cause::new(
                                        format!(
                                            "cannot read broker.pubsub.credentials_file {}",
                                            path.display()
                                        ),
                                        e,
                                    ))
                                })?;
                            config.with_credentials(file).await
                        }
                        None => config.with_auth().await,
                    }
                    .map_err(|e| {
                        BrokerError::Fatal(format!(
                        "no Google credentials ({e}): set GOOGLE_APPLICATION_CREDENTIALS or \
                         broker.pubsub.credentials_file, or point broker.pubsub.endpoint or \
                         PUBSUB_EMULATOR_HOST at an emulator"
                    ).into())
                    })?;
                host.clone()
            }
        };
        let client = Client::new(config).await.map_err(|e| {
            BrokerError::Unavailable(Cause::new(format!("cannot connect to pubsub ({shown})"), e))
        })?;
        let handle = client.subscription(&options.subscription);
        let subscriber = handle.get_client();
        // Only `publish_immediately` is used: the crate's batching publisher
        // waits for company (~100 ms) before each call.
        let publisher_config = PublisherConfig {
            workers: 1,
            ..PublisherConfig::default()
        };
        let requests = client.topic(&options.settings.topic);
        let dead_letters = client.topic(&options.settings.dead_letter_topic);
        let subscription = client.fully_qualified_subscription_name(&options.subscription);
        Ok(Self {
            client,
            publisher: requests.new_publisher(Some(publisher_config.clone())),
            dead_letter_publisher: dead_letters.new_publisher(Some(publisher_config)),
            requests,
            dead_letters,
            subscriber,
            handle,
            options,
            subscription,
        })
    }

    /// The subscription we want: pull, our ack deadline, every message, no
    /// expiry, no ordering, no dead-letter policy (the worker gives up and
    /// dead-letters with a reason itself).
    pub(super) fn wanted(&self, name: &str, topic: &str) -> Subscription {
        Subscription {
            name: name.to_owned(),
            topic: topic.to_owned(),
            ack_deadline_seconds: deadline_seconds(self.options.ack_deadline),
            expiration_policy: Some(ExpirationPolicy { ttl: None }),
            ..Subscription::default()
        }
    }

    /// Creates the subscription if missing; else checks it (unless
    /// `lenient`, for the dead-letter subscription: only its topic matters).
    pub(super) async fn ensure_subscription(
        &self,
        name: &str,
        topic: &str,
        lenient: bool,
    ) -> Result<Subscription, BrokerError> {
        let wanted = self.wanted(name, topic);
        let get = || {
            self.subscriber.get_subscription(
                GetSubscriptionRequest {
                    subscription: name.to_owned(),
                },
                no_retry(),
            )
        };
        let existing = match get().await {
            Ok(existing) => existing.into_inner(),
            Err(status) if status.code() == Code::NotFound => {
                match self
                    .subscriber
                    .create_subscription(wanted.clone(), no_retry())
                    .await
                {
                    Ok(created) => {
                        info!(subscription = name, topic, "pubsub subscription created");
                        return Ok(created.into_inner());
                    }
                    // Another instance was first: check what it made.
                    Err(status) if status.code() == Code::AlreadyExists => get()
                        .await
                        .map_err(|s| classify(&format!("cannot read subscription {name}"), &s))?
                        .into_inner(),
                    Err(status) => {
                        return Err(classify(
                            &format!("cannot create subscription {name}"),
                            &status,
                        ));
                    }
                }
            }
            Err(status) => {
                return Err(classify(
                    &format!("cannot read subscription {name}"),
                    &status,
                ));
            }
        };
        let differences = if lenient {
            mismatches_of_topic(&existing, &wanted)
        } else {
            mismatches(&existing, &wanted, self.options.max_deliveries)
        };
        if !differences.is_empty() {
            return Err(BrokerError::Fatal(
                format!(
                    "subscription {name} exists with other settings: {}; \
                 delete the subscription (it is created again; its unacknowledged messages \
                 are lost) or change the configuration to match",
                    differences.join(", ")
                )
                .into(),
            ));
        }
        Ok(existing)
    }

    pub(super) fn dead_letter_subscription(&self) -> String {
        format!(
            "projects/{}/subscriptions/{}",
            self.options.project, self.options.settings.dead_letter_subscription
        )
    }

    /// Publishes messages in as few calls as the service allows, waiting
    /// for each call's confirmation.
    pub(super) async fn publish_messages(
        publisher: &TopicPublisher,
        messages: Vec<PubsubMessage>,
    ) -> Result<(), BrokerError> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        for message in messages {
            let size = message.data.len();
            if !batch.is_empty()
                && (batch.len() == MAX_MESSAGES_PER_CALL || bytes + size > MAX_PUBLISH_BYTES)
            {
                Self::publish_call(publisher, std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += size;
            batch.push(message);
        }
        if !batch.is_empty() {
            Self::publish_call(publisher, batch).await?;
        }
        Ok(())
    }

    pub(super) async fn publish_call(
        publisher: &TopicPublisher,
        messages: Vec<PubsubMessage>,
    ) -> Result<(), BrokerError> {
        publisher
            .publish_immediately(messages, None)
            .await
            .map(drop)
            .map_err(|status| classify("cannot publish", &status))
    }

    /// Publishes many payloads, up to 1000 per call, each with its request's
    /// message id as an attribute when it has one.
    pub(crate) async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        let messages = payloads.into_iter().map(request_message).collect();
        Self::publish_messages(&self.publisher, messages).await
    }
}

/// Creates the topic if missing.
pub(super) async fn ensure_topic(topic: &Topic) -> Result<(), BrokerError> {
    let name = topic.fully_qualified_name();
    match topic.exists(no_retry()).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(status) => return Err(classify(&format!("cannot read topic {name}"), &status)),
    }
    match topic.create(None, no_retry()).await {
        Ok(()) => {
            info!(topic = name, "pubsub topic created");
            Ok(())
        }
        // Another instance was first.
        Err(status) if status.code() == Code::AlreadyExists => Ok(()),
        Err(status) => Err(classify(&format!("cannot create topic {name}"), &status)),
    }
}

/// The settings of an existing subscription that differ from ours.
pub(super) fn mismatches(
    existing: &Subscription,
    wanted: &Subscription,
    max_deliveries: u32,
) -> Vec<String> {
    let mut found = mismatches_of_topic(existing, wanted);
    if existing.ack_deadline_seconds != wanted.ack_deadline_seconds {
        found.push(format!(
            "ack_deadline is {}s (configured broker.ack_deadline {}s)",
            existing.ack_deadline_seconds, wanted.ack_deadline_seconds
        ));
    }
    if let Some(push) = &existing.push_config
        && !push.push_endpoint.is_empty()
    {
        found.push(format!(
            "it pushes to {} (mandrill pulls)",
            push.push_endpoint
        ));
    }
    if existing.bigquery_config.is_some() || existing.cloud_storage_config.is_some() {
        found.push("it exports to BigQuery or Cloud Storage (mandrill pulls)".into());
    }
    if !existing.filter.is_empty() {
        found.push(format!(
            "it filters messages ({:?}; mandrill reads every message)",
            existing.filter
        ));
    }
    if existing.detached {
        found.push("it is detached from its topic".into());
    }
    if let Some(DeadLetterPolicy {
        max_delivery_attempts,
        dead_letter_topic,
    }) = &existing.dead_letter_policy
        && i64::from(*max_delivery_attempts) <= i64::from(max_deliveries)
    {
        found.push(format!(
            "its dead-letter policy forwards to {dead_letter_topic} after \
             {max_delivery_attempts} deliveries, not above broker.max_deliveries \
             ({max_deliveries}): messages would leave unrecorded before the worker gives up"
        ));
    }
    found
}

pub(super) fn mismatches_of_topic(existing: &Subscription, wanted: &Subscription) -> Vec<String> {
    if existing.topic == wanted.topic {
        return Vec::new();
    }
    vec![format!(
        "topic is {} (configured {})",
        existing.topic, wanted.topic
    )]
}

#[async_trait]
impl Close for PubSubPublisher {
    async fn close(&self) {
        // Clones share the publishers' tasks, which this stops.
        self.publisher.clone().shutdown().await;
        self.dead_letter_publisher.clone().shutdown().await;
    }
}

#[async_trait]
impl Publisher for PubSubPublisher {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        // Immediately, one call: the crate's batching publisher would wait
        // for company first.
        Self::publish_call(&self.publisher, vec![request_message(payload)]).await
    }

    /// Up to 1000 per call.
    async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        PubSubPublisher::publish_all(self, payloads).await
    }
}
