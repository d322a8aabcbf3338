//! Dead-letter administration: listing and requeueing, on the read pool.

use super::*;

/// Most bytes of a dead letter's payload a listing reads: a payload can be
/// far larger than any valid request (that may be why it is dead).
pub(super) const MAX_LISTED_PAYLOAD_BYTES: i64 = 64 * 1024;

#[async_trait]
impl DeadLetterAdmin for SqliteBroker {
    fn keeps_records(&self) -> bool {
        true
    }

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
                let payload: Vec<u8> = row.try_get("payload")?;
                Ok(DeadLetterEntry {
                    id: DeadLetterId::Row(row.try_get("id")?),
                    reason: row.try_get("reason")?,
                    payload: Bytes::from(payload),
                    record: Some(DeadLetterRecord {
                        deliveries: row.try_get("deliveries")?,
                        published_at: row.try_get("published_at")?,
                        dead_at: row.try_get("dead_at")?,
                        payload_size: row.try_get("payload_size")?,
                    }),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(unavailable)
    }

    /// Moves dead letters back into the queue as new, undelivered messages.
    /// All or nothing: if an id is unknown, nothing is requeued.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError> {
        let now = now_millis();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        let selected: Vec<i64> = match ids {
            None => sqlx::query_scalar("SELECT id FROM dead_letters ORDER BY id")
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?,
            Some(ids) => {
                let mut missing = Vec::new();
                let mut found = Vec::with_capacity(ids.len());
                for given in ids {
                    // An id that is not a number names no row.
                    let exists: Option<i64> = match given.parse::<i64>() {
                        Ok(id) => sqlx::query_scalar("SELECT id FROM dead_letters WHERE id = ?1")
                            .bind(id)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(unavailable)?,
                        Err(_) => None,
                    };
                    match exists {
                        Some(id) => found.push(id),
                        None => missing.push(given.clone()),
                    }
                }
                if !missing.is_empty() {
                    return Err(BrokerError::Fatal(
                        format!(
                            "no dead letter with id {}; nothing requeued",
                            missing.join(", ")
                        )
                        .into(),
                    ));
                }
                found
            }
        };
        for &id in &selected {
            sqlx::query(
                "INSERT INTO queue (payload, published_at, visible_at)
                 SELECT payload, published_at, ?2 FROM dead_letters WHERE id = ?1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
            sqlx::query("DELETE FROM dead_letters WHERE id = ?1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(selected.into_iter().map(DeadLetterId::Row).collect())
    }
}
