//! Where a campaign's targets stand, read from the store: what `campaign
//! status`, `wait`, the report and the dashboard show, judged by
//! [`super::standing`] from each request's record.

use std::collections::HashSet;

use anyhow::Context as _;
use uuid::Uuid;

use super::{Standing, Verdict};
use crate::domain::Timestamp;
use crate::store::{Campaign, CampaignTarget, HistoryEntry, Identity, Store};

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
    let identities: Vec<Identity> = (0..campaign.targets.len())
        .map(|index| crate::store::target_identity(campaign, index))
        .collect();
    let ids: Vec<(Uuid, AskedFor<'_>)> = campaign
        .targets
        .iter()
        .zip(&identities)
        .map(|(target, identity)| (target.message_id, AskedFor::Target(identity)))
        .collect();
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
///
/// A record under the id for another host than the one asked for, or for
/// a campaign's target another requester or reason, is not this request's
/// (another request took the id first: a schedule's or a campaign's ids
/// can be known in advance); this request was refused, so it failed,
/// saying so.
pub(crate) async fn standings(
    store: &dyn Store,
    ids: &[(Uuid, AskedFor<'_>)],
) -> anyhow::Result<Vec<Standing>> {
    let mut standings = Vec::with_capacity(ids.len());
    for &(id, asked) in ids {
        let context = || format!("cannot read request {id} in the store");
        // A rejection never takes an id (the valid request is handled as
        // new): a rejected payload that asked for something else is no
        // news of this request.
        let story = store
            .story(id)
            .await
            .with_context(context)?
            .filter(|story| !asked.disowns(&story.entry));
        if let Some(taken) = story.as_ref().and_then(|story| asked.taken(&story.entry)) {
            standings.push(Standing {
                state: "rejected".into(),
                verdict: Verdict::Failed,
                detail: taken,
                recovered_after_seconds: None,
            });
            continue;
        }
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
        .map(|((id, _), _)| *id)
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
            let index = ids.iter().position(|(i, _)| *i == id).unwrap_or_default();
            if entry.status != crate::domain::Status::Rejected || ids[index].1.disowns(&entry) {
                continue;
            }
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

/// Which request an id was published for, as far as the asker knows.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AskedFor<'a> {
    /// Only the id (`mandrill wait ID`).
    Any,
    /// A campaign's target: the request its campaign signed (this
    /// instance, the campaign's requester, the target's reason).
    Target(&'a Identity),
    /// A line `mandrill publish` printed: this host.
    Host(&'a str),
}

impl AskedFor<'_> {
    /// Whether `entry` is a rejected payload that said it asked for
    /// another host, or (for a target) for another reason: not this
    /// request's message. One that said nothing of it is judged as the
    /// rejection it is.
    fn disowns(self, entry: &HistoryEntry) -> bool {
        if entry.status != crate::domain::Status::Rejected {
            return false;
        }
        let other = |said: Option<&str>, asked: &str| said.is_some_and(|said| said != asked);
        match self {
            Self::Any => false,
            Self::Target(target) => {
                other(entry.instance_name.as_deref(), &target.instance)
                    || entry.reason.is_some() && entry.reason != target.reason
            }
            // A rejection keeps the instance it named, never a hostname:
            // the host's instance is its first label.
            Self::Host(host) => other(
                entry.instance_name.as_deref(),
                host.split('.').next().unwrap_or(host),
            ),
        }
    }

    /// Why `entry`, recorded under the id, is another request's, if it is.
    fn taken(self, entry: &HistoryEntry) -> Option<String> {
        const TAKEN: &str = "another request took the id first, and this one was refused \
                             (`mandrill explain` the id)";
        let (what, asked, recorded) = match self {
            Self::Any => return None,
            Self::Target(asked) => (
                "instance",
                asked.instance.as_str(),
                entry.instance_name.as_deref()?,
            ),
            Self::Host(asked) => ("host", asked, entry.hostname.as_deref()?),
        };
        if asked != recorded {
            return Some(format!(
                "its id is recorded for {what} {recorded}, not {asked}: {TAKEN}"
            ));
        }
        // A rejected payload's row keeps no identity to compare (the signer
        // only once verified): it is judged as the rejection it is.
        let Self::Target(target) = self else {
            return None;
        };
        if entry.status == crate::domain::Status::Rejected {
            return None;
        }
        // As the claim's rule compares them (`identity_conflict`): who
        // asked, signed or not, and why.
        let same = entry.requested_by == target.requested_by
            && entry.verified == target.requester.is_some()
            && entry.reason == target.reason;
        (!same).then(|| {
            format!(
                "its id is recorded for {recorded} asked by another requester or for another \
                 reason: {TAKEN}"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Outcome, Restarted, Status};
    use crate::store::{ClaimTerms, ClaimToken, MemoryStore};

    /// `request` claimed and restarted.
    async fn restart(store: &MemoryStore, request: &crate::domain::RestartRequest) {
        let terms = ClaimTerms {
            max_attempts: 1,
            hold: std::time::Duration::from_secs(60),
            limits: crate::safety::Limits::NONE,
        };
        store
            .claim_restart(request, terms, ClaimToken::new())
            .await
            .unwrap();
        store
            .record_outcome(request, 1, &Outcome::Restarted(Restarted::default()))
            .await
            .unwrap();
    }

    /// A request that took another's id first, and restarted its own host:
    /// asked about by the other's host (a line `mandrill publish` printed)
    /// or by a campaign's target, the id's record is not that request's,
    /// and it failed, saying why; asked by the id alone, the record stands.
    #[tokio::test]
    async fn a_record_for_another_host_under_the_id_is_not_the_one_asked_for() {
        let store = MemoryStore::new();
        let squatter = crate::domain::testing::request("db-9");
        restart(&store, &squatter).await;
        let id = squatter.message_id;
        assert_eq!(
            store.story(id).await.unwrap().unwrap().entry.status,
            Status::Restarted
        );

        let web_1 = Identity {
            instance: "web-1".into(),
            ..Identity::default()
        };
        let asked = [
            (id, AskedFor::Host("web-1.example.net")),
            (id, AskedFor::Target(&web_1)),
            (id, AskedFor::Host(squatter.hostname.as_str())),
            (id, AskedFor::Any),
        ];
        let stood = standings(&store, &asked).await.unwrap();
        for (standing, what) in stood[..2].iter().zip(["host", "instance"]) {
            assert_eq!(standing.verdict, Verdict::Failed, "{standing:?}");
            assert_eq!(standing.state, "rejected");
            assert!(
                standing
                    .detail
                    .starts_with(&format!("its id is recorded for {what} db-9")),
                "{standing:?}"
            );
        }
        for standing in &stood[2..] {
            assert_eq!(standing.verdict, Verdict::Succeeded, "{standing:?}");
        }
    }

    /// A campaign of one target, `web-1`, signed as chaos.
    fn web_1_campaign() -> Campaign {
        Campaign {
            id: Uuid::new_v4(),
            group: "web".into(),
            created_at: Timestamp::now(),
            requester: Some("chaos".into()),
            targets: vec![CampaignTarget {
                instance_name: "web-1".into(),
                message_id: Uuid::new_v4(),
                due_at: Timestamp::now(),
            }],
            stopped: None,
        }
    }

    /// The request `campaign start` signs for the campaign's one target.
    fn target_request(campaign: &Campaign) -> crate::domain::RestartRequest {
        let mut own = crate::domain::testing::request("web-1");
        own.message_id = campaign.targets[0].message_id;
        own.requester = campaign.requester.clone();
        own.requested_by = campaign.requester.clone();
        own.reason = Some(campaign.target_reason(0));
        own
    }

    /// A request that took a campaign target's id first for the target's
    /// own instance, asked by another requester: the campaign's signed
    /// request was refused, so the target failed, whatever the squatter's
    /// restart did (it was judged by the host alone: succeeded).
    #[tokio::test]
    async fn a_targets_id_taken_by_another_requester_for_its_instance_is_not_the_target() {
        let store = MemoryStore::new();
        let campaign = web_1_campaign();
        let mut squatter = target_request(&campaign);
        squatter.requester = Some("mallory".into());
        squatter.requested_by = Some("mallory".into());
        restart(&store, &squatter).await;

        let (judged, verdict) = judge(&store, &campaign).await.unwrap();
        let standing = &judged[0].1;
        assert_eq!(
            (standing.verdict, standing.state.as_str()),
            (Verdict::Failed, "rejected"),
            "{standing:?}"
        );
        assert!(
            standing
                .detail
                .starts_with("its id is recorded for web-1 asked by another requester"),
            "{standing:?}"
        );
        assert_eq!(verdict, Verdict::Failed);

        // The campaign's own request, recorded first, is the target.
        let store = MemoryStore::new();
        restart(&store, &target_request(&campaign)).await;
        let (judged, _) = judge(&store, &campaign).await.unwrap();
        assert_eq!(judged[0].1.verdict, Verdict::Succeeded, "{:?}", judged[0].1);
    }

    /// A payload rejected under a target's id that asked for another host
    /// (anyone can publish under an id known in advance) neither fails the
    /// target nor takes its id: the target is still waiting, and once its
    /// own request is restarted it succeeded.
    #[tokio::test]
    async fn a_rejected_payload_for_another_host_under_a_targets_id_is_no_news_of_it() {
        let store = MemoryStore::new();
        let campaign = web_1_campaign();
        let id = campaign.targets[0].message_id;
        for instance in ["db-9", "web-1"] {
            let asked = crate::domain::Asked {
                message_id: Some(id),
                instance_name: Some(instance.into()),
                requested_by: Some("mallory".into()),
                reason: Some("not the campaign's".into()),
                requester: None,
            };
            store
                .record_rejection(&asked, "signature rejected: unknown key", b"{}")
                .await
                .unwrap();
            let (judged, verdict) = judge(&store, &campaign).await.unwrap();
            let standing = &judged[0].1;
            assert_eq!(standing.state, "published", "{instance}: {standing:?}");
            assert_eq!(verdict, Verdict::InProgress, "{instance}: {standing:?}");
            // Asked for by the host a `publish` line printed: a rejection
            // naming another host is no news of it either (one naming the
            // same host with another reason may be its own message).
            if instance == "db-9" {
                let asked = [(id, AskedFor::Host("web-1.example.net"))];
                let stood = standings(&store, &asked).await.unwrap();
                assert_eq!(stood[0].state, "published", "{:?}", stood[0]);
            }
        }
        restart(&store, &target_request(&campaign)).await;
        let (judged, _) = judge(&store, &campaign).await.unwrap();
        assert_eq!(judged[0].1.verdict, Verdict::Succeeded, "{:?}", judged[0].1);
    }
}
