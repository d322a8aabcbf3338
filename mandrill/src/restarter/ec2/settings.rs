//! `[restarter.ec2]`: which EC2 action a restart is, and where AWS is.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::restarter::http::aws;
use crate::settings::{duration, settings};

/// What a restart of an instance does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Ec2Action {
    /// `RebootInstances`.
    #[default]
    Reboot,
    /// `StopInstances`, stopped for `stopped_for`, then `StartInstances`.
    StopStart,
    /// `TerminateInstanceInAutoScalingGroup`, the group's desired capacity
    /// kept: only for members of an Auto Scaling group.
    Terminate,
}

settings! {
    /// `[restarter.ec2]`: the `ec2` backend.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct Ec2Settings {
        /// The AWS region, e.g. `us-east-1`; default `AWS_REGION`, else
        /// `AWS_DEFAULT_REGION`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub region: Option<String> = None,
        /// Another endpoint than AWS's public ones, for EC2 and Auto
        /// Scaling both: an emulator (plain http only on loopback).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub endpoint_url: Option<String> = None,
        /// Auto Scaling's endpoint when it is not `endpoint_url` (a VPC
        /// endpoint of its own).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub autoscaling_endpoint_url: Option<String> = None,
        /// reboot | stop-start | terminate
        pub action: Ec2Action = Ec2Action::Reboot,
        /// stop-start: how long the instance stays stopped.
        #[serde(with = "duration")]
        pub stopped_for: Duration = Duration::from_secs(60),
        /// stop-start: longest wait for the instance to reach `stopped`.
        ///
        /// Also how long after its stop was due to end another mandrill
        /// waits before starting an instance a stop-start left stopped.
        #[serde(with = "duration")]
        pub stop_timeout: Duration = Duration::from_secs(600),
        /// stop-start: longest wait, once `StartInstances` is accepted,
        /// for the instance to reach `running`.
        ///
        /// One that does not, or falls back to `stopped` (a key its
        /// volumes cannot be decrypted with, no capacity), is recorded
        /// unrecovered, and keeps its start-after tag.
        #[serde(with = "duration")]
        pub start_timeout: Duration = Duration::from_secs(300),
        /// Wait between two looks at an instance's state.
        #[serde(with = "duration")]
        pub poll_interval: Duration = Duration::from_secs(5),
        /// Longest one API call may take (each try of it).
        #[serde(with = "duration")]
        pub call_timeout: Duration = Duration::from_secs(20),
    }
}

impl Ec2Settings {
    /// The region in force: the section's, else the environment's.
    pub(crate) fn region(&self) -> Option<String> {
        aws::region(self.region.as_deref())
    }

    /// Checks what types cannot: `(key within the section, why)`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let region = self.region().ok_or((
            "region",
            "is required (or AWS_REGION in the environment)".to_owned(),
        ))?;
        aws::check_region(&region).map_err(|why| ("region", why))?;
        for (key, endpoint) in [
            ("endpoint_url", &self.endpoint_url),
            ("autoscaling_endpoint_url", &self.autoscaling_endpoint_url),
        ] {
            if let Some(endpoint) = endpoint {
                aws::check_endpoint(endpoint).map_err(|why| (key, why))?;
            }
        }
        for (key, value) in [
            ("stop_timeout", self.stop_timeout),
            ("start_timeout", self.start_timeout),
            ("poll_interval", self.poll_interval),
            ("call_timeout", self.call_timeout),
        ] {
            if value.is_zero() {
                return Err((key, "must be longer than 0s".into()));
            }
        }
        Ok(())
    }

    /// The longest a restart can take, for `worker.restart_timeout`: its
    /// calls, each at its longest ([`aws::longest_call`]), and for a
    /// stop-start the waits for `stopped` and for `running` (each may end
    /// with one more look, a `poll_interval` and a call past its timeout)
    /// and the time stopped.
    pub(crate) fn longest_restart(&self) -> Duration {
        let calls = |count: u32| aws::longest_call(self.call_timeout).saturating_mul(count);
        match self.action {
            Ec2Action::Reboot => calls(1),
            // DescribeAutoScalingInstances, TerminateInstanceInAutoScalingGroup.
            Ec2Action::Terminate => calls(2),
            // DescribeInstances, CreateTags, StopInstances, StartInstances,
            // DeleteTags, and the last look of each wait.
            Ec2Action::StopStart => calls(7)
                .saturating_add(self.stop_timeout)
                .saturating_add(self.start_timeout)
                .saturating_add(self.poll_interval.saturating_mul(2))
                .saturating_add(self.stopped_for),
        }
    }
}
