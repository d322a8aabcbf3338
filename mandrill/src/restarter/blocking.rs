//! Bridges blocking restart code into the runtime.
//!
//! Each call runs on tokio's blocking thread pool, and a semaphore bounds how
//! many run at once so that a slow backend cannot grow the pool without
//! limit. The async side only waits on a join handle, so the runtime's worker
//! threads keep pulling and handling other messages meanwhile.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::{Reservation, Reserving, RestartError, Restarter};
use crate::domain::{RestartRequest, Restarted};

/// A restart backend written with blocking calls (a sync client, a
/// subprocess wait, `std::thread::sleep`).
pub(crate) trait BlockingRestart: Send + Sync + 'static {
    /// Restarts `host`, blocking the calling thread until done.
    fn restart_blocking(&self, request: &RestartRequest) -> Result<Restarted, RestartError>;
}

/// Runs a [`BlockingRestart`] on at most `threads` blocking threads at a time.
pub(crate) struct Blocking<R> {
    inner: Arc<R>,
    threads: Arc<Semaphore>,
}

impl<R: BlockingRestart> Blocking<R> {
    /// Wraps `inner`, allowing `threads` concurrent blocking calls (at least 1).
    pub(crate) fn new(inner: R, threads: usize) -> Self {
        Self {
            inner: Arc::new(inner),
            threads: Arc::new(Semaphore::new(threads.max(1))),
        }
    }
}

#[async_trait]
impl<R: BlockingRestart> Restarter for Blocking<R> {
    /// Waits for a free blocking thread (without a wait when one is free).
    fn reserve<'a>(&'a self, _request: &'a RestartRequest) -> Reserving<'a> {
        if let Ok(permit) = self.threads.clone().try_acquire_owned() {
            return Reserving::now(Ok(Reservation::permit(permit)));
        }
        Reserving::wait(async move {
            // The semaphore is never closed, so acquiring cannot fail.
            let permit = self
                .threads
                .clone()
                .acquire_owned()
                .await
                .expect("blocking pool semaphore is never closed");
            Ok(Reservation::permit(permit))
        })
    }

    async fn restart(
        &self,
        request: &RestartRequest,
        reservation: Reservation,
    ) -> Result<Restarted, RestartError> {
        let inner = self.inner.clone();
        let thread_request = request.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let _reservation = reservation;
            inner.restart_blocking(&thread_request)
        })
        .await;
        joined.unwrap_or_else(|join_error| {
            Err(RestartError::Aborted {
                host: request.hostname.clone(),
                source: Arc::new(join_error),
            })
        })
    }
}
