//! The kill switch and group pauses: what they stop, and how they are
//! turned.

use super::*;

pub(crate) async fn the_kill_switch_stops_every_claim_until_resumed(store: &dyn Store) {
    assert!(!store.switch().await.unwrap().paused);
    let request = request("cattle-0007");
    store
        .set_switch(true, "sre-on-call", "incident 42")
        .await
        .unwrap();
    let switch = store.switch().await.unwrap();
    assert!(switch.paused);
    assert_eq!(switch.by.as_deref(), Some("sre-on-call"));
    assert_eq!(switch.reason.as_deref(), Some("incident 42"));
    assert!(switch.since.is_some());
    let Claim::Paused { reason } = store
        .claim_restart(&request, TERMS, ClaimToken::new())
        .await
        .unwrap()
    else {
        panic!("a paused store must refuse the claim");
    };
    assert!(
        reason.contains("sre-on-call") && reason.contains("incident 42"),
        "{reason}"
    );
    // Nothing was claimed: no attempt used.
    assert_eq!(
        store
            .lookup(request.message_id)
            .await
            .unwrap()
            .unwrap_or(Status::Received),
        Status::Received
    );
    store
        .set_switch(false, "sre-on-call", "resolved")
        .await
        .unwrap();
    assert!(!store.switch().await.unwrap().paused);
    assert_eq!(
        store
            .claim_restart(&request, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
}

/// `set_switch_if` checks and writes in one step: a pause that is not the
/// expected one is never undone, and a pause never overwrites another.
pub(crate) async fn a_conditional_turn_of_the_switch_happens_only_as_expected(store: &dyn Store) {
    use crate::store::SwitchExpected::{PausedBy, Running};
    assert!(!store.switch().await.unwrap().paused);
    let by = |switch: Switch| (switch.paused, switch.by.unwrap_or_default());
    assert!(
        !store
            .set_switch_if(PausedBy("file"), false, "file", "x")
            .await
            .unwrap()
    );
    assert!(
        store
            .set_switch_if(Running, true, "file", "exists")
            .await
            .unwrap()
    );
    assert_eq!(by(store.switch().await.unwrap()), (true, "file".into()));
    // Already paused: a second pause does not take it over.
    assert!(
        !store
            .set_switch_if(Running, true, "other", "x")
            .await
            .unwrap()
    );
    // Someone else paused since: not resumed.
    store.set_switch(true, "sre", "game day").await.unwrap();
    assert!(
        !store
            .set_switch_if(PausedBy("file"), false, "file", "removed")
            .await
            .unwrap()
    );
    assert_eq!(by(store.switch().await.unwrap()), (true, "sre".into()));
    store.set_switch(true, "file", "exists").await.unwrap();
    assert!(
        store
            .set_switch_if(PausedBy("file"), false, "file", "removed")
            .await
            .unwrap()
    );
    let switch = store.switch().await.unwrap();
    assert_eq!(
        (switch.paused, switch.reason.as_deref()),
        (false, Some("removed"))
    );
}

/// A group pause defers every claim of that group's hosts, naming the
/// pause and its cause, with or without counting guards (the SQL stores
/// read it on both their claim paths), and no other group's; it keeps its
/// first cause, and lifts only when resumed.
pub(crate) async fn a_paused_group_defers_its_claims_only_until_resumed(store: &dyn Store) {
    assert!(store.group_pauses().await.unwrap().is_empty());
    assert!(
        store
            .set_group_pause("slowpoke", Some(("recovery-objective", "p95 exceeds 2m")))
            .await
            .unwrap()
    );
    // Paused already: the first cause stays.
    assert!(
        !store
            .set_group_pause("slowpoke", Some(("ana", "again")))
            .await
            .unwrap()
    );
    let pauses = store.group_pauses().await.unwrap();
    assert_eq!(pauses.len(), 1, "{pauses:?}");
    assert_eq!(
        (
            pauses[0].group.as_str(),
            pauses[0].by.as_str(),
            pauses[0].reason.as_str()
        ),
        ("slowpoke", "recovery-objective", "p95 exceeds 2m")
    );
    let counted = ClaimTerms {
        limits: Limits {
            group_max: Some(100),
            window: Duration::from_secs(3600),
            ..Limits::NONE
        },
        ..TERMS
    };
    let paused = request("slowpoke-0001");
    for terms in [TERMS, counted] {
        let claim = store
            .claim_restart(&paused, terms, ClaimToken::new())
            .await
            .unwrap();
        let Claim::Deferred {
            guard,
            reason,
            wait,
        } = claim
        else {
            panic!("a paused group's claim must be deferred, not {claim:?}");
        };
        assert_eq!((guard, wait), ("group pause", GROUP_PAUSE_RECHECK));
        assert!(
            reason.contains("slowpoke") && reason.contains("p95 exceeds 2m"),
            "{reason}"
        );
    }
    // Recorded as a deferral, and nothing claimed.
    let story = store.story(paused.message_id).await.unwrap().unwrap();
    assert!(story.attempts.is_empty(), "{story:?}");
    assert!(
        story.decisions.iter().any(|d| d.guard == "group pause"),
        "{story:?}"
    );
    // Another group is not paused.
    let other = request("brisk-0001");
    assert_eq!(
        store
            .claim_restart(&other, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
    assert!(store.set_group_pause("slowpoke", None).await.unwrap());
    assert!(!store.set_group_pause("slowpoke", None).await.unwrap());
    assert!(store.group_pauses().await.unwrap().is_empty());
    assert_eq!(
        store
            .claim_restart(&paused, TERMS, ClaimToken::new())
            .await
            .unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None
        }
    );
}
