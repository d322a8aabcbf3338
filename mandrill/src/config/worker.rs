//! `[worker]` and `[message]`, and the worker's part of the configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Config;
use crate::backoff::Backoff;
use crate::domain::{Domain, ParseRules};
use crate::safety::{Eligibility, Policy, PolicyHandle};
use crate::settings::{duration, settings};
use crate::worker::WorkerConfig;

settings! {
    /// `[worker]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct WorkerSettings {
        /// Messages handled at once (1-1000000; reloadable).
        pub max_in_flight: usize = 100,
        /// Most messages asked for in one pull (1-10000).
        pub pull_batch: usize = 32,
        /// Deliveries before a failing restart is dead-lettered.
        pub max_attempts: u32 = 5,
        /// First redelivery delay after a failed restart; doubles per attempt.
        #[serde(with = "duration")]
        pub retry_initial: Duration = Duration::from_secs(1),
        /// Longest redelivery delay.
        #[serde(with = "duration")]
        pub retry_max: Duration = Duration::from_secs(60),
        /// Tries at recording an outcome before nacking.
        pub record_attempts: u32 = 5,
        /// First delay between those tries; doubles per try.
        #[serde(with = "duration")]
        pub record_backoff: Duration = Duration::from_millis(100),
        /// A restart taking longer counts as failed.
        #[serde(with = "duration")]
        pub restart_timeout: Duration = Duration::from_secs(30),
        /// Time in-flight work may take to finish on shutdown.
        #[serde(with = "duration")]
        pub shutdown_grace: Duration = Duration::from_secs(10),
        /// Lease extension interval; default a third of
        /// `broker.ack_deadline`, at most half of it.
        #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
        pub lease_extension_interval: Option<Duration> = None,
        /// Consecutive pull failures before the service gives up.
        pub max_pull_failures: u32 = 10,
        /// First delay before restarting a failed pull loop; doubles, up to 30s.
        #[serde(with = "duration")]
        pub pull_backoff: Duration = Duration::from_millis(200),
    }
}

settings! {
    /// `[message]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct MessageSettings {
        /// Hostname = `{instance_name}.{domain}`.
        pub domain: String = "example.net".into(),
        /// Larger payloads are dead-lettered unread (at most 64 MiB).
        pub max_payload_bytes: usize = 4096,
    }
}

impl Config {
    /// The worker's part.
    pub(crate) fn worker_config(&self) -> WorkerConfig {
        let w = &self.worker;
        WorkerConfig {
            max_in_flight: w.max_in_flight,
            pull_batch: w.pull_batch,
            max_attempts: w.max_attempts,
            max_deliveries: self.broker.max_deliveries,
            retry_backoff: Backoff {
                initial: w.retry_initial,
                max: w.retry_max,
            },
            record_attempts: w.record_attempts,
            record_backoff: Backoff {
                initial: w.record_backoff,
                max: w.record_backoff.saturating_mul(16),
            },
            restart_timeout: w.restart_timeout,
            shutdown_grace: w.shutdown_grace,
            lease_extension_interval: w.lease_extension_interval,
            max_pull_failures: w.max_pull_failures,
            pull_backoff: Backoff {
                initial: w.pull_backoff,
                max: Duration::from_secs(30),
            },
            parse: self.parse_rules(),
            switch_poll_interval: self.safety.poll_interval,
            store_timeout: self.store.timeout,
            // Validated in `validate`; should an invalid one get here, fail
            // closed: leashed, nobody eligible.
            policy: PolicyHandle::new(self.policy().unwrap_or_else(|_| Policy {
                dry_run: true,
                eligibility: Eligibility::nobody(),
                pause_on_unrecovered: true,
                requesters: std::sync::Arc::new(crate::safety::Requesters::refuse_unsigned()),
                ..Policy::default()
            })),
        }
    }

    /// How payloads are validated.
    pub(crate) fn parse_rules(&self) -> ParseRules {
        ParseRules {
            // Validated in `validate`; the fallback is unreachable in practice.
            domain: Domain::parse(&self.message.domain).unwrap_or_default(),
            max_payload_bytes: self.message.max_payload_bytes,
        }
    }
}
