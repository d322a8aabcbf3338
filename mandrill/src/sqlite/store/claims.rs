//! Claims of restart attempts and the guards' decisions, inside the
//! writer's transaction.

use std::collections::HashMap;
use std::sync::LazyLock;

use sqlx::{QueryBuilder, Sqlite};

use super::{AroundValues, ROWS_PER_STATEMENT};
use crate::domain::{RestartRequest, Status};
use crate::safety::limits::{Subject, Usage};
use crate::sqlite::runs;
use crate::sqlite::writer::Tx;
use crate::store::reads::sqlite::{insert_decision, usage};
use crate::store::sql::{
    GROUP_PAUSES_SQL, GroupPauseRow, SWITCH_SQL, SwitchRow, held_hosts_where, identity_from,
    upsert_journal,
};
use crate::store::{
    Claim, ClaimState, ClaimTerms, ClaimToken, ClaimWrite, GroupPause, HeldHosts, claim_decision,
    decide_claim, group_pause_from, switch_from,
};

/// Writes claimed attempts into the restart journal.
static UPSERT_JOURNAL: LazyLock<AroundValues> = LazyLock::new(|| {
    AroundValues::new(
        upsert_journal,
        &[
            "id",
            "attempt",
            "instance_name",
            "grp",
            "zone",
            "requester",
            "verdict",
            "at",
        ],
    )
});

/// Claims restart attempts, in the same few statements whatever their
/// number (per chunk of [`ROWS_PER_STATEMENT`]): read the claim state of
/// every row and the kill switch, create the rows that are missing with
/// their claims (or bare receipts, when a claim is refused) in one insert,
/// update the rows that exist and are claimed, write the claims' journal
/// rows. With counting guards active, the writes so far are flushed before
/// each claim's read of the journal. Creating a row
/// already claimed, not a receipt then updating it, writes each new row
/// once. The request ids must be distinct.
pub(super) async fn claim(
    tx: &mut Tx<'_>,
    claims: &[(&RestartRequest, ClaimTerms, ClaimToken)],
    now: i64,
) -> Result<Vec<Claim>, sqlx::Error> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    // Bound parameters, not a JSON array taken apart inside SQLite: the
    // JSON functions cost more than the writes themselves.
    let ids: Vec<String> = claims
        .iter()
        .map(|(request, ..)| request.message_id.to_string())
        .collect();
    let mut states: HashMap<String, ClaimState> = HashMap::with_capacity(claims.len());
    // With the rows, in the same statement, the claims of any request that
    // hold the batch's hosts (`held_hosts_where`): no host is restarted for
    // two requests at once, counting guards or none.
    let held_where = held_hosts_where("");
    let mut held = HeldHosts::default();
    for chunk in runs(claims, ROWS_PER_STATEMENT) {
        let mut select: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT message_id, status, attempts, claim_until, claim_token, claim_unknown, NULL,
                    instance_name, requested_by, requester, reason, cancel_reason
             FROM requests WHERE message_id IN (",
        );
        let mut list = select.separated(", ");
        for (request, ..) in chunk {
            list.push_bind(request.message_id.to_string());
        }
        select
            .push(
                ") UNION ALL
                 SELECT r.message_id, NULL, NULL, q.claim_until, NULL, NULL, r.instance_name,
                        NULL, NULL, NULL, NULL, NULL ",
            )
            .push(&held_where)
            .push_bind(now)
            .push(" AND r.instance_name IN (");
        let mut list = select.separated(", ");
        for (request, ..) in chunk {
            list.push_bind(request.machine());
        }
        select.push(")");
        let found = select
            .build_query_as::<StateRow>()
            .fetch_all(&mut **tx)
            .await?;
        for (
            id,
            status,
            attempts,
            claim_until,
            token,
            unknown,
            host,
            instance,
            by,
            signer,
            why,
            cancelled,
        ) in found
        {
            if let Some(host) = host {
                if let Some(until) = claim_until {
                    held.read(host, &id, until);
                }
                continue;
            }
            let state = ClaimState {
                // The CHECK constraint admits only known statuses.
                status: status
                    .as_deref()
                    .and_then(Status::from_name)
                    .unwrap_or(Status::Failed),
                attempts: attempts.and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
                claim_until,
                token: token.map(ClaimToken::from_stored),
                unknown: unknown.and_then(|attempt| u32::try_from(attempt).ok()),
                identity: Some(identity_from((instance, by, signer, why))),
                cancelled,
            };
            states.insert(id, state);
        }
    }
    // Read in the claims' own write transaction: a pause committed before
    // it stops every claim of the batch.
    // The leash is in the same row: read with it.
    let row: SwitchRow = sqlx::query_as(SWITCH_SQL).fetch_one(&mut **tx).await?;
    let switch = switch_from(row);
    // The group pauses, likewise: a handful of rows at most.
    let pauses: Vec<GroupPause> = sqlx::query_as::<_, GroupPauseRow>(GROUP_PAUSES_SQL)
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(group_pause_from)
        .collect();
    let mut decided = Vec::with_capacity(claims.len());
    let mut writes = Vec::new();
    for ((request, terms, token), id) in claims.iter().zip(&ids) {
        // The counting guards read the journal as this transaction left it,
        // so the claims written so far go in first.
        let mut usage = if terms.limits.is_active_for(Subject::of(request)) {
            write_claims(tx, &mut writes, now).await?;
            usage(tx, request, &terms.limits, now).await?
        } else {
            Usage::default()
        };
        usage.host_held = held.get(request.machine());
        let state = states.remove(id);
        let created = state.is_none();
        let group_pause = pauses.iter().find(|pause| pause.group == request.group());
        let (claim, write) = decide_claim(
            request,
            state,
            &switch,
            group_pause,
            now,
            *terms,
            *token,
            &usage,
        );
        if let Some(write) = &write {
            held.claimed(request, write);
        }
        if write.is_none()
            && let Some(decision) = claim_decision(&claim)
        {
            insert_decision(tx, request.message_id, 0, decision, now).await?;
        }
        if created || write.is_some() {
            writes.push(Pending {
                id,
                request,
                created,
                write,
            });
        }
        decided.push(claim);
    }
    write_claims(tx, &mut writes, now).await?;
    Ok(decided)
}

/// A row of the claims' read: id, status, attempts, `claim_until`,
/// `claim_token`, `claim_unknown`, no host, then the row's identity
/// (instance, requested by, requester, reason) and `cancel_reason`; or a
/// claim holding a host:
/// its id, its hold's end as `claim_until`, and the host.
type StateRow = (
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A request's row to write, decided and not yet written.
struct Pending<'r> {
    id: &'r str,
    request: &'r RestartRequest,
    /// The row is missing: it is created (received now).
    created: bool,
    /// The claim, if it succeeded.
    write: Option<ClaimWrite>,
}

/// Writes the rows decided so far, and their claims' journal rows;
/// empties `writes`.
async fn write_claims(
    tx: &mut Tx<'_>,
    writes: &mut Vec<Pending<'_>>,
    now: i64,
) -> Result<(), sqlx::Error> {
    let (created, updated): (Vec<&Pending<'_>>, Vec<&Pending<'_>>) =
        writes.iter().partition(|pending| pending.created);
    for chunk in runs(&created, ROWS_PER_STATEMENT) {
        let mut insert: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO requests
                 (message_id, instance_name, hostname, requested_by, requester, reason, status,
                  attempts, claim_until, claim_token, claim_unknown, last_error, received_at,
                  updated_at) ",
        );
        insert.push_values(chunk, |mut row, pending| {
            let write = pending.write.as_ref();
            row.push_bind(pending.id)
                .push_bind(pending.request.instance_name.as_str())
                .push_bind(pending.request.hostname.as_str())
                .push_bind(pending.request.requested_by.as_deref())
                .push_bind(pending.request.requester.as_deref())
                .push_bind(pending.request.reason.as_deref())
                .push_bind(Status::Received.as_str())
                .push_bind(write.map_or(0, |write| i64::from(write.attempts)))
                .push_bind(write.map(|write| write.claim_until))
                .push_bind(write.map(|write| write.token.to_stored()))
                .push_bind(write.and_then(|write| write.unknown.map(i64::from)))
                .push_bind(write.and_then(|write| write.last_error.as_deref()))
                .push_bind(now)
                .push_bind(now);
        });
        insert.build().execute(&mut **tx).await?;
    }
    for chunk in runs(&updated, ROWS_PER_STATEMENT) {
        let mut update: QueryBuilder<Sqlite> = QueryBuilder::new(
            "UPDATE requests SET status = 'received', attempts = j.column2,
                 claim_until = j.column3, claim_token = j.column5, claim_unknown = j.column6,
                 last_error = coalesce(j.column4, requests.last_error), updated_at = ",
        );
        update.push_bind(now).push(" FROM (");
        update.push_values(chunk, |mut row, pending| {
            let write = pending.write.as_ref();
            row.push_bind(pending.id)
                .push_bind(write.map(|write| i64::from(write.attempts)))
                .push_bind(write.map(|write| write.claim_until))
                .push_bind(write.and_then(|write| write.last_error.as_deref()))
                .push_bind(write.map(|write| write.token.to_stored()))
                .push_bind(write.and_then(|write| write.unknown.map(i64::from)));
        });
        update.push(") AS j WHERE requests.message_id = j.column1");
        update.build().execute(&mut **tx).await?;
    }
    let claimed: Vec<(&Pending<'_>, &ClaimWrite)> = writes
        .iter()
        .filter_map(|pending| Some((pending, pending.write.as_ref()?)))
        .filter(|(_, write)| !write.renewal)
        .collect();
    for chunk in runs(&claimed, ROWS_PER_STATEMENT) {
        let mut journal = UPSERT_JOURNAL.query(chunk, |mut row, (pending, write)| {
            row.push_bind(pending.id)
                .push_bind(i64::from(write.attempts))
                .push_bind(pending.request.machine())
                .push_bind(pending.request.group())
                .push_bind(pending.request.zone.as_deref())
                .push_bind(pending.request.requester.as_deref())
                .push_bind(write.verdict.as_str())
                .push_bind(now);
        });
        journal.build().execute(&mut **tx).await?;
    }
    writes.clear();
    Ok(())
}
