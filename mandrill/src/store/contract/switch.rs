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
            unknown: None,
            leashed: None,
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
            unknown: None,
            leashed: None,
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
            unknown: None,
            leashed: None,
        }
    );
}

/// The leash is one word for every instance sharing the store: none until
/// an operator turns it; each claim carries it as read in the claim's own
/// transaction, so no claim made after `set_leash` returned reads the
/// earlier one; the kill switch and the leash turn apart. Last in the
/// contract: nothing unturns the leash.
pub(crate) async fn the_leash_is_read_by_every_claim_and_turned_apart_from_the_switch(
    store: &dyn Store,
) {
    let claimed = |leashed: Option<bool>| Claim::Claimed {
        attempt: 1,
        unknown: None,
        leashed,
    };
    assert_eq!(store.switch().await.unwrap().leash, None);
    // Each claim given back at the end: the journal is as the contract
    // left it before (others read it after).
    let mut made = Vec::new();
    let mut claim = async |name: &'static str| {
        let (request, token) = (request(name), ClaimToken::new());
        let claim = store.claim_restart(&request, TERMS, token).await.unwrap();
        made.push((request, token));
        claim
    };
    assert_eq!(claim("cattle-leash-1").await, claimed(None));

    store.set_leash(true, "ana", "game day over").await.unwrap();
    let leashed = store.switch().await.unwrap().leash.expect("recorded");
    assert!(leashed.leashed);
    assert_eq!(
        (leashed.by.as_str(), leashed.reason.as_str()),
        ("ana", "game day over")
    );
    assert!(leashed.since.as_millis() > 0);
    assert_eq!(claim("cattle-leash-2").await, claimed(Some(true)));

    // The switch turns without touching the leash, and the reverse.
    store.set_switch(true, "bob", "incident 7").await.unwrap();
    let switch = store.switch().await.unwrap();
    assert!(switch.paused);
    assert_eq!(switch.leash.as_ref(), Some(&leashed));
    store.set_switch(false, "bob", "resolved").await.unwrap();
    store
        .set_leash(false, "carol", "game day 2, ticket 12")
        .await
        .unwrap();
    let switch = store.switch().await.unwrap();
    assert_eq!(
        (
            switch.paused,
            switch.by.as_deref(),
            switch.reason.as_deref()
        ),
        (false, Some("bob"), Some("resolved"))
    );
    let unleashed = switch.leash.expect("recorded");
    assert!(!unleashed.leashed);
    assert_eq!(unleashed.by, "carol");
    assert_eq!(claim("cattle-leash-3").await, claimed(Some(false)));

    // A claim retried with its own token carries the leash as it is now.
    let request = request("cattle-leash-4");
    let token = ClaimToken::new();
    assert_eq!(
        store.claim_restart(&request, TERMS, token).await.unwrap(),
        claimed(Some(false))
    );
    store.set_leash(true, "dan", "hold on").await.unwrap();
    assert_eq!(
        store.claim_restart(&request, TERMS, token).await.unwrap(),
        claimed(Some(true))
    );
    made.push((request, token));
    for (request, token) in made {
        store.release_claim(&request, 1, token).await.unwrap();
    }
}
