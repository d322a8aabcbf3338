//! A durable broker in a SQLite file (`broker.url = "sqlite:PATH"`), by
//! default the store's own `mandrill.db`.
//!
//! The queue is a table (migration `0002_queue.sql`): publish inserts a row; a
//! claim sets a row's lease (the delivery number) and its `visible_at` to the
//! lease deadline; ack deletes the row, nack clears the lease and sets the
//! redelivery time, extend pushes the deadline. A row whose deadline passes
//! is simply visible again, and the next claim takes it with a new delivery
//! number, so a late settlement of the old delivery finds no match and gets
//! [`BrokerError::LeaseLost`]. The broker never gives up on a message by
//! itself: however often a row was claimed, it is delivered with that count as
//! its attempt, and the worker, which keeps `broker.max_deliveries`, records
//! and dead-letters it. Only a row that cannot be read at all moves to
//! `dead_letters` at claim time.
//!
//! A claim reads at most `max_payload_bytes + 1` bytes of a payload (see
//! [`SqliteBroker::connect_with_payload_limit`]) and reports its full size, so
//! that an oversized row is rejected without being loaded; dead-lettering
//! copies it inside SQLite, never through this process.
//!
//! Every write goes through one writer task that owns one connection: it
//! takes whatever operations are queued (publishes, claims, acks, nacks,
//! extensions, dead letters), runs them in one `BEGIN IMMEDIATE` transaction
//! and answers each caller only after the commit. Throughput therefore does
//! not collapse into one fsync per message, and nothing is reported settled
//! before it is durable. Claims run inside that write transaction, so two
//! processes on one database never claim the same row at once. A failed
//! transaction fails every operation of its batch, and the writer replaces its
//! connection, so that writing resumes once the cause (a full disk, say) is
//! gone.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Connection, QueryBuilder, Row, Sqlite};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::{
    BrokerError, Close, Consumer, DeadLetterAdmin, DeadLetterEntry, DeadLetterId, DeadLetterRecord,
    Delivery, DeliveryTag, Publisher, bounded_reason,
};
use crate::config::BrokerConfig;
use crate::store::sqlite::WriterConnection;

/// Most operations committed in one transaction.
const MAX_BATCH: usize = 1024;
/// Rows per multi-row `INSERT` (three parameters each, well under SQLite's limit).
const INSERT_CHUNK: usize = 500;
/// How much longer than the poll wait a pull may take before it fails: the
/// writer may be waiting for another process's write lock (up to the busy
/// timeout) or for a stalled disk, and an unbounded pull would hide that
/// from the worker's supervisor.
const PULL_MARGIN: Duration = Duration::from_secs(5);

/// See the module docs.
#[derive(Debug)]
pub struct SqliteBroker {
    ack_deadline: Duration,
    poll_wait: Duration,
    poll_interval: Duration,
    /// To the writer task.
    ops: mpsc::Sender<Op>,
    /// For reads (backlog, dead-letter listing) and the rare admin writes, so
    /// that they never queue behind a batch.
    pool: SqlitePool,
    /// Woken after a commit that published or nacked, so that a pull in this
    /// process returns at once; other processes' publishes are found by
    /// polling every `poll_interval`.
    available: Arc<Notify>,
    /// The writer task.
    tasks: TaskTracker,
}

/// Most bytes of a dead letter's payload a listing reads: a payload can be
/// far larger than any valid request (that may be why it is dead).
pub const MAX_LISTED_PAYLOAD_BYTES: i64 = 64 * 1024;

/// What the writer task does for one caller.
#[derive(Debug)]
enum Op {
    Publish {
        payloads: Vec<Bytes>,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    Claim {
        max: usize,
        reply: oneshot::Sender<Result<Claimed, BrokerError>>,
    },
    Settle {
        claim: Claim,
        action: Action,
        reply: oneshot::Sender<Result<(), BrokerError>>,
    },
    /// Stop after this batch; later operations are refused.
    Close,
}

#[derive(Debug)]
enum Action {
    Ack,
    Nack(Duration),
    Extend,
    DeadLetter(String),
}

/// One claim of one row: the row id and the delivery number holding the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Claim {
    id: i64,
    delivery: i64,
}

impl Claim {
    fn tag(self) -> DeliveryTag {
        DeliveryTag::pair(self.id.unsigned_abs(), self.delivery.unsigned_abs())
    }

    fn from_tag(tag: &DeliveryTag) -> Result<Self, BrokerError> {
        let (id, delivery) = tag
            .as_pair()
            .ok_or_else(|| BrokerError::LeaseLost(tag.clone()))?;
        Ok(Self {
            id: i64::try_from(id).map_err(|_| BrokerError::LeaseLost(tag.clone()))?,
            delivery: i64::try_from(delivery).map_err(|_| BrokerError::LeaseLost(tag.clone()))?,
        })
    }
}

#[derive(Debug, Default)]
struct Claimed {
    deliveries: Vec<(Claim, Delivery)>,
    /// When nothing was claimable: the earliest `visible_at` in the queue.
    next_visible_at: Option<i64>,
}

/// The writer's answer to one operation, sent after the commit.
enum Answer {
    Unit(
        oneshot::Sender<Result<(), BrokerError>>,
        Result<(), BrokerError>,
    ),
    Claimed(oneshot::Sender<Result<Claimed, BrokerError>>, Claimed),
}

fn now_millis() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn unavailable(error: sqlx::Error) -> BrokerError {
    BrokerError::Unavailable(error.to_string())
}

fn closed() -> BrokerError {
    BrokerError::Fatal("the sqlite broker is closed".into())
}

/// The options every connection to the queue uses: WAL so that readers never
/// block the writer, `synchronous = FULL` so that a committed publish or
/// settlement survives power loss, and a busy timeout so that several
/// processes on one file wait for each other's write transactions.
fn connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10)))
}

impl SqliteBroker {
    /// Opens (creating if missing) the queue at `config.url` (`sqlite:PATH`),
    /// brings the schema up to date and starts the writer task. Pulls hand
    /// over payloads whole; a consumer uses
    /// [`connect_with_payload_limit`](Self::connect_with_payload_limit).
    pub async fn connect(config: &BrokerConfig) -> Result<Self, BrokerError> {
        Self::connect_with_payload_limit(config, usize::MAX).await
    }

    /// As [`connect`](Self::connect), but a pull reads at most
    /// `max_payload_bytes + 1` bytes of a payload: a larger one is handed
    /// over as that prefix with its [`Delivery::full_size`], for the worker
    /// to reject, instead of being loaded whole.
    pub async fn connect_with_payload_limit(
        config: &BrokerConfig,
        max_payload_bytes: usize,
    ) -> Result<Self, BrokerError> {
        let options =
            connect_options(&config.url).map_err(|e| BrokerError::Fatal(e.to_string()))?;
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .map_err(|e| BrokerError::Fatal(e.to_string()))?;
        let migrator = sqlx::migrate!("./migrations/sqlite");
        if let Err(first) = migrator.run(&pool).await {
            // Another process may have been migrating the same file at the
            // same moment; by now it has finished, so a second run sees its
            // work. A real problem fails again.
            debug!(error = %first, "migration failed; trying once more");
            migrator
                .run(&pool)
                .await
                .map_err(|e| BrokerError::Fatal(format!("migration failed: {e}")))?;
        }
        let writer = WriterConnection::open(options)
            .await
            .map_err(|e| BrokerError::Fatal(e.to_string()))?;
        let (ops, receiver) = mpsc::channel(MAX_BATCH * 4);
        let available = Arc::new(Notify::new());
        let tasks = TaskTracker::new();
        tasks.spawn(write_loop(
            writer,
            receiver,
            Limits {
                ack_deadline: millis(config.ack_deadline),
                // SQLite keeps no value over 2^31 bytes, and `substr`
                // misbehaves when start plus length overflows.
                payload_prefix: i64::try_from(max_payload_bytes.saturating_add(1))
                    .unwrap_or(i64::MAX)
                    .min(i64::from(i32::MAX)),
            },
            available.clone(),
        ));
        tasks.close();
        Ok(Self {
            ack_deadline: config.ack_deadline,
            poll_wait: config.poll_wait,
            poll_interval: config.poll_interval,
            ops,
            pool,
            available,
            tasks,
        })
    }

    async fn call<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, BrokerError>>) -> Op,
    ) -> Result<T, BrokerError> {
        let (reply, answer) = oneshot::channel();
        self.ops.send(op(reply)).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// Publishes every payload in one transaction: all of them or none.
    pub async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        if payloads.is_empty() {
            return Ok(());
        }
        self.call(|reply| Op::Publish { payloads, reply }).await
    }
}

#[async_trait]
impl Close for SqliteBroker {
    async fn close(&self) {
        // Fails only if the writer already stopped, which is what we want.
        let _ = self.ops.send(Op::Close).await;
        self.tasks.wait().await;
        self.pool.close().await;
    }
}

#[async_trait]
impl Publisher for SqliteBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.publish_all(vec![payload]).await
    }
}

#[async_trait]
impl DeadLetterAdmin for SqliteBroker {
    fn keeps_records(&self) -> bool {
        true
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BrokerError> {
        let rows = sqlx::query(
            "SELECT id, reason, deliveries, published_at, dead_at,
                    substr(payload, 1, ?1) AS payload, length(payload) AS payload_size
             FROM dead_letters ORDER BY id",
        )
        .bind(MAX_LISTED_PAYLOAD_BYTES)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                let payload: Vec<u8> = row.try_get("payload")?;
                Ok(DeadLetterEntry {
                    id: DeadLetterId::Row(row.try_get("id")?),
                    reason: row.try_get("reason")?,
                    payload: Bytes::from(payload),
                    record: Some(DeadLetterRecord {
                        deliveries: row.try_get("deliveries")?,
                        published_at: row.try_get("published_at")?,
                        dead_at: row.try_get("dead_at")?,
                        payload_size: row.try_get("payload_size")?,
                    }),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(unavailable)
    }

    /// Moves dead letters back into the queue as new, undelivered messages.
    /// All or nothing: if an id is unknown, nothing is requeued.
    async fn requeue(&self, ids: Option<&[String]>) -> Result<Vec<DeadLetterId>, BrokerError> {
        let now = now_millis();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        let selected: Vec<i64> = match ids {
            None => sqlx::query_scalar("SELECT id FROM dead_letters ORDER BY id")
                .fetch_all(&mut *tx)
                .await
                .map_err(unavailable)?,
            Some(ids) => {
                let mut missing = Vec::new();
                let mut found = Vec::with_capacity(ids.len());
                for given in ids {
                    // An id that is not a number names no row.
                    let exists: Option<i64> = match given.parse::<i64>() {
                        Ok(id) => sqlx::query_scalar("SELECT id FROM dead_letters WHERE id = ?1")
                            .bind(id)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(unavailable)?,
                        Err(_) => None,
                    };
                    match exists {
                        Some(id) => found.push(id),
                        None => missing.push(given.clone()),
                    }
                }
                if !missing.is_empty() {
                    return Err(BrokerError::Fatal(format!(
                        "no dead letter with id {}; nothing requeued",
                        missing.join(", ")
                    )));
                }
                found
            }
        };
        for &id in &selected {
            sqlx::query(
                "INSERT INTO queue (payload, published_at, visible_at)
                 SELECT payload, published_at, ?2 FROM dead_letters WHERE id = ?1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(unavailable)?;
            sqlx::query("DELETE FROM dead_letters WHERE id = ?1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(selected.into_iter().map(DeadLetterId::Row).collect())
    }
}

#[async_trait]
impl Consumer for SqliteBroker {
    fn lease(&self) -> Option<Duration> {
        Some(self.ack_deadline)
    }

    async fn pull(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let give_up_at = Instant::now() + self.poll_wait;
        let fail_at = give_up_at + PULL_MARGIN;
        loop {
            // Armed before claiming, so that a publish committed between the
            // claim and the wait still wakes us.
            let notified = self.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Cancel-safe: if this future is dropped while the claim is in
            // the writer, the writer finds nobody to answer and releases the
            // claimed rows at once.
            let claim = self.call(|reply| Op::Claim { max, reply });
            let claimed = tokio::time::timeout_at(fail_at, claim)
                .await
                .map_err(|_elapsed| {
                    BrokerError::Unavailable(format!(
                        "the queue's writer did not answer a claim within {:?}; \
                         is another process holding the database's write lock?",
                        self.poll_wait + PULL_MARGIN
                    ))
                })??;
            if !claimed.deliveries.is_empty() {
                return Ok(claimed.deliveries.into_iter().map(|(_, d)| d).collect());
            }
            let now = Instant::now();
            if now >= give_up_at {
                return Ok(Vec::new());
            }
            let mut wake_at = give_up_at.min(now + self.poll_interval);
            if let Some(visible_at) = claimed.next_visible_at {
                let wait = Duration::from_millis(
                    u64::try_from(visible_at.saturating_sub(now_millis())).unwrap_or(0),
                );
                wake_at = wake_at.min(now + wait);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    async fn ack(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.settle(tag, Action::Ack).await
    }

    async fn nack(&self, tag: &DeliveryTag, delay: Duration) -> Result<(), BrokerError> {
        self.settle(tag, Action::Nack(delay)).await
    }

    async fn extend(&self, tag: &DeliveryTag) -> Result<(), BrokerError> {
        self.settle(tag, Action::Extend).await
    }

    async fn dead_letter(&self, tag: &DeliveryTag, reason: &str) -> Result<(), BrokerError> {
        self.settle(tag, Action::DeadLetter(reason.to_owned()))
            .await
    }

    async fn backlog(&self) -> Result<Option<u64>, BrokerError> {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM queue")
            .fetch_one(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(Some(count.unsigned_abs()))
    }
}

impl SqliteBroker {
    async fn settle(&self, tag: &DeliveryTag, action: Action) -> Result<(), BrokerError> {
        let claim = Claim::from_tag(tag)?;
        self.call(|reply| Op::Settle {
            claim,
            action,
            reply,
        })
        .await
    }
}

/// The writer's fixed settings.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Milliseconds.
    ack_deadline: i64,
    /// Most bytes of a payload a claim reads: one more than the largest
    /// acceptable, so that the worker sees that the payload is too large.
    payload_prefix: i64,
}

/// Takes every queued operation, commits them in one transaction, answers.
async fn write_loop(
    mut writer: WriterConnection,
    mut receiver: mpsc::Receiver<Op>,
    limits: Limits,
    available: Arc<Notify>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // Claims whose puller went away before the answer: released in the next
    // transaction rather than left to lease expiry.
    let mut orphans: Vec<Claim> = Vec::new();
    let mut closing = false;
    while !closing && receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let before = batch.len();
        batch.retain(|op| !matches!(op, Op::Close));
        closing = batch.len() < before;
        let wakes = batch.iter().any(|op| {
            matches!(
                op,
                Op::Publish { .. }
                    | Op::Settle {
                        action: Action::Nack(_),
                        ..
                    }
            )
        }) || !orphans.is_empty();
        let committed = match writer.get().await {
            Ok(conn) => commit_batch(conn, &mut batch, &orphans, limits).await,
            Err(error) => Err(error),
        };
        match committed {
            Ok(answers) => {
                orphans.clear();
                for answer in answers {
                    match answer {
                        Answer::Unit(reply, result) => {
                            let _ = reply.send(result);
                        }
                        Answer::Claimed(reply, claimed) => {
                            if let Err(Ok(unwanted)) = reply.send(Ok(claimed)) {
                                orphans.extend(unwanted.deliveries.iter().map(|(c, _)| *c));
                            }
                        }
                    }
                }
                if wakes {
                    available.notify_waiters();
                }
            }
            Err(error) => {
                warn!(%error, operations = batch.len(), "queue transaction failed");
                // Nothing of the batch was committed; orphans stay for the next one.
                writer.discard().await;
                let message = error.to_string();
                for op in batch.drain(..) {
                    fail(op, BrokerError::Unavailable(message.clone()));
                }
            }
        }
        batch.clear();
    }
    // Whoever is still waiting gets an answer, not a hang.
    receiver.close();
    while let Ok(op) = receiver.try_recv() {
        fail(op, closed());
    }
    writer.close().await;
}

fn fail(op: Op, error: BrokerError) {
    match op {
        Op::Publish { reply, .. } | Op::Settle { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Op::Claim { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Op::Close => {}
    }
}

/// Runs `batch` (draining it) in one write transaction. Any SQL error fails
/// the whole batch: nothing of it is committed, and every caller is told.
async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &mut Vec<Op>,
    orphans: &[Claim],
    limits: Limits,
) -> Result<Vec<Answer>, sqlx::Error> {
    let now = now_millis();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    for claim in orphans {
        sqlx::query(
            "UPDATE queue SET lease = NULL, visible_at = ?3, deliveries = deliveries - 1
             WHERE id = ?1 AND lease = ?2",
        )
        .bind(claim.id)
        .bind(claim.delivery)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    // Ops are only drained once the transaction committed; until then a
    // failure must still be able to answer them.
    //
    // Publishes and acks are the bulk of the traffic, so each kind goes in
    // one statement for the whole batch; the rest run one by one, in order.
    // Running the acks first is one valid order among concurrent callers: an
    // ack and a claim in one batch never concern the same live lease.
    let payloads: Vec<&[u8]> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Publish { payloads, .. } => Some(payloads.iter().map(|p| p.as_ref())),
            _ => None,
        })
        .flatten()
        .collect();
    publish(&mut tx, &payloads, now).await?;
    let acks: Vec<Claim> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Settle {
                claim,
                action: Action::Ack,
                ..
            } => Some(*claim),
            _ => None,
        })
        .collect();
    let acked = ack_all(&mut tx, &acks).await?;
    let mut steps = Vec::with_capacity(batch.len());
    for op in batch.iter() {
        match op {
            Op::Publish { .. } | Op::Close => {}
            Op::Claim { max, .. } => steps.push(claim(&mut tx, *max, now, limits).await?),
            Op::Settle {
                claim,
                action: Action::Ack,
                ..
            } => steps.push(Step::Settled(if acked.contains(claim) {
                Ok(())
            } else {
                Err(BrokerError::LeaseLost(claim.tag()))
            })),
            Op::Settle { claim, action, .. } => {
                steps.push(settle(&mut tx, *claim, action, now, limits).await?)
            }
        }
    }
    tx.commit().await?;
    let mut results = steps.into_iter();
    let mut out = Vec::with_capacity(batch.len());
    for op in batch.drain(..) {
        match op {
            Op::Publish { reply, .. } => out.push(Answer::Unit(reply, Ok(()))),
            Op::Claim { reply, .. } => match results.next() {
                Some(Step::Claimed(claimed)) => out.push(Answer::Claimed(reply, claimed)),
                _ => unreachable!("one step per claim, in order"),
            },
            Op::Settle { reply, .. } => match results.next() {
                Some(Step::Settled(result)) => out.push(Answer::Unit(reply, result)),
                _ => unreachable!("one step per settlement, in order"),
            },
            Op::Close => {}
        }
    }
    Ok(out)
}

/// Deletes every acked row whose lease is still the ack's, in one statement;
/// returns the claims that matched.
async fn ack_all(
    tx: &mut Tx<'_>,
    acks: &[Claim],
) -> Result<std::collections::HashSet<Claim>, sqlx::Error> {
    if acks.is_empty() {
        return Ok(Default::default());
    }
    let pairs: Vec<[i64; 2]> = acks.iter().map(|c| [c.id, c.delivery]).collect();
    // A vector of integer pairs always serialises.
    let pairs = serde_json::to_string(&pairs).expect("pairs serialise");
    let deleted: Vec<(i64, i64)> = sqlx::query_as(
        "DELETE FROM queue WHERE id IN (
             SELECT q.id FROM json_each(?1) AS j
             JOIN queue AS q ON q.id = j.value ->> 0 AND q.lease = j.value ->> 1)
         RETURNING id, lease",
    )
    .bind(pairs)
    .fetch_all(&mut **tx)
    .await?;
    Ok(deleted
        .into_iter()
        .map(|(id, delivery)| Claim { id, delivery })
        .collect())
}

/// What one claim or settlement did inside the transaction.
enum Step {
    Claimed(Claimed),
    Settled(Result<(), BrokerError>),
}

type Tx<'c> = sqlx::Transaction<'c, Sqlite>;

async fn publish(tx: &mut Tx<'_>, payloads: &[&[u8]], now: i64) -> Result<(), sqlx::Error> {
    for chunk in payloads.chunks(INSERT_CHUNK) {
        let mut insert: QueryBuilder<Sqlite> =
            QueryBuilder::new("INSERT INTO queue (payload, published_at, visible_at) ");
        insert.push_values(chunk, |mut row, payload| {
            row.push_bind(*payload).push_bind(now).push_bind(now);
        });
        insert.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// The largest delivery count a claim writes: attempts are `u32`, and the
/// bound keeps a hand-edited count from overflowing.
const MAX_DELIVERY_COUNT: i64 = u32::MAX as i64 - 1;

async fn claim(tx: &mut Tx<'_>, max: usize, now: i64, limits: Limits) -> Result<Step, sqlx::Error> {
    // However often a row was claimed, it is delivered: the worker keeps the
    // delivery limit, and records in the store whatever it gives up on. Only
    // a prefix of the payload is read (`substr` on a BLOB counts bytes), and
    // `length` of a BLOB column needs no read of its content.
    let rows = sqlx::query(
        "UPDATE queue SET
             deliveries = min(max(deliveries, 0), ?1) + 1,
             lease      = min(max(deliveries, 0), ?1) + 1,
             visible_at = ?2
         WHERE id IN (SELECT id FROM queue WHERE visible_at <= ?3
                      ORDER BY visible_at, id LIMIT ?4)
         RETURNING id, substr(payload, 1, ?5) AS payload, length(payload) AS full_size, lease",
    )
    .bind(MAX_DELIVERY_COUNT)
    .bind(now.saturating_add(limits.ack_deadline))
    .bind(now)
    .bind(i64::try_from(max).unwrap_or(i64::MAX))
    .bind(limits.payload_prefix)
    .fetch_all(&mut **tx)
    .await?;
    let mut claimed = Claimed::default();
    let mut unreadable: Vec<(i64, String)> = Vec::new();
    for row in &rows {
        // The primary key is always an integer.
        let id: i64 = row.try_get("id")?;
        let decoded = (|| -> Result<_, sqlx::Error> {
            let payload: Vec<u8> = row.try_get("payload")?;
            let full_size: i64 = row.try_get("full_size")?;
            let lease: i64 = row.try_get("lease")?;
            Ok((payload, full_size, lease))
        })();
        match decoded {
            Ok((payload, full_size, lease)) => {
                let claim = Claim {
                    id,
                    delivery: lease,
                };
                let mut delivery = Delivery::new(
                    claim.tag(),
                    Bytes::from(payload),
                    u32::try_from(lease).unwrap_or(u32::MAX),
                );
                delivery.full_size = usize::try_from(full_size)
                    .unwrap_or(usize::MAX)
                    .max(delivery.payload.len());
                claimed.deliveries.push((claim, delivery));
            }
            Err(error) => unreadable.push((id, format!("unreadable queue row: {error}"))),
        }
    }
    for (id, reason) in unreadable {
        let reason = bounded_reason(&reason);
        warn!(id, %reason, "message dead-lettered by the broker");
        move_to_dead_letters(tx, id, None, &reason, now).await?;
    }
    claimed.deliveries.sort_by_key(|(claim, _)| claim.id);
    if claimed.deliveries.is_empty() {
        claimed.next_visible_at = sqlx::query_scalar("SELECT min(visible_at) FROM queue")
            .fetch_one(&mut **tx)
            .await?;
    }
    Ok(Step::Claimed(claimed))
}

/// Moves row `id` (if its lease is still `lease`, when given) to the dead
/// letters; returns whether it did.
async fn move_to_dead_letters(
    tx: &mut Tx<'_>,
    id: i64,
    lease: Option<i64>,
    reason: &str,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "INSERT INTO dead_letters (payload, reason, deliveries, published_at, dead_at)
         SELECT CAST(payload AS BLOB), ?3, deliveries, published_at, ?4 FROM queue
         WHERE id = ?1 AND (?2 IS NULL OR lease = ?2)",
    )
    .bind(id)
    .bind(lease)
    .bind(reason)
    .bind(now)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if moved == 0 {
        return Ok(false);
    }
    sqlx::query("DELETE FROM queue WHERE id = ?1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(true)
}

async fn settle(
    tx: &mut Tx<'_>,
    claim: Claim,
    action: &Action,
    now: i64,
    limits: Limits,
) -> Result<Step, sqlx::Error> {
    let matched = match action {
        Action::Ack => {
            sqlx::query("DELETE FROM queue WHERE id = ?1 AND lease = ?2")
                .bind(claim.id)
                .bind(claim.delivery)
                .execute(&mut **tx)
                .await?
                .rows_affected()
                > 0
        }
        Action::Nack(delay) => {
            sqlx::query(
                "UPDATE queue SET lease = NULL, visible_at = ?3 WHERE id = ?1 AND lease = ?2",
            )
            .bind(claim.id)
            .bind(claim.delivery)
            .bind(now.saturating_add(millis(*delay)))
            .execute(&mut **tx)
            .await?
            .rows_affected()
                > 0
        }
        Action::Extend => {
            sqlx::query("UPDATE queue SET visible_at = ?3 WHERE id = ?1 AND lease = ?2")
                .bind(claim.id)
                .bind(claim.delivery)
                .bind(now.saturating_add(limits.ack_deadline))
                .execute(&mut **tx)
                .await?
                .rows_affected()
                > 0
        }
        Action::DeadLetter(reason) => {
            move_to_dead_letters(
                tx,
                claim.id,
                Some(claim.delivery),
                &bounded_reason(reason),
                now,
            )
            .await?
        }
    };
    Ok(Step::Settled(if matched {
        Ok(())
    } else {
        Err(BrokerError::LeaseLost(claim.tag()))
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Generous: reached only when something hangs.
    const PATIENCE: Duration = Duration::from_secs(30);

    fn config(dir: &std::path::Path, ack_deadline: Duration, max_deliveries: u32) -> BrokerConfig {
        BrokerConfig {
            url: format!("sqlite:{}", dir.join("queue.db").display()),
            ack_deadline,
            poll_wait: Duration::from_millis(50),
            poll_interval: Duration::from_millis(10),
            max_deliveries,
            ..Default::default()
        }
    }

    async fn open(
        dir: &std::path::Path,
        ack_deadline: Duration,
        max_deliveries: u32,
    ) -> SqliteBroker {
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
        assert_eq!(dead[0].record.unwrap().deliveries, 3);
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
            matches!(&refused, Err(BrokerError::Unavailable(m)) if m.contains("disk is full")),
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
            matches!(&pulled, Err(BrokerError::Unavailable(m)) if m.contains("did not answer")),
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
        let reason = "x".repeat(10 * super::super::MAX_REASON_BYTES);
        broker
            .dead_letter(&delivered[0].tag, &reason)
            .await
            .unwrap();
        let dead = broker.dead_letters().await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(
            dead[0].record.unwrap().payload_size,
            i64::try_from(SIZE).unwrap(),
            "the whole payload is kept"
        );
        assert_eq!(
            dead[0].payload.len(),
            usize::try_from(MAX_LISTED_PAYLOAD_BYTES).unwrap(),
            "a listing reads a bounded prefix"
        );
        assert!(dead[0].reason.len() <= super::super::MAX_REASON_BYTES);
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
}

#[cfg(test)]
mod contract_harness {
    use std::sync::Arc;

    use super::*;
    use crate::broker::contract::{Harness, Queue, StaleAck, Tolerance, broker_contract};

    const POLL_WAIT: Duration = Duration::from_millis(50);

    struct Sqlite;

    #[async_trait]
    impl Harness for Sqlite {
        fn tolerance(&self) -> Tolerance {
            Tolerance {
                ack_deadline: Duration::from_secs(1),
                // Deadlines are milliseconds in the table.
                nack_early: Duration::from_millis(1),
                counts_attempts: true,
                stale_ack: StaleAck::Refused,
                pull_bound: Duration::ZERO,
            }
        }

        async fn open(&self, _stoppable: bool) -> Queue {
            let dir = tempfile::tempdir().unwrap();
            let config = BrokerConfig {
                url: format!("sqlite:{}", dir.path().join("queue.db").display()),
                ack_deadline: Duration::from_secs(1),
                poll_wait: POLL_WAIT,
                poll_interval: Duration::from_millis(10),
                max_deliveries: 10,
                ..Default::default()
            };
            let consumer = Arc::new(SqliteBroker::connect(&config).await.unwrap());
            // Another process on the same file.
            let other = Arc::new(SqliteBroker::connect(&config).await.unwrap());
            let reader = consumer.clone();
            Queue {
                consumer,
                other,
                dead_letters: Box::new(move || {
                    let reader = reader.clone();
                    Box::pin(async move {
                        reader
                            .dead_letters()
                            .await
                            .unwrap()
                            .into_iter()
                            .map(|d| (Bytes::from(d.payload), d.reason))
                            .collect()
                    })
                }),
                stop_server: None,
                keep: Box::new(dir),
            }
        }
    }

    broker_contract!(Sqlite, POLL_WAIT);
}
