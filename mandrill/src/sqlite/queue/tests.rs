use std::collections::HashMap;

use super::*;
use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;

/// Generous: reached only when something hangs.
const PATIENCE: Duration = Duration::from_secs(30);

/// `_max_deliveries` is the worker's limit, which the broker never reads:
/// each test still says which limit it stands for.
fn config(dir: &std::path::Path, ack_deadline: Duration, _max_deliveries: u32) -> SqliteOptions {
    SqliteOptions {
        url: format!("sqlite:{}", dir.join("queue.db").display()),
        ack_deadline,
        poll_wait: Duration::from_millis(50),
        poll_interval: Duration::from_millis(10),
    }
}

async fn open(dir: &std::path::Path, ack_deadline: Duration, max_deliveries: u32) -> SqliteBroker {
    SqliteBroker::connect(&config(dir, ack_deadline, max_deliveries))
        .await
        .unwrap()
}

/// Pulls until something arrives; fails the test after `PATIENCE`.
async fn pull_some(broker: &SqliteBroker, max: usize) -> Vec<Delivery> {
    let give_up = Instant::now() + PATIENCE;
    loop {
        let batch = broker.pull(max).await.unwrap();
        if !batch.is_empty() {
            return batch;
        }
        assert!(Instant::now() < give_up, "nothing became visible");
    }
}

#[tokio::test]
async fn expired_lease_is_redelivered_and_the_stale_ack_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_millis(200), 10).await;
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let first = broker.pull(10).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].attempt, 1);
    // Not extended: once the deadline passes, the next claim takes it.
    let again = pull_some(&broker, 10).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    assert_eq!(again[0].payload, first[0].payload);
    for stale in [
        broker.ack(&first[0].tag).await,
        broker.extend(&first[0].tag).await,
        broker.nack(&first[0].tag, Duration::ZERO).await,
        broker.dead_letter(&first[0].tag, "late").await,
    ] {
        assert!(matches!(stale, Err(BrokerError::LeaseLost(_))), "{stale:?}");
    }
    broker.ack(&again[0].tag).await.unwrap();
    // Settled once; a second ack of the same delivery is refused too.
    assert!(matches!(
        broker.ack(&again[0].tag).await,
        Err(BrokerError::LeaseLost(_))
    ));
    assert_eq!(broker.backlog().await.unwrap(), Some(0));
    broker.close().await;
}

#[tokio::test]
async fn extended_lease_is_not_redelivered() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_millis(300), 10).await;
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = broker.pull(10).await.unwrap().remove(0);
    // Well past the original deadline, extending every third of it.
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        broker.extend(&delivery.tag).await.unwrap();
        assert!(broker.pull(10).await.unwrap().is_empty());
    }
    broker.ack(&delivery.tag).await.unwrap();
    assert_eq!(broker.backlog().await.unwrap(), Some(0));
    broker.close().await;
}

#[tokio::test]
async fn nack_delay_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_secs(30), 10).await;
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    let delivery = broker.pull(10).await.unwrap().remove(0);
    let delay = Duration::from_millis(400);
    let nacked_at = std::time::Instant::now();
    broker.nack(&delivery.tag, delay).await.unwrap();
    // Delayed, not lost: still in the backlog.
    assert_eq!(broker.backlog().await.unwrap(), Some(1));
    let again = pull_some(&broker, 10).await;
    // It cannot have become visible before the delay passed.
    assert!(nacked_at.elapsed() >= delay);
    assert_eq!(again[0].attempt, 2);
    broker.ack(&again[0].tag).await.unwrap();
    broker.close().await;
}

#[tokio::test]
async fn claims_past_max_deliveries_are_delivered_and_dead_letters_requeue() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_secs(30), 2).await;
    broker.publish(Bytes::from_static(b"poison")).await.unwrap();
    for attempt in 1..=2 {
        let delivery = broker.pull(10).await.unwrap().remove(0);
        assert_eq!(delivery.attempt, attempt);
        broker.nack(&delivery.tag, Duration::ZERO).await.unwrap();
    }
    // Past `max_deliveries`, the broker still delivers: the worker keeps
    // the limit, so that the store learns why the message was given up.
    let third = broker.pull(10).await.unwrap().remove(0);
    assert_eq!(third.attempt, 3);
    assert!(broker.dead_letters().await.unwrap().is_empty());
    broker
        .dead_letter(&third.tag, "not settled after 3 deliveries")
        .await
        .unwrap();
    assert_eq!(broker.backlog().await.unwrap(), Some(0));
    let dead = broker.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload, "poison");
    assert_eq!(dead[0].deliveries, Some(3));
    assert_eq!(dead[0].reason, "not settled after 3 deliveries");

    // Unknown ids requeue nothing.
    let ids = [dead[0].id.to_string(), "999".to_owned()];
    assert!(broker.requeue(Some(&ids)).await.is_err());
    assert_eq!(broker.dead_letters().await.unwrap().len(), 1);
    assert_eq!(
        broker.requeue(None).await.unwrap(),
        vec![dead[0].id.clone()]
    );
    assert!(broker.dead_letters().await.unwrap().is_empty());
    let back = broker.pull(10).await.unwrap();
    assert_eq!(back[0].attempt, 1, "a requeued message starts afresh");
    broker.dead_letter(&back[0].tag, "malformed").await.unwrap();
    assert_eq!(broker.dead_letters().await.unwrap()[0].reason, "malformed");
    broker.close().await;
}

#[tokio::test]
async fn rows_that_make_no_sense_are_delivered_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_secs(30), 5).await;
    // Rows written by hand, as a confused operator might.
    for (payload, deliveries) in [("'exhausted'", i64::MAX), ("'negative'", -7), ("''", 0)] {
        sqlx::query(&format!(
            "INSERT INTO queue (payload, published_at, visible_at, deliveries)
             VALUES (CAST({payload} AS BLOB), 0, 0, {deliveries})"
        ))
        .execute(&broker.pool)
        .await
        .unwrap();
    }
    let delivered = broker.pull(10).await.unwrap();
    let payloads: Vec<&[u8]> = delivered.iter().map(|d| d.payload.as_ref()).collect();
    assert_eq!(payloads, [&b"exhausted"[..], b"negative", b""]);
    let attempts: Vec<u32> = delivered.iter().map(|d| d.attempt).collect();
    // An exhausted count is delivered at the largest attempt, for the
    // worker to give up on; it neither overflows nor wraps.
    assert_eq!(attempts, [u32::MAX, 1, 1]);
    for delivery in &delivered {
        broker
            .dead_letter(&delivery.tag, "malformed")
            .await
            .unwrap();
    }
    assert_eq!(broker.backlog().await.unwrap(), Some(0));
    assert_eq!(broker.dead_letters().await.unwrap().len(), 3);
    broker.close().await;
}

/// Makes every write to the queue fail the way a full disk does: SQLite
/// itself ends the transaction (here by `RAISE(ROLLBACK)`), so that the
/// rollback the writer's connection then sends finds no transaction.
async fn break_writes(broker: &SqliteBroker, broken: bool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS test_fault (broken INTEGER NOT NULL);
         CREATE TRIGGER IF NOT EXISTS test_fault_on_publish BEFORE INSERT ON queue
         WHEN (SELECT broken FROM test_fault) BEGIN
             SELECT RAISE(ROLLBACK, 'database or disk is full');
         END;
         DELETE FROM test_fault;",
    )
    .execute(&broker.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO test_fault (broken) VALUES (?1)")
        .bind(broken)
        .execute(&broker.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn writer_recovers_after_a_transaction_sqlite_ended_itself() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_secs(30), 10).await;
    broker.publish(Bytes::from_static(b"before")).await.unwrap();
    let before = broker.pull(10).await.unwrap().remove(0);
    break_writes(&broker, true).await;
    let refused = broker.publish(Bytes::from_static(b"lost")).await;
    assert!(
        matches!(&refused, Err(BrokerError::Unavailable(m)) if m.to_string().contains("disk is full")),
        "{refused:?}"
    );
    break_writes(&broker, false).await;
    // The cause is gone: every kind of write works again.
    broker.publish(Bytes::from_static(b"after")).await.unwrap();
    broker.ack(&before.tag).await.unwrap();
    let after = broker.pull(10).await.unwrap();
    let payloads: Vec<&[u8]> = after.iter().map(|d| d.payload.as_ref()).collect();
    assert_eq!(
        payloads,
        [&b"after"[..]],
        "the refused publish left nothing"
    );
    broker.ack(&after[0].tag).await.unwrap();
    assert_eq!(broker.backlog().await.unwrap(), Some(0));
    broker.close().await;
}

#[tokio::test]
async fn pull_fails_in_bounded_time_while_another_process_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_secs(30), 10).await;
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    // Another process's write transaction, held until released below.
    let url = config(dir.path(), Duration::ZERO, 0).url;
    let mut other = SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    // The writer waits for the lock up to its busy timeout (10s); the
    // pull gives up first, saying why, instead of hanging that long.
    let pulled = broker.pull(10).await;
    assert!(
        matches!(&pulled, Err(BrokerError::Unavailable(m)) if m.to_string().contains("did not answer")),
        "{pulled:?}"
    );
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    // The abandoned claim was released, not counted as a delivery.
    let delivery = pull_some(&broker, 10).await.remove(0);
    assert_eq!(delivery.attempt, 1);
    broker.ack(&delivery.tag).await.unwrap();
    broker.close().await;
}

#[tokio::test]
async fn oversized_row_is_claimed_as_a_bounded_prefix_and_dead_lettered_in_place() {
    const LIMIT: usize = 4096;
    const SIZE: usize = 20 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let broker = SqliteBroker::connect_with_payload_limit(
        &config(dir.path(), Duration::from_secs(30), 10),
        LIMIT,
    )
    .await
    .unwrap();
    // Written by SQLite itself, as another process's publish would be.
    sqlx::query(
        "INSERT INTO queue (payload, published_at, visible_at)
         VALUES (zeroblob(?1), 0, 0), (CAST('small' AS BLOB), 0, 0)",
    )
    .bind(i64::try_from(SIZE).unwrap())
    .execute(&broker.pool)
    .await
    .unwrap();
    let delivered = broker.pull(10).await.unwrap();
    assert_eq!(delivered.len(), 2);
    assert_eq!(delivered[0].payload.len(), LIMIT + 1);
    assert_eq!(delivered[0].full_size, SIZE);
    assert_eq!(delivered[1].payload, "small");
    assert_eq!(delivered[1].full_size, 5);
    let reason = "x".repeat(10 * crate::broker::MAX_REASON_BYTES);
    broker
        .dead_letter(&delivered[0].tag, &reason)
        .await
        .unwrap();
    let dead = broker.dead_letters().await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].payload_size,
        u64::try_from(SIZE).unwrap(),
        "the whole payload is kept"
    );
    assert_eq!(
        dead[0].payload.len(),
        usize::try_from(admin::MAX_LISTED_PAYLOAD_BYTES).unwrap(),
        "a listing reads a bounded prefix"
    );
    assert!(dead[0].reason.len() <= crate::broker::MAX_REASON_BYTES);
    broker.ack(&delivered[1].tag).await.unwrap();
    broker.close().await;
}

#[tokio::test]
async fn two_brokers_on_one_file_never_claim_the_same_message_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Separate connections and writers, as two processes would have.
    let a = Arc::new(open(dir.path(), Duration::from_secs(60), 10).await);
    let b = Arc::new(open(dir.path(), Duration::from_secs(60), 10).await);
    let total = 2_000;
    let payloads = (0..total).map(|i| Bytes::from(i.to_string())).collect();
    a.publish_all(payloads).await.unwrap();
    let consume = |broker: Arc<SqliteBroker>| {
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let batch = broker.pull(16).await.unwrap();
                if batch.is_empty() && broker.backlog().await.unwrap() == Some(0) {
                    return seen;
                }
                let acks = batch.iter().map(|delivery| broker.ack(&delivery.tag));
                for acked in futures::future::join_all(acks).await {
                    acked.unwrap();
                }
                seen.extend(batch.into_iter().map(|delivery| delivery.payload));
            }
        })
    };
    let (seen_a, seen_b) = tokio::join!(consume(a.clone()), consume(b.clone()));
    let (seen_a, seen_b) = (seen_a.unwrap(), seen_b.unwrap());
    let mut times: HashMap<Bytes, usize> = HashMap::new();
    for payload in seen_a.iter().chain(&seen_b) {
        *times.entry(payload.clone()).or_default() += 1;
    }
    // Leases never expired (60s), so each message was delivered exactly
    // once, to one of the two.
    assert_eq!(times.len(), total);
    assert!(times.values().all(|&n| n == 1));
    a.close().await;
    b.close().await;
}

/// A pull dropped while its claim waits in the writer (at shutdown, say):
/// the rows then claimed for nobody are given back at once, not left leased
/// until their deadline because no further write came to carry the release
/// (a writer closing next must not leave them leased, their delivery
/// counted).
#[tokio::test]
async fn rows_claimed_for_a_dropped_pull_are_given_back_even_if_nothing_else_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), Duration::from_secs(600), 10).await;
    broker.publish(Bytes::from_static(b"m")).await.unwrap();
    // Another process holds the write lock, so the claim waits in the writer.
    let url = format!("sqlite:{}", dir.path().join("queue.db").display());
    let mut other = SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(200), broker.pull(10)).await;
    assert!(dropped.is_err(), "the pull should still be waiting");
    let release_the_lock = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    };
    tokio::join!(broker.close(), release_the_lock);
    let (lease, deliveries): (Option<i64>, i64) =
        sqlx::query_as("SELECT lease, deliveries FROM queue")
            .fetch_one(&mut other)
            .await
            .unwrap();
    assert_eq!((lease, deliveries), (None, 0), "the row stayed claimed");
}
