//! Outcomes, rejections, released claims and pruning, inside the writer's
//! transaction.

use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::ROWS_PER_STATEMENT;
use crate::domain::{Outcome, RestartRequest, Status};
use crate::sqlite::writer::Tx;
use crate::store::sql::{
    PRUNE_JOURNAL_SQL, PRUNE_ORPHANS_SQL, REJECTION_SQL, RELEASE_JOURNAL_SQL, RELEASE_SQL,
    not_final, outcome_set,
};
use crate::store::{Timestamp, millis_of};

/// Records outcomes, in one statement; for each, `None` if recorded, or the
/// final status that was already there. The request ids must be distinct.
pub(super) async fn insert_outcomes(
    tx: &mut Tx<'_>,
    outcomes: &[(&RestartRequest, u32, &Outcome)],
    now: i64,
) -> Result<Vec<Option<Status>>, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(Vec::new());
    }
    // Bound parameters, not a JSON array taken apart inside SQLite: the
    // JSON functions cost more than the writes themselves.
    let ids: Vec<String> = outcomes
        .iter()
        .map(|(request, _, _)| request.message_id.to_string())
        .collect();
    let mut recorded: Vec<String> = Vec::with_capacity(outcomes.len());
    for (chunk, ids) in outcomes
        .chunks(ROWS_PER_STATEMENT)
        .zip(ids.chunks(ROWS_PER_STATEMENT))
    {
        // One statement per chunk of distinct requests, so that two
        // deliveries of the same message (or two instances) cannot both
        // record a first final outcome.
        let mut insert: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO requests
                 (message_id, instance_name, hostname, requested_by, reason, status,
                  attempts, last_error, received_at, updated_at, completed_at, output,
                  recovered_after_ms) ",
        );
        insert.push_values(
            chunk.iter().zip(ids),
            |mut row, ((request, attempt, outcome), id)| {
                let status = outcome.status();
                row.push_bind(id.as_str())
                    .push_bind(request.instance_name.as_str())
                    .push_bind(request.hostname.as_str())
                    .push_bind(request.requested_by.as_deref())
                    .push_bind(request.reason.as_deref())
                    .push_bind(status.as_str())
                    .push_bind(i64::from(*attempt))
                    .push_bind(outcome.error())
                    .push_bind(now)
                    .push_bind(now)
                    .push_bind(status.is_final().then_some(now))
                    .push_bind(outcome.output())
                    .push_bind(millis_of(outcome.recovered_after()));
            },
        );
        insert.push(format!(
            " ON CONFLICT (message_id) DO UPDATE SET {} WHERE {} RETURNING message_id",
            outcome_set("excluded", "requests", "excluded.updated_at"),
            not_final("requests"),
        ));
        recorded.extend(
            insert
                .build_query_scalar::<String>()
                .fetch_all(&mut **tx)
                .await?,
        );
        // The attempt's own end, whatever another delivery recorded first.
        let mut settle: QueryBuilder<Sqlite> =
            QueryBuilder::new("UPDATE restarts SET outcome = j.column3, settled_at = ");
        settle.push_bind(now).push(" FROM (");
        settle.push_values(
            chunk.iter().zip(ids),
            |mut row, ((_, attempt, outcome), id)| {
                row.push_bind(id.as_str())
                    .push_bind(i64::from(*attempt))
                    .push_bind(outcome.status().as_str());
            },
        );
        settle.push(
            ") AS j WHERE restarts.message_id = j.column1 AND restarts.attempt = j.column2
               AND restarts.outcome IS NULL",
        );
        settle.build().execute(&mut **tx).await?;
    }
    let recorded: std::collections::HashSet<String> = recorded.into_iter().collect();
    let mut results = Vec::with_capacity(outcomes.len());
    for (request, _, _) in outcomes {
        let id = request.message_id.to_string();
        if recorded.contains(&id) {
            results.push(None);
            continue;
        }
        let existing: String =
            sqlx::query_scalar("SELECT status FROM requests WHERE message_id = ?1")
                .bind(&id)
                .fetch_one(&mut **tx)
                .await?;
        // The row was written by this program with a status from the CHECK list.
        results.push(Some(Status::from_name(&existing).unwrap_or(Status::Failed)));
    }
    Ok(results)
}

pub(super) async fn insert_rejection(
    tx: &mut Tx<'_>,
    message_id: Option<Uuid>,
    reason: &str,
    excerpt: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(REJECTION_SQL)
        .bind(message_id.map(|id| id.to_string()))
        .bind(reason)
        .bind(excerpt)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(super) async fn release(
    tx: &mut Tx<'_>,
    message_id: Uuid,
    attempt: u32,
    now: i64,
) -> Result<(), sqlx::Error> {
    let released = sqlx::query(&RELEASE_SQL)
        .bind(message_id.to_string())
        .bind(i64::from(attempt))
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?
        .is_some();
    if released {
        sqlx::query(RELEASE_JOURNAL_SQL)
            .bind(message_id.to_string())
            .bind(i64::from(attempt))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Deletes at most `max_rows` final rows completed before `before`.
pub(super) async fn prune(
    tx: &mut Tx<'_>,
    before: Timestamp,
    max_rows: u32,
) -> Result<u64, sqlx::Error> {
    let deleted = sqlx::query(
        "DELETE FROM requests WHERE id IN (
             SELECT id FROM requests WHERE completed_at < ?1
             ORDER BY completed_at LIMIT ?2)",
    )
    .bind(before.as_millis())
    .bind(i64::from(max_rows))
    .execute(&mut **tx)
    .await?;
    sqlx::query(PRUNE_JOURNAL_SQL)
        .bind(before.as_millis())
        .execute(&mut **tx)
        .await?;
    for orphans in PRUNE_ORPHANS_SQL {
        sqlx::query(orphans).execute(&mut **tx).await?;
    }
    Ok(deleted.rows_affected())
}
