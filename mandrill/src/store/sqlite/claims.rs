//! Claims of restart attempts and the guards' decisions, inside the
//! writer's transaction.

use uuid::Uuid;

use crate::domain::{RestartRequest, Status};
use crate::safety::limits::Usage;
use crate::sqlite::writer::Tx;
use crate::store::{
    Claim, ClaimState, ClaimTerms, DECISION_SQL, Decision, USAGE_SQL, claim_decision, decide_claim,
    switch_from, usage_binds, usage_from,
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
    let rows: Vec<_> = claims
        .iter()
        .map(|(request, _)| {
            serde_json::json!([
                request.message_id.to_string(),
                request.instance_name.as_str(),
                request.hostname.as_str(),
                request.requested_by,
                request.reason,
            ])
        })
        .collect();
    let rows = serde_json::Value::Array(rows).to_string();
    sqlx::query(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, reason, status,
              attempts, received_at, updated_at)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4,
                'received', 0, ?2, ?2
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(&rows)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    let found: Vec<(String, String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT message_id, status, attempts, claim_until FROM requests
         WHERE message_id IN (SELECT j.value ->> 0 FROM json_each(?1) AS j)",
    )
    .bind(&rows)
    .fetch_all(&mut **tx)
    .await?;
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
            writes.push(serde_json::json!([
                id,
                write.attempts,
                write.claim_until,
                write.last_error,
                request.instance_name.as_str(),
                request.group(),
                write.verdict,
            ]));
        } else if let Some(decision) = claim_decision(&claim) {
            insert_decision(tx, request.message_id, 0, decision, now).await?;
        }
        decided.push(claim);
    }
    write_claims(tx, &mut writes, now).await?;
    Ok(decided)
}

/// Writes the claims decided so far, and their journal rows; empties `writes`.
async fn write_claims(
    tx: &mut Tx<'_>,
    writes: &mut Vec<serde_json::Value>,
    now: i64,
) -> Result<(), sqlx::Error> {
    if writes.is_empty() {
        return Ok(());
    }
    let json = serde_json::Value::Array(std::mem::take(writes)).to_string();
    sqlx::query(
        "UPDATE requests SET status = 'received', attempts = j.value ->> 1,
             claim_until = j.value ->> 2,
             last_error = coalesce(j.value ->> 3, requests.last_error), updated_at = ?2
         FROM json_each(?1) AS j WHERE requests.message_id = j.value ->> 0",
    )
    .bind(&json)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 4, j.value ->> 5, ?2, j.value ->> 6
         FROM json_each(?1) AS j WHERE true
         ON CONFLICT (message_id, attempt) DO UPDATE SET
             claimed_at = excluded.claimed_at, verdict = excluded.verdict,
             outcome = NULL, settled_at = NULL",
    )
    .bind(&json)
    .bind(now)
    .execute(&mut **tx)
    .await?;
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
