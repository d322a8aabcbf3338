//! The statements each operation runs inside the writer's transaction:
//! publish, claim, settle, and the move to `dead_letters`.

use super::writer::Limits;
use super::*;

/// What one claim or settlement did inside the transaction.
pub(crate) enum Step {
    Claimed(Claimed),
    Settled(Result<(), BrokerError>),
}

pub(super) use crate::sqlite::writer::Tx;

/// One claim of one row: the row id and the delivery number holding the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Claim {
    pub(super) id: i64,
    pub(super) delivery: i64,
}

impl Claim {
    pub(super) fn tag(self) -> DeliveryTag {
        DeliveryTag::pair(self.id.unsigned_abs(), self.delivery.unsigned_abs())
    }

    pub(super) fn from_tag(tag: &DeliveryTag) -> Result<Self, BrokerError> {
        let (id, delivery) = tag
            .as_pair()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        Ok(Self {
            id: i64::try_from(id).map_err(|_| BrokerError::LeaseLost(tag.clone()))?,
            delivery: i64::try_from(delivery).map_err(|_| BrokerError::LeaseLost(tag.clone()))?,
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub(super) deliveries: Vec<(Claim, Delivery)>,
    /// When nothing was claimable: the earliest `visible_at` in the queue.
    pub(super) next_visible_at: Option<i64>,
}

pub(super) async fn publish(
    tx: &mut Tx<'_>,
    payloads: &[&[u8]],
    now: i64,
) -> Result<(), sqlx::Error> {
    for chunk in crate::sqlite::runs(payloads, INSERT_CHUNK) {
        let mut insert: QueryBuilder<Sqlite> =
            QueryBuilder::new("INSERT INTO queue (payload, published_at, visible_at) ");
        insert.push_values(chunk, |mut row, payload| {
            row.push_bind(*payload).push_bind(now).push_bind(now);
        });
        insert.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// The largest delivery count a claim writes: attempts are `u32`, and the
/// bound keeps a hand-edited count from overflowing.
pub(super) const MAX_DELIVERY_COUNT: i64 = u32::MAX as i64 - 1;

pub(super) async fn claim(
    tx: &mut Tx<'_>,
    max: usize,
    now: i64,
    limits: Limits,
) -> Result<Step, sqlx::Error> {
    // However often a row was claimed, it is delivered: the worker keeps the
    // delivery limit, and records in the store whatever it gives up on. Only
    // a prefix of the payload is read (`substr` on a BLOB counts bytes), and
    // `length` of a BLOB column needs no read of its content.
    let rows = sqlx::query(
        "UPDATE queue SET
             deliveries = min(max(deliveries, 0), ?1) + 1,
             lease      = min(max(deliveries, 0), ?1) + 1,
             visible_at = ?2
         WHERE id IN (SELECT id FROM queue WHERE visible_at <= ?3
                      ORDER BY visible_at, id LIMIT ?4)
         RETURNING id, substr(payload, 1, ?5) AS payload, length(payload) AS full_size, lease",
    )
    .bind(MAX_DELIVERY_COUNT)
    .bind(now.saturating_add(limits.ack_deadline))
    .bind(now)
    .bind(i64::try_from(max).unwrap_or(i64::MAX))
    .bind(limits.payload_prefix)
    .fetch_all(&mut **tx)
    .await?;
    let mut claimed = Claimed::default();
    let mut unreadable: Vec<(i64, String)> = Vec::new();
    for row in &rows {
        // The primary key is always an integer.
        let id: i64 = row.try_get("id")?;
        let decoded = (|| -> Result<_, sqlx::Error> {
            let payload: Vec<u8> = row.try_get("payload")?;
            let full_size: i64 = row.try_get("full_size")?;
            let lease: i64 = row.try_get("lease")?;
            Ok((payload, full_size, lease))
        })();
        match decoded {
            Ok((payload, full_size, lease)) => {
                let claim = Claim {
                    id,
                    delivery: lease,
                };
                let mut delivery = Delivery::new(
                    claim.tag(),
                    Bytes::from(payload),
                    u32::try_from(lease).unwrap_or(u32::MAX),
                );
                delivery.full_size = usize::try_from(full_size)
                    .unwrap_or(usize::MAX)
                    .max(delivery.payload.len());
                claimed.deliveries.push((claim, delivery));
            }
            Err(error) => unreadable.push((id, format!("unreadable queue row: {error}"))),
        }
    }
    for (id, reason) in unreadable {
        let reason = bounded_reason(&reason);
        warn!(id, %reason, "message dead-lettered by the broker");
        move_to_dead_letters(tx, id, None, &reason, now).await?;
    }
    claimed.deliveries.sort_by_key(|(claim, _)| claim.id);
    if claimed.deliveries.is_empty() {
        claimed.next_visible_at = sqlx::query_scalar("SELECT min(visible_at) FROM queue")
            .fetch_one(&mut **tx)
            .await?;
    }
    Ok(Step::Claimed(claimed))
}

/// Moves row `id` (if its lease is still `lease`, when given) to the dead
/// letters; returns whether it did.
pub(super) async fn move_to_dead_letters(
    tx: &mut Tx<'_>,
    id: i64,
    lease: Option<i64>,
    reason: &str,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "INSERT INTO dead_letters (payload, reason, deliveries, published_at, dead_at)
         SELECT CAST(payload AS BLOB), ?3, deliveries, published_at, ?4 FROM queue
         WHERE id = ?1 AND (?2 IS NULL OR lease = ?2)",
    )
    .bind(id)
    .bind(lease)
    .bind(reason)
    .bind(now)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved == 0 {
        return Ok(false);
    }
    sqlx::query("DELETE FROM queue WHERE id = ?1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(true)
}

pub(super) async fn settle(
    tx: &mut Tx<'_>,
    claim: Claim,
    action: &Action,
    now: i64,
    limits: Limits,
) -> Result<Step, sqlx::Error> {
    let matched = match action {
        Action::Ack => {
            sqlx::query("DELETE FROM queue WHERE id = ?1 AND lease = ?2")
                .bind(claim.id)
                .bind(claim.delivery)
                .execute(&mut **tx)
                .await?
                .rows_affected()
                > 0
        }
        Action::Nack(delay) => {
            sqlx::query(
                "UPDATE queue SET lease = NULL, visible_at = ?3 WHERE id = ?1 AND lease = ?2",
            )
            .bind(claim.id)
            .bind(claim.delivery)
            .bind(now.saturating_add(millis(*delay)))
            .execute(&mut **tx)
            .await?
            .rows_affected()
                > 0
        }
        Action::Extend => {
            sqlx::query("UPDATE queue SET visible_at = ?3 WHERE id = ?1 AND lease = ?2")
                .bind(claim.id)
                .bind(claim.delivery)
                .bind(now.saturating_add(limits.ack_deadline))
                .execute(&mut **tx)
                .await?
                .rows_affected()
                > 0
        }
        Action::DeadLetter(reason) => {
            move_to_dead_letters(
                tx,
                claim.id,
                Some(claim.delivery),
                &bounded_reason(reason),
                now,
            )
            .await?
        }
    };
    Ok(Step::Settled(if matched {
        Ok(())
    } else {
        Err(BrokerError::LeaseLost(claim.tag()))
    }))
}
