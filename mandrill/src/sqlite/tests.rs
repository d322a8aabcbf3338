use std::time::Duration;

use bytes::Bytes;
use sqlx::SqlitePool;

use super::*;
use crate::broker::{Close, Consumer, Delivery, Publisher};
use crate::domain::Outcome;
use crate::store::{Recorded, Store, contract};

fn queue_config(url: &str) -> SqliteOptions {
    SqliteOptions {
        url: url.to_owned(),
        ack_deadline: Duration::from_secs(30),
        poll_wait: Duration::from_millis(50),
        poll_interval: Duration::from_millis(10),
    }
}

/// A store and a queue on `url`'s one file, with one message published and
/// pulled.
async fn one_file_with_a_delivery(url: &str) -> (SqliteStore, SqliteBroker, Delivery) {
    let store = SqliteStore::connect(url, 2).await.unwrap();
    let broker = SqliteBroker::connect(&queue_config(url)).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = broker.pull(1).await.unwrap().remove(0);
    (store, broker, delivery)
}

async fn tables(url: &str) -> Vec<String> {
    let pool = SqlitePool::connect(url).await.unwrap();
    let names = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table'
           AND name NOT LIKE 'sqlite_%' AND name != '_sqlx_migrations' ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    names
}

async fn queued(url: &str) -> i64 {
    let pool = SqlitePool::connect(url).await.unwrap();
    let count = sqlx::query_scalar("SELECT count(*) FROM queue")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count
}

#[tokio::test]
async fn the_queue_and_the_store_each_get_only_their_own_tables() {
    let dir = tempfile::tempdir().unwrap();
    let queue_url = format!("sqlite:{}", dir.path().join("queue.db").display());
    let store_url = format!("sqlite:{}", dir.path().join("store.db").display());
    let broker = SqliteBroker::connect(&queue_config(&queue_url))
        .await
        .unwrap();
    let store = SqliteStore::connect(&store_url, 2).await.unwrap();
    broker.close().await;
    store.close().await;
    assert_eq!(tables(&queue_url).await, ["dead_letters", "queue"]);
    assert_eq!(
        tables(&store_url).await,
        [
            "campaigns",
            "control",
            "decisions",
            "deferrals",
            "group_pauses",
            "requests",
            "restarts"
        ]
    );
}

/// A file made with one migration list for both (every table in it) opens with the split migrators and keeps working, both ways round.
#[tokio::test]
async fn a_file_made_with_the_shared_migration_list_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("old.db").display());
    let mut all: Vec<_> = store_migrations().migrations.to_vec();
    all.extend(queue_migrations().migrations.iter().cloned());
    all.sort_by_key(|m| m.version);
    let old = Migrator {
        migrations: std::borrow::Cow::Owned(all),
        ..Migrator::DEFAULT
    };
    let pool = SqlitePool::connect_with(connect_options(&url).unwrap())
        .await
        .unwrap();
    old.run(&pool).await.unwrap();
    pool.close().await;
    let (store, broker, delivery) = one_file_with_a_delivery(&url).await;
    broker.ack(&delivery.tag).await.unwrap();
    contract::all(&store).await;
    broker.close().await;
    store.close().await;
}

#[tokio::test]
async fn a_queue_and_a_store_on_one_file_share_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("one.db").display());
    // Another spelling of the same file.
    let other = format!("sqlite:{}/./one.db", dir.path().display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let broker = SqliteBroker::connect(&queue_config(&other)).await.unwrap();
    let elsewhere = format!("sqlite:{}", dir.path().join("two.db").display());
    let apart = SqliteStore::connect(&elsewhere, 2).await.unwrap();
    assert!(Arc::ptr_eq(store.writer(), broker.writer()));
    assert!(!Arc::ptr_eq(apart.writer(), broker.writer()));
    // Closing one user leaves the writer to the other.
    broker.close().await;
    contract::outcome_without_claim_creates_row(&store).await;
    store.close().await;
    apart.close().await;
}

/// The outcome and its ack commit in one transaction: after it, the
/// outcome is recorded and the message gone; and an ack for another file
/// is not taken (the caller acks as usual).
#[tokio::test]
async fn an_outcome_and_its_ack_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("one.db").display());
    let (store, broker, delivery) = one_file_with_a_delivery(&url).await;
    let request = contract::request("cattle-joint");
    let outcome = Outcome::Restarted(Default::default());
    let ack = broker.joint_ack(&delivery.tag);
    assert!(ack.is_some());
    let recorded = store
        .record_outcome_acking(&request, 1, &outcome, ack)
        .await
        .unwrap();
    assert_eq!(recorded, (Recorded::Recorded, true));
    assert_eq!(queued(&url).await, 0);
    assert!(matches!(
        broker.ack(&delivery.tag).await,
        Err(crate::broker::BrokerError::LeaseLost(_))
    ));

    // A store on another file records, and leaves the ack to the caller.
    let elsewhere = format!("sqlite:{}", dir.path().join("two.db").display());
    let apart = SqliteStore::connect(&elsewhere, 2).await.unwrap();
    broker.publish(Bytes::from_static(b"n")).await.unwrap();
    let delivery = broker.pull(1).await.unwrap().remove(0);
    let ack = broker.joint_ack(&delivery.tag);
    let recorded = apart
        .record_outcome_acking(&contract::request("cattle-apart"), 1, &outcome, ack)
        .await
        .unwrap();
    assert_eq!(recorded, (Recorded::Recorded, false));
    assert_eq!(queued(&url).await, 1);
    broker.ack(&delivery.tag).await.unwrap();
    broker.close().await;
    store.close().await;
    apart.close().await;
}

/// A transaction that fails takes the outcome and the ack with it: the
/// message stays for redelivery, the outcome is not recorded, and the
/// retry records it once and acks.
#[tokio::test]
async fn a_failed_transaction_fails_the_outcome_and_its_ack_together() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("one.db").display());
    let (store, broker, delivery) = one_file_with_a_delivery(&url).await;
    let pool = SqlitePool::connect(&url).await.unwrap();
    // The ack, which runs after the outcome in the same transaction, fails.
    sqlx::query(
        "CREATE TRIGGER refuse_ack BEFORE DELETE ON queue
         BEGIN SELECT RAISE(ABORT, 'ack refused'); END",
    )
    .execute(&pool)
    .await
    .unwrap();
    let request = contract::request("cattle-joint");
    let outcome = Outcome::Restarted(Default::default());
    let failed = store
        .record_outcome_acking(&request, 1, &outcome, broker.joint_ack(&delivery.tag))
        .await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(store.lookup(request.message_id).await.unwrap(), None);
    assert_eq!(queued(&url).await, 1);
    sqlx::query("DROP TRIGGER refuse_ack")
        .execute(&pool)
        .await
        .unwrap();
    let recorded = store
        .record_outcome_acking(&request, 1, &outcome, broker.joint_ack(&delivery.tag))
        .await
        .unwrap();
    assert_eq!(recorded, (Recorded::Recorded, true));
    assert_eq!(queued(&url).await, 0);
    let history = store.history(10).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    pool.close().await;
    broker.close().await;
    store.close().await;
}

/// An outcome that is not recorded (another delivery recorded a final one
/// first) acks nothing: its caller settles the way that case needs.
#[tokio::test]
async fn an_outcome_not_recorded_acks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("one.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let broker = SqliteBroker::connect(&queue_config(&url)).await.unwrap();
    let request = contract::request("cattle-twice");
    let failed = Outcome::Failed { error: "no".into() };
    store.record_outcome(&request, 1, &failed).await.unwrap();
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = broker.pull(1).await.unwrap().remove(0);
    let recorded = store
        .record_outcome_acking(
            &request,
            2,
            &Outcome::Restarted(Default::default()),
            broker.joint_ack(&delivery.tag),
        )
        .await
        .unwrap();
    assert!(
        matches!(recorded, (Recorded::AlreadyFinal(_), false)),
        "{recorded:?}"
    );
    assert_eq!(queued(&url).await, 1);
    broker.close().await;
    store.close().await;
}

/// A store write the database refuses for good fails alone: the queue's
/// operations that shared its transaction are written again without it.
#[tokio::test]
async fn a_refused_store_write_does_not_fail_the_queue_operations_of_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("one.db").display());
    let store = SqliteStore::connect(&url, 2).await.unwrap();
    let broker = SqliteBroker::connect(&queue_config(&url)).await.unwrap();
    let pool = SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON requests
         WHEN NEW.instance_name = 'cattle-poison'
         BEGIN SELECT RAISE(ABORT, 'poisoned row'); END",
    )
    .execute(&pool)
    .await
    .unwrap();
    let poison = contract::request("cattle-poison");
    let outcome = Outcome::Restarted(Default::default());
    let (refused, published) = tokio::join!(
        futures::future::join_all((0..5).map(|_| store.record_outcome(&poison, 1, &outcome))),
        futures::future::join_all((0..20).map(|n| broker.publish(Bytes::from(format!("m{n}"))))),
    );
    for refused in refused {
        assert!(refused.is_err_and(|e| !e.is_transient()));
    }
    for published in published {
        published.unwrap();
    }
    assert_eq!(queued(&url).await, 20);
    pool.close().await;
    broker.close().await;
    store.close().await;
}

/// Processes starting together on one file (a queue made it, nobody has
/// migrated the store yet) all open it: concurrent migrators wait for each
/// other instead of failing start-up. Each connect here has a pool of its
/// own, as a process would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opening_one_fresh_file_together_all_migrate_it() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("shared.db").display());
        let broker = SqliteBroker::connect(&queue_config(&url)).await.unwrap();
        let opens = (0..6).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteStore::connect(&url, 2).await })
        });
        for (n, open) in futures::future::join_all(opens)
            .await
            .into_iter()
            .enumerate()
        {
            let store = open
                .unwrap()
                .unwrap_or_else(|error| panic!("round {round}, store {n}: {error}"));
            store.close().await;
        }
        broker.close().await;
    }
}

/// Processes started together on one file that does not exist yet (two
/// `mandrill run`, a test starting two instances) each create it and set
/// its journal mode: SQLite may refuse one of them at once (busy) rather
/// than wait, when waiting could deadlock. Every open still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_and_stores_creating_one_file_together_all_open_it() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("fresh.db").display());
        let brokers = (0..4).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteBroker::connect(&queue_config(&url)).await })
        });
        let stores = (0..4).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteStore::connect(&url, 2).await })
        });
        let (brokers, stores) = futures::future::join(
            futures::future::join_all(brokers),
            futures::future::join_all(stores),
        )
        .await;
        for (n, broker) in brokers.into_iter().enumerate() {
            let broker = broker
                .unwrap()
                .unwrap_or_else(|error| panic!("round {round}, broker {n}: {error}"));
            broker.close().await;
        }
        for (n, store) in stores.into_iter().enumerate() {
            let store = store
                .unwrap()
                .unwrap_or_else(|error| panic!("round {round}, store {n}: {error}"));
            store.close().await;
        }
    }
}

/// Durability is not traded for speed: every connection (the writer's
/// included) journals in WAL with `synchronous = FULL`, and only the
/// checkpoint interval was raised.
#[tokio::test]
async fn connections_stay_durable_with_the_longer_checkpoint_interval() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("pragmas.db").display());
    let pool = SqlitePool::connect_with(connect_options(&url).unwrap())
        .await
        .unwrap();
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    let (synchronous,): (i64,) = sqlx::query_as("PRAGMA synchronous")
        .fetch_one(&pool)
        .await
        .unwrap();
    let (checkpoint,): (i64,) = sqlx::query_as("PRAGMA wal_autocheckpoint")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(synchronous, 2, "synchronous = FULL");
    assert_eq!(checkpoint, i64::from(super::WAL_AUTOCHECKPOINT_PAGES));
    pool.close().await;
}

#[test]
fn runs_take_every_item_in_order_in_a_few_lengths() {
    for len in 0..=1100 {
        let items: Vec<usize> = (0..len).collect();
        let runs: Vec<&[usize]> = runs(&items, 500).collect();
        assert_eq!(runs.concat(), items, "every item once, in order");
        for run in &runs {
            assert!(
                run.len().is_power_of_two() && run.len() <= 256,
                "{len}: {}",
                run.len()
            );
        }
        // Largest first: each run at least as long as the next.
        assert!(runs.windows(2).all(|pair| pair[0].len() >= pair[1].len()));
        // A batch takes at most one statement per bit of its length (of
        // the last 500), plus one per 256 before.
        assert!(runs.len() <= len / 256 + 9, "{len}: {} runs", runs.len());
    }
}
