//! The `Restarter` seam: what actually restarts a host.
//!
//! Async restarters implement [`Restarter`] directly. Restarters built on
//! blocking code implement [`BlockingRestart`] and are wrapped in
//! [`Blocking`], which runs them on a bounded pool of blocking threads so
//! that they never stall the runtime.

pub(crate) mod blocking;
pub(crate) mod command;
pub(crate) mod ec2;
pub(crate) mod hosts;
pub(crate) mod http;
pub(crate) mod journal;
pub(crate) mod process;
pub(crate) mod simulate;
pub(crate) mod ssh;
pub(crate) mod template;
pub(crate) mod verify;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::domain::{Hostname, RestartRequest, Restarted};

pub(crate) use crate::causes::Cause;
pub(crate) use blocking::{Blocking, BlockingRestart};
pub(crate) use command::{CommandRestarter, CommandSettings};
pub(crate) use ec2::{Ec2Restarter, Ec2Settings};
pub(crate) use http::{HttpRestarter, HttpSettings};
pub(crate) use journal::Journaled;
pub(crate) use simulate::{SimulatedBlockingRestarter, SimulatedRestarter, Simulation};
pub(crate) use ssh::{SshRestarter, SshSettings};
pub(crate) use verify::{Verified, VerifySettings};

/// Why a restart did not happen, or did not end well. The worker branches
/// on [`RestartError::is_retryable`], and leaves the claim of an
/// [`RestartError::OutcomeUnknown`] holding the host. The message names the
/// host and what became of the restart; what the backend saw is the source
/// (a [`Cause`]), so a log line or the history shows the whole chain
/// through [`RestartError::with_causes`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RestartError {
    /// The backend tried and failed; retrying may help.
    #[error("restart of {host} failed")]
    Failed {
        /// The host.
        host: Hostname,
        /// What the backend saw.
        #[source]
        cause: Cause,
        /// When the backend asked to be tried again (e.g. `Retry-After`).
        retry_after: Option<Duration>,
    },
    /// The backend refused in a way retrying cannot fix: bad credentials, a
    /// host key mismatch, a 4xx answer, a configured exit code.
    #[error("restart of {host} refused")]
    Permanent {
        /// The host.
        host: Hostname,
        /// What the backend saw.
        #[source]
        cause: Cause,
    },
    /// The backend did not answer in time; the host may or may not restart.
    #[error("restart of {host} timed out after {after:?}")]
    TimedOut {
        /// The host.
        host: Hostname,
        /// The configured limit.
        after: Duration,
    },
    /// The restart was issued and did not end in time, and the backend
    /// could not confirm that it stopped: it may still be running on the
    /// host. Not retried now: the worker records no outcome, so the claim
    /// keeps holding the host until it expires and then counts as a used
    /// attempt ("issued, outcome unknown"), and no second restart runs
    /// beside this one meanwhile.
    #[error("restart of {host}: outcome unknown, it may still be running or have run")]
    OutcomeUnknown {
        /// The host.
        host: Hostname,
        /// What happened, and why the end could not be confirmed.
        #[source]
        cause: Cause,
    },
    /// The blocking pool's thread panicked or was shut down.
    #[error("restart of {host} did not complete")]
    Aborted {
        /// The host.
        host: Hostname,
        /// What happened to the thread.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
    /// The restart was issued but the host did not come back healthy in
    /// time. Not retried: the restart happened.
    #[error("{host} did not recover within {after:?}")]
    Unrecovered {
        /// The host.
        host: Hostname,
        /// The verification timeout.
        after: Duration,
        /// What the last probe saw.
        #[source]
        cause: Cause,
        /// What the backend printed or answered, truncated.
        output: Option<String>,
    },
}

impl RestartError {
    /// A failure worth retrying, without a hint of when.
    pub(crate) fn failed(host: &Hostname, cause: impl Into<Cause>) -> Self {
        Self::Failed {
            host: host.clone(),
            cause: cause.into(),
            retry_after: None,
        }
    }

    /// A refusal that retrying cannot fix.
    pub(crate) fn permanent(host: &Hostname, cause: impl Into<Cause>) -> Self {
        Self::Permanent {
            host: host.clone(),
            cause: cause.into(),
        }
    }

    /// The error followed by its causes (`restart of web-1 failed: POST
    /// https://… answered 503`), for a log line, a notification or the
    /// history, where the message must stand alone.
    pub(crate) fn with_causes(&self) -> impl std::fmt::Display + '_ {
        crate::causes::WithCauses(self)
    }

    /// Whether another attempt may succeed.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Failed { .. } | Self::TimedOut { .. } | Self::Aborted { .. }
        )
    }

    /// When the backend asked to be tried again, if it did.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Failed { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A backend setting that cannot be used, found when the backend is built:
/// the dotted key, what is wrong, and the error beneath when there is one
/// (a file that cannot be read).
#[derive(Debug, thiserror::Error)]
#[error("{key}: {why}")]
#[non_exhaustive]
pub(crate) struct SettingError {
    /// The dotted key (`restarter.http.ca_file`).
    pub key: String,
    /// What is wrong.
    pub why: String,
    /// What failed beneath.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl SettingError {
    /// `key` cannot be used: `why`.
    pub(crate) fn new(key: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            why: why.into(),
            source: None,
        }
    }

    /// The error followed by its cause, for the line that tells the
    /// operator.
    #[cfg(test)]
    pub(crate) fn with_causes(&self) -> impl std::fmt::Display + '_ {
        crate::causes::WithCauses(self)
    }

    /// `key` cannot be used: `why`, because of `source`.
    pub(crate) fn because(
        key: impl Into<String>,
        why: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            source: Some(Box::new(source)),
            ..Self::new(key, why)
        }
    }
}

/// Capacity to issue one restart, held from [`Restarter::reserve`] until the
/// restart is done.
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Reservation {
    /// Nothing to hold: the backend has no limit of its own.
    pub(crate) fn unlimited() -> Self {
        Self::default()
    }

    /// Holds a semaphore permit until the restart is done.
    pub(crate) fn permit(permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        Self {
            _permit: Some(permit),
        }
    }
}

/// A backend (or a guard wrapped around one) will not take this restart
/// now. Nothing was issued: the worker defers the request for
/// `retry_after`, records `reason` as the decision (`mandrill explain`),
/// and counts no attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{guard} refused: {reason} (retry after {retry_after:?})")]
#[non_exhaustive]
pub(crate) struct Refusal {
    /// Who refused, as a decision names its guard (`backend`, `rate limit`).
    pub guard: &'static str,
    /// Why, in plain words.
    pub reason: String,
    /// When to try again.
    pub retry_after: Duration,
}

impl Refusal {
    /// `guard` refuses for `reason`; ask again after `retry_after`.
    #[cfg(test)]
    pub(crate) fn new(
        guard: &'static str,
        reason: impl Into<String>,
        retry_after: Duration,
    ) -> Self {
        Self {
            guard,
            reason: reason.into(),
            retry_after,
        }
    }
}

/// What [`Restarter::reserve`] returns: an answer at once, or a wait.
///
/// Not an `async fn` on purpose: a `dyn Restarter`'s `async fn` allocates
/// a boxed future per call, and most reservations are decided at once (no
/// limit, a free permit). Only a reservation that must wait is boxed.
#[must_use = "a reservation does nothing unless awaited"]
pub(crate) struct Reserving<'a>(ReservingInner<'a>);

enum ReservingInner<'a> {
    Now(Option<Result<Reservation, Refusal>>),
    Waiting(BoxFuture<'a, Result<Reservation, Refusal>>),
}

impl<'a> Reserving<'a> {
    /// Decided already.
    pub(crate) fn now(answer: Result<Reservation, Refusal>) -> Self {
        Self(ReservingInner::Now(Some(answer)))
    }

    /// Nothing to wait for and nothing to hold.
    pub(crate) fn unlimited() -> Self {
        Self::now(Ok(Reservation::unlimited()))
    }

    /// Decided by `wait`, which must be cancel-safe (dropping it reserves
    /// nothing).
    pub(crate) fn wait(
        wait: impl Future<Output = Result<Reservation, Refusal>> + Send + 'a,
    ) -> Self {
        Self(ReservingInner::Waiting(Box::pin(wait)))
    }

    /// Whether the answer may take a while (decisions made before it may
    /// be stale by then).
    pub(crate) fn may_wait(&self) -> bool {
        matches!(self.0, ReservingInner::Waiting(_))
    }
}

impl Future for Reserving<'_> {
    type Output = Result<Reservation, Refusal>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Unpin: the answer is moved out, the wait is boxed.
        match &mut self.get_mut().0 {
            ReservingInner::Now(answer) => Poll::Ready(
                answer
                    .take()
                    .expect("a reservation is polled after its answer"),
            ),
            ReservingInner::Waiting(wait) => wait.as_mut().poll(cx),
        }
    }
}

/// Restarts one host, in two steps. [`Restarter::reserve`] waits for
/// capacity (a free thread, a connection), or refuses (a rate limit, a
/// schedule, a backend in maintenance), and has not touched the host: the
/// worker may abandon it on shutdown, and a refusal defers the request
/// without using an attempt. [`Restarter::restart`] issues the restart:
/// from then on the worker waits for its outcome and records it. Both see
/// the whole request: its message id is the idempotency key a webhook or
/// remote command can pass on. Decorators ([`Journaled`], [`Verified`])
/// pass reservations and refusals through unchanged.
#[async_trait]
pub(crate) trait Restarter: Send + Sync + 'static {
    /// Waits until a restart of `request` can be issued, or refuses it.
    /// Cancel-safe: dropping the future issues nothing.
    fn reserve<'a>(&'a self, _request: &'a RestartRequest) -> Reserving<'a> {
        Reserving::unlimited()
    }

    /// The exact action a restart of `request` would take (the argv, the
    /// SSH destination and command, the HTTP request), for dry runs and the
    /// audit record. Touches nothing.
    fn describe(&self, request: &RestartRequest) -> String {
        format!("restart {} (simulated)", request.hostname)
    }

    /// Restarts the request's host, returning once the backend confirmed it
    /// (or failed).
    async fn restart(
        &self,
        request: &RestartRequest,
        reservation: Reservation,
    ) -> Result<Restarted, RestartError>;
}
