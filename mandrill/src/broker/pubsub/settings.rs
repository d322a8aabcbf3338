//! `[broker.pubsub]`: the Pub/Sub adapter's own settings (configuration
//! depends on them, never the reverse).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{duration, settings};

/// How deliveries are pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PullMode {
    /// `Pull` calls of up to 1000 messages: measured faster on the emulator
    /// (see docs/pubsub.md), and a pull that is not running holds no lease.
    #[default]
    Unary,
    /// `StreamingPull`: the server pushes into a stream that this process
    /// keeps open, bounded by flow control (`worker.max_in_flight`).
    Streaming,
}

settings! {
    /// `[broker.pubsub]`: topics, the dead-letter subscription and how to
    /// reach the service. The project and the request subscription are in
    /// `broker.url = "pubsub://PROJECT/SUBSCRIPTION"`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct PubSubSettings {
        /// Pub/Sub topic requests are published to (created with the
        /// subscription).
        ///
        /// The subscription reads it; consumers create both if missing.
        pub topic: String = "mandrill-requests".into(),
        /// Pub/Sub topic dead letters are copied to, with their reason as an
        /// attribute.
        pub dead_letter_topic: String = "mandrill-dead-letters".into(),
        /// Pub/Sub subscription keeping the dead letters (for dead-letters
        /// and requeue).
        ///
        /// A topic without subscriptions drops what is published to it.
        pub dead_letter_subscription: String = "mandrill-dead-letters".into(),
        /// http://HOST:PORT of an emulator, or a regional host name (default:
        /// PUBSUB_EMULATOR_HOST, else pubsub.googleapis.com).
        ///
        /// An emulator is plain text, without credentials; a host name such
        /// as `europe-west1-pubsub.googleapis.com` is a regional endpoint.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub endpoint: Option<String> = None,
        /// Service-account key file (default: Application Default
        /// Credentials).
        ///
        /// That is `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's, or the
        /// metadata server.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub credentials_file: Option<PathBuf> = None,
        /// `unary` (Pull calls) or `streaming` (StreamingPull).
        pub pull: PullMode = PullMode::default(),
        /// How often a waiting unary pull asks again, until
        /// `broker.poll_wait` is over.
        #[serde(with = "duration")]
        pub poll_interval: Duration = Duration::from_millis(100),
    }
}

impl PubSubSettings {
    /// Checks what types cannot; the key is relative to `[broker.pubsub]`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, name) in [
            ("topic", &self.topic),
            ("dead_letter_topic", &self.dead_letter_topic),
            ("dead_letter_subscription", &self.dead_letter_subscription),
        ] {
            check_resource_name(name).map_err(|why| (key, why))?;
        }
        if self.topic == self.dead_letter_topic {
            return Err(("dead_letter_topic", "must differ from topic".into()));
        }
        if let Some(endpoint) = &self.endpoint {
            parse_endpoint(endpoint).map_err(|why| ("endpoint", why))?;
        }
        Ok(())
    }
}

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// An emulator at `HOST:PORT`: plain text, no credentials.
    Emulator(String),
    /// A TLS endpoint with credentials, by host name.
    Google(String),
}

/// Reads the `endpoint` setting.
pub(crate) fn parse_endpoint(endpoint: &str) -> Result<Endpoint, String> {
    if let Some(host_port) = endpoint.strip_prefix("http://") {
        let host_port = host_port.trim_end_matches('/');
        let valid = host_port
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            return Err(format!(
                "{endpoint:?} is not http://HOST:PORT (an emulator)"
            ));
        }
        return Ok(Endpoint::Emulator(host_port.to_owned()));
    }
    let host = endpoint.strip_prefix("https://").unwrap_or(endpoint);
    let host = host.trim_end_matches('/');
    if host.is_empty() || host.contains(['/', ' ', '@']) {
        return Err(format!(
            "{endpoint:?} is neither http://HOST:PORT (an emulator) nor a host name"
        ));
    }
    Ok(Endpoint::Google(host.to_owned()))
}

/// Pub/Sub's rule for topic and subscription ids: 3-255 characters, a
/// letter first, then letters, digits and `-_.~+%`, not starting with `goog`.
pub(crate) fn check_resource_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.~+%".contains(c);
    if !(3..=255).contains(&name.len())
        || !name.starts_with(|c: char| c.is_ascii_alphabetic())
        || !name.chars().all(allowed)
        || name.to_ascii_lowercase().starts_with("goog")
    {
        return Err(format!(
            "{name:?} is not a Pub/Sub name: 3-255 letters, digits or -_.~+%, \
             starting with a letter and not with goog"
        ));
    }
    Ok(())
}

/// Reads `pubsub://PROJECT/SUBSCRIPTION` into the project and subscription ids.
pub(crate) fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("pubsub://")
        .ok_or_else(|| format!("{url:?} is not pubsub://PROJECT/SUBSCRIPTION"))?;
    let Some((project, subscription)) = rest.split_once('/') else {
        return Err(format!("{url:?} is not pubsub://PROJECT/SUBSCRIPTION"));
    };
    let project_ok = !project.is_empty()
        && project
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:".contains(c));
    if !project_ok {
        return Err(format!("{url:?}: {project:?} is not a project id"));
    }
    check_resource_name(subscription).map_err(|why| format!("{url:?}: subscription {why}"))?;
    Ok((project.to_owned(), subscription.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_names_and_endpoints_are_checked() {
        assert_eq!(
            parse_url("pubsub://my-project/requests").unwrap(),
            ("my-project".into(), "requests".into())
        );
        for bad in [
            "pubsub://",
            "pubsub://p",
            "pubsub:///sub",
            "pubsub://p/x",
            "pubsub://p/goog-sub",
            "pubsub://p/a b c",
            "nats://p/sub",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_endpoint("http://127.0.0.1:8085").unwrap(),
            Endpoint::Emulator("127.0.0.1:8085".into())
        );
        assert_eq!(
            parse_endpoint("europe-west1-pubsub.googleapis.com").unwrap(),
            Endpoint::Google("europe-west1-pubsub.googleapis.com".into())
        );
        assert!(parse_endpoint("http://nohost").is_err());
        let mut settings = PubSubSettings::default();
        assert!(settings.validate().is_ok());
        settings.dead_letter_topic = settings.topic.clone();
        assert_eq!(settings.validate().unwrap_err().0, "dead_letter_topic");
    }
}
