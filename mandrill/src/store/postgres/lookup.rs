//! Lookups answered in groups: one task takes every queued lookup and
//! answers them all with one query. Every handler's first store call is a
//! lookup; through the pool, tens of thousands of handlers in flight queue
//! for its few connections, and those waiting longer than the pool's
//! acquire timeout fail (transiently) and come back to queue again.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::Status;
use crate::store::StoreError;
use crate::store::status_from_name;

/// Most lookups answered by one query.
pub(super) const MAX_BATCH: usize = 1024;

/// A lookup waiting for its answer.
pub(super) type Lookup = (Uuid, oneshot::Sender<Result<Option<Status>, StoreError>>);

/// The statuses of the requests `$1` that are recorded. A join on
/// `unnest`, as the writers' statements, so that the index is used.
pub(super) const LOOKUP_SQL: &str = "SELECT r.message_id, r.status
    FROM unnest($1::text[]) AS u(id) JOIN requests r ON r.message_id = u.id";

/// Answers every queued lookup with one query, until `closing`; then
/// answers what is still queued `Closed`.
pub(super) async fn lookup_loop(
    pool: PgPool,
    mut receiver: mpsc::Receiver<Lookup>,
    closing: CancellationToken,
) {
    let mut batch: Vec<Lookup> = Vec::with_capacity(MAX_BATCH);
    loop {
        tokio::select! {
            received = receiver.recv_many(&mut batch, MAX_BATCH) => if received == 0 { break },
            () = closing.cancelled() => break,
        }
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.to_string()).collect();
        let found: Result<Vec<(String, String)>, sqlx::Error> =
            sqlx::query_as(LOOKUP_SQL).bind(&ids).fetch_all(&pool).await;
        match found {
            Ok(rows) => {
                let statuses: HashMap<String, String> = rows.into_iter().collect();
                for ((_, reply), id) in batch.drain(..).zip(&ids) {
                    let status = statuses.get(id).map(|name| status_from_name(name));
                    let _ = reply.send(status.transpose());
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Batch(error.clone())));
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
