//! Campaigns as a store keeps them (`mandrill campaign start` writes one,
//! `campaign status` and `wait` read it): one row each, its targets as JSON,
//! read whole. What each target's request came to is in the requests' own
//! records ([`super::Store::story`]), found by the targets' message ids.

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

/// `campaigns` row: id, group, created_at, requester, targets.
pub(crate) type CampaignRow = (String, String, i64, Option<String>, String);

pub(crate) const INSERT_CAMPAIGN_SQL: &str =
    "INSERT INTO campaigns (id, grp, created_at, requester, targets) VALUES ($1, $2, $3, $4, $5)";

pub(crate) const CAMPAIGN_SQL: &str =
    "SELECT id, grp, created_at, requester, targets FROM campaigns WHERE id = $1";

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

    /// A campaign from its row.
    pub(crate) fn from_row(row: CampaignRow) -> Result<Self, StoreError> {
        let (id, group, created_at, requester, targets) = row;
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
        )
    }
}
