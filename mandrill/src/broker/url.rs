//! `broker.url`, parsed once into the broker it names, so that the wiring
//! and the commands match on a [`BrokerUrl`] instead of on URL prefixes.

use super::pubsub::settings::parse_url as parse_pubsub_url;
use crate::settings::redact_url;

/// Which broker `broker.url` names, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BrokerUrl {
    /// `memory`: in-process; it lives and dies with `mandrill run`.
    Memory,
    /// `sqlite:PATH`: a queue in a SQLite file.
    Sqlite {
        /// The whole URL, as SQLite's driver takes it.
        url: String,
    },
    /// `nats://HOST:PORT` (several comma-separated), or `tls://…` to
    /// require TLS.
    Nats {
        /// The whole URL, credentials included.
        url: String,
        /// Whether the scheme requires TLS (`tls://`).
        tls: bool,
    },
    /// `pubsub://PROJECT/SUBSCRIPTION`.
    PubSub {
        /// The project id.
        project: String,
        /// The subscription every instance shares.
        subscription: String,
    },
}

/// A `broker.url` that names no broker this build supports. Its message
/// follows `broker.url`, e.g. "broker.url \"x\" is not supported: …".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BrokerUrlError {
    /// No broker has this scheme.
    #[error(
        "{0:?} is not supported: use sqlite:PATH, nats://HOST:PORT, \
         pubsub://PROJECT/SUBSCRIPTION or memory"
    )]
    Unsupported(String),
    /// A Pub/Sub URL that names no project and subscription.
    #[error("{0}")]
    PubSub(String),
    /// A SQLite queue in memory: no other process (`mandrill publish`, a
    /// second instance) can reach it, and it is lost at exit.
    #[error(
        "{0:?} is a SQLite queue in memory, which no publisher can reach and which \
         is lost at exit: use sqlite:PATH for a queue, or memory for a throwaway one"
    )]
    SqliteInMemory(String),
}

impl BrokerUrl {
    /// Parses `broker.url`. Only a Pub/Sub URL's parts are checked here; a
    /// NATS URL's servers are checked by the configuration's validation and
    /// by the client.
    pub(crate) fn parse(url: &str) -> Result<Self, BrokerUrlError> {
        if url == "memory" {
            return Ok(Self::Memory);
        }
        if url.starts_with("sqlite:") {
            if url.contains(":memory:") || url.contains("mode=memory") {
                return Err(BrokerUrlError::SqliteInMemory(redact_url(url)));
            }
            return Ok(Self::Sqlite {
                url: url.to_owned(),
            });
        }
        if url.starts_with("nats://") || url.starts_with("tls://") {
            return Ok(Self::Nats {
                url: url.to_owned(),
                tls: url.starts_with("tls://"),
            });
        }
        if url.starts_with("pubsub:") {
            let (project, subscription) = parse_pubsub_url(url).map_err(BrokerUrlError::PubSub)?;
            return Ok(Self::PubSub {
                project,
                subscription,
            });
        }
        Err(BrokerUrlError::Unsupported(redact_url(url)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_names_its_broker() {
        assert_eq!(BrokerUrl::parse("memory"), Ok(BrokerUrl::Memory));
        assert_eq!(
            BrokerUrl::parse("sqlite:q.db"),
            Ok(BrokerUrl::Sqlite {
                url: "sqlite:q.db".into()
            })
        );
        assert_eq!(
            BrokerUrl::parse("tls://h:4222"),
            Ok(BrokerUrl::Nats {
                url: "tls://h:4222".into(),
                tls: true
            })
        );
        assert_eq!(
            BrokerUrl::parse("nats://a:1,nats://b:2"),
            Ok(BrokerUrl::Nats {
                url: "nats://a:1,nats://b:2".into(),
                tls: false
            })
        );
        assert_eq!(
            BrokerUrl::parse("pubsub://p/requests"),
            Ok(BrokerUrl::PubSub {
                project: "p".into(),
                subscription: "requests".into()
            })
        );
        assert!(matches!(
            BrokerUrl::parse("pubsub:p"),
            Err(BrokerUrlError::PubSub(_))
        ));
        for in_memory in ["sqlite::memory:", "sqlite:file:q?mode=memory&cache=shared"] {
            let error = BrokerUrl::parse(in_memory).unwrap_err();
            assert_eq!(error, BrokerUrlError::SqliteInMemory(in_memory.into()));
            assert!(error.to_string().contains("use sqlite:PATH"), "{error}");
        }
        let unsupported = BrokerUrl::parse("amqp://u:s3cret@h").unwrap_err();
        assert!(!unsupported.to_string().contains("s3cret"), "{unsupported}");
        assert!(unsupported.to_string().contains("is not supported"));
    }
}
