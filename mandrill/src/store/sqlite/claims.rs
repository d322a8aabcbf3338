//! Claims of restart attempts and the guards' decisions, inside the
//! writer's transaction.

use sqlx::{QueryBuilder, Sqlite};
use uuid::Uuid;

use super::ROWS_PER_STATEMENT;
use crate::domain::{RestartRequest, Status};
use crate::safety::limits::Usage;
use crate::sqlite::writer::Tx;
use crate::store::{
    Claim, ClaimState, ClaimTerms, ClaimWrite, DECISION_SQL, Decision, USAGE_SQL, claim_decision,
    decide_claim, switch_from, usage_binds, usage_from,
};

/// Claims restart attempts, in three statements whatever their number:
/// create missing rows, read the claim state of every row, write the claims
/// that succeed. The request ids must be distinct.
pub(super) async fn claim(
    tx: &mut Tx<'_>,
    claims: &[(&RestartRequest, ClaimTerms)],
    now: i64,
) -> Result<Vec<Claim>, sqlx::Error> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    // Bound parameters, not a JSON array taken apart inside SQLite: the
    // JSON functions cost more than the writes themselves.
    let ids: Vec<String> = claims
        .iter()
        .map(|(request, _)| request.message_id.to_string())
        .collect();
    let mut found: Vec<(String, String, i64, Option<i64>)> = Vec::with_capacity(claims.len());
    for (chunk, ids) in claims
        .chunks(ROWS_PER_STATEMENT)
        .zip(ids.chunks(ROWS_PER_STATEMENT))
    {
        let mut insert: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO requests
                 (message_id, instance_name, hostname, requested_by, reason, status,
                  attempts, received_at, updated_at) ",
        );
        insert.push_values(chunk.iter().zip(ids), |mut row, ((request, _), id)| {
            row.push_bind(id.as_str())
                .push_bind(request.instance_name.as_str())
                .push_bind(request.hostname.as_str())
                .push_bind(request.requested_by.as_deref())
                .push_bind(request.reason.as_deref())
                .push("'received', 0")
                .push_bind(now)
                .push_bind(now);
        });
        insert.push(" ON CONFLICT (message_id) DO NOTHING");
        insert.build().execute(&mut **tx).await?;
        let mut select: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT message_id, status, attempts, claim_until FROM requests WHERE message_id IN (",
        );
        let mut list = select.separated(", ");
        for id in ids {
            list.push_bind(id.as_str());
        }
        select.push(")");
        found.extend(
            select
                .build_query_as::<(String, String, i64, Option<i64>)>()
                .fetch_all(&mut **tx)
                .await?,
        );
    }
    let states: std::collections::HashMap<String, ClaimState> = found
        .into_iter()
        .map(|(id, status, attempts, claim_until)| {
            let state = ClaimState {
                // The CHECK constraint admits only known statuses.
                status: Status::from_name(&status).unwrap_or(Status::Failed),
                attempts: u32::try_from(attempts).unwrap_or(0),
                claim_until,
            };
            (id, state)
        })
        .collect();
    // Read in the claims' own write transaction: a pause committed before
    // it stops every claim of the batch.
    let (paused, by, why, since): (bool, Option<String>, Option<String>, i64) =
        sqlx::query_as("SELECT paused, by_whom, reason, updated_at FROM control WHERE id = 1")
            .fetch_one(&mut **tx)
            .await?;
    let switch = switch_from(paused, by, why, since);
    let mut decided = Vec::with_capacity(claims.len());
    let mut writes = Vec::new();
    for (request, terms) in claims {
        let id = request.message_id.to_string();
        // The counting guards read the journal as this transaction left it,
        // so the claims written so far go in first.
        let usage = if terms.limits.is_active() {
            write_claims(tx, &mut writes, now).await?;
            let (window_start, memory_start) = usage_binds(&terms.limits, now);
            let row = sqlx::query_as(USAGE_SQL)
                .bind(request.group())
                .bind(request.instance_name.as_str())
                .bind(window_start)
                .bind(memory_start)
                .bind(now)
                .fetch_one(&mut **tx)
                .await?;
            usage_from(row)
        } else {
            Usage::default()
        };
        let (claim, write) = decide_claim(
            request,
            states.get(&id).copied(),
            &switch,
            now,
            *terms,
            &usage,
        );
        if let Some(write) = write {
            writes.push((id, request, write));
        } else if let Some(decision) = claim_decision(&claim) {
            insert_decision(tx, request.message_id, 0, decision, now).await?;
        }
        decided.push(claim);
    }
    write_claims(tx, &mut writes, now).await?;
    Ok(decided)
}

/// A claim decided and not yet written: the request id, the request, what
/// to write.
type Pending<'r> = (String, &'r RestartRequest, ClaimWrite);

/// Writes the claims decided so far, and their journal rows; empties `writes`.
async fn write_claims(
    tx: &mut Tx<'_>,
    writes: &mut Vec<Pending<'_>>,
    now: i64,
) -> Result<(), sqlx::Error> {
    for chunk in writes.chunks(ROWS_PER_STATEMENT) {
        let mut update: QueryBuilder<Sqlite> = QueryBuilder::new(
            "UPDATE requests SET status = 'received', attempts = j.column2,
                 claim_until = j.column3,
                 last_error = coalesce(j.column4, requests.last_error), updated_at = ",
        );
        update.push_bind(now).push(" FROM (");
        update.push_values(chunk, |mut row, (id, _, write)| {
            row.push_bind(id.as_str())
                .push_bind(i64::from(write.attempts))
                .push_bind(write.claim_until)
                .push_bind(write.last_error.as_deref());
        });
        update.push(") AS j WHERE requests.message_id = j.column1");
        update.build().execute(&mut **tx).await?;
        let mut journal: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict) ",
        );
        journal.push_values(chunk, |mut row, (id, request, write)| {
            row.push_bind(id.as_str())
                .push_bind(i64::from(write.attempts))
                .push_bind(request.instance_name.as_str())
                .push_bind(request.group())
                .push_bind(now)
                .push_bind(write.verdict.as_str());
        });
        journal.push(
            " ON CONFLICT (message_id, attempt) DO UPDATE SET
                 claimed_at = excluded.claimed_at, verdict = excluded.verdict,
                 outcome = NULL, settled_at = NULL",
        );
        journal.build().execute(&mut **tx).await?;
    }
    writes.clear();
    Ok(())
}

pub(super) async fn insert_decision(
    tx: &mut Tx<'_>,
    message_id: Uuid,
    attempt: u32,
    decision: Decision<'_>,
    now: i64,
) -> Result<(), sqlx::Error> {
    if decision.verdict == "deferred" {
        sqlx::query(crate::store::DEFERRAL_SQL)
            .bind(message_id.to_string())
            .execute(&mut **tx)
            .await?;
    }
    sqlx::query(DECISION_SQL)
        .bind(message_id.to_string())
        .bind(now)
        .bind(i64::from(attempt))
        .bind(decision.verdict)
        .bind(decision.guard)
        .bind(decision.reason)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
