//! A campaign is recorded once and read back whole.

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
