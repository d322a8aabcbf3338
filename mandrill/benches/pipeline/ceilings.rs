//! The ceilings (issue 14, "honest ceilings"): for each path, a bare loop
//! doing the work the pipeline must do on that path and nothing else,
//! measured in the same run as the pipeline. Each returns messages per
//! second, timed from its first message to its last, after an untimed
//! set-up (payloads generated, queue or stream filled, schema created).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use mandrill::domain::{Domain, ParseRules, RestartRequest, Status};
use mandrill::simulate::random_request;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// `n` fresh payloads, as the pipeline's.
pub fn payloads(n: usize) -> Vec<Bytes> {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| Bytes::from(random_request(&mut rng).to_wire()))
        .collect()
}

/// The parse rules the benchmark's worker uses.
pub fn parse_rules() -> ParseRules {
    ParseRules {
        domain: Domain::default(),
        max_payload_bytes: 4096,
    }
}

fn parse(payload: &[u8], rules: &ParseRules) -> RestartRequest {
    RestartRequest::parse(payload, rules).expect("the benchmark's payloads are valid")
}

fn now_millis() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds fit in i64")
}

/// (a) In memory: one spawned task per message (into a `TaskTracker`, as
/// the worker tracks its handlers) that parses the payload into a
/// `RestartRequest`, waits `work` (the save), claims it in a map (attempt
/// counted), waits `work` (the restart, failing with probability
/// `fail_rate`) and records the outcome in the map. No broker, no leases,
/// no flow control: what is left of the pipeline's per-message work.
pub async fn in_memory(n: usize, work: Duration, fail_rate: f64) -> f64 {
    let payloads = payloads(n);
    let rules = Arc::new(parse_rules());
    let store: Arc<Mutex<HashMap<Uuid, (u32, Status)>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(n)));
    let tasks = TaskTracker::new();
    let started = Instant::now();
    for payload in payloads {
        let rules = rules.clone();
        let store = store.clone();
        tasks.spawn(async move {
            let request = parse(&payload, &rules);
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            let attempt = {
                // A panic elsewhere would have ended the benchmark already.
                let mut store = store.lock().expect("not poisoned");
                let entry = store
                    .entry(request.message_id)
                    .or_insert((0, Status::Received));
                entry.0 += 1;
                entry.0
            };
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            let status = if fail_rate > 0.0 && rand::random::<f64>() < fail_rate {
                Status::Failed
            } else {
                Status::Restarted
            };
            store
                .lock()
                .expect("not poisoned")
                .insert(request.message_id, (attempt, status));
        });
    }
    tasks.close();
    tasks.wait().await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    assert_eq!(store.lock().expect("not poisoned").len(), n);
    rate
}

/// The SQLite ceiling's tables: the shapes of the queue's and the store's
/// (columns, keys, indexes), without `AUTOINCREMENT` and with no JSON on
/// the hot path, which is what issue 14 asks of the real writer.
const SQLITE_SCHEMA: &str = "
CREATE TABLE queue (
    id INTEGER PRIMARY KEY, payload BLOB NOT NULL, published_at INTEGER NOT NULL,
    visible_at INTEGER NOT NULL, deliveries INTEGER NOT NULL DEFAULT 0, lease INTEGER
) STRICT;
CREATE INDEX queue_visible_at ON queue (visible_at);
CREATE TABLE requests (
    id INTEGER PRIMARY KEY, message_id TEXT UNIQUE, instance_name TEXT, hostname TEXT,
    requested_by TEXT, reason TEXT, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT, received_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
    completed_at INTEGER, claim_until INTEGER
);
CREATE INDEX requests_updated_at ON requests (updated_at);
CREATE INDEX requests_completed_at ON requests (completed_at);
CREATE TABLE restarts (
    message_id TEXT NOT NULL, attempt INTEGER NOT NULL, instance_name TEXT NOT NULL,
    grp TEXT NOT NULL, claimed_at INTEGER NOT NULL, outcome TEXT, settled_at INTEGER,
    verdict TEXT NOT NULL, PRIMARY KEY (message_id, attempt)
);
CREATE INDEX restarts_group ON restarts (grp, claimed_at);
CREATE INDEX restarts_host ON restarts (instance_name, claimed_at);
CREATE INDEX restarts_claimed ON restarts (claimed_at);
";

/// Messages a ceiling transaction takes, as the queue's writer batches.
const SQLITE_BATCH: usize = 1024;

/// (b) SQLite: one writer (rusqlite, on a thread of its own) on a fresh
/// file with the real writer's pragmas (WAL, `synchronous = FULL`, 10 s busy
/// timeout). The queue is filled first, untimed, as the pipeline's is; then
/// each transaction takes up to 1024 visible messages and, for each, parses
/// it and writes its receipt (the request row), its claim (attempt counted,
/// claim deadline, journal row), its outcome (request and journal row
/// settled) and its ack (the queue row deleted), with prepared statements
/// of one row each; one commit per batch.
pub async fn sqlite(n: usize, dir: &std::path::Path) -> f64 {
    let path = dir.join("ceiling.db");
    tokio::task::spawn_blocking(move || sqlite_blocking(n, &path))
        .await
        .expect("the SQLite ceiling finishes")
}

fn sqlite_blocking(n: usize, path: &std::path::Path) -> f64 {
    use rusqlite::{Connection, TransactionBehavior, params};

    let mut conn = Connection::open(path).expect("ceiling database opens");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("WAL");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("synchronous = FULL");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn.execute_batch(SQLITE_SCHEMA).expect("ceiling schema");
    let rules = parse_rules();
    {
        let now = now_millis();
        let tx = conn.transaction().expect("begin");
        {
            let mut insert = tx
                .prepare(
                    "INSERT INTO queue (payload, published_at, visible_at) VALUES (?1, ?2, ?2)",
                )
                .expect("prepare");
            for payload in payloads(n) {
                insert
                    .execute(params![payload.as_ref(), now])
                    .expect("publish");
            }
        }
        tx.commit().expect("commit");
    }
    let started = Instant::now();
    let mut done = 0;
    loop {
        let now = now_millis();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        let batch: Vec<(i64, Vec<u8>)> = tx
            .prepare_cached(
                "SELECT id, payload FROM queue WHERE visible_at <= ?1 ORDER BY visible_at LIMIT ?2",
            )
            .expect("prepare")
            .query_map(params![now, SQLITE_BATCH as i64], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .expect("pull")
            .collect::<Result<_, _>>()
            .expect("rows");
        if batch.is_empty() {
            break;
        }
        for (queue_id, payload) in &batch {
            let request = parse(payload, &rules);
            let id = request.message_id.to_string();
            tx.prepare_cached(
                "INSERT INTO requests (message_id, instance_name, hostname, requested_by, reason,
                                       status, attempts, received_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'received', 0, ?6, ?6)
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .expect("prepare")
            .execute(params![
                id,
                request.instance_name.as_str(),
                request.hostname.as_str(),
                request.requested_by,
                request.reason,
                now
            ])
            .expect("receipt");
            let attempt: i64 = tx
                .prepare_cached(
                    "UPDATE requests SET attempts = attempts + 1, claim_until = ?2, updated_at = ?3
                     WHERE message_id = ?1 RETURNING attempts",
                )
                .expect("prepare")
                .query_row(params![id, now + 60_000, now], |row| row.get(0))
                .expect("claim");
            tx.prepare_cached(
                "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'allowed')",
            )
            .expect("prepare")
            .execute(params![
                id,
                attempt,
                request.instance_name.as_str(),
                request.group(),
                now
            ])
            .expect("journal");
            tx.prepare_cached(
                "UPDATE requests SET status = 'restarted', claim_until = NULL, updated_at = ?2,
                                     completed_at = ?2
                 WHERE message_id = ?1 AND status NOT IN ('restarted', 'failed', 'rejected')",
            )
            .expect("prepare")
            .execute(params![id, now])
            .expect("outcome");
            tx.prepare_cached(
                "UPDATE restarts SET outcome = 'restarted', settled_at = ?3
                 WHERE message_id = ?1 AND attempt = ?2 AND outcome IS NULL",
            )
            .expect("prepare")
            .execute(params![id, attempt, now])
            .expect("journal settled");
            tx.prepare_cached("DELETE FROM queue WHERE id = ?1")
                .expect("prepare")
                .execute(params![queue_id])
                .expect("ack");
        }
        tx.commit().expect("commit");
        done += batch.len();
    }
    assert_eq!(done, n);
    n as f64 / started.elapsed().as_secs_f64()
}

/// (c) NATS: a bare async-nats loop on a stream of its own (filled first,
/// untimed) that pulls continuously (batches of 256, as the worker's
/// `pull_batch`) and acks each message with a confirmed ack, up to
/// `max_in_flight` acks outstanding: it keeps pulling while acks are in
/// flight, as mandrill does. No other work.
pub async fn nats(url: &str, stream_name: &str, subject: &str, n: usize) -> f64 {
    use async_nats::jetstream::consumer::{PullConsumer, pull};
    use async_nats::jetstream::{AckKind, stream};

    let client = async_nats::connect(url).await.expect("nats");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .create_stream(stream::Config {
            name: stream_name.to_owned(),
            subjects: vec![subject.to_owned()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .expect("ceiling stream");
    futures::stream::iter(payloads(n))
        .map(|payload| {
            let js = js.clone();
            async move {
                js.publish(subject.to_owned(), payload)
                    .await
                    .expect("publish")
                    .await
                    .expect("confirmed")
            }
        })
        .buffer_unordered(512)
        .for_each(|_| async {})
        .await;
    let max_in_flight = 100_000;
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("ceiling".into()),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: max_in_flight as i64,
            ..Default::default()
        })
        .await
        .expect("ceiling consumer");
    let started = Instant::now();
    let messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await
        .expect("pull stream");
    messages
        .take(n)
        .map(|message| async move {
            message
                .expect("message")
                .double_ack_with(AckKind::Ack)
                .await
                .expect("ack")
        })
        .buffer_unordered(max_in_flight)
        .for_each(|()| async {})
        .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = js.delete_stream(stream_name).await;
    rate
}

/// Messages per PostgreSQL ceiling batch, as the store's writer batches.
const POSTGRES_BATCH: usize = 512;

/// (d) PostgreSQL: a database of its own with the store's schema (its
/// migrations, so its indexes), and `writers` loops, each on one
/// connection with the store's `plan_cache_mode`, over its share of the
/// messages in batches of 512: parse each; one transaction looks the batch
/// up (`JOIN unnest($1::text[])`, which uses the index) and writes the
/// receipts and claims (one `unnest` upsert) and the journal rows; a second
/// transaction (the restart sits between a claim and its outcome) records
/// the outcomes and settles the journal rows. Four statements and two
/// commits per batch.
pub async fn postgres(admin_url: &str, n: usize, writers: u32) -> f64 {
    use sqlx::postgres::PgConnectOptions;
    use std::str::FromStr as _;

    let database =
        super::throwaway_postgres::TestDatabase::create_on(admin_url, "mandrill_bench_ceiling")
            .await;
    let options = PgConnectOptions::from_str(&database.url)
        .expect("postgres url")
        .options([("plan_cache_mode", "force_custom_plan")]);
    {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect_with(&options)
            .await
            .expect("ceiling database");
        mandrill::migrations::postgres()
            .run(&mut conn)
            .await
            .expect("ceiling schema");
        conn.close().await.expect("closes");
    }
    let payloads = payloads(n);
    let share = n.div_ceil(writers.max(1) as usize).max(1);
    let started = Instant::now();
    futures::future::join_all(
        payloads
            .chunks(share)
            .map(|share| postgres_writer(&options, share)),
    )
    .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    // The writers' connections are closed: the database can be dropped.
    drop(database);
    rate
}

async fn postgres_writer(options: &sqlx::postgres::PgConnectOptions, payloads: &[Bytes]) {
    use sqlx::Connection as _;

    let rules = parse_rules();
    let mut conn = sqlx::PgConnection::connect_with(options)
        .await
        .expect("ceiling connection");
    for batch in payloads.chunks(POSTGRES_BATCH) {
        let requests: Vec<RestartRequest> = batch.iter().map(|p| parse(p, &rules)).collect();
        let ids: Vec<String> = requests.iter().map(|r| r.message_id.to_string()).collect();
        let instances: Vec<&str> = requests.iter().map(|r| r.instance_name.as_str()).collect();
        let hosts: Vec<&str> = requests.iter().map(|r| r.hostname.as_str()).collect();
        let by: Vec<Option<&str>> = requests.iter().map(|r| r.requested_by.as_deref()).collect();
        let reasons: Vec<Option<&str>> = requests.iter().map(|r| r.reason.as_deref()).collect();
        let groups: Vec<&str> = requests.iter().map(|r| r.group()).collect();
        let now = now_millis();

        let mut tx = conn.begin().await.expect("begin");
        let found: Vec<(String, String, i32)> = sqlx::query_as(
            "SELECT r.message_id, r.status, r.attempts
             FROM requests r JOIN unnest($1::text[]) AS u(id) ON r.message_id = u.id",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .expect("lookup");
        assert!(found.is_empty(), "every message is new");
        sqlx::query(
            "INSERT INTO requests (message_id, instance_name, hostname, requested_by, reason,
                                   status, attempts, claim_until, received_at, updated_at)
             SELECT u.id, u.instance, u.host, u.by, u.reason, 'received', 1, $6, $7, $7
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                  AS u(id, instance, host, by, reason)
             ON CONFLICT (message_id) DO UPDATE SET
                 attempts = requests.attempts + 1, claim_until = excluded.claim_until,
                 updated_at = excluded.updated_at",
        )
        .bind(&ids)
        .bind(&instances)
        .bind(&hosts)
        .bind(&by)
        .bind(&reasons)
        .bind(now + 60_000)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("receipts and claims");
        sqlx::query(
            "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
             SELECT u.id, 1, u.instance, u.grp, $4, 'allowed'
             FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, instance, grp)",
        )
        .bind(&ids)
        .bind(&instances)
        .bind(&groups)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("journal");
        tx.commit().await.expect("claims commit");

        let mut tx = conn.begin().await.expect("begin");
        sqlx::query(
            "UPDATE requests SET status = 'restarted', claim_until = NULL, updated_at = $2,
                                 completed_at = $2
             FROM unnest($1::text[]) AS u(id)
             WHERE requests.message_id = u.id
               AND requests.status NOT IN ('restarted', 'failed', 'rejected')",
        )
        .bind(&ids)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("outcomes");
        sqlx::query(
            "UPDATE restarts SET outcome = 'restarted', settled_at = $2
             FROM unnest($1::text[]) AS u(id)
             WHERE restarts.message_id = u.id AND restarts.attempt = 1
               AND restarts.outcome IS NULL",
        )
        .bind(&ids)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("journal settled");
        tx.commit().await.expect("outcomes commit");
    }
    conn.close().await.expect("closes");
}
