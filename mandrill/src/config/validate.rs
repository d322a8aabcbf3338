//! What types alone cannot check: bounds, cross-checks between settings,
//! URLs and the adapters' own sections. Every error names the key at fault.
//!
//! Every cross-setting check in one place, so that start-up refuses a bad
//! configuration in one pass naming each key: one piece past 400 lines.

use std::time::Duration;

use super::{Config, ConfigError, RestarterKind, limits};
use crate::domain::Domain;
use crate::restarter::verify::ProbeKind;
use crate::safety::{Eligibility, Requesters, StopConditions};

impl Config {
    /// Checks what types alone cannot, naming the key at fault.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.checked(false)
    }

    /// As [`validate`](Self::validate), for a reload: a `[[requesters]]`
    /// entry whose key cannot be used does not refuse it (the reloaded
    /// policy leaves that entry out: see
    /// [`Requesters::without_unusable_keys`]).
    pub(crate) fn validate_for_reload(&self) -> Result<(), ConfigError> {
        self.checked(true)
    }

    fn checked(&self, reloading: bool) -> Result<(), ConfigError> {
        fn at_least_one(key: &str, value: u64) -> Result<(), ConfigError> {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
            Ok(())
        }
        fn probability(key: &str, value: f64) -> Result<(), ConfigError> {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::invalid(
                    key,
                    format!("{value} is not in [0, 1]"),
                ));
            }
            Ok(())
        }
        fn positive(key: &str, value: Duration) -> Result<(), ConfigError> {
            if value.is_zero() {
                return Err(ConfigError::invalid(key, "must be longer than 0s"));
            }
            Ok(())
        }
        fn at_most(key: &str, value: u64, max: u64) -> Result<(), ConfigError> {
            if value > max {
                return Err(ConfigError::invalid(
                    key,
                    format!("{value} is above the maximum of {max}"),
                ));
            }
            Ok(())
        }
        let w = &self.worker;
        let size = |value: usize| value as u64;
        at_least_one("worker.max_in_flight", size(w.max_in_flight))?;
        at_most(
            "worker.max_in_flight",
            size(w.max_in_flight),
            size(limits::MAX_IN_FLIGHT),
        )?;
        at_least_one("worker.pull_batch", size(w.pull_batch))?;
        at_most(
            "worker.pull_batch",
            size(w.pull_batch),
            size(limits::MAX_PULL_BATCH),
        )?;
        at_least_one("worker.max_attempts", w.max_attempts.into())?;
        at_least_one("worker.record_attempts", w.record_attempts.into())?;
        at_least_one("worker.max_pull_failures", w.max_pull_failures.into())?;
        at_least_one("store.max_connections", self.store.max_connections.into())?;
        at_most(
            "store.max_connections",
            self.store.max_connections.into(),
            limits::MAX_CONNECTIONS.into(),
        )?;
        at_least_one("store.writers", self.store.writers.into())?;
        at_most(
            "store.writers",
            self.store.writers.into(),
            limits::MAX_STORE_WRITERS.into(),
        )?;
        at_least_one(
            "message.max_payload_bytes",
            size(self.message.max_payload_bytes),
        )?;
        at_most(
            "message.max_payload_bytes",
            size(self.message.max_payload_bytes),
            size(limits::MAX_PAYLOAD_BYTES),
        )?;
        at_least_one(
            "restarter.blocking_threads",
            size(self.restarter.blocking_threads),
        )?;
        at_most(
            "restarter.blocking_threads",
            size(self.restarter.blocking_threads),
            size(limits::MAX_BLOCKING_THREADS),
        )?;
        for (key, value) in self.durations() {
            if value > limits::MAX_DURATION {
                return Err(ConfigError::invalid(key, "is longer than 365 days"));
            }
        }
        if !(limits::MIN_STORE_TIMEOUT..=limits::MAX_STORE_TIMEOUT).contains(&self.store.timeout) {
            return Err(ConfigError::invalid(
                "store.timeout",
                "must be between 1s and 1h",
            ));
        }
        // Audit history may be kept for years; bounded so that "now minus
        // retention" never overflows.
        if self.store.retention > limits::MAX_RETENTION {
            return Err(ConfigError::invalid(
                "store.retention",
                "is longer than 100 years",
            ));
        }
        if self.broker.ack_deadline < limits::MIN_ACK_DEADLINE {
            return Err(ConfigError::invalid(
                "broker.ack_deadline",
                "must be at least 1s: a shorter lease can lapse before its extension lands, \
                 and another consumer would restart the host again",
            ));
        }
        positive(
            "broker.sqlite.poll_interval",
            self.broker.sqlite.poll_interval,
        )?;
        positive(
            "broker.pubsub.poll_interval",
            self.broker.pubsub.poll_interval,
        )?;
        if self.broker.max_deliveries < w.max_attempts {
            return Err(ConfigError::invalid(
                "broker.max_deliveries",
                format!(
                    "{} is below worker.max_attempts ({}): the worker's last attempt would never come",
                    self.broker.max_deliveries, w.max_attempts
                ),
            ));
        }
        positive("worker.restart_timeout", w.restart_timeout)?;
        if let Some(interval) = w.lease_extension_interval
            && (interval > self.broker.ack_deadline / 2 || interval.is_zero())
        {
            return Err(ConfigError::invalid(
                "worker.lease_extension_interval",
                "must be above 0s and at most half of broker.ack_deadline, \
                 so that an extension lands before the lease runs out",
            ));
        }
        if self.debug.stall_threshold < limits::MIN_STALL_THRESHOLD {
            return Err(ConfigError::invalid(
                "debug.stall_threshold",
                "must be at least 1ms",
            ));
        }
        self.validate_urls()?;
        self.validate_replies()?;
        if self.simulate.enabled && self.restarter.kind.is_real() {
            // The demo publisher makes up instance names; a real backend
            // would act on them, and the broker may be the one the real
            // publishers use.
            let kind = clap::ValueEnum::to_possible_value(&self.restarter.kind).map_or_else(
                || format!("{:?}", self.restarter.kind),
                |v| v.get_name().to_owned(),
            );
            return Err(ConfigError::invalid(
                "simulate.enabled",
                format!(
                    "--simulate (simulate.enabled) publishes made-up requests into broker.url; \
                     refused with the real backend restarter.kind = {kind}: use restarter.kind = \
                     simulate to try mandrill, or `mandrill publish` for real requests"
                ),
            ));
        }
        self.validate_restarter()?;
        Eligibility::new(
            &self.safety.allow,
            &self.safety.deny,
            self.restarter.kind.is_real(),
        )
        .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        self.calendar()
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        self.counting()
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        StopConditions::new(&self.safety.stop_conditions)
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        // Reads the key files: a bad or unreadable key fails start-up here.
        if reloading {
            Requesters::without_unusable_keys(&self.requesters, self.require_signed()).map(drop)
        } else {
            Requesters::new(&self.requesters, self.require_signed()).map(drop)
        }
        .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        for (index, entry) in self.requesters.iter().enumerate() {
            if let Some(quota) = &entry.quota
                && quota.window > limits::MAX_DURATION
            {
                return Err(ConfigError::invalid(
                    &format!("requesters[{index}].quota.window"),
                    "is longer than 365 days",
                ));
            }
        }
        // Reads the schedules' key files: a bad one fails start-up here.
        // Not on a reload, which does not apply `[[schedule]]`: refusing it
        // for a schedule would keep a revoked requester trusted.
        if !reloading {
            self.schedules().map(drop)?;
        }
        positive("safety.stop_retry", self.safety.stop_retry)?;
        positive("safety.recheck", self.safety.recheck)?;
        // The running service's only way to see `mandrill resume`: a pause
        // found by a claim stops pulling, and without the poll nothing
        // would ever start it again.
        if self.safety.poll_interval.is_zero() {
            return Err(ConfigError::invalid(
                "safety.poll_interval",
                "must be longer than 0s: the switch is read every poll_interval to see \
                 `mandrill resume`, so with 0s a service that found it paused would never pull again",
            ));
        }
        if let Some(path) = &self.safety.pause_file
            && (path.as_os_str().is_empty() || path.file_name().is_none())
        {
            return Err(ConfigError::invalid(
                "safety.pause_file",
                "must name a file (its directory is watched)",
            ));
        }
        probability("restarter.failure_rate", self.restarter.failure_rate)?;
        probability("simulate.malformed_rate", self.simulate.malformed_rate)?;
        if self.restarter.min_latency > self.restarter.max_latency {
            return Err(ConfigError::invalid(
                "restarter.min_latency",
                "is longer than restarter.max_latency",
            ));
        }
        if !(self.simulate.rate.is_finite()
            && self.simulate.rate > 0.0
            && self.simulate.rate <= limits::MAX_SIMULATE_RATE)
        {
            return Err(ConfigError::invalid(
                "simulate.rate",
                "must be above 0 and at most 1000000",
            ));
        }
        self.broker
            .nats
            .validate()
            .map_err(|(key, why)| ConfigError::invalid(&format!("broker.nats.{key}"), why))?;
        Domain::parse(&self.message.domain)
            .map_err(|why| ConfigError::invalid("message.domain", why))?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|error| ConfigError::invalid("log.level", error.to_string()))?;
        self.admin.address()?;
        if let Some(path) = &self.admin.token_file
            && path.file_name().is_none()
        {
            return Err(ConfigError::invalid(
                "admin.token_file",
                "must name a file (the generated admin token is written there)",
            ));
        }
        if let Some(path) = &self.admin.instances_dir
            && path.as_os_str().is_empty()
        {
            return Err(ConfigError::invalid(
                "admin.instances_dir",
                "must name a directory (each instance writes its admin address there)",
            ));
        }
        self.validate_notify()?;
        crate::safety::objectives::validate(&self.recovery_objective)
            .map_err(|(key, why)| ConfigError::invalid(&key, why))?;
        self.inventory
            .validate()
            .map_err(|(key, why)| ConfigError::invalid(key, why))?;
        Ok(())
    }

    /// `[[notify]]` entries and `[notifier]`; errors name `notify[i].key`
    /// and never quote a URL.
    fn validate_notify(&self) -> Result<(), ConfigError> {
        for (i, entry) in self.notify.iter().enumerate() {
            entry
                .validate()
                .map_err(|(key, why)| ConfigError::invalid(&format!("notify[{i}].{key}"), why))?;
            if entry.timeout > limits::MAX_DURATION {
                return Err(ConfigError::invalid(
                    &format!("notify[{i}].timeout"),
                    "is longer than 365 days",
                ));
            }
        }
        let capacity = self.notifier.queue_capacity;
        if capacity == 0 || capacity > crate::notify::MAX_QUEUE_CAPACITY {
            return Err(ConfigError::invalid(
                "notifier.queue_capacity",
                format!(
                    "must be between 1 and {}",
                    crate::notify::MAX_QUEUE_CAPACITY
                ),
            ));
        }
        Ok(())
    }

    /// Every duration setting with its key.
    pub(super) fn durations(&self) -> Vec<(&'static str, Duration)> {
        let (b, w, r, d) = (&self.broker, &self.worker, &self.restarter, &self.debug);
        let mut durations = vec![
            ("broker.ack_deadline", b.ack_deadline),
            ("broker.poll_wait", b.poll_wait),
            ("broker.sqlite.poll_interval", b.sqlite.poll_interval),
            ("broker.pubsub.poll_interval", b.pubsub.poll_interval),
            ("worker.retry_initial", w.retry_initial),
            ("worker.retry_max", w.retry_max),
            ("worker.record_backoff", w.record_backoff),
            ("worker.restart_timeout", w.restart_timeout),
            ("worker.shutdown_grace", w.shutdown_grace),
            ("worker.pull_backoff", w.pull_backoff),
            ("store.timeout", self.store.timeout),
            ("restarter.min_latency", r.min_latency),
            ("restarter.max_latency", r.max_latency),
            ("debug.stall_threshold", d.stall_threshold),
            ("debug.status_interval", d.status_interval),
            ("restarter.command.timeout", r.command.timeout),
            ("restarter.ssh.connect_timeout", r.ssh.connect_timeout),
            ("restarter.ssh.timeout", r.ssh.timeout),
            ("restarter.ssh.idle_timeout", r.ssh.idle_timeout),
            (
                "restarter.ssh.server_alive_interval",
                r.ssh.server_alive_interval,
            ),
            ("restarter.http.timeout", r.http.timeout),
            ("verify.initial_delay", self.verify.initial_delay),
            ("verify.interval", self.verify.interval),
            ("verify.probe_timeout", self.verify.probe_timeout),
            ("verify.timeout", self.verify.timeout),
            ("safety.poll_interval", self.safety.poll_interval),
            ("safety.stop_retry", self.safety.stop_retry),
            ("safety.max_defer", self.safety.max_defer),
            ("safety.recheck", self.safety.recheck),
            ("safety.rate.window", self.safety.rate.window),
            ("safety.rate.host_cooldown", self.safety.rate.host_cooldown),
            (
                "safety.budget.forget_after",
                self.safety.budget.forget_after,
            ),
            ("safety.budget.retry", self.safety.budget.retry),
            ("notifier.flush_timeout", self.notifier.flush_timeout),
        ];
        if let Some(interval) = w.lease_extension_interval {
            durations.push(("worker.lease_extension_interval", interval));
        }
        durations
    }

    /// The chosen backend's section, verification and the host map; and
    /// that the worker waits longer for a restart than the backend and the
    /// verification may take, so that an issued restart is never cut off
    /// by the worker and retried (a second restart of a host that was fine).
    fn validate_restarter(&self) -> Result<(), ConfigError> {
        let r = &self.restarter;
        fn in_section(name: &'static str) -> impl Fn((&str, String)) -> ConfigError {
            move |(key, why)| ConfigError::invalid(&format!("restarter.{name}.{key}"), why)
        }
        let (backend, backend_keys) = match r.kind {
            // A simulated restart that outlasts the worker's wait is a
            // simulated time-out, nothing more.
            RestarterKind::Simulate | RestarterKind::SimulateBlocking => (Duration::ZERO, ""),
            RestarterKind::Command => {
                r.command.validate().map_err(in_section("command"))?;
                (r.command.timeout, "restarter.command.timeout")
            }
            RestarterKind::Ssh => {
                r.ssh.validate().map_err(in_section("ssh"))?;
                (
                    r.ssh.longest_restart(),
                    "2 × restarter.ssh.connect_timeout + restarter.ssh.timeout + 4s to kill a \
                     command that timed out",
                )
            }
            RestarterKind::Http => {
                r.http.validate().map_err(in_section("http"))?;
                (r.http.timeout, "restarter.http.timeout")
            }
            RestarterKind::Ec2 => {
                r.ec2.validate().map_err(in_section("ec2"))?;
                (
                    r.ec2.longest_restart(),
                    "the calls (1 for a reboot, 2 for a terminate, 7 for a stop-start), each \
                     5 tries of restarter.ec2.call_timeout and 3s of backoff between them, and \
                     for a stop-start restarter.ec2.stop_timeout + restarter.ec2.start_timeout + \
                     2 × restarter.ec2.poll_interval + restarter.ec2.stopped_for",
                )
            }
        };
        self.verify
            .validate()
            .map_err(|(key, why)| ConfigError::invalid(&format!("verify.{key}"), why))?;
        if self.verify.probe == ProbeKind::Ec2 && r.kind != RestarterKind::Ec2 {
            return Err(ConfigError::invalid(
                "verify.probe",
                "\"ec2\" asks EC2 about the instances the ec2 restarter acted on: it needs \
                 restarter.kind = \"ec2\"",
            ));
        }
        crate::restarter::hosts::HostMap::new(&self.hosts)
            .map_err(|why| ConfigError::invalid("hosts", why))?;
        let verification = if self.verify.probe == ProbeKind::None {
            Duration::ZERO
        } else {
            self.verify
                .initial_delay
                .saturating_add(self.verify.timeout)
                .saturating_add(self.verify.probe_timeout)
        };
        let needed = backend.saturating_add(verification);
        if self.worker.restart_timeout <= needed {
            return Err(ConfigError::invalid(
                "worker.restart_timeout",
                format!(
                    "{} must be longer than the restart can take, {} ({}{}verify.initial_delay \
                     + verify.timeout + verify.probe_timeout when verifying): otherwise the \
                     worker cuts an issued restart short and retries it",
                    humantime::format_duration(self.worker.restart_timeout),
                    humantime::format_duration(needed),
                    backend_keys,
                    if backend_keys.is_empty() {
                        ""
                    } else {
                        ", plus "
                    },
                ),
            ));
        }
        Ok(())
    }
}
