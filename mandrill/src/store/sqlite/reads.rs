//! Batched lookups and the mapping of a history row.

use std::sync::Arc;

use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Lookup;
use crate::domain::Status;
use crate::sqlite::writer::MAX_BATCH;
use crate::store::{HistoryEntry, StoreError, Timestamp, duration_of};

/// Answers every queued lookup with one query, until `closing`.
pub(super) async fn lookup_loop(
    pool: SqlitePool,
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
        // A vector of strings always serialises.
        let ids = serde_json::to_string(&ids).expect("ids serialise");
        let found: Result<Vec<(String, String)>, sqlx::Error> = sqlx::query_as(
            "SELECT message_id, status FROM requests
             WHERE message_id IN (SELECT value FROM json_each(?1))",
        )
        .bind(ids)
        .fetch_all(&pool)
        .await;
        match found {
            Ok(rows) => {
                let statuses: std::collections::HashMap<String, String> =
                    rows.into_iter().collect();
                for (id, reply) in batch.drain(..) {
                    let status = statuses.get(&id.to_string()).map(|s| {
                        Status::from_name(s)
                            .ok_or_else(|| StoreError::Corrupt(format!("status {s:?}")))
                    });
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
    receiver.close();
    while let Ok((_, reply)) = receiver.try_recv() {
        let _ = reply.send(Err(StoreError::Closed));
    }
}

pub(super) fn entry_from_row(row: &SqliteRow) -> Result<HistoryEntry, StoreError> {
    let status: String = row.try_get("status")?;
    let message_id: Option<String> = row.try_get("message_id")?;
    Ok(HistoryEntry {
        message_id: message_id
            .map(|id| {
                Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("message_id {id:?}")))
            })
            .transpose()?,
        instance_name: row.try_get("instance_name")?,
        hostname: row.try_get("hostname")?,
        status: Status::from_name(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("status {status:?}")))?,
        attempts: row
            .try_get::<i64, _>("attempts")?
            .try_into()
            .unwrap_or(u32::MAX),
        requested_by: row.try_get("requested_by")?,
        reason: row.try_get("reason")?,
        last_error: row.try_get("last_error")?,
        output: row.try_get("output")?,
        recovered_after: duration_of(row.try_get("recovered_after_ms")?),
        received_at: Timestamp::from_millis(row.try_get("received_at")?),
        updated_at: Timestamp::from_millis(row.try_get("updated_at")?),
        completed_at: row
            .try_get::<Option<i64>, _>("completed_at")?
            .map(Timestamp::from_millis),
    })
}
