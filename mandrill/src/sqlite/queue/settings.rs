//! `[broker.sqlite]`: the SQLite queue's own settings (configuration
//! depends on them, never the reverse), and [`SqliteOptions`], what
//! [`SqliteBroker::connect`](super::SqliteBroker::connect) needs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{duration, settings};

settings! {
    /// `[broker.sqlite]`, when `broker.url` is `sqlite:PATH`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct SqliteSettings {
        /// How often a waiting pull looks for messages other processes
        /// published.
        ///
        /// This process's own publishes and nacks wake a waiting pull at once.
        #[serde(with = "duration")]
        pub poll_interval: Duration = Duration::from_millis(100),
    }
}

/// Everything [`SqliteBroker`](super::SqliteBroker) needs: the queue's file,
/// the generic broker settings and `[broker.sqlite]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SqliteOptions {
    /// `sqlite:PATH`.
    pub url: String,
    /// A delivery's lease.
    pub ack_deadline: Duration,
    /// How long one pull waits for a first message.
    pub poll_wait: Duration,
    /// See [`SqliteSettings::poll_interval`].
    pub poll_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            url: "sqlite:mandrill.db".into(),
            ack_deadline: Duration::from_secs(10),
            poll_wait: Duration::from_secs(1),
            poll_interval: SqliteSettings::default().poll_interval,
        }
    }
}
