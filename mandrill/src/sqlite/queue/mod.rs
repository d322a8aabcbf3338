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
//! Every write goes through the file's writer ([`crate::sqlite`]), shared
//! with the store when it uses the same file: it takes whatever operations
//! are queued (publishes, claims, acks, nacks, extensions, dead letters, and
//! the store's writes), runs them in one `BEGIN IMMEDIATE` transaction and
//! answers each caller only after the commit. Throughput therefore does not
//! collapse into one fsync per message, and nothing is reported settled
//! before it is durable. Claims run inside that write transaction, so two
//! processes on one database never claim the same row at once. A failed
//! transaction fails every operation of its batch, and the writer replaces
//! its connection, so that writing resumes once the cause (a full disk,
//! say) is gone. When the store shares the file, an outcome and its ack
//! commit together ([`Consumer::joint_ack`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use sqlx::{QueryBuilder, Row, Sqlite};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::warn;

use super::writer::Job;
use super::{FileAck, FileWriter, queue_migrations};
use crate::broker::{
    BrokerError, Cause, Close, Consumer, DeadLetterAdmin, DeadLetterEntry, DeadLetterId, Delivery,
    DeliveryTag, Publisher, bounded_reason, choose,
};
use crate::domain::JointAck;

mod admin;
mod claims;
#[cfg(test)]
mod contract_harness;
mod settings;
#[cfg(test)]
mod tests;
mod writer;

pub(super) use claims::Claim;
pub use settings::SqliteOptions;
pub(crate) use settings::SqliteSettings;
pub(crate) use writer::QueuePart;
pub(super) use writer::ack_all;
use writer::{Action, Limits, Op};

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
    /// What each operation carries to the writer.
    limits: Limits,
    /// The file's writer, shared with the store when it uses the same file.
    writer: Arc<FileWriter>,
    /// Set by [`Close::close`]: later operations are refused.
    closed: AtomicBool,
    /// For reads (backlog, dead-letter listing) and the rare admin writes, so
    /// that they never queue behind a batch.
    pool: SqlitePool,
    /// Woken after a commit that published or nacked, so that a pull in this
    /// process returns at once; other processes' publishes are found by
    /// polling every `poll_interval`.
    available: Arc<Notify>,
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
    BrokerError::Unavailable(Cause::from_error(error))
}

fn closed() -> BrokerError {
    BrokerError::Fatal("the sqlite broker is closed".into())
}

impl SqliteBroker {
    /// Opens (creating if missing) the queue at `config.url` (`sqlite:PATH`),
    /// brings the schema up to date and starts the writer task. Pulls hand
    /// over payloads whole; a consumer uses
    /// [`connect_with_payload_limit`](Self::connect_with_payload_limit).
    pub async fn connect(config: &SqliteOptions) -> Result<Self, BrokerError> {
        Self::connect_with_payload_limit(config, usize::MAX).await
    }

    /// As [`connect`](Self::connect), but a pull reads at most
    /// `max_payload_bytes + 1` bytes of a payload: a larger one is handed
    /// over as that prefix with its [`Delivery::full_size`], for the worker
    /// to reject, instead of being loaded whole.
    pub async fn connect_with_payload_limit(
        config: &SqliteOptions,
        max_payload_bytes: usize,
    ) -> Result<Self, BrokerError> {
        let options = crate::sqlite::connect_options(&config.url)
            .map_err(|e| BrokerError::Fatal(Cause::from_error(e)))?;
        let pool = crate::sqlite::open_pool(SqlitePoolOptions::new().max_connections(2), &options)
            .await
            .map_err(|e| BrokerError::Fatal(Cause::from_error(e)))?;
        crate::sqlite::migrate(&pool, queue_migrations())
            .await
            .map_err(|e| BrokerError::Fatal(Cause::new("migration failed", e)))?;
        let writer = FileWriter::open(&options)
            .await
            .map_err(|e| BrokerError::Fatal(Cause::from_error(e)))?;
        let limits = Limits {
            ack_deadline: millis(config.ack_deadline),
            // SQLite keeps no value over 2^31 bytes, and `substr`
            // misbehaves when start plus length overflows.
            payload_prefix: i64::try_from(max_payload_bytes.saturating_add(1))
                .unwrap_or(i64::MAX)
                .min(i64::from(i32::MAX)),
        };
        Ok(Self {
            ack_deadline: config.ack_deadline,
            poll_wait: config.poll_wait,
            poll_interval: config.poll_interval,
            limits,
            available: writer.available.clone(),
            writer,
            closed: AtomicBool::new(false),
            pool,
        })
    }

    async fn call<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, BrokerError>>) -> Op,
    ) -> Result<T, BrokerError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let (reply, answer) = oneshot::channel();
        if !self.writer.send(Job::A(op(reply))).await {
            return Err(closed());
        }
        answer.await.map_err(|_| closed())?
    }

    /// The file's writer, to tell whether two users share it.
    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Arc<FileWriter> {
        &self.writer
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
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.writer.close().await;
        }
        self.pool.close().await;
    }
}

#[async_trait]
impl Publisher for SqliteBroker {
    async fn publish(&self, payload: Bytes) -> Result<(), BrokerError> {
        self.publish_all(vec![payload]).await
    }

    /// In one transaction: all of them or none.
    async fn publish_all(&self, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        SqliteBroker::publish_all(self, payloads).await
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
            // claimed rows in a transaction of their own right after
            // (`rows_claimed_for_a_dropped_pull_are_given_back_even_if_nothing_else_is_written`).
            let limits = self.limits;
            let claim = self.call(|reply| Op::Claim { max, limits, reply });
            let claimed = tokio::time::timeout_at(fail_at, claim)
                .await
                .map_err(|_elapsed| {
                    BrokerError::Unavailable(
                        format!(
                            "the queue's writer did not answer a claim within {:?}; \
                         is another process holding the database's write lock?",
                            self.poll_wait + PULL_MARGIN
                        )
                        .into(),
                    )
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

    fn joint_ack(&self, tag: &DeliveryTag) -> Option<JointAck> {
        let claim = Claim::from_tag(tag).ok()?;
        Some(JointAck::new(FileAck::new(&self.writer, claim)))
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
        let limits = self.limits;
        self.call(|reply| Op::Settle {
            claim,
            action,
            limits,
            reply,
        })
        .await
    }
}
