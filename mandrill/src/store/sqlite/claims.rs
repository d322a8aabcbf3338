//! Claims of restart attempts and the guards' decisions, inside the
//! writer's transaction.

use std::sync::LazyLock;

use sqlx::{QueryBuilder, Sqlite};

use super::{AroundValues, ROWS_PER_STATEMENT};
use crate::domain::{RestartRequest, Status};
use crate::safety::limits::Usage;
use crate::sqlite::writer::Tx;
use crate::store::reads::sqlite::{insert_decision, usage};
use crate::store::sql::{SWITCH_SQL, SwitchRow, insert_requests, upsert_journal};
use crate::store::{
    Claim, ClaimState, ClaimTerms, ClaimWrite, claim_decision, decide_claim, switch_from,
};

/// Creates the rows of requests that have none.
static INSERT_REQUESTS: LazyLock<AroundValues> = LazyLock::new(|| {
    AroundValues::new(
        insert_requests,
        &[
            "id",
            "instance_name",
            "hostname",
            "requested_by",
            "reason",
            "at",
        ],
    )
});

/// Writes claimed attempts into the restart journal.
static UPSERT_JOURNAL: LazyLock<AroundValues> = LazyLock::new(|| {
    AroundValues::new(
        upsert_journal,
        &["id", "attempt", "instance_name", "grp", "verdict", "at"],
    )
});

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
        let mut insert =
            INSERT_REQUESTS.query(chunk.iter().zip(ids), |mut row, ((request, _), id)| {
                row.push_bind(id.as_str())
                    .push_bind(request.instance_name.as_str())
                    .push_bind(request.hostname.as_str())
                    .push_bind(request.requested_by.as_deref())
                    .push_bind(request.reason.as_deref())
                    .push_bind(now);
            });
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
    let (paused, by, why, since): SwitchRow =
        sqlx::query_as(SWITCH_SQL).fetch_one(&mut **tx).await?;
    let switch = switch_from(paused, by, why, since);
    let mut decided = Vec::with_capacity(claims.len());
    let mut writes = Vec::new();
    for (request, terms) in claims {
        let id = request.message_id.to_string();
        // The counting guards read the journal as this transaction left it,
        // so the claims written so far go in first.
        let usage = if terms.limits.is_active() {
            write_claims(tx, &mut writes, now).await?;
            usage(tx, request, &terms.limits, now).await?
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
        let mut journal = UPSERT_JOURNAL.query(chunk, |mut row, (id, request, write)| {
            row.push_bind(id.as_str())
                .push_bind(i64::from(write.attempts))
                .push_bind(request.instance_name.as_str())
                .push_bind(request.group())
                .push_bind(write.verdict.as_str())
                .push_bind(now);
        });
        journal.build().execute(&mut **tx).await?;
    }
    writes.clear();
    Ok(())
}
