//! A campaign is recorded once and read back whole, and a stop cancels
//! its targets not yet issued, for every claim after it.

use super::*;

/// A campaign reads back whole (targets in order, times to the
/// millisecond); an unknown id is `None`; the same id twice is refused.
pub(crate) async fn a_campaign_is_read_back_as_recorded_and_only_once(store: &dyn Store) {
    let campaign = Campaign {
        id: Uuid::new_v4(),
        group: "cattle".into(),
        created_at: Timestamp::from_millis(1_795_000_000_123),
        requester: Some("chaos".into()),
        targets: ["cattle-07", "cattle-02"]
            .iter()
            .enumerate()
            .map(|(index, name)| CampaignTarget {
                instance_name: (*name).into(),
                message_id: Uuid::new_v4(),
                due_at: Timestamp::from_millis(1_795_000_000_123 + 60_000 * index as i64),
            })
            .collect(),
        stopped: None,
    };
    assert_eq!(store.campaign(campaign.id).await.unwrap(), None);
    store.record_campaign(&campaign).await.unwrap();
    assert_eq!(
        store.campaign(campaign.id).await.unwrap(),
        Some(campaign.clone())
    );
    let unsigned = Campaign {
        id: Uuid::new_v4(),
        requester: None,
        targets: Vec::new(),
        ..campaign.clone()
    };
    store.record_campaign(&unsigned).await.unwrap();
    assert_eq!(
        store.campaign(unsigned.id).await.unwrap(),
        Some(unsigned.clone())
    );
    assert!(
        store.record_campaign(&campaign).await.is_err(),
        "one id, once"
    );
    // The report reads the campaigns started since its moment, oldest first.
    let since = |millis| store.report(Timestamp::from_millis(millis));
    let ids = |data: ReportData| data.campaigns.iter().map(|c| c.id).collect::<Vec<_>>();
    let both = ids(since(1_795_000_000_123).await.unwrap());
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both.contains(&campaign.id) && both.contains(&unsigned.id));
    assert!(ids(since(1_795_000_000_124).await.unwrap()).is_empty());
    // As the dashboard reads them: whole, oldest first (then by id).
    let mut both = vec![campaign.clone(), unsigned.clone()];
    both.sort_by_key(|c| c.id);
    assert_eq!(
        store
            .campaigns_since(Timestamp::from_millis(1_795_000_000_123))
            .await
            .unwrap(),
        both
    );
    let later = Campaign {
        id: Uuid::new_v4(),
        created_at: Timestamp::from_millis(1_795_000_060_000),
        ..unsigned.clone()
    };
    store.record_campaign(&later).await.unwrap();
    assert_eq!(
        store
            .campaigns_since(Timestamp::from_millis(1_795_000_000_124))
            .await
            .unwrap(),
        vec![later]
    );
}

/// The request `campaign start` publishes for target `index`, as the
/// worker hands it to the store (signed: who asked is the requester).
fn target_request(campaign: &Campaign, index: usize) -> RestartRequest {
    let mut request = request(&campaign.targets[index].instance_name);
    request.message_id = campaign.targets[index].message_id;
    request.requester = campaign.requester.clone();
    request.requested_by = campaign.requester.clone();
    request.reason = Some(campaign.target_reason(index));
    request
}

/// `campaign stop`: in one step, every target that is not final and not
/// held by a claim is recorded `cancelled` with who stopped it and why, a
/// target no instance received yet included (recorded as the request its
/// message carries); every claim after it finds them final, however late
/// the message comes, and a payload under such an id asking something
/// else is another request, refused. A restart in flight finishes and is
/// recorded as usual (another delivery meanwhile waits for it:
/// `Claim::InFlight`), and is never claimed again (`Claim::Cancelled`). The
/// first stop is kept; an unknown id is `None`.
pub(crate) async fn a_stopped_campaigns_unissued_targets_are_cancelled_for_every_claim(
    store: &dyn Store,
) {
    let campaign = Campaign {
        id: Uuid::new_v4(),
        group: "stopped".into(),
        created_at: Timestamp::now(),
        requester: Some("chaos".into()),
        targets: ["stopped-01", "stopped-02", "stopped-03"]
            .iter()
            .map(|name| CampaignTarget {
                instance_name: (*name).into(),
                message_id: Uuid::new_v4(),
                due_at: Timestamp::now(),
            })
            .collect(),
        stopped: None,
    };
    store.record_campaign(&campaign).await.unwrap();
    let [running, deferred, unseen] = [0, 1, 2].map(|index| target_request(&campaign, index));
    assert!(matches!(
        store
            .claim_restart(&running, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    let decision = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "deferred by calendar: closed",
    };
    store.record_decision(&deferred, 0, decision).await.unwrap();

    let (stopped, cancelled) = store
        .stop_campaign(campaign.id, "ana", "game day over")
        .await
        .unwrap()
        .expect("the campaign is recorded");
    let stop = stopped.stopped.clone().expect("stopped");
    assert_eq!(
        (stop.by.as_str(), stop.reason.as_str()),
        ("ana", "game day over")
    );
    let mut expected = vec![deferred.message_id, unseen.message_id];
    let mut cancelled = cancelled;
    expected.sort_unstable();
    cancelled.sort_unstable();
    assert_eq!(cancelled, expected, "the running target is left to finish");
    assert_eq!(store.campaign(campaign.id).await.unwrap(), Some(stopped));

    // Every claim after the stop, of either, finds it final.
    for cancelled in [&deferred, &unseen] {
        assert_eq!(
            store
                .claim_restart(cancelled, TERMS, ClaimToken::new())
                .await
                .unwrap(),
            Claim::Final(Status::Cancelled)
        );
        let story = store.story(cancelled.message_id).await.unwrap().unwrap();
        assert_eq!(story.entry.status, Status::Cancelled);
        let why = story.entry.last_error.unwrap();
        assert!(
            why.contains(&format!("campaign {} was stopped by ana", campaign.id))
                && why.contains("game day over"),
            "{why}"
        );
        assert!(
            story.attempts.is_empty(),
            "nothing claimed: {:?}",
            story.attempts
        );
    }
    // A payload under a cancelled target's id that asks something else
    // is not that request: refused, never claimed.
    let mut other = unseen.clone();
    other.requester = Some("mallory".into());
    other.requested_by = Some("mallory".into());
    assert!(matches!(
        store
            .claim_restart(&other, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Conflict { .. }
    ));
    // Another delivery of the target in flight waits for its attempt: not
    // cancelled while its restart runs (the record said `cancelled` and the
    // restart's outcome found it final).
    assert!(matches!(
        store
            .claim_restart(&running, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::InFlight { attempt: 1, .. }
    ));
    // The claim in flight finishes, recorded as usual; it failed, but is
    // not tried again: the next claim finds the stop's mark, claims
    // nothing, and the caller records it cancelled.
    let failed = Outcome::Retrying {
        error: "exit 1".into(),
    };
    assert_eq!(
        store.record_outcome(&running, 1, &failed).await.unwrap(),
        Recorded::Recorded
    );
    let Claim::Cancelled { reason } = store
        .claim_restart(&running, TERMS, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("a stopped campaign's target is not claimed again");
    };
    assert!(reason.contains("stopped by ana"), "{reason}");
    let cancelled = Outcome::Cancelled { reason };
    assert_eq!(
        store.record_outcome(&running, 0, &cancelled).await.unwrap(),
        Recorded::Recorded
    );
    let story = store.story(running.message_id).await.unwrap().unwrap();
    assert_eq!(story.entry.status, Status::Cancelled);
    assert_eq!(story.attempts.len(), 1, "the one attempt in flight, kept");
    // Stopped again: the first stop is kept, nothing more to cancel.
    let (again, cancelled) = store
        .stop_campaign(campaign.id, "bob", "again")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.stopped.unwrap().by, "ana");
    assert!(cancelled.is_empty(), "{cancelled:?}");
    assert_eq!(
        store
            .stop_campaign(Uuid::new_v4(), "ana", "no such")
            .await
            .unwrap(),
        None
    );
}

/// A request that took a target's id before the stop (another host, or
/// another requester: the id is only the publisher's word) is not the
/// campaign's: the stop neither cancels it nor marks it, and it stays
/// claimable as the request it is. The campaign's own target under that
/// id is refused as a conflict, as before.
pub(crate) async fn a_campaign_stop_never_cancels_another_request_under_a_targets_id(
    store: &dyn Store,
) {
    let campaign = Campaign {
        id: Uuid::new_v4(),
        group: "squat".into(),
        created_at: Timestamp::now(),
        requester: Some("chaos".into()),
        targets: ["squat-01", "squat-02"]
            .iter()
            .map(|name| CampaignTarget {
                instance_name: (*name).into(),
                message_id: Uuid::new_v4(),
                due_at: Timestamp::now(),
            })
            .collect(),
        stopped: None,
    };
    store.record_campaign(&campaign).await.unwrap();
    let mut squatter = request("other-01");
    squatter.message_id = campaign.targets[0].message_id;
    squatter.requested_by = Some("mallory".into());
    let deferred = Decision {
        verdict: "deferred",
        guard: "calendar",
        reason: "deferred by calendar: closed",
    };
    store.record_decision(&squatter, 0, deferred).await.unwrap();
    let (_, cancelled) = store
        .stop_campaign(campaign.id, "ana", "game day over")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cancelled, [campaign.targets[1].message_id]);
    let story = store.story(squatter.message_id).await.unwrap().unwrap();
    assert_eq!(
        (story.entry.status, story.entry.instance_name.as_deref()),
        (Status::Received, Some("other-01"))
    );
    assert!(matches!(
        store
            .claim_restart(&squatter, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed { attempt: 1, .. }
    ));
    assert!(matches!(
        store
            .claim_restart(&target_request(&campaign, 0), TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Conflict { .. }
    ));
}
