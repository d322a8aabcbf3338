//! Outcomes, rejections, released claims and pruning, inside the writer's
//! transaction.

use std::collections::HashSet;
use std::sync::LazyLock;

use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::{AroundValues, ROWS_PER_STATEMENT};
use crate::domain::Timestamp;
use crate::domain::{Asked, Outcome, RestartRequest, Status};
use crate::sqlite::runs;
use crate::sqlite::writer::Tx;
use crate::store::sql::{
    REJECTION_SQL, RELEASE_JOURNAL_SQL, RELEASE_SQL, identity_from, not_final, outcome_set,
    same_identity,
};
use crate::store::{ClaimToken, Recorded, identity_conflict, millis_of};

/// Settles open rows with outcomes: for each row whose request is in the
/// `VALUES` list and not final, sets what an outcome sets, and returns its
/// id. An `UPDATE` by the unique index, not an upsert: nearly every outcome
/// ends a claim committed earlier, so its row exists, and an insert that
/// conflicts and then updates cost about 1.6 times as much.
static UPDATE_OUTCOMES: LazyLock<AroundValues> = LazyLock::new(|| {
    AroundValues::new(
        |rows| {
            format!(
                "UPDATE requests SET {} FROM ({rows}) AS new
                 WHERE requests.message_id = new.id AND {} AND {}
                 RETURNING requests.message_id",
                outcome_set("new", "requests", "new.updated_at"),
                not_final("requests"),
                same_identity("requests", "new"),
            )
        },
        &[
            "id",
            "status",
            "attempts",
            "last_error",
            "output",
            "recovered_after_ms",
            "completed_at",
            "updated_at",
            "instance_name",
            "requested_by",
            "requester",
            "reason",
        ],
    )
});

/// One outcome to record: the request, the attempt it ends, the outcome.
type Recording<'r> = (&'r RestartRequest, u32, &'r Outcome);

/// Records outcomes; for each, whether it was recorded, or the final
/// status already there, or the conflict with another request's row
/// ([`identity_conflict`]: nothing written). The request ids must be
/// distinct.
///
/// One statement records the outcomes whose rows are open (the common
/// case, see [`UPDATE_OUTCOMES`]); the rest go through an upsert, which
/// creates the rows that are missing, and the rows final already are read.
/// Either way one statement per chunk decides, so that two deliveries of
/// the same message (or two instances) cannot both record a first final
/// outcome.
pub(super) async fn insert_outcomes(
    tx: &mut Tx<'_>,
    outcomes: &[Recording<'_>],
    now: i64,
) -> Result<Vec<Recorded>, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(Vec::new());
    }
    // Bound parameters, not a JSON array taken apart inside SQLite: the
    // JSON functions cost more than the writes themselves.
    let ids: Vec<String> = outcomes
        .iter()
        .map(|(request, _, _)| request.message_id.to_string())
        .collect();
    let mut recorded: HashSet<String> = HashSet::with_capacity(outcomes.len());
    for (chunk, ids) in runs(outcomes, ROWS_PER_STATEMENT).zip(runs(&ids, ROWS_PER_STATEMENT)) {
        let mut update = UPDATE_OUTCOMES.query(
            chunk.iter().zip(ids),
            |mut row, ((request, attempt, outcome), id)| {
                let status = outcome.status();
                row.push_bind(id.as_str())
                    .push_bind(status.as_str())
                    .push_bind(i64::from(*attempt))
                    .push_bind(outcome.error())
                    .push_bind(outcome.output())
                    .push_bind(millis_of(outcome.recovered_after()))
                    .push_bind(status.is_final().then_some(now))
                    .push_bind(now)
                    .push_bind(request.instance_name.as_str())
                    .push_bind(request.requested_by.as_deref())
                    .push_bind(request.requester.as_deref())
                    .push_bind(request.reason.as_deref());
            },
        );
        recorded.extend(
            update
                .build_query_scalar::<String>()
                .fetch_all(&mut **tx)
                .await?,
        );
    }
    let rest: Vec<(Recording<'_>, &String)> = outcomes
        .iter()
        .zip(&ids)
        .filter(|(_, id)| !recorded.contains(*id))
        .map(|(outcome, id)| (*outcome, id))
        .collect();
    for chunk in runs(&rest, ROWS_PER_STATEMENT) {
        recorded.extend(upsert_outcomes(tx, chunk, now).await?);
    }
    let mut results = Vec::with_capacity(outcomes.len());
    // Another request's ids: a payload refused for its identity settles
    // nothing in the journal (rare: no allocation without one).
    let mut conflicts: Vec<&String> = Vec::new();
    for ((request, ..), id) in outcomes.iter().zip(&ids) {
        if recorded.contains(id) {
            results.push(Recorded::Recorded);
            continue;
        }
        let (existing, instance, by, signer, why): (String, _, _, _, _) = sqlx::query_as(
            "SELECT status, instance_name, requested_by, requester, reason
             FROM requests WHERE message_id = ?1",
        )
        .bind(id)
        .fetch_one(&mut **tx)
        .await?;
        if let Some(conflict) =
            identity_conflict(&identity_from((instance, by, signer, why)), request)
        {
            results.push(Recorded::Conflict(conflict));
            conflicts.push(id);
            continue;
        }
        // The row was written by this program with a status from the CHECK list.
        results.push(Recorded::AlreadyFinal(
            Status::from_name(&existing).unwrap_or(Status::Failed),
        ));
    }
    if conflicts.is_empty() {
        for (chunk, ids) in runs(outcomes, ROWS_PER_STATEMENT).zip(runs(&ids, ROWS_PER_STATEMENT)) {
            settle(tx, chunk.iter().zip(ids), now).await?;
        }
    } else {
        let own: Vec<(&Recording<'_>, &String)> = outcomes
            .iter()
            .zip(&ids)
            .filter(|(_, id)| !conflicts.contains(id))
            .collect();
        for chunk in runs(&own, ROWS_PER_STATEMENT) {
            settle(tx, chunk.iter().copied(), now).await?;
        }
    }
    Ok(results)
}

/// Records outcomes whose rows are missing (creating them) or final (for
/// which it does nothing); returns the ids it recorded.
async fn upsert_outcomes(
    tx: &mut Tx<'_>,
    chunk: &[(Recording<'_>, &String)],
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    let mut insert: QueryBuilder<Sqlite> = QueryBuilder::new(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, requester, reason, status,
              attempts, last_error, received_at, updated_at, completed_at, output,
              recovered_after_ms) ",
    );
    insert.push_values(chunk, |mut row, ((request, attempt, outcome), id)| {
        let status = outcome.status();
        row.push_bind(id.as_str())
            .push_bind(request.instance_name.as_str())
            .push_bind(request.hostname.as_str())
            .push_bind(request.requested_by.as_deref())
            .push_bind(request.requester.as_deref())
            .push_bind(request.reason.as_deref())
            .push_bind(status.as_str())
            .push_bind(i64::from(*attempt))
            .push_bind(outcome.error())
            .push_bind(now)
            .push_bind(now)
            .push_bind(status.is_final().then_some(now))
            .push_bind(outcome.output())
            .push_bind(millis_of(outcome.recovered_after()));
    });
    insert.push(format!(
        " ON CONFLICT (message_id) DO UPDATE SET {} WHERE {} AND {} RETURNING message_id",
        outcome_set("excluded", "requests", "excluded.updated_at"),
        not_final("requests"),
        same_identity("requests", "excluded"),
    ));
    insert
        .build_query_scalar::<String>()
        .fetch_all(&mut **tx)
        .await
}

/// Writes each attempt's own end into the journal, whatever another
/// delivery recorded first.
async fn settle<'a, 'r: 'a>(
    tx: &mut Tx<'_>,
    rows: impl IntoIterator<Item = (&'a Recording<'r>, &'a String)>,
    now: i64,
) -> Result<(), sqlx::Error> {
    let mut settle: QueryBuilder<Sqlite> =
        QueryBuilder::new("UPDATE restarts SET outcome = j.column3, settled_at = ");
    settle.push_bind(now).push(" FROM (");
    settle.push_values(rows, |mut row, ((_, attempt, outcome), id)| {
        row.push_bind(id.as_str())
            .push_bind(i64::from(*attempt))
            .push_bind(outcome.status().as_str());
    });
    settle.push(
        ") AS j WHERE restarts.message_id = j.column1 AND restarts.attempt = j.column2
           AND restarts.outcome IS NULL",
    );
    settle.build().execute(&mut **tx).await?;
    Ok(())
}

pub(super) async fn insert_rejection(
    tx: &mut Tx<'_>,
    asked: &Asked,
    reason: &str,
    excerpt: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(REJECTION_SQL)
        .bind(asked.message_id.map(|id| id.to_string()))
        .bind(reason)
        .bind(excerpt)
        .bind(now)
        .bind(asked.instance_name.as_deref())
        .bind(asked.requested_by.as_deref())
        .bind(asked.reason.as_deref())
        .bind(asked.requester.as_deref())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(super) async fn release(
    tx: &mut Tx<'_>,
    message_id: Uuid,
    attempt: u32,
    token: ClaimToken,
    now: i64,
) -> Result<(), sqlx::Error> {
    let released = sqlx::query(&RELEASE_SQL)
        .bind(message_id.to_string())
        .bind(i64::from(attempt))
        .bind(now)
        .bind(token.to_stored())
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

/// Deletes at most `?2` final rows completed before `?1`, found by the
/// index of completed requests; their message ids.
pub(super) const PRUNE_REQUESTS_SQL: &str = "DELETE FROM requests WHERE id IN (
         SELECT id FROM requests WHERE completed_at < ?1
         ORDER BY completed_at LIMIT ?2) RETURNING message_id";

/// Deletes at most `?2` journal rows claimed before `?1` (the counting
/// guards look back far less; a pruned request's rows were all claimed
/// before it completed), found by `restarts_claimed`.
pub(super) const PRUNE_JOURNAL_SQL: &str = "DELETE FROM restarts WHERE rowid IN (
         SELECT rowid FROM restarts WHERE claimed_at < ?1 ORDER BY claimed_at LIMIT ?2)";

/// The decisions and the deferral counts of the pruned requests (`?1`, a
/// JSON array of their ids), found by their indexes.
pub(super) const PRUNE_PRUNED_SQL: [&str; 2] = [
    "DELETE FROM decisions WHERE message_id IN (SELECT value FROM json_each(?1))",
    "DELETE FROM deferrals WHERE message_id IN (SELECT value FROM json_each(?1))",
];

/// Journal rows a pass deletes per request it prunes, at most: attempts,
/// and the journal of requests still open that claimed long ago.
const JOURNAL_ROWS_PER_REQUEST: u32 = 4;

/// Deletes at most `max_rows` final rows completed before `before`, with
/// what is kept about them. Inside the writer's transaction, which the
/// queue shares: every statement is bounded and reads an index, never a
/// whole table (a first prune after retention was turned on over a large
/// file held the queue past its pulls' bound).
pub(super) async fn prune(
    tx: &mut Tx<'_>,
    before: Timestamp,
    max_rows: u32,
) -> Result<u64, sqlx::Error> {
    let pruned: Vec<Option<String>> = sqlx::query_scalar(PRUNE_REQUESTS_SQL)
        .bind(before.as_millis())
        .bind(i64::from(max_rows))
        .fetch_all(&mut **tx)
        .await?;
    sqlx::query(PRUNE_JOURNAL_SQL)
        .bind(before.as_millis())
        .bind(i64::from(max_rows.saturating_mul(JOURNAL_ROWS_PER_REQUEST)))
        .execute(&mut **tx)
        .await?;
    let ids: Vec<&str> = pruned.iter().flatten().map(String::as_str).collect();
    if !ids.is_empty() {
        let ids = serde_json::to_string(&ids).expect("strings serialise");
        for statement in PRUNE_PRUNED_SQL {
            sqlx::query(statement).bind(&ids).execute(&mut **tx).await?;
        }
    }
    Ok(pruned.len() as u64)
}
