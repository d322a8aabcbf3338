//! Dead-letter administration: listing and requeueing, on the read pool.

use super::*;
use crate::domain::{Timestamp, salvage_message_id};

/// Most bytes of a dead letter's payload a listing reads: a payload can be
/// far larger than any valid request (that may be why it is dead).
pub(super) const MAX_LISTED_PAYLOAD_BYTES: i64 = 64 * 1024;

#[async_trait]
impl DeadLetterAdmin for SqliteBroker {
    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError> {
        let rows = sqlx::query(
            "SELECT id, reason, deliveries, published_at, dead_at,
                    substr(payload, 1, ?1) AS payload, length(payload) AS payload_size
             FROM dead_letters ORDER BY id",
        )
        .bind(MAX_LISTED_PAYLOAD_BYTES)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                let payload = Bytes::from(row.try_get::<Vec<u8>, _>("payload")?);
                let count = |column: &str| -> Result<u64, sqlx::Error> {
                    Ok(row.try_get::<i64, _>(column)?.max(0).unsigned_abs())
                };
                Ok(DeadLetterEntry {
                    id: DeadLetterId::Number(count("id")?),
                    reason: row.try_get("reason")?,
                    message_id: salvage_message_id(&payload).map(|id| id.to_string()),
                    dead_at: Timestamp::from_millis(row.try_get("dead_at")?),
                    published_at: Some(Timestamp::from_millis(row.try_get("published_at")?)),
                    deliveries: Some(count("deliveries")?),
                    payload_size: count("payload_size")?,
                    payload,
                    // The table keeps the whole payload; a listing reads a prefix.
                    truncated: false,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(unavailable)
    }

    /// Moves dead letters back into the queue as new, undelivered messages,
    /// in one transaction: all that [`choose`] picks, or nothing.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError> {
        let now = now_millis();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        let listed: Vec<DeadLetterId> =
            sqlx::query_scalar::<_, i64>("SELECT id FROM dead_letters ORDER BY id")
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?
                .into_iter()
                .map(|id| DeadLetterId::Number(id.max(0).unsigned_abs()))
                .collect();
        let chosen = choose(ids, listed.iter().map(|id| (id, false)))?;
        for id in &chosen {
            let DeadLetterId::Number(row) = id else {
                continue;
            };
            // Rows are positive: within i64.
            let row = i64::try_from(*row).unwrap_or(i64::MAX);
            sqlx::query(
                "INSERT INTO queue (payload, published_at, visible_at)
                 SELECT payload, published_at, ?2 FROM dead_letters WHERE id = ?1",
            )
            .bind(row)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
            sqlx::query("DELETE FROM dead_letters WHERE id = ?1")
                .bind(row)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(chosen)
    }
}
