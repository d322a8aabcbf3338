//! The outcomes of one round of a batch ([`super::batch`]): rows already
//! locked by the batch's transaction, so an `UPDATE` over `unnest` arrays
//! records them all in one statement.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::rows::{Tx, attempts};
use crate::domain::{Outcome, RestartRequest};
use crate::store::sql::{not_final, outcome_set};
use crate::store::{ClaimState, Recorded, identity_conflict, millis_of};

/// Records outcomes over a status that is not final (as every store does,
/// with the same assignments), and settles each attempt's journal row
/// (the attempt's own end, whatever another delivery recorded first);
/// returns the ids recorded.
pub(super) static OUTCOME_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH settled AS (
             UPDATE restarts t SET outcome = u.status, settled_at = $8
             FROM unnest($1::text[], $3::int4[], $2::text[]) AS u(id, attempt, status)
             WHERE t.message_id = u.id AND t.attempt = u.attempt AND t.outcome IS NULL)
         UPDATE requests r SET {}
         FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::int8[], $6::text[],
                     $7::int8[])
              AS u(id, status, attempts, last_error, completed_at, output, recovered_after_ms)
         WHERE r.message_id = u.id AND {}
         RETURNING r.message_id",
        outcome_set("u", "r", "$8"),
        not_final("r")
    )
});

/// Records the outcomes of one round (distinct requests, rows locked, as
/// `states` read them), in one statement.
pub(super) async fn record_outcomes(
    tx: &mut Tx<'_>,
    outcomes: &[(usize, &RestartRequest, u32, &Outcome)],
    states: &HashMap<String, ClaimState>,
    now: i64,
) -> Result<Vec<(usize, Recorded)>, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(Vec::new());
    }
    let mut results = Vec::with_capacity(outcomes.len());
    let mut written = Vec::with_capacity(outcomes.len());
    let mut ids = Vec::with_capacity(outcomes.len());
    let mut statuses = Vec::with_capacity(outcomes.len());
    let mut attempt_numbers = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::with_capacity(outcomes.len());
    let mut completed = Vec::with_capacity(outcomes.len());
    let mut outputs = Vec::with_capacity(outcomes.len());
    let mut recovered = Vec::with_capacity(outcomes.len());
    for (index, request, attempt, outcome) in outcomes {
        let id = request.message_id.to_string();
        // Another request's row (read locked, with its identity, by this
        // transaction): nothing written, the conflict told.
        if let Some(conflict) = states
            .get(&id)
            .and_then(|state| state.identity.as_ref())
            .and_then(|recorded| identity_conflict(recorded, request))
        {
            results.push((*index, Recorded::Conflict(conflict)));
            continue;
        }
        written.push(*index);
        let status = outcome.status();
        ids.push(id);
        statuses.push(status.as_str());
        attempt_numbers.push(attempts(*attempt));
        errors.push(outcome.error());
        completed.push(status.is_final().then_some(now));
        outputs.push(outcome.output());
        recovered.push(millis_of(outcome.recovered_after()));
    }
    // The row exists and is locked by this transaction (see `lock_rows`),
    // so an update does what the single-row upsert did.
    let recorded: Vec<String> = sqlx::query_scalar(&OUTCOME_SQL)
        .bind(&ids)
        .bind(&statuses)
        .bind(&attempt_numbers)
        .bind(&errors)
        .bind(&completed)
        .bind(&outputs)
        .bind(&recovered)
        .bind(now)
        .fetch_all(&mut **tx)
        .await?;
    let recorded: std::collections::HashSet<String> = recorded.into_iter().collect();
    for (index, id) in written.iter().zip(&ids) {
        let result = if recorded.contains(id) {
            Recorded::Recorded
        } else {
            // Not recorded over a final status; the row is locked by this
            // transaction since `states` was read, and no other write of
            // this round touches it.
            let status = states
                .get(id)
                .map(|state| state.status)
                .ok_or(sqlx::Error::RowNotFound)?;
            Recorded::AlreadyFinal(status)
        };
        results.push((*index, result));
    }
    Ok(results)
}
