//! Where a campaign's targets stand, read from the store: what `campaign
//! status`, `wait`, the report and the dashboard show, judged by
//! [`super::standing`] from each request's record.

use std::collections::HashSet;

use anyhow::Context as _;
use uuid::Uuid;

use super::{Standing, Verdict};
use crate::domain::Timestamp;
use crate::store::{Campaign, CampaignTarget, Store};

/// A campaign with each target and where it stands, and its verdict.
pub(crate) type Judged = (Campaign, Vec<(CampaignTarget, Standing)>, Verdict);

/// The newest `max` campaigns started since `since`, newest first, each
/// judged: what the dashboard lists, those in flight first.
pub(crate) async fn recent(
    store: &dyn Store,
    since: Timestamp,
    max: usize,
) -> anyhow::Result<Vec<Judged>> {
    let mut campaigns = store
        .campaigns_since(since)
        .await
        .context("cannot read the campaigns")?;
    campaigns.reverse();
    campaigns.truncate(max);
    let mut judged = Vec::with_capacity(campaigns.len());
    for campaign in campaigns {
        let (targets, verdict) = judge(store, &campaign).await?;
        judged.push((campaign, targets, verdict));
    }
    // Stable: newest first within in flight and within the rest.
    judged.sort_by_key(|(_, _, verdict)| *verdict != Verdict::InProgress);
    Ok(judged)
}

/// Each target of `campaign` with where it stands, and the campaign's
/// verdict, from the store.
pub(crate) async fn judge(
    store: &dyn Store,
    campaign: &Campaign,
) -> anyhow::Result<(Vec<(CampaignTarget, Standing)>, Verdict)> {
    let ids: Vec<Uuid> = campaign.targets.iter().map(|t| t.message_id).collect();
    let standings = standings(store, &ids).await?;
    let judged: Vec<_> = campaign.targets.iter().cloned().zip(standings).collect();
    let verdict = Verdict::of_all(judged.iter().map(|(_, standing)| standing.verdict));
    Ok((judged, verdict))
}

/// How many of the newest history entries are searched for a rejection of
/// a request that has no record of its own.
const REJECTIONS_SEARCHED: usize = 1000;

/// Where each request stands. A request with no record and no decision
/// may have been rejected (a bad or unknown signature): a rejection is
/// recorded apart, under the id salvaged from the payload, so the newest
/// history is searched for one; found, the request failed.
pub(crate) async fn standings(store: &dyn Store, ids: &[Uuid]) -> anyhow::Result<Vec<Standing>> {
    let mut standings = Vec::with_capacity(ids.len());
    for &id in ids {
        let context = || format!("cannot read request {id} in the store");
        let story = store.story(id).await.with_context(context)?;
        let early = match &story {
            Some(_) => Vec::new(),
            None => store.decisions(id).await.with_context(context)?,
        };
        standings.push(super::standing(story.as_ref(), &early));
    }
    let unheard: HashSet<Uuid> = ids
        .iter()
        .zip(&standings)
        .filter(|(_, standing)| standing.state == "published")
        .map(|(id, _)| *id)
        .collect();
    if !unheard.is_empty() {
        let recent = store
            .history(REJECTIONS_SEARCHED)
            .await
            .context("cannot read the store's recent history")?;
        for entry in recent {
            let Some(id) = entry.message_id.filter(|id| unheard.contains(id)) else {
                continue;
            };
            if entry.status != crate::domain::Status::Rejected {
                continue;
            }
            let index = ids.iter().position(|i| *i == id).unwrap_or_default();
            standings[index] = Standing {
                state: "rejected".into(),
                verdict: Verdict::Failed,
                detail: format!(
                    "a payload with this id was rejected: {}",
                    entry.last_error.as_deref().unwrap_or("no reason recorded")
                ),
                recovered_after_seconds: None,
            };
        }
    }
    Ok(standings)
}
