//! The SQLite store's tests: the store contract, batches decided as if
//! each request were alone, and the guards as the one writer decides them;
//! `writes.rs` (a database that refuses) and `upgrade.rs` (older schemas).

use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use super::*;
use crate::store::contract;

mod upgrade;
mod writes;

#[tokio::test]
async fn sqlite_store_keeps_the_store_contract() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    contract::all(&store).await;
    let kept = store.history(100).await.unwrap().len();
    store.close().await;
    // Reopening runs migrations again without harm and keeps the data.
    let store = SqliteStore::connect(&url, 1).await.unwrap();
    assert_eq!(store.history(100).await.unwrap().len(), kept);
    store.close().await;
}

/// One transaction holding claims of requests never seen, seen and open,
/// held and final, then one holding outcomes of claimed, never claimed and
/// final requests: each is decided as if it were alone. The writer creates
/// new rows already claimed and records the outcomes of open rows with an
/// `UPDATE`, the rest with an upsert; this is the mix that splits them.
#[tokio::test]
async fn a_batch_mixing_new_open_held_and_final_requests_decides_each_as_if_alone() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(60),
        limits: crate::safety::Limits::NONE,
    };
    let first = Claim::Claimed {
        attempt: 1,
        unknown: None,
        leashed: None,
    };
    let new: Vec<_> = (0..8)
        .map(|n| contract::request(&format!("cattle-new-{n}")))
        .collect();
    let open = contract::request("cattle-open");
    let held = contract::request("cattle-held");
    let done = contract::request("cattle-done");
    let stranger = contract::request("cattle-stranger");
    let token = crate::store::ClaimToken::new();
    assert_eq!(
        store.claim_restart(&open, terms, token).await.unwrap(),
        first
    );
    store.release_claim(&open, 1, token).await.unwrap();
    assert_eq!(
        store
            .claim_restart(&held, terms, crate::store::ClaimToken::new())
            .await
            .unwrap(),
        first
    );
    assert_eq!(
        store
            .claim_restart(&done, terms, crate::store::ClaimToken::new())
            .await
            .unwrap(),
        first
    );
    let restarted = Outcome::restarted();
    assert_eq!(
        store.record_outcome(&done, 1, &restarted).await.unwrap(),
        Recorded::Recorded
    );

    // On this test's single thread every write is queued before the
    // writer runs, so each group below shares one transaction.
    // A new request refused (no attempt allowed): its row is a bare receipt.
    let refused = contract::request("cattle-refused");
    let no_attempts = ClaimTerms {
        max_attempts: 0,
        ..terms
    };
    let claimants: Vec<&RestartRequest> = new.iter().chain([&open, &held, &done]).collect();
    let (claims, refusal) = tokio::join!(
        futures::future::join_all(claimants.iter().map(|r| store.claim_restart(
            r,
            terms,
            crate::store::ClaimToken::new()
        ))),
        store.claim_restart(&refused, no_attempts, crate::store::ClaimToken::new())
    );
    let claims: Vec<Claim> = claims.into_iter().map(Result::unwrap).collect();
    assert!(
        matches!(refusal, Ok(Claim::Exhausted { attempts: 0, .. })),
        "{refusal:?}"
    );
    assert!(
        claims[..8].iter().all(|claim| *claim == first),
        "{claims:?}"
    );
    assert_eq!(claims[8], first, "a released claim is not a used attempt");
    assert!(
        matches!(claims[9], Claim::InFlight { attempt: 1, .. }),
        "{:?}",
        claims[9]
    );
    assert_eq!(claims[10], Claim::Final(Status::Restarted));

    let recorders: Vec<&RestartRequest> = new.iter().chain([&stranger, &done]).collect();
    let recorded = futures::future::join_all(
        recorders
            .iter()
            .map(|r| store.record_outcome(r, 1, &restarted)),
    )
    .await;
    let recorded: Vec<Recorded> = recorded.into_iter().map(Result::unwrap).collect();
    assert!(
        recorded[..9].iter().all(|r| *r == Recorded::Recorded),
        "{recorded:?}"
    );
    assert_eq!(recorded[9], Recorded::AlreadyFinal(Status::Restarted));

    let history = store.history(100).await.unwrap();
    let row = |request: &RestartRequest| {
        history
            .iter()
            .find(|entry| entry.message_id == Some(request.message_id))
            .unwrap_or_else(|| panic!("no row for {}", request.instance_name))
    };
    for request in new.iter().chain([&stranger]) {
        let entry = row(request);
        assert_eq!(
            (entry.status, entry.attempts, entry.hostname.as_deref()),
            (Status::Restarted, 1, Some(request.hostname.as_str())),
            "{entry:?}"
        );
        assert!(entry.completed_at.is_some(), "{entry:?}");
    }
    let entry = row(&open);
    assert_eq!((entry.status, entry.attempts), (Status::Received, 1));
    let entry = row(&refused);
    assert_eq!(
        (entry.status, entry.attempts, entry.completed_at),
        (Status::Received, 0, None),
        "{entry:?}"
    );
    // One transaction, one `now`: the rows it created share their receipt
    // time (a batch that failed and was rewritten write by write would not).
    let received = row(&new[0]).received_at;
    assert!(
        new.iter()
            .chain([&refused])
            .all(|request| row(request).received_at == received)
    );
    let story = store.story(new[0].message_id).await.unwrap().unwrap();
    assert_eq!(story.attempts.len(), 1);
    assert_eq!(story.attempts[0].outcome, Some(Status::Restarted));
    store.close().await;
}

#[tokio::test]
async fn a_claim_stamped_after_now_still_cools_its_host() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let later = async {
        sqlx::query(contract::STAMP_LATER_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::a_claim_stamped_after_now_still_cools_its_host(&store, later).await;
}

#[tokio::test]
async fn a_restarted_host_counts_as_disrupted_until_settle_passes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let settle_passes = async {
        sqlx::query(contract::SETTLE_PASSES_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::a_restarted_host_counts_as_disrupted_until_settle_passes(&store, settle_passes).await;
    store.close().await;
}

#[tokio::test]
async fn every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let tie = async {
        sqlx::query(contract::TIE_CLAIMS_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::every_claim_tied_at_a_hosts_latest_time_counts_toward_disruption(&store, tie).await;
    store.close().await;
}

#[tokio::test]
async fn a_claim_that_issued_nothing_never_hides_a_disrupted_host() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let earlier = async {
        sqlx::query(contract::CLAIMS_EARLIER_SQL)
            .execute(&store.pool)
            .await
            .unwrap();
    };
    contract::a_claim_that_issued_nothing_never_hides_a_disrupted_host(&store, earlier).await;
    store.close().await;
}

/// Two instances (two stores) on one file: the requester quota and the
/// zone budget count what either claimed.
#[tokio::test]
async fn the_requester_quota_and_the_zone_budget_count_across_instances() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let first = SqliteStore::connect(&url, 2).await.unwrap();
    let second = SqliteStore::connect(&url, 2).await.unwrap();
    contract::the_requester_quota_and_the_zone_budget_count_across_groups_and_instances(
        &first, &second,
    )
    .await;
    first.close().await;
    second.close().await;
}

#[tokio::test]
async fn a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("w.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    // Another process's write transaction: the writer's BEGIN IMMEDIATE
    // waits for it (the busy timeout).
    let mut other = SqliteConnection::connect_with(&SqliteConnectOptions::from_str(&url).unwrap())
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let release = async {
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    };
    contract::a_claim_that_waits_for_the_guards_locks_is_stamped_when_it_gets_them(&store, release)
        .await;
    store.close().await;
}

/// How an answer is lost with SQLite: the writer commits a claim whose
/// caller has stopped waiting (its deadline passed while another process
/// held the write lock). The caller tries again with the same token and
/// gets the attempt it claimed, not its own claim "in flight".
#[tokio::test]
async fn a_claim_committed_after_its_caller_gave_up_is_answered_again_to_the_same_token() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let terms = ClaimTerms {
        max_attempts: 1,
        hold: Duration::from_secs(60),
        limits: crate::safety::Limits::NONE,
    };
    let request = contract::request("cattle-late");
    let token = ClaimToken::new();
    // Another process's write transaction keeps the writer waiting (up to
    // its busy timeout, 10 s) with the claim in its batch.
    let mut other = SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        store.claim_restart(&request, terms, token),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the writer cannot answer yet: {gave_up:?}"
    );
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    // The writer commits the claim nobody waits for any more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.lookup(request.message_id).await.unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the claim was never committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.claim_restart(&request, terms, token).await.unwrap(),
        Claim::Claimed {
            attempt: 1,
            unknown: None,
            leashed: None,
        }
    );
    assert!(matches!(
        store
            .claim_restart(&request, terms, ClaimToken::new())
            .await
            .unwrap(),
        Claim::InFlight { attempt: 1, .. }
    ));
    store.close().await;
}

/// A release committed after its caller gave up (its deadline passed while
/// another process held the write lock): the caller, hearing nothing, tries
/// it again, and meanwhile another delivery claimed the same attempt. The
/// second try names the first delivery's token, so it frees nothing of the
/// other delivery's claim (naming only the attempt, it freed it).
#[tokio::test]
async fn a_release_committed_after_its_caller_gave_up_never_frees_another_deliverys_claim() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("r.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let terms = ClaimTerms {
        max_attempts: 3,
        hold: Duration::from_secs(60),
        limits: crate::safety::Limits::NONE,
    };
    let request = contract::request("cattle-late-release");
    let (first, second) = (ClaimToken::new(), ClaimToken::new());
    let claimed = Claim::Claimed {
        attempt: 1,
        unknown: None,
        leashed: None,
    };
    assert_eq!(
        store.claim_restart(&request, terms, first).await.unwrap(),
        claimed
    );
    let mut other = SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        store.release_claim(&request, 1, first),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the writer cannot answer yet: {gave_up:?}"
    );
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    // The writer commits the release nobody waits for any more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while entry_attempts(&store, &request).await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the release was never committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another delivery claims the attempt given back...
    assert_eq!(
        store.claim_restart(&request, terms, second).await.unwrap(),
        claimed
    );
    // ...and the first delivery's release, tried again, leaves it held.
    store.release_claim(&request, 1, first).await.unwrap();
    assert!(matches!(
        store
            .claim_restart(&request, terms, ClaimToken::new())
            .await
            .unwrap(),
        Claim::InFlight { attempt: 1, .. }
    ));
    assert_eq!(entry_attempts(&store, &request).await, 1);
    store.close().await;
}

/// The attempts `request`'s row counts now.
async fn entry_attempts(store: &SqliteStore, request: &crate::domain::RestartRequest) -> u32 {
    store
        .story(request.message_id)
        .await
        .unwrap()
        .map_or(0, |story| story.entry.attempts)
}
