//! Campaigns as a store keeps them (`mandrill campaign start` writes one,
//! `campaign status` and `wait` read it, `campaign stop` stops it): one row
//! each, its targets as JSON, read whole. What each target's request came
//! to is in the requests' own records ([`super::Store::story`]), found by
//! the targets' message ids; a stop records `cancelled` onto them
//! ([`cancellation`], the one rule every store applies).

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{StoreError, Timestamp};

/// A campaign as recorded when it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Campaign {
    /// Its id; each target's message id is derived from it.
    pub id: Uuid,
    /// The inventory group its targets were drawn from.
    pub group: String,
    /// When it started.
    pub created_at: Timestamp,
    /// The requester its requests are signed as.
    pub requester: Option<String>,
    /// The targets, in the order they are due.
    pub targets: Vec<CampaignTarget>,
    /// Who stopped it, when and why (the first stop), if anyone did.
    pub stopped: Option<CampaignStop>,
}

/// A campaign's stop (`mandrill campaign stop`, `POST
/// /api/campaigns/{id}/stop`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CampaignStop {
    /// Who stopped it, as the pause commands name an operator.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When.
    pub at: Timestamp,
}

/// One target of a campaign.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CampaignTarget {
    /// The host.
    pub instance_name: String,
    /// Its request's message id.
    pub message_id: Uuid,
    /// When it is due (the request's `not_before`, with `--spread`).
    pub due_at: Timestamp,
}

/// A target as stored in the `targets` column.
#[derive(Serialize, Deserialize)]
struct StoredTarget {
    instance_name: String,
    message_id: Uuid,
    /// Milliseconds since the Unix epoch.
    due_at: i64,
}

/// `campaigns` row: id, group, created_at, requester, targets, then the
/// stop: stopped_at, stopped_by, stop_reason.
pub(crate) type CampaignRow = (
    String,
    String,
    i64,
    Option<String>,
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
);

pub(crate) const INSERT_CAMPAIGN_SQL: &str =
    "INSERT INTO campaigns (id, grp, created_at, requester, targets) VALUES ($1, $2, $3, $4, $5)";

pub(crate) const CAMPAIGNS_SINCE_SQL: &str = "SELECT id, grp, created_at, requester, targets, \
     stopped_at, stopped_by, stop_reason \
     FROM campaigns WHERE created_at >= $1 ORDER BY created_at, id";

pub(crate) const CAMPAIGN_SQL: &str = "SELECT id, grp, created_at, requester, targets, \
     stopped_at, stopped_by, stop_reason FROM campaigns WHERE id = $1";

/// Records a campaign's stop unless one is recorded (the first is kept):
/// `$1` id, `$2` now, `$3` by, `$4` reason. A write first, so that
/// SQLite's transaction takes the write lock before it reads.
pub(crate) const STOP_CAMPAIGN_SQL: &str = "UPDATE campaigns SET stopped_at = $2, \
     stopped_by = $3, stop_reason = $4 WHERE id = $1 AND stopped_at IS NULL";

/// Marks a target that is not final with [`cancellation`]'s words (`$2`):
/// `$1` its message id. A claim that finds the mark makes no claim
/// ([`super::decide_claim`]): a target whose restart was in flight when
/// the campaign stopped is not tried again once that attempt ends.
pub(crate) static MARK_TARGET_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE requests SET cancel_reason = $2 WHERE message_id = $1 AND status IN {}",
        *super::sql::OPEN_STATUSES
    )
});

/// Records a target `cancelled` ([`cancellation`]'s words, `$2`) at `$3`
/// if its request is not final and no claim of it holds now: `$1` its
/// message id. A claim still held is a restart that may be running: it
/// finishes, and its outcome is recorded as usual.
pub(crate) static CANCEL_TARGET_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE requests SET status = 'cancelled', last_error = $2, updated_at = $3, \
         completed_at = $3 \
         WHERE message_id = $1 AND status IN {} AND (claim_until IS NULL OR claim_until <= $3)",
        *super::sql::OPEN_STATUSES
    )
});

impl Campaign {
    /// The `targets` column.
    pub(crate) fn targets_json(&self) -> String {
        let stored: Vec<StoredTarget> = self
            .targets
            .iter()
            .map(|target| StoredTarget {
                instance_name: target.instance_name.clone(),
                message_id: target.message_id,
                due_at: target.due_at.as_millis(),
            })
            .collect();
        // A list of strings and numbers serialises.
        serde_json::to_string(&stored).expect("targets serialise")
    }

    /// The reason each target's request gives (what `campaign start`
    /// signs): the campaign, the target's place and the group. Part of
    /// who asked and for what, so that a stop can record a target no
    /// instance has received yet as the very request its message carries.
    pub(crate) fn target_reason(&self, index: usize) -> String {
        format!(
            "campaign {}: target {} of {} in group {}",
            self.id,
            index + 1,
            self.targets.len(),
            self.group
        )
    }

    /// A campaign from its row.
    pub(crate) fn from_row(row: CampaignRow) -> Result<Self, StoreError> {
        let (id, group, created_at, requester, targets, stopped_at, stopped_by, stop_reason) = row;
        let id =
            Uuid::parse_str(&id).map_err(|_| StoreError::Corrupt(format!("campaign id {id:?}")))?;
        let stored: Vec<StoredTarget> = serde_json::from_str(&targets)
            .map_err(|error| StoreError::Corrupt(format!("campaign {id} targets: {error}")))?;
        Ok(Self {
            id,
            group,
            created_at: Timestamp::from_millis(created_at),
            requester,
            targets: stored
                .into_iter()
                .map(|target| CampaignTarget {
                    instance_name: target.instance_name,
                    message_id: target.message_id,
                    due_at: Timestamp::from_millis(target.due_at),
                })
                .collect(),
            stopped: stopped_at.map(|at| CampaignStop {
                by: stopped_by.unwrap_or_default(),
                reason: stop_reason.unwrap_or_default(),
                at: Timestamp::from_millis(at),
            }),
        })
    }

    /// The row it is stored as (the memory store keeps the same, so that
    /// every store round-trips alike, to the millisecond).
    pub(crate) fn to_row(&self) -> CampaignRow {
        (
            self.id.to_string(),
            self.group.clone(),
            self.created_at.as_millis(),
            self.requester.clone(),
            self.targets_json(),
            self.stopped.as_ref().map(|stop| stop.at.as_millis()),
            self.stopped.as_ref().map(|stop| stop.by.clone()),
            self.stopped.as_ref().map(|stop| stop.reason.clone()),
        )
    }
}

/// The words a target cancelled by `stop` records as its reason: which
/// campaign, who stopped it and why (what `campaign status`, `wait` and
/// `explain` show). Not "before it was issued": a target whose attempt
/// failed (`retrying`), or whose restart was in flight, was issued.
pub(crate) fn cancellation(campaign: Uuid, stop: &CampaignStop) -> String {
    format!(
        "cancelled: campaign {campaign} was stopped by {} at {} ({}); no further attempt of \
         this target is issued",
        stop.by, stop.at, stop.reason
    )
}

/// What a target's record must say to be the request `campaign start`
/// published for it: a stop that finds no record creates this one (as
/// `received`, then cancels it), so that its redelivery is that request,
/// found final, and never a new one. The identity is the campaign's own:
/// its requester signed it (and so is who asked), the target's host, and
/// [`Campaign::target_reason`]. A payload claiming anything else under the
/// id is another request, refused ([`super::identity_conflict`]).
pub(crate) fn target_identity(campaign: &Campaign, index: usize) -> super::Identity {
    super::Identity {
        instance: campaign.targets[index].instance_name.clone(),
        requested_by: campaign.requester.clone(),
        requester: campaign.requester.clone(),
        reason: Some(campaign.target_reason(index)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reason is true of every target it is written onto: a target
    /// retrying after a failed attempt, or with a restart in flight, was
    /// issued, so the words never say "before it was issued".
    #[test]
    fn a_cancelled_targets_reason_never_says_it_was_not_issued() {
        let stop = CampaignStop {
            by: "ana".into(),
            reason: "game day over".into(),
            at: Timestamp::from_millis(1_795_000_000_000),
        };
        let words = cancellation(Uuid::nil(), &stop);
        assert!(words.starts_with("cancelled: campaign "), "{words}");
        assert!(words.contains("stopped by ana at "), "{words}");
        assert!(!words.contains("before"), "{words}");
        assert!(words.ends_with("no further attempt of this target is issued"));
    }
}
