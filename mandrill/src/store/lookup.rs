//! Lookups answered in groups: one task takes every queued lookup and
//! answers them all with one query. Every handler's first store call is a
//! lookup; through a pool, tens of thousands of handlers in flight queue
//! for its few connections, and those waiting longer than the pool's
//! acquire timeout fail (transiently) and come back to queue again.
//!
//! Written once for the SQL stores: each passes the query that reads the
//! statuses of a batch of ids.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{StoreError, status_from_name};
use crate::domain::Status;

/// A lookup waiting for its answer.
pub(crate) type Lookup = (Uuid, oneshot::Sender<Result<Option<Status>, StoreError>>);

/// Answers every queued lookup, at most `max_batch` at a time, with one
/// call of `fetch` (the ids, as stored; it returns the `(id, status)` of
/// those recorded), until `closing`; then answers what is still queued
/// `Closed`. A failed fetch fails each lookup of its batch, and so does one
/// that takes longer than `timeout` (its callers have stopped waiting by
/// then, and a database that hangs must not hold the task, and the store's
/// close, for ever).
pub(crate) async fn lookup_loop<F, Fut>(
    mut receiver: mpsc::Receiver<Lookup>,
    closing: CancellationToken,
    max_batch: usize,
    timeout: Duration,
    mut fetch: F,
) where
    F: FnMut(Vec<String>) -> Fut,
    Fut: Future<Output = Result<Vec<(String, String)>, sqlx::Error>>,
{
    let mut batch: Vec<Lookup> = Vec::with_capacity(max_batch);
    loop {
        tokio::select! {
            received = receiver.recv_many(&mut batch, max_batch) => if received == 0 { break },
            () = closing.cancelled() => break,
        }
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.to_string()).collect();
        let fetched = tokio::time::timeout(timeout, fetch(ids.clone())).await;
        match fetched {
            Ok(Ok(rows)) => {
                let statuses: HashMap<String, String> = rows.into_iter().collect();
                for ((_, reply), id) in batch.drain(..).zip(&ids) {
                    let status = statuses.get(id).map(|name| status_from_name(name));
                    let _ = reply.send(status.transpose());
                }
            }
            Ok(Err(error)) => {
                let error = Arc::new(error);
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Batch(error.clone())));
                }
            }
            Err(_elapsed) => {
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::TimedOut { after: timeout }));
                }
            }
        }
    }
    // Whoever is still waiting gets an answer, not a hang.
    receiver.close();
    while let Ok((_, reply)) = receiver.try_recv() {
        let _ = reply.send(Err(StoreError::Closed));
    }
}
