//! One batch of the writers, in one transaction of array statements
//! (`unnest`), whatever its size.
//!
//! Locks are taken in one order by every batch, so two batches never wait
//! for each other in a cycle: first the `requests` rows of every request the
//! batch touches, sorted by id (a missing row is created first, in the same
//! order), then whatever else each write needs, all of it on rows of
//! requests already locked. A batch with claims also takes the kill switch
//! under a share lock, in the statement that creates the rows: it conflicts
//! only with `set_switch`, which waits for nothing else, so it makes no
//! cycle wherever it is taken.
//!
//! The writes a batch is made of ([`Write`]) and what it answers for each
//! ([`Answer`]) are defined here; the writer tasks ([`super::writer`]) only
//! queue and hand them over. Past 400 lines as one piece: a batch's
//! transaction, its statements and the values it commits.

use std::collections::HashMap;
use std::sync::LazyLock;

use tokio::sync::oneshot;

use super::outcomes::record_outcomes;
use super::rows::{Tx, attempts};
use crate::domain::{Outcome, RestartRequest};
use crate::safety::limits::Usage;
use crate::store::reads::postgres::insert_decision;
use crate::store::sql::{
    GROUP_PAUSES_SQL, GroupPauseRow, HELD_HOSTS_SQL, HeldRow, SWITCH_SQL, identity_from,
    insert_requests, upsert_journal,
};
use crate::store::{
    Claim, ClaimState, ClaimTerms, ClaimToken, ClaimWrite, GroupPause, HeldHosts, Recorded,
    StoreError, Switch, Timestamp, claim_decision, decide_claim, group_pause_from,
    status_from_name, switch_from,
};

/// One queued write, with whom to tell once it is committed.
#[derive(Debug)]
pub(super) enum Write {
    Claim {
        request: RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
        reply: oneshot::Sender<Result<Claim, StoreError>>,
    },
    Outcome {
        request: RestartRequest,
        attempt: u32,
        outcome: Outcome,
        reply: oneshot::Sender<Result<Recorded, StoreError>>,
    },
}

impl Write {
    pub(super) fn request(&self) -> &RestartRequest {
        match self {
            Self::Claim { request, .. } | Self::Outcome { request, .. } => request,
        }
    }
}

/// What one write of a committed batch answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    Claim(Claim),
    Outcome(Recorded),
}

/// The kill switch under a share lock: `set_switch` waits for the claims
/// in progress, and every claim after it sees the switch as it left it.
pub(super) static SWITCH_SHARED_SQL: LazyLock<String> =
    LazyLock::new(|| format!("{SWITCH_SQL} FOR SHARE"));

/// Creates the missing rows of a batch's requests: `$1`..`$5` arrays of
/// ids, instances, hosts, requested by, reasons; `$6` now; `$7` array of
/// requesters (verified signers). Returns the ids
/// of the rows it created (received, no attempt: this transaction's own,
/// so locked by it) and, on every row, the kill switch, read under a share
/// lock (see [`SWITCH_SHARED_SQL`]); at least one row, the switch's, when
/// it created none.
static INSERT_REQUESTS_SQL: LazyLock<String> =
    LazyLock::new(|| insert_returning_switch(&SWITCH_SHARED_SQL));

/// As [`INSERT_REQUESTS_SQL`], for a batch without claims: the switch is
/// read but not locked (nothing decided from it waits on it).
static INSERT_REQUESTS_UNLOCKED_SQL: LazyLock<String> =
    LazyLock::new(|| insert_returning_switch(SWITCH_SQL));

fn insert_returning_switch(switch: &str) -> String {
    let insert = insert_requests(
        "SELECT u.id, u.instance_name, u.hostname, u.requested_by, u.requester, u.reason,
                $6::int8 AS at
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $7::text[])
              AS u(id, instance_name, hostname, requested_by, reason, requester)",
    );
    format!(
        "WITH switch AS ({switch}), created AS ({insert} RETURNING message_id)
         SELECT c.message_id, s.paused, s.by_whom, s.reason, s.updated_at,
                s.leashed, s.leash_by, s.leash_reason, s.leash_updated_at
         FROM switch s LEFT JOIN created c ON true"
    )
}

/// A row of [`INSERT_REQUESTS_SQL`]: an id created (or none), then the
/// switch and the leash (as [`crate::store::sql::SwitchRow`]).
type CreatedRow = (
    Option<String>,
    bool,
    Option<String>,
    Option<String>,
    i64,
    Option<bool>,
    Option<String>,
    Option<String>,
    i64,
);

/// A round's claims and their journal rows, in one statement: `$1`..`$4`
/// arrays of ids, attempts, claim deadlines, last errors; `$5` now;
/// `$6`..`$10` arrays of instances, groups, verdicts, zones, requesters;
/// `$11`, `$12` arrays of the claims' tokens and unknown attempts; `$13`
/// whether each only renews its hold (no journal row then).
static CLAIMS_SQL: LazyLock<String> = LazyLock::new(|| {
    let journal = upsert_journal(
        "SELECT u.id, u.attempt, u.instance_name, u.grp, u.zone, u.requester, u.verdict,
                $5::int8 AS at
         FROM unnest($1::text[], $2::int4[], $6::text[], $7::text[], $8::text[], $9::text[],
                     $10::text[], $13::bool[])
              AS u(id, attempt, instance_name, grp, verdict, zone, requester, renewal)
         WHERE NOT u.renewal",
    );
    format!(
        "WITH claimed AS (
             UPDATE requests r SET status = 'received', attempts = u.attempts,
                 claim_until = u.claim_until, claim_token = u.claim_token,
                 claim_unknown = u.claim_unknown,
                 last_error = COALESCE(u.last_error, r.last_error), updated_at = $5
             FROM unnest($1::text[], $2::int4[], $3::int8[], $4::text[], $11::int8[],
                         $12::int4[])
                  AS u(id, attempts, claim_until, last_error, claim_token, claim_unknown)
             WHERE r.message_id = u.id)
         {journal}"
    )
});

/// Locks the row of every request in `batch` (see the module docs), then
/// applies the writes. A request that appears more than once (two
/// deliveries racing, or a claim and an outcome) splits the batch into
/// rounds, each with distinct requests, applied in arrival order.
pub(super) async fn commit_batch(
    tx: &mut Tx<'_>,
    batch: &[Write],
) -> Result<Vec<Answer>, sqlx::Error> {
    let now = Timestamp::now().as_millis();
    let (mut states, switch) = lock_rows(tx, batch, now).await?;
    let mut held = hold_hosts(tx, batch, now).await?;
    // Read after the switch's share lock (a statement of its own, so with
    // a snapshot taken after it): a group pause waits for that lock.
    let pauses: Vec<GroupPause> = if batch
        .iter()
        .any(|write| matches!(write, Write::Claim { .. }))
    {
        sqlx::query_as::<_, GroupPauseRow>(GROUP_PAUSES_SQL)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .map(group_pause_from)
            .collect()
    } else {
        Vec::new()
    };
    let mut answers: Vec<Option<Answer>> = vec![None; batch.len()];
    let mut rounds = 0;
    while answers.iter().any(Option::is_none) {
        if rounds > 0 {
            // The earlier rounds changed the rows; they are still ours.
            states = read_states(tx, batch).await?;
        }
        rounds += 1;
        let mut seen = std::collections::HashSet::new();
        let round: Vec<usize> = (0..batch.len())
            .filter(|&index| answers[index].is_none())
            .filter(|&index| seen.insert(batch[index].request().message_id))
            .collect();
        let mut claims = ClaimWrites::default();
        let mut outcomes = Vec::new();
        for &index in &round {
            match &batch[index] {
                Write::Claim {
                    request,
                    terms,
                    token,
                    ..
                } => {
                    let id = request.message_id.to_string();
                    let state = states.get(&id).cloned();
                    let usage = Usage {
                        host_held: held.get(request.machine()),
                        ..Usage::default()
                    };
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
                    if let Some(write) = write {
                        held.claimed(request, &write);
                        claims.push(request, id, write);
                    } else if let Some(decision) = claim_decision(&claim) {
                        insert_decision(tx, request.message_id, 0, decision, now).await?;
                    }
                    answers[index] = Some(Answer::Claim(claim));
                }
                Write::Outcome {
                    request,
                    attempt,
                    outcome,
                    ..
                } => outcomes.push((index, request, *attempt, outcome)),
            }
        }
        claims.write(tx, now).await?;
        for (index, recorded) in record_outcomes(tx, &outcomes, &states, now).await? {
            answers[index] = Some(Answer::Outcome(recorded));
        }
    }
    // Every write was answered: the loop runs until none is left.
    Ok(answers.into_iter().flatten().collect())
}

/// Takes the advisory lock of the host of every claim in `batch` (the one
/// a claim under counting guards takes last, see
/// [`super::claims::lock_keys`]), then reads the claims that hold those
/// hosts. Taken after every row lock, in the order of the keys' hashes,
/// and a claim under counting guards takes no lock after its host's: no
/// cycle. Two claims of one host, in batches of two writers or instances,
/// thus never decide at once, and the second sees the first's claim.
async fn hold_hosts(tx: &mut Tx<'_>, batch: &[Write], now: i64) -> Result<HeldHosts, sqlx::Error> {
    let mut hosts: Vec<String> = batch
        .iter()
        .filter_map(|write| match write {
            Write::Claim { request, .. } => Some(request.machine().to_owned()),
            Write::Outcome { .. } => None,
        })
        .collect();
    let mut held = HeldHosts::default();
    if hosts.is_empty() {
        return Ok(held);
    }
    hosts.sort();
    hosts.dedup();
    // Volatile functions in the select list are evaluated after the sort.
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k.key)
         FROM (SELECT DISTINCT hashtextextended('mandrill:host:' || h, 0) AS key
               FROM unnest($1::text[]) AS h) AS k
         ORDER BY k.key",
    )
    .bind(&hosts)
    .execute(&mut **tx)
    .await?;
    // A statement of its own: one that took the locks would read with the
    // snapshot of its start, before a claim it waited for committed.
    let rows: Vec<HeldRow> = sqlx::query_as(&HELD_HOSTS_SQL)
        .bind(&hosts)
        .bind(now)
        .fetch_all(&mut **tx)
        .await?;
    for (host, message_id, until) in rows {
        held.read(host, &message_id, until);
    }
    Ok(held)
}

/// Creates the missing rows of the batch's requests and locks every one of
/// them, in id order; returns their claim state, and the kill switch (read
/// under a share lock: `set_switch` waits for the claims in progress, and
/// every claim after it sees the switch as it left it).
async fn lock_rows(
    tx: &mut Tx<'_>,
    batch: &[Write],
    now: i64,
) -> Result<(HashMap<String, ClaimState>, Switch), sqlx::Error> {
    let mut requests: Vec<(String, &RestartRequest)> = batch
        .iter()
        .map(|write| (write.request().message_id.to_string(), write.request()))
        .collect();
    requests.sort_by(|a, b| a.0.cmp(&b.0));
    requests.dedup_by(|a, b| a.0 == b.0);
    let mut rows = RequestRows::default();
    for (id, request) in requests {
        rows.ids.push(id);
        rows.instances
            .push(request.instance_name.as_str().to_owned());
        rows.hosts.push(request.hostname.as_str().to_owned());
        rows.requested_by.push(request.requested_by.clone());
        rows.reasons.push(request.reason.clone());
        rows.requesters.push(request.requester.clone());
    }
    // In id order (unnest keeps the array's order), so that two batches
    // creating the same rows wait for each other, never in a cycle. The
    // switch's share lock conflicts only with `set_switch`, which waits for
    // nothing else, so taking it first makes no cycle either.
    let claims = batch
        .iter()
        .any(|write| matches!(write, Write::Claim { .. }));
    let insert = if claims {
        &INSERT_REQUESTS_SQL
    } else {
        &INSERT_REQUESTS_UNLOCKED_SQL
    };
    let created: Vec<CreatedRow> = sqlx::query_as(insert)
        .bind(&rows.ids)
        .bind(&rows.instances)
        .bind(&rows.hosts)
        .bind(&rows.requested_by)
        .bind(&rows.reasons)
        .bind(now)
        .bind(&rows.requesters)
        .fetch_all(&mut **tx)
        .await?;
    let switch = created
        .first()
        .map(
            |(_, paused, by, why, since, leashed, leash_by, leash_why, leash_since)| {
                switch_from((
                    *paused,
                    by.clone(),
                    why.clone(),
                    *since,
                    *leashed,
                    leash_by.clone(),
                    leash_why.clone(),
                    *leash_since,
                ))
            },
        )
        .ok_or(sqlx::Error::RowNotFound)?;
    // A row this transaction created is its own until it commits: received,
    // no attempt claimed, as the insert wrote it from the first write of
    // its request in the batch, which the first round decides (a later
    // write of another identity is judged in a later round, read again).
    let mut states: HashMap<String, ClaimState> = created
        .into_iter()
        .filter_map(|(id, ..)| id)
        .map(|id| (id, ClaimState::NEW))
        .collect();
    // The others already existed: the row locks serialise the writes of
    // one request across writers and instances; taken in id order, after
    // the rows created (as a lock of every row would take them: those are
    // this transaction's already), so no two batches deadlock.
    let existing: Vec<&str> = rows
        .ids
        .iter()
        .filter(|id| !states.contains_key(*id))
        .map(String::as_str)
        .collect();
    if !existing.is_empty() {
        let found: Vec<StateRow> = sqlx::query_as(LOCK_SQL)
            .bind(existing)
            .fetch_all(&mut **tx)
            .await?;
        states.extend(states_from(found)?);
    }
    Ok((states, switch))
}

/// Locks the rows of the requests `$1`, in id order, and reads their claim
/// state and identity (who asked and for what: every write of the batch
/// is judged on it). A join on `unnest`, not `= ANY($1)`: a prepared
/// statement's generic plan for `= ANY` was seen scanning the whole table.
pub(super) const LOCK_SQL: &str = "SELECT r.message_id, r.status, r.attempts, r.claim_until,
        r.claim_token, r.claim_unknown, r.instance_name, r.requested_by, r.requester, r.reason,
        r.cancel_reason
    FROM unnest($1::text[]) AS u(id) JOIN requests r ON r.message_id = u.id
    ORDER BY r.message_id FOR UPDATE OF r";

async fn read_states(
    tx: &mut Tx<'_>,
    batch: &[Write],
) -> Result<HashMap<String, ClaimState>, sqlx::Error> {
    let ids: Vec<String> = batch
        .iter()
        .map(|write| write.request().message_id.to_string())
        .collect();
    read_states_of(tx, &ids).await
}

/// A row of [`LOCK_SQL`].
type StateRow = (
    String,
    String,
    i32,
    Option<i64>,
    Option<i64>,
    Option<i32>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn states_from(found: Vec<StateRow>) -> Result<HashMap<String, ClaimState>, sqlx::Error> {
    found
        .into_iter()
        .map(
            |(
                id,
                status,
                claimed,
                claim_until,
                token,
                unknown,
                instance,
                by,
                signer,
                why,
                cancelled,
            )| {
                let status = status_from_name(&status)
                    .map_err(|error| sqlx::Error::Decode(Box::new(error)))?;
                let state = ClaimState {
                    status,
                    attempts: u32::try_from(claimed).unwrap_or(0),
                    claim_until,
                    token: token.map(ClaimToken::from_stored),
                    unknown: unknown.and_then(|attempt| u32::try_from(attempt).ok()),
                    identity: Some(identity_from((instance, by, signer, why))),
                    cancelled,
                };
                Ok((id, state))
            },
        )
        .collect()
}

/// The columns of the rows a batch creates, one array each.
#[derive(Default)]
struct RequestRows {
    ids: Vec<String>,
    instances: Vec<String>,
    hosts: Vec<String>,
    requested_by: Vec<Option<String>>,
    reasons: Vec<Option<String>>,
    requesters: Vec<Option<String>>,
}

/// The claims of one round that succeed, one array per column.
#[derive(Default)]
struct ClaimWrites {
    ids: Vec<String>,
    attempts: Vec<i32>,
    claim_until: Vec<i64>,
    tokens: Vec<i64>,
    unknown: Vec<Option<i32>>,
    renewals: Vec<bool>,
    last_error: Vec<Option<String>>,
    instances: Vec<String>,
    groups: Vec<String>,
    verdicts: Vec<String>,
    zones: Vec<Option<String>>,
    requesters: Vec<Option<String>>,
}

impl ClaimWrites {
    fn push(&mut self, request: &RestartRequest, id: String, write: ClaimWrite) {
        self.ids.push(id);
        self.attempts.push(attempts(write.attempts));
        self.claim_until.push(write.claim_until);
        self.tokens.push(write.token.to_stored());
        self.unknown.push(write.unknown.map(attempts));
        self.renewals.push(write.renewal);
        self.last_error.push(write.last_error);
        // The journal knows the machine (an alias counts as its machine).
        self.instances.push(request.machine().to_owned());
        self.groups.push(request.group().to_owned());
        self.verdicts.push(write.verdict);
        self.zones.push(request.zone.clone());
        self.requesters.push(request.requester.clone());
    }

    /// The claims and their journal rows, in one statement.
    async fn write(self, tx: &mut Tx<'_>, now: i64) -> Result<(), sqlx::Error> {
        if self.ids.is_empty() {
            return Ok(());
        }
        sqlx::query(&CLAIMS_SQL)
            .bind(&self.ids)
            .bind(&self.attempts)
            .bind(&self.claim_until)
            .bind(&self.last_error)
            .bind(now)
            .bind(&self.instances)
            .bind(&self.groups)
            .bind(&self.verdicts)
            .bind(&self.zones)
            .bind(&self.requesters)
            .bind(&self.tokens)
            .bind(&self.unknown)
            .bind(&self.renewals)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

async fn read_states_of(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<HashMap<String, ClaimState>, sqlx::Error> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids.dedup();
    let found = sqlx::query_as(LOCK_SQL)
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await?;
    states_from(found)
}
