//! The memory store against the store contract, and its journal's own cases.

use super::super::contract;
use super::*;

#[tokio::test]
async fn memory_store_keeps_the_store_contract() {
    let store = MemoryStore::new();
    contract::all(&store).await;
}

#[tokio::test]
async fn a_claim_stamped_after_now_still_cools_its_host() {
    let store = MemoryStore::new();
    let later = async {
        for row in store.lock().requests.values_mut() {
            for attempt in &mut row.journal {
                attempt.claimed_at += 60_000;
            }
        }
    };
    contract::a_claim_stamped_after_now_still_cools_its_host(&store, later).await;
}

#[tokio::test]
async fn a_restarted_host_counts_as_disrupted_until_settle_passes() {
    let store = MemoryStore::new();
    let settle_passes = async {
        for row in store.lock().requests.values_mut() {
            for attempt in &mut row.journal {
                attempt.settled_at = attempt.settled_at.map(|at| at - 600_000);
            }
        }
    };
    contract::a_restarted_host_counts_as_disrupted_until_settle_passes(&store, settle_passes).await;
}

#[tokio::test]
async fn every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption() {
    let store = MemoryStore::new();
    let tie = async {
        let mut state = store.lock();
        let mut journal: Vec<_> = state
            .requests
            .values_mut()
            .flat_map(|row| &mut row.journal)
            .collect();
        let latest = journal.iter().map(|attempt| attempt.claimed_at).max();
        for attempt in &mut journal {
            attempt.claimed_at = latest.expect("claims to tie");
        }
    };
    contract::every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption(&store, tie).await;
}

#[tokio::test]
async fn a_claim_that_issued_nothing_never_hides_a_disrupted_host() {
    let store = MemoryStore::new();
    let earlier = async {
        for row in store.lock().requests.values_mut() {
            for attempt in &mut row.journal {
                attempt.claimed_at -= 60_000;
                attempt.settled_at = attempt.settled_at.map(|at| at - 60_000);
            }
        }
    };
    contract::a_claim_that_issued_nothing_never_hides_a_disrupted_host(&store, earlier).await;
}

/// A released claim leaves the journal, and a prune drops requests and old
/// attempts: each request's outcomes must still land on its own attempts
/// afterwards.
#[tokio::test(start_paused = true)]
async fn outcomes_land_on_their_own_attempts_across_releases_and_a_prune() {
    let store = MemoryStore::new();
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: std::time::Duration::from_secs(3600),
        limits: crate::safety::Limits::NONE,
    };
    // Three requests, their ids in order.
    let request = |n: u128| {
        let mut request = contract::request(&format!("cattle-{n:04}"));
        request.message_id = Uuid::from_u128(n << 8);
        request
    };
    let (a, b, c) = (request(1), request(2), request(3));
    let attempts = |id| {
        let store = &store;
        async move {
            let story = store.story(id).await.unwrap().unwrap();
            story
                .attempts
                .iter()
                .map(|a| (a.attempt, a.outcome))
                .collect::<Vec<_>>()
        }
    };
    let retrying = Outcome::Retrying { error: "e".into() };
    store
        .claim_restart(&a, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    store
        .claim_restart(&b, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    store
        .record_outcome(&a, 1, &Outcome::restarted())
        .await
        .unwrap();
    store.record_outcome(&b, 1, &retrying).await.unwrap();
    tokio::time::advance(std::time::Duration::from_secs(10)).await;
    let later = Timestamp::from_millis(store.clock.now());
    store
        .claim_restart(&b, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    let token = crate::store::ClaimToken::new();
    store.claim_restart(&c, terms, token).await.unwrap();
    store.release_claim(&c, 1, token).await.unwrap();
    store
        .claim_restart(&c, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    store.record_outcome(&c, 1, &retrying).await.unwrap();
    store
        .claim_restart(&c, terms, crate::store::ClaimToken::new())
        .await
        .unwrap();
    assert_eq!(
        attempts(b.message_id).await,
        [(1, Some(Status::Retrying)), (2, None)]
    );
    assert_eq!(
        attempts(c.message_id).await,
        [(1, Some(Status::Retrying)), (2, None)]
    );

    // `a` is final and old: pruned with its attempt; `b`'s first
    // attempt is older than the cut; `c`'s released claim is gone
    // already, its two attempts stay.
    assert_eq!(store.prune(later, 1000).await.unwrap(), 1);
    assert!(store.story(a.message_id).await.unwrap().is_none());
    assert_eq!(attempts(b.message_id).await, [(2, None)]);
    store
        .record_outcome(&b, 2, &Outcome::restarted())
        .await
        .unwrap();
    store
        .record_outcome(&c, 2, &Outcome::Failed { error: "e".into() })
        .await
        .unwrap();
    assert_eq!(attempts(b.message_id).await, [(2, Some(Status::Restarted))]);
    assert_eq!(
        attempts(c.message_id).await,
        [(1, Some(Status::Retrying)), (2, Some(Status::Failed))]
    );
}
