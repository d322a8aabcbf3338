//! `broker.url` and `store.url`, and the broker sections that depend on the
//! URL's scheme.

use super::{Config, ConfigError};
use crate::broker::{BrokerUrl, BrokerUrlError, pubsub};
use crate::safety::ReplyDestinations;
use crate::settings::redact_url;

impl Config {
    /// `broker.reply_to_allowed`: patterns that parse, on a broker that can
    /// carry a reply (NATS, Pub/Sub), and that admit none of the broker's
    /// own subjects or topics (a verdict published there would be taken for
    /// a request, or a dead letter).
    pub(super) fn validate_replies(&self) -> Result<(), ConfigError> {
        const KEY: &str = "broker.reply_to_allowed";
        let allowed = ReplyDestinations::new(&self.broker.reply_to_allowed)
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        if allowed.is_empty() {
            return Ok(());
        }
        let (nats, pubsub) = (&self.broker.nats, &self.broker.pubsub);
        let own = match BrokerUrl::parse(&self.broker.url) {
            Ok(BrokerUrl::Nats { .. }) => [&nats.subject, &nats.dead_letter_subject],
            Ok(BrokerUrl::PubSub { .. }) => [&pubsub.topic, &pubsub.dead_letter_topic],
            _ => {
                return Err(ConfigError::invalid(
                    KEY,
                    "only NATS and Pub/Sub can carry a reply: the SQLite and in-process \
                     queues have nowhere to publish a verdict (leave it empty, or use \
                     `mandrill explain` for the verdict)",
                ));
            }
        };
        for name in own {
            if let Some(pattern) = allowed.admitting(name) {
                return Err(ConfigError::invalid(
                    KEY,
                    format!(
                        "{pattern:?} admits {name:?}, where this broker's requests or dead \
                         letters go: a verdict must never be published there"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `broker.url` and `store.url` name something this build supports.
    pub(super) fn validate_urls(&self) -> Result<(), ConfigError> {
        let broker = self.broker.url.as_str();
        // One parser decides what `broker.url` names, here and when wiring.
        let nats = match BrokerUrl::parse(broker) {
            Ok(BrokerUrl::PubSub { .. }) | Err(BrokerUrlError::PubSub(_)) => {
                return self.validate_pubsub();
            }
            Ok(BrokerUrl::Nats { .. }) => true,
            Ok(BrokerUrl::Memory | BrokerUrl::Sqlite { .. }) => false,
            Err(error) => return Err(ConfigError::invalid("broker.url", error.to_string())),
        };
        if nats {
            for server in broker.split(',') {
                let parsed = url::Url::parse(server.trim()).map_err(|error| {
                    ConfigError::invalid(
                        "broker.url",
                        format!("{:?} is not a valid url: {error}", redact_url(server)),
                    )
                })?;
                if parsed.host_str().is_none_or(str::is_empty) {
                    return Err(ConfigError::invalid(
                        "broker.url",
                        format!("{:?} names no host", redact_url(server)),
                    ));
                }
                if !parsed.username().is_empty() && self.broker.nats.has_credentials() {
                    return Err(ConfigError::invalid(
                        "broker.url",
                        "has credentials, and so do broker.nats.user/password, broker.nats.token \
                         or broker.nats.creds_file: choose one",
                    ));
                }
            }
        }
        let store = self.store.url.as_str();
        let postgres = store.starts_with("postgres://") || store.starts_with("postgresql://");
        if !(store == "memory" || store.starts_with("sqlite:") || postgres) {
            return Err(ConfigError::invalid(
                "store.url",
                format!(
                    "{:?} is not supported: use sqlite:PATH, postgres://… or memory",
                    redact_url(store)
                ),
            ));
        }
        if postgres && let Err(error) = url::Url::parse(store) {
            return Err(ConfigError::invalid(
                "store.url",
                format!("{:?} is not a valid url: {error}", redact_url(store)),
            ));
        }
        if postgres && self.store.max_connections < 2 {
            return Err(ConfigError::invalid(
                "store.max_connections",
                "must be at least 2 with PostgreSQL: each writer keeps a connection of its \
                 own, and the reads and guarded claims need another",
            ));
        }
        Ok(())
    }

    /// `pubsub://PROJECT/SUBSCRIPTION` and `[broker.pubsub]`, and the bounds
    /// the service puts on a subscription (the emulator does not enforce them).
    fn validate_pubsub(&self) -> Result<(), ConfigError> {
        let broker = &self.broker;
        pubsub::settings::parse_url(&broker.url)
            .map_err(|why| ConfigError::invalid("broker.url", why))?;
        broker
            .pubsub
            .validate()
            .map_err(|(key, why)| ConfigError::invalid(&format!("broker.pubsub.{key}"), why))?;
        let (min, max) = (pubsub::MIN_ACK_DEADLINE, pubsub::MAX_ACK_DEADLINE);
        if !(min..=max).contains(&broker.ack_deadline) {
            return Err(ConfigError::invalid(
                "broker.ack_deadline",
                format!("must be between {min:?} and {max:?} on Pub/Sub"),
            ));
        }
        Ok(())
    }
}
