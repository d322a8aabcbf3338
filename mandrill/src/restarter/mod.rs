//! The `Restarter` seam: what actually restarts a host.
//!
//! Async restarters implement [`Restarter`] directly. Restarters built on
//! blocking code implement [`BlockingRestart`] and are wrapped in
//! [`Blocking`], which runs them on a bounded pool of blocking threads so
//! that they never stall the runtime.

pub mod blocking;
pub mod journal;
pub mod simulate;

use async_trait::async_trait;

use crate::domain::Hostname;

pub use blocking::{Blocking, BlockingRestart};
pub use journal::Journaled;
pub use simulate::{SimulatedBlockingRestarter, SimulatedRestarter, Simulation};

/// Why a restart did not happen. Every kind is retried by the worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestartError {
    /// The backend tried and failed.
    #[error("restart of {host} failed: {reason}")]
    Failed {
        /// The host.
        host: Hostname,
        /// What the backend said.
        reason: String,
    },
    /// The backend did not answer in time; the host may or may not restart.
    #[error("restart of {host} timed out after {after:?}")]
    TimedOut {
        /// The host.
        host: Hostname,
        /// The configured limit.
        after: std::time::Duration,
    },
    /// The blocking pool's thread panicked or was shut down.
    #[error("restart of {host} did not complete: {reason}")]
    Aborted {
        /// The host.
        host: Hostname,
        /// What happened to the thread.
        reason: String,
    },
}

/// Capacity to issue one restart, held from [`Restarter::reserve`] until the
/// restart is done.
#[derive(Debug, Default)]
pub struct Reservation {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Reservation {
    /// Nothing to hold: the backend has no limit of its own.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// Holds a semaphore permit until the restart is done.
    pub fn permit(permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        Self {
            _permit: Some(permit),
        }
    }
}

/// Restarts one host, in two steps. [`Restarter::reserve`] waits for
/// capacity (a free thread, later a rate limit) and has not touched the host:
/// the worker may abandon it on shutdown. [`Restarter::restart`] issues the
/// restart: from then on the worker waits for its outcome and records it.
#[async_trait]
pub trait Restarter: Send + Sync + 'static {
    /// Waits until a restart can be issued. Cancel-safe: dropping the future
    /// issues nothing.
    async fn reserve(&self) -> Reservation {
        Reservation::unlimited()
    }

    /// Restarts `host`, returning once the backend confirmed it (or failed).
    async fn restart(&self, host: &Hostname, reservation: Reservation) -> Result<(), RestartError>;
}
