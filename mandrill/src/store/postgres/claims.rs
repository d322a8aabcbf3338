//! The writes that keep a transaction (and a pooled connection) of their
//! own, taking turns for the connections the writers leave: claims that a
//! counting guard must check, under advisory locks; releases; decisions.

use std::sync::LazyLock;

use super::PostgresStore;
use super::batch::SWITCH_SHARED_SQL;
use super::rows::attempts;
use crate::domain::RestartRequest;
use crate::safety::limits::{Limits, Subject, Usage};
use crate::store::reads::postgres as reads;
use crate::store::sql::{
    GROUP_PAUSE_SQL, GroupPauseRow, HELD_HOSTS_SQL, HeldRow, INSERT_REQUEST_SQL,
    RELEASE_JOURNAL_SQL, RELEASE_SQL, SwitchRow, identity_from, upsert_journal,
};
use crate::store::{
    Claim, ClaimState, ClaimTerms, ClaimToken, Decision, HeldHosts, Recorded, StoreError,
    Timestamp, claim_decision, decide_claim, group_pause_from, status_from_name, switch_from,
};

/// A claim's journal row: `$1` id, `$2` attempt, `$3` machine, `$4`
/// group, `$5` now, `$6` verdict, `$7` zone, `$8` requester.
static JOURNAL_SQL: LazyLock<String> = LazyLock::new(|| {
    upsert_journal(
        "SELECT $1::text AS id, $2::int4 AS attempt, $3::text AS instance_name,
                $4::text AS grp, $7::text AS zone, $8::text AS requester,
                $6::text AS verdict, $5::int8 AS at",
    )
});

/// The advisory locks a claim of `subject` takes under `limits`, in the
/// order every claim takes them: global → requester → zone → group →
/// host. Each kind has its own prefix, so a requester named like a group
/// never shares its lock.
pub(super) fn lock_keys(limits: &Limits, subject: Subject<'_>) -> Vec<String> {
    let mut keys = Vec::with_capacity(5);
    if limits.global_max.is_some() {
        keys.push("mandrill:global".to_owned());
    }
    if let Some(requester) = subject
        .requester
        .filter(|_| limits.counts_requester(subject))
    {
        keys.push(format!("mandrill:requester:{requester}"));
    }
    if let Some(zone) = subject.zone.filter(|_| limits.counts_zone(subject)) {
        keys.push(format!("mandrill:zone:{zone}"));
    }
    keys.push(format!("mandrill:group:{}", subject.group));
    keys.push(format!("mandrill:host:{}", subject.instance));
    keys
}

/// A request's row as a claim reads it: status, attempts, `claim_until`,
/// `claim_token`, `claim_unknown`; then who asked and for what (instance,
/// requested by, requester, reason), and `cancel_reason`.
type ClaimRow = (
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

impl PostgresStore {
    /// A claim in its own transaction: the counting guards take advisory
    /// locks (global, requester, zone, group, host) that a batch must not
    /// interleave.
    pub(super) async fn claim_alone(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError> {
        let received = Timestamp::now().as_millis();
        let id = request.message_id.to_string();
        let _turn = self.turn().await?;
        let mut tx = self.pool.begin().await?;
        sqlx::query(&INSERT_REQUEST_SQL)
            .bind(&id)
            .bind(request.instance_name.as_str())
            .bind(request.hostname.as_str())
            .bind(request.requested_by.as_deref())
            .bind(request.requester.as_deref())
            .bind(request.reason.as_deref())
            .bind(received)
            .execute(&mut *tx)
            .await?;
        // The row lock serialises claims of one request across instances.
        // Its identity in the same read: the claim judges it (a row this
        // insert created is the request's own, and judged alike).
        let (status, claimed, claim_until, held_by, unknown, instance, by, signer, why, cancelled): ClaimRow =
            sqlx::query_as(
                "SELECT status, attempts, claim_until, claim_token, claim_unknown,
                    instance_name, requested_by, requester, reason, cancel_reason
             FROM requests WHERE message_id = $1 FOR UPDATE",
            )
            .bind(&id)
            .fetch_one(&mut *tx)
            .await?;
        let state = ClaimState {
            status: status_from_name(&status)?,
            attempts: u32::try_from(claimed).unwrap_or(0),
            claim_until,
            token: held_by.map(ClaimToken::from_stored),
            unknown: unknown.and_then(|attempt| u32::try_from(attempt).ok()),
            identity: Some(identity_from((instance, by, signer, why))),
            cancelled,
        };
        // The leash is in the same row: read with it, under the same lock.
        let row: SwitchRow = sqlx::query_as(&SWITCH_SHARED_SQL)
            .fetch_one(&mut *tx)
            .await?;
        let switch = switch_from(row);
        // After the switch's share lock: a group pause waits for it.
        let group_pause = sqlx::query_as::<_, GroupPauseRow>(GROUP_PAUSE_SQL)
            .bind(request.group())
            .fetch_optional(&mut *tx)
            .await?
            .map(group_pause_from);
        let subject = Subject::of(request);
        let (usage, now) = if terms.limits.is_active_for(subject) && !switch.paused {
            // Serialise the claims that count against the same limits, on
            // every instance: global (when a global limit is set), then the
            // requester and the zone (when their limits count this
            // request), then the group, then the host; always in that
            // order, so no two claims wait for each other. Transaction-
            // scoped advisory locks: no table to keep, released by the
            // commit.
            for key in lock_keys(&terms.limits, subject) {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
            }
            // Read once the locks are held (they may have waited for other
            // instances' claims, and this one for a connection): the stamp
            // is then never earlier than the claim takes effect, so the
            // restart cannot leave a rate window or a cooldown early by
            // the time spent waiting.
            let now = Timestamp::now().as_millis();
            let mut usage = reads::usage(&mut tx, request, &terms.limits, now).await?;
            let held: Vec<HeldRow> = sqlx::query_as(&HELD_HOSTS_SQL)
                .bind(vec![request.machine()])
                .bind(now)
                .fetch_all(&mut *tx)
                .await?;
            let mut hosts = HeldHosts::default();
            for (host, message_id, until) in held {
                if message_id != id {
                    hosts.read(host, &message_id, until);
                }
            }
            usage.host_held = hosts.get(request.machine());
            (usage, now)
        } else {
            (Usage::default(), Timestamp::now().as_millis())
        };
        let (claim, write) = decide_claim(
            request,
            Some(state),
            &switch,
            group_pause.as_ref(),
            now,
            terms,
            token,
            &usage,
        );
        if let Some(decision) = claim_decision(&claim) {
            reads::insert_decision(&mut tx, request.message_id, 0, decision, now).await?;
        }
        if let Some(write) = write {
            if !write.renewal {
                sqlx::query(&JOURNAL_SQL)
                    .bind(&id)
                    .bind(attempts(write.attempts))
                    .bind(request.machine())
                    .bind(request.group())
                    .bind(now)
                    .bind(&write.verdict)
                    .bind(request.zone.as_deref())
                    .bind(request.requester.as_deref())
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(
                "UPDATE requests SET status = 'received', attempts = $2, claim_until = $3,
                     last_error = COALESCE($4, last_error), updated_at = $5,
                     claim_token = $6, claim_unknown = $7
                 WHERE message_id = $1",
            )
            .bind(&id)
            .bind(attempts(write.attempts))
            .bind(write.claim_until)
            .bind(write.last_error)
            .bind(now)
            .bind(write.token.to_stored())
            .bind(write.unknown.map(attempts))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(claim)
    }

    /// See [`crate::store::Store::release_claim`].
    pub(super) async fn release(
        &self,
        request: &RestartRequest,
        attempt: u32,
        token: ClaimToken,
    ) -> Result<(), StoreError> {
        let _turn = self.turn().await?;
        let mut tx = self.pool.begin().await?;
        let released = sqlx::query(&RELEASE_SQL)
            .bind(request.message_id.to_string())
            .bind(attempts(attempt))
            .bind(Timestamp::now().as_millis())
            .bind(token.to_stored())
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
        if released {
            sqlx::query(RELEASE_JOURNAL_SQL)
                .bind(request.message_id.to_string())
                .bind(attempts(attempt))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// See [`crate::store::Store::first_received`].
    pub(super) async fn first_received(
        &self,
        request: &RestartRequest,
    ) -> Result<Timestamp, StoreError> {
        {
            let _turn = self.turn().await?;
            sqlx::query(&INSERT_REQUEST_SQL)
                .bind(request.message_id.to_string())
                .bind(request.instance_name.as_str())
                .bind(request.hostname.as_str())
                .bind(request.requested_by.as_deref())
                .bind(request.requester.as_deref())
                .bind(request.reason.as_deref())
                .bind(Timestamp::now().as_millis())
                .execute(&self.pool)
                .await?;
        }
        reads::received_at(&self.pool, request.message_id).await
    }

    /// See [`crate::store::Store::record_decision`].
    pub(super) async fn decide(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<Recorded, StoreError> {
        let _turn = self.turn().await?;
        let mut tx = self.pool.begin().await?;
        let now = Timestamp::now().as_millis();
        let recorded = reads::record_decision(&mut tx, request, attempt, decision, now).await?;
        tx.commit().await?;
        Ok(recorded)
    }
}
