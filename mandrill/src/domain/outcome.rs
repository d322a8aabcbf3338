//! Where a request stands, and what a restart attempt came to.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a request stands in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Received; a restart may be in progress.
    Received,
    /// The last attempt failed; the message was nacked for a retry.
    Retrying,
    /// The host was restarted. Final.
    Restarted,
    /// Every attempt failed; the message was dead-lettered. Final.
    Failed,
    /// The payload was malformed and dead-lettered. Final.
    Rejected,
    /// The host was restarted but did not come back healthy within the
    /// verification timeout. Final.
    Unrecovered,
    /// A safety guard refused the request for good. Final.
    Denied,
    /// Leashed: the restart was decided and recorded, never issued. Final.
    DryRun,
    /// Deferred by a guard past `safety.max_defer`; never issued. Final.
    Expired,
    /// A target of a campaign stopped before it was issued
    /// (`mandrill campaign stop`); never issued. Final.
    Cancelled,
}

impl Status {
    /// Every status, in declaration order (`store::sql` tests that none is
    /// missing): what the stores derive their SQL lists of statuses from.
    pub const ALL: [Self; 10] = [
        Self::Received,
        Self::Retrying,
        Self::Restarted,
        Self::Failed,
        Self::Rejected,
        Self::Unrecovered,
        Self::Denied,
        Self::DryRun,
        Self::Expired,
        Self::Cancelled,
    ];

    /// The outcomes of attempts that issued no restart, though claimed (a
    /// claim is written before its restart is issued).
    pub const NOT_ISSUED: [Self; 3] = [Self::DryRun, Self::Expired, Self::Denied];

    /// Whether no further work will be done for this request.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Restarted
                | Self::Failed
                | Self::Rejected
                | Self::Unrecovered
                | Self::Denied
                | Self::DryRun
                | Self::Expired
                | Self::Cancelled
        )
    }

    /// The name used in storage and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Retrying => "retrying",
            Self::Restarted => "restarted",
            Self::Failed => "failed",
            Self::Rejected => "rejected",
            Self::Unrecovered => "unrecovered",
            Self::Denied => "denied",
            Self::DryRun => "dry-run",
            Self::Expired => "expired",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses the name used in storage.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "received" => Self::Received,
            "retrying" => Self::Retrying,
            "restarted" => Self::Restarted,
            "failed" => Self::Failed,
            "rejected" => Self::Rejected,
            "unrecovered" => Self::Unrecovered,
            "denied" => Self::Denied,
            "dry-run" => Self::DryRun,
            "expired" => Self::Expired,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a successful restart leaves for the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Restarted {
    /// How long the host took to pass its health probe after the restart;
    /// `None` when recovery is not verified.
    pub recovered_after: Option<std::time::Duration>,
    /// What the backend printed or answered, truncated.
    pub output: Option<String>,
}

/// The outcome of one attempt at a request, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The host was restarted (and, if verification is on, came back).
    Restarted(Restarted),
    /// The restart failed and will be retried.
    Retrying {
        /// What went wrong.
        error: String,
    },
    /// The restart failed for the last time, or for good.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// The host was restarted but did not come back in time. Final: the
    /// restart happened, and doing it again is not the answer.
    Unrecovered {
        /// What the verification saw.
        error: String,
        /// What the backend printed or answered, truncated.
        output: Option<String>,
    },
    /// A safety guard refused the request for good. Final.
    Denied {
        /// Which guard, and why.
        reason: String,
    },
    /// Leashed: nothing was issued. Final.
    DryRun {
        /// The exact action that would have been taken.
        action: String,
    },
    /// A guard deferred the request past `safety.max_defer`. Final.
    Expired {
        /// What deferred it, and since when.
        reason: String,
    },
    /// Its campaign was stopped while it was in flight, and the claim
    /// found the stop's mark at its next delivery. Final.
    Cancelled {
        /// Which campaign, who stopped it and why.
        reason: String,
    },
}

impl Outcome {
    /// A restart with nothing more to say.
    #[cfg(test)]
    pub(crate) fn restarted() -> Self {
        Self::Restarted(Restarted::default())
    }

    /// The status this outcome leaves the request in.
    pub(crate) fn status(&self) -> Status {
        match self {
            Self::Restarted(_) => Status::Restarted,
            Self::Retrying { .. } => Status::Retrying,
            Self::Failed { .. } => Status::Failed,
            Self::Unrecovered { .. } => Status::Unrecovered,
            Self::Denied { .. } => Status::Denied,
            Self::DryRun { .. } => Status::DryRun,
            Self::Expired { .. } => Status::Expired,
            Self::Cancelled { .. } => Status::Cancelled,
        }
    }

    /// The error text, if the attempt failed.
    pub(crate) fn error(&self) -> Option<&str> {
        match self {
            Self::Restarted(_) | Self::DryRun { .. } => None,
            Self::Retrying { error }
            | Self::Failed { error }
            | Self::Unrecovered { error, .. }
            | Self::Denied { reason: error }
            | Self::Expired { reason: error }
            | Self::Cancelled { reason: error } => Some(error),
        }
    }

    /// The backend's output, if it gave any.
    pub(crate) fn output(&self) -> Option<&str> {
        match self {
            Self::Restarted(restarted) => restarted.output.as_deref(),
            Self::Unrecovered { output, .. } => output.as_deref(),
            Self::DryRun { action } => Some(action),
            Self::Retrying { .. }
            | Self::Failed { .. }
            | Self::Denied { .. }
            | Self::Expired { .. }
            | Self::Cancelled { .. } => None,
        }
    }

    /// How long the host took to recover, if that was verified.
    pub(crate) fn recovered_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Restarted(restarted) => restarted.recovered_after,
            _ => None,
        }
    }
}
