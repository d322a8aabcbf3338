//! The `Store` seam: the durable record of what was requested and what was done.
//!
//! The store, not the process, carries the guarantees: the worker acks a
//! message only after [`Store::record_outcome`] returned, and a request whose
//! outcome is final is never restarted again ([`Store::lookup`]).
//!
//! This file holds the trait; the rest is one file a concern: `error.rs`
//! (errors and their classification), `claim.rs` (the claim rule every
//! store applies), `history.rs` (what a store tells about the past),
//! `campaigns.rs` (campaigns as recorded), `sql.rs` (the statements the
//! SQL stores share), `reads.rs` (the reads
//! they share), `lookup.rs` (lookups answered in groups), `story.rs` (a
//! story in words), `contract.rs` (what every store is tested for), and one
//! module per store. The SQLite store lives beside the SQLite queue, in the
//! crate's `sqlite` module, and implements [`Store`] from there. The paths
//! other modules use are re-exported here.

mod campaigns;
mod claim;
#[cfg(test)]
pub(crate) mod contract;
mod error;
mod history;
pub(crate) mod lookup;
pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod reads;
pub(crate) mod sql;
mod story;

use async_trait::async_trait;
use uuid::Uuid;

use crate::domain::{Asked, JointAck, Outcome, RestartRequest, Status, Timestamp};

pub(crate) use crate::safety::limits::UsageStarts;
pub(crate) use campaigns::{Campaign, CampaignTarget, target_identity};
#[cfg(test)]
pub(crate) use claim::GROUP_PAUSE_RECHECK;
pub(crate) use claim::{Claim, ClaimTerms, ClaimToken, Decision};
pub(crate) use claim::{
    ClaimState, ClaimWrite, HeldHosts, UsageBinds, UsageRow, UsageSubjectRow, claim_decision,
    decide_claim, group_pause_from, switch_from, usage_binds, usage_from, usage_subject_from,
};
pub(crate) use claim::{GroupPause, unknown_outcome};
pub(crate) use claim::{Identity, identity_conflict, same_request};
pub(crate) use claim::{Switch, SwitchExpected};
pub(crate) use error::DEFAULT_TIMEOUT;
pub(crate) use error::StoreError;
pub(crate) use error::{ask, sqlx_error_is_transient, within};
pub(crate) use history::GroupUsage;
pub use history::HistoryEntry;
pub(crate) use history::Recorded;
pub(crate) use history::{
    AttemptRecord, DecisionRecord, ReportAttempt, ReportDecision, payload_excerpt,
};
pub use history::{ReportData, Story};
pub(crate) use history::{group_usage_from, millis_of, status_from_name};
pub(crate) use memory::MemoryStore;
pub(crate) use postgres::PostgresStore;
pub(crate) use sql::{DECISION_SQL, DEFERRAL_SQL};

/// What [`Store::each_history`] hands each entry to; false stops it.
pub(crate) type EachEntry<'a> =
    &'a mut (dyn FnMut(HistoryEntry, Vec<DecisionRecord>) -> bool + Send);

/// The durable record of requests and outcomes. See the module docs.
#[async_trait]
pub(crate) trait Store: Send + Sync + 'static {
    /// The recorded status of a request, if it was ever recorded.
    async fn lookup(&self, message_id: Uuid) -> Result<Option<Status>, StoreError>;

    /// Claims the next restart attempt of a request, recording the claim
    /// (the audit record of a restart about to be issued) before the caller
    /// issues anything; see [`Claim`]. Creates the row if need be. Atomic:
    /// two deliveries of one request, on any number of instances, never both
    /// claim while a claim holds.
    ///
    /// `token` names the call: the claim keeps it, and the same call tried
    /// again with it while that claim holds (its answer was lost) is
    /// answered with the same attempt, writing nothing; see [`ClaimToken`].
    async fn claim_restart(
        &self,
        request: &RestartRequest,
        terms: ClaimTerms,
        token: ClaimToken,
    ) -> Result<Claim, StoreError>;

    /// Records the outcome of restart attempt `attempt`, unless a final
    /// outcome is already recorded or the row is another request's
    /// ([`identity_conflict`]: [`Recorded::Conflict`], nothing written),
    /// and releases that attempt's claim. Creates the row if no claim did.
    async fn record_outcome(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
    ) -> Result<Recorded, StoreError>;

    /// As [`Store::record_outcome`], and, if the outcome was recorded and
    /// `ack` is for this store's own database, the ack in the same
    /// transaction: both commit or neither. Returns whether the ack was
    /// committed; when not (the default: a store that cannot), the caller
    /// acks as usual.
    async fn record_outcome_acking(
        &self,
        request: &RestartRequest,
        attempt: u32,
        outcome: &Outcome,
        ack: Option<JointAck>,
    ) -> Result<(Recorded, bool), StoreError> {
        let _ = ack;
        Ok((self.record_outcome(request, attempt, outcome).await?, false))
    }

    /// Gives back restart attempt `attempt`, claimed but never issued (a
    /// guard closed between the claim and the restart): the attempt is
    /// uncounted and its hold lifted, so the redelivery claims it again.
    /// Does nothing unless `attempt` is the latest claim, still held, and
    /// made with `token` (the [`ClaimToken`] of the claiming call): a
    /// release that commits late never frees another delivery's claim.
    async fn release_claim(
        &self,
        request: &RestartRequest,
        attempt: u32,
        token: ClaimToken,
    ) -> Result<(), StoreError>;

    /// Records a payload that was dead-lettered: malformed, or refused for
    /// asking something else under another request's `message_id`.
    /// `asked` is what could be read of it (its requester only if its
    /// signature was verified): shown in the history, marked unverified
    /// where it is, but never taken as a request's own record (a later
    /// valid request with that id is handled as new).
    async fn record_rejection(
        &self,
        asked: &Asked,
        reason: &str,
        payload: &[u8],
    ) -> Result<(), StoreError>;

    /// The most recently updated entries, newest first.
    async fn history(&self, limit: usize) -> Result<Vec<HistoryEntry>, StoreError>;

    /// Records a guard's verdict on a request that the claim did not
    /// decide (eligibility, the calendar, stop conditions, a dry run), for
    /// [`Store::story`]; claims record their own refusals. Creates the
    /// request's row if need be, so that who asked is bound from its first
    /// record; writes nothing, and answers [`Recorded::Conflict`], when
    /// the row is another request's ([`identity_conflict`]).
    async fn record_decision(
        &self,
        request: &RestartRequest,
        attempt: u32,
        decision: Decision<'_>,
    ) -> Result<Recorded, StoreError>;

    /// Everything recorded about one request, if anything is.
    async fn story(&self, message_id: Uuid) -> Result<Option<Story>, StoreError>;

    /// Each group's use of its limits, counted from `starts` as the claim's
    /// counting guards count: restarts in the rate window, and hosts
    /// disrupted now (a restart still settling included). For `mandrill
    /// status`, the dashboard and `/metrics`.
    async fn group_usage(
        &self,
        starts: UsageStarts,
    ) -> Result<std::collections::BTreeMap<String, GroupUsage>, StoreError>;

    /// The restart journal's attempts claimed at `since` or later and the
    /// verdicts recorded since then, as plain rows, for `mandrill report`.
    /// A store that keeps no journal (a test double) says so.
    async fn report(&self, since: Timestamp) -> Result<ReportData, StoreError> {
        let _ = since;
        Err(StoreError::Unsupported("report"))
    }

    /// How many deliveries of a request a guard deferred (each recorded
    /// `deferred` decision counts, repeated or not): the worker does not
    /// count them against `broker.max_deliveries`.
    async fn deferrals(&self, message_id: Uuid) -> Result<u32, StoreError>;

    /// When the store first received a request: its row's `received_at`,
    /// the row created now (status `received`, no attempt) if it has none,
    /// so that the time stays the first one asked for. What
    /// `safety.max_defer` counts from when the request's own `published_at`
    /// cannot date it; asked only when such a request is deferred.
    async fn first_received(&self, request: &RestartRequest) -> Result<Timestamp, StoreError>;

    /// The kill switch, and the leash beside it, as every instance sharing
    /// this store sees them.
    async fn switch(&self) -> Result<Switch, StoreError>;

    /// Turns the kill switch on (`paused`) or off. Once this returns, no
    /// instance claims another restart until it is turned off.
    async fn set_switch(&self, paused: bool, by: &str, reason: &str) -> Result<(), StoreError>;

    /// Turns the kill switch as [`Store::set_switch`] does, but only if it
    /// is as `expected`, checked and written in one step; whether it
    /// turned. For a turn that must not undo someone else's (the pause
    /// file resumes only its own pause).
    async fn set_switch_if(
        &self,
        expected: SwitchExpected<'_>,
        paused: bool,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError>;

    /// Turns the leash for every instance sharing this store: `leashed`
    /// (restarts recorded as dry runs) or not, by whom, why. Read by every
    /// claim in its own transaction with the kill switch, so once this
    /// returns no instance claims a restart under the leash as it was
    /// (see `safety::leash`). The default, for a store that keeps none
    /// (test doubles): refused.
    async fn set_leash(&self, leashed: bool, by: &str, reason: &str) -> Result<(), StoreError> {
        let _ = (leashed, by, reason);
        Err(StoreError::Unsupported("the leash"))
    }

    /// The groups whose restarts are paused, by group; a claim for a host
    /// of one of them is deferred (`group pause`). The default, for a
    /// store that keeps none (test doubles): none.
    async fn group_pauses(&self) -> Result<Vec<GroupPause>, StoreError> {
        Ok(Vec::new())
    }

    /// Pauses `group` (`Some((by, reason))`) unless it is paused already,
    /// or lifts its pause (`None`); whether anything changed. Once this
    /// returns, no instance claims a restart of that group until it is
    /// lifted. The default, for a store that keeps none: refused.
    async fn set_group_pause(
        &self,
        group: &str,
        pause: Option<(&str, &str)>,
    ) -> Result<bool, StoreError> {
        let _ = (group, pause);
        Err(StoreError::Unsupported("group pauses"))
    }

    /// The last `limit` verified restarts of `group` (journal rows settled
    /// `restarted` with a recovery time, or `unrecovered`), newest claim
    /// first: how long each host took to come back, `None` if it never
    /// did. What a recovery objective is judged on.
    async fn recent_recoveries(
        &self,
        group: &str,
        limit: u32,
    ) -> Result<Vec<Option<std::time::Duration>>, StoreError> {
        let _ = (group, limit);
        Ok(Vec::new())
    }

    /// Deletes at most `max_rows` final entries completed before `before`,
    /// oldest first; returns how many went. Bounded, so that pruning a large
    /// history never holds the database for long.
    async fn prune(&self, before: Timestamp, max_rows: u32) -> Result<u64, StoreError>;

    /// Records a campaign as it starts, before its requests are published.
    /// A store that keeps none (a test double) refuses.
    async fn record_campaign(&self, campaign: &Campaign) -> Result<(), StoreError> {
        let _ = campaign;
        Err(StoreError::Unsupported("campaigns"))
    }

    /// The decisions recorded about a request, oldest first (a request
    /// deferred before any claim has these and a record with no attempt).
    /// For `campaign status` and `wait`.
    async fn decisions(&self, message_id: Uuid) -> Result<Vec<DecisionRecord>, StoreError> {
        let _ = message_id;
        Err(StoreError::Unsupported("decisions apart from a story"))
    }

    /// What the counting guards would read for a claim of `request` under
    /// `limits` now, read on its own (no lock, nothing written): for
    /// `campaign start`'s verdicts, never for a claim, which reads it in
    /// its own transaction. A store that keeps no journal refuses.
    async fn usage(
        &self,
        request: &RestartRequest,
        limits: &crate::safety::Limits,
    ) -> Result<crate::safety::limits::Usage, StoreError> {
        let _ = (request, limits);
        Err(StoreError::Unsupported("usage"))
    }

    /// Stops campaign `id` (`mandrill campaign stop`): records who stopped
    /// it and why (the first stop is kept; a later one records nothing
    /// new of its own) and, in the same transaction, records `cancelled`
    /// each target whose request is not final and not held by a claim
    /// (a restart that may be running finishes), creating the record of
    /// a target no instance has received yet with the identity its
    /// signed request carries ([`campaigns::target_identity`]). So every
    /// claim after it, on any instance, finds those targets final and
    /// issues nothing, however late their messages come. `None` when no
    /// campaign `id` is recorded; else the campaign as recorded now and
    /// the targets this call cancelled.
    async fn stop_campaign(
        &self,
        id: Uuid,
        by: &str,
        reason: &str,
    ) -> Result<Option<(Campaign, Vec<Uuid>)>, StoreError> {
        let _ = (id, by, reason);
        Err(StoreError::Unsupported("campaigns"))
    }

    /// The entries [`Store::history`] returns for `limit`, newest first,
    /// each handed to `each` with its decisions (oldest first; none unless
    /// `decisions`, and none for a rejected payload) until `each` answers
    /// false: `history` and `history --json` over a whole record, in
    /// memory bounded by a page however long it is. The SQL stores read
    /// the pages from one snapshot.
    async fn each_history(
        &self,
        limit: usize,
        decisions: bool,
        each: EachEntry<'_>,
    ) -> Result<(), StoreError> {
        for entry in self.history(limit).await? {
            let decided = match entry.message_id {
                Some(id) if decisions && entry.status != Status::Rejected => {
                    self.decisions(id).await?
                }
                _ => Vec::new(),
            };
            if !each(entry, decided) {
                break;
            }
        }
        Ok(())
    }

    /// The campaign with this id, if one is recorded.
    async fn campaign(&self, id: Uuid) -> Result<Option<Campaign>, StoreError> {
        let _ = id;
        Err(StoreError::Unsupported("campaigns"))
    }

    /// The campaigns started at or after `since`, oldest first: the
    /// dashboard's campaigns in flight.
    async fn campaigns_since(&self, since: Timestamp) -> Result<Vec<Campaign>, StoreError> {
        let _ = since;
        Err(StoreError::Unsupported("campaigns"))
    }

    /// Closes connections; called once, after the last write.
    async fn close(&self) {}
}
