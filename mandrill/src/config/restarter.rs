//! `[restarter]`: which backend, the simulation's knobs and the journal. The
//! real backends' sections (`[restarter.command]`, `[restarter.ssh]`,
//! `[restarter.http]`, `[restarter.ec2]`) are owned by their modules.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::restarter::{CommandSettings, Ec2Settings, HttpSettings, SshSettings};
use crate::settings::{duration, settings};

/// Which restart backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RestarterKind {
    /// Waits asynchronously, fails at random.
    Simulate,
    /// Blocks a thread of the bounded blocking pool, fails at random.
    SimulateBlocking,
    /// Runs a program per restart, without a shell (`[restarter.command]`).
    Command,
    /// Runs a command on the host over SSH (`[restarter.ssh]`).
    Ssh,
    /// Calls a webhook (`[restarter.http]`).
    Http,
    /// Reboots, stops and starts, or terminates EC2 instances (`[restarter.ec2]`).
    Ec2,
}

impl RestarterKind {
    /// Whether this backend touches real hosts.
    pub(crate) fn is_real(self) -> bool {
        matches!(self, Self::Command | Self::Ssh | Self::Http | Self::Ec2)
    }
}

settings! {
    /// `[restarter]`
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub(crate) struct RestarterSettings {
        /// simulate | simulate-blocking | command | ssh | http | ec2
        pub kind: RestarterKind = RestarterKind::Simulate,
        /// Shortest simulated restart.
        #[serde(with = "duration")]
        pub min_latency: Duration = Duration::ZERO,
        /// Longest simulated restart.
        #[serde(with = "duration")]
        pub max_latency: Duration = Duration::from_secs(1),
        /// Probability in [0, 1] that a simulated restart fails.
        pub failure_rate: f64 = 0.1,
        /// Blocking restarts running at once (1-512; blocking kinds only).
        pub blocking_threads: usize = 16,
        /// File to append each restart issued to (audit); default none.
        ///
        /// One line (the host) per restart, written before issuing it: an
        /// audit trail that survives the process being killed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub journal: Option<PathBuf> = None,
        /// `[restarter.command]`: the `command` backend.
        pub command: CommandSettings = CommandSettings::default(),
        /// `[restarter.ssh]`: the `ssh` backend.
        pub ssh: SshSettings = SshSettings::default(),
        /// `[restarter.http]`: the `http` backend.
        pub http: HttpSettings = HttpSettings::default(),
        /// `[restarter.ec2]`: the `ec2` backend.
        pub ec2: Ec2Settings = Ec2Settings::default(),
    }
}
