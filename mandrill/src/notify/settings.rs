//! `[[notify]]` (the endpoints) and `[notifier]` (the queue and the flush
//! bound), owned here; the configuration embeds them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::EventKind;
use crate::settings::{Secret, settings};

/// How a notification body looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Format {
    /// The event as a JSON object (`event`, `at`, `message_id`, …).
    #[default]
    Json,
    /// `{"text": "…"}`, as Slack's incoming webhooks (and Mattermost,
    /// Rocket.Chat, Teams' Slack-compatible ones) read.
    Slack,
}

/// One `[[notify]]` endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NotifyEntry {
    /// Where to POST; a secret (a webhook's path is often its key): never
    /// logged, never echoed in an error.
    pub url: Secret,
    /// The body's shape.
    #[serde(default)]
    pub format: Format,
    /// The events this endpoint wants.
    pub events: Vec<EventKind>,
    /// Longest one POST may take, connecting included.
    #[serde(default = "default_timeout", with = "crate::settings::duration")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

impl NotifyEntry {
    /// The distinct events wanted.
    pub(super) fn wanted(&self) -> impl Iterator<Item = EventKind> + '_ {
        self.events
            .iter()
            .enumerate()
            .filter(|(i, kind)| !self.events[..*i].contains(kind))
            .map(|(_, kind)| *kind)
    }

    /// Checks what types cannot: `(key within the entry, why)`. The URL is
    /// never quoted.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let url = url::Url::parse(&self.url.0).map_err(|_| {
            (
                "url",
                "is not a valid URL (not shown: it is a secret)".to_owned(),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
            return Err((
                "url",
                "must be an http:// or https:// URL with a host (not shown: it is a secret)"
                    .to_owned(),
            ));
        }
        if self.events.is_empty() {
            return Err((
                "events",
                "must name at least one of restarted, failed, dead-lettered, unrecovered, \
                 paused, resumed"
                    .to_owned(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(("timeout", "must be longer than 0s".to_owned()));
        }
        Ok(())
    }
}

settings! {
    /// `[notifier]`: the queue between the pipeline and the sending task.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct NotifierSettings {
        /// Notifications waiting to be sent; beyond it they are dropped
        /// (counted), never waited for.
        pub queue_capacity: usize = 1024,
        /// How long shutdown waits for queued notifications; the rest are
        /// dropped (counted).
        #[serde(with = "crate::settings::duration")]
        pub flush_timeout: Duration = Duration::from_secs(5),
    }
}

/// Most events queued: each holds a few short strings.
pub(crate) const MAX_QUEUE_CAPACITY: usize = 1_000_000;
