//! The group-commit writer: one task owns one connection, takes whatever
//! operations are queued, runs them in one `BEGIN IMMEDIATE` transaction
//! and answers each caller only after the commit. Many callers share one
//! fsync, and nobody hears "done" before it is durable.
//!
//! The writer knows nothing of tables: it carries the operations of two
//! [`Part`]s (the queue's and the store's, when they share a file) and lets
//! each run its own in the common transaction. What it does own:
//!
//! - A write the database refuses for good (a constraint, say) fails alone,
//!   not its batch: the batch is written again one operation per
//!   transaction, so that only the culprit hears the error.
//! - A failed transaction drops the connection ([`WriterConnection`]), and
//!   the next batch opens a fresh one, so that writing resumes once the cause
//!   (a full disk, say) is gone.

use std::future::Future;
use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool};
use sqlx::{Connection, Sqlite};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::store::sqlx_error_is_transient;

/// Most operations committed in one transaction.
pub(crate) const MAX_BATCH: usize = 1024;

/// The write transaction every operation runs in.
pub(crate) type Tx<'c> = sqlx::Transaction<'c, Sqlite>;

/// One family of operations (the queue's, the store's) run by a writer.
pub(crate) trait Part: Send + 'static {
    /// Names the part in logs ("queue", "store").
    const NAME: &'static str;
    /// One caller's operation, with whom to answer.
    type Op: Send + 'static;
    /// What one operation answers once committed.
    type Answer: Send + 'static;

    /// Runs `ops`, in arrival order as far as their answers can tell, inside
    /// the open transaction; one answer per operation. An error fails the
    /// whole transaction.
    fn run<'a>(
        &'a mut self,
        tx: &'a mut Tx<'_>,
        ops: &'a [Self::Op],
        now: i64,
    ) -> impl Future<Output = Result<Vec<Self::Answer>, sqlx::Error>> + Send + 'a;

    /// The transaction that ran `ops` committed (called once per commit,
    /// before the answers are sent, even when this part had no operations).
    fn committed_batch(&mut self, ops: &[Self::Op]);

    /// Tells one caller its committed answer.
    fn answer(&mut self, op: Self::Op, answer: Self::Answer);

    /// Tells one caller that its transaction failed: nothing of it committed.
    fn fail(&mut self, op: Self::Op, error: &Arc<sqlx::Error>);

    /// Tells one caller that the writer has stopped.
    fn closed(&mut self, op: Self::Op);

    /// Whether the part has work of its own to commit even with no
    /// operation (the queue: rows claimed for a caller who left).
    fn has_pending(&self) -> bool {
        false
    }
}

/// One queued operation.
pub(crate) enum Job<A: Part, B: Part> {
    A(A::Op),
    B(B::Op),
    /// Stop after this batch; later operations are refused.
    Close,
}

/// Where the writer writes: its own connection, or (in-memory databases,
/// which live in one connection) the pool's only connection.
pub(crate) enum Source {
    /// Boxed: the connect options are large, and the enum is made once.
    Own(Box<WriterConnection>),
    Pool(SqlitePool),
}

/// A writer task's own connection, replaced after a failed transaction.
///
/// Some errors (a full disk, for one) make SQLite end the transaction by
/// itself; sqlx's `ROLLBACK` then fails, sqlx keeps counting the transaction
/// as open, and the connection refuses every later `BEGIN IMMEDIATE` ("at
/// non-zero transaction depth"). A fresh connection carries no such state.
pub(crate) struct WriterConnection {
    options: SqliteConnectOptions,
    /// `None` after a failure, until the next batch connects again.
    conn: Option<SqliteConnection>,
}

impl WriterConnection {
    pub(crate) async fn open(options: SqliteConnectOptions) -> Result<Self, sqlx::Error> {
        // sqlx's SQLite thread hands rows back through a channel of 50 by
        // default, and stops when it is full until this task takes them; a
        // batch's statements return up to a row per operation, so with room
        // for a whole batch the thread never waits on this task mid-statement
        // (the writer's time per 20k messages: about 5-10% less).
        let options = options.row_buffer_size(MAX_BATCH);
        let conn = super::open_busy(|| SqliteConnection::connect_with(&options)).await?;
        Ok(Self {
            options,
            conn: Some(conn),
        })
    }

    /// The connection, opened again if the last one was discarded.
    async fn get(&mut self) -> Result<&mut SqliteConnection, sqlx::Error> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => SqliteConnection::connect_with(&self.options).await?,
        };
        Ok(self.conn.insert(conn))
    }

    /// Drops the connection after a failed transaction.
    async fn discard(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(error) = conn.close().await
        {
            debug!(%error, "closing a failed writer connection failed");
        }
    }

    /// Closes the connection, if one is open.
    async fn close(mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(error) = conn.close().await
        {
            warn!(%error, "closing a writer connection failed");
        }
    }
}

/// The writer's state: where it writes and its two parts.
struct Writer<A, B> {
    source: Source,
    a: A,
    b: B,
}

impl<A: Part, B: Part> Writer<A, B> {
    fn has_pending(&self) -> bool {
        self.a.has_pending() || self.b.has_pending()
    }

    /// Runs `a_ops` and `b_ops` in one transaction and, if it committed,
    /// answers them. After a failure nothing of it was committed, the ops
    /// are handed back, and the own connection is replaced (an in-memory
    /// database lives in its one connection, which must not be).
    async fn commit(
        &mut self,
        a_ops: Vec<A::Op>,
        b_ops: Vec<B::Op>,
    ) -> Result<(), (sqlx::Error, Vec<A::Op>, Vec<B::Op>)> {
        let result = match &mut self.source {
            Source::Own(own) => match own.get().await {
                Ok(conn) => transaction(conn, &mut self.a, &mut self.b, &a_ops, &b_ops).await,
                Err(error) => Err(error),
            },
            Source::Pool(pool) => match pool.acquire().await {
                Ok(mut conn) => {
                    transaction(&mut conn, &mut self.a, &mut self.b, &a_ops, &b_ops).await
                }
                Err(error) => Err(error),
            },
        };
        match result {
            Ok((a_answers, b_answers)) => {
                self.a.committed_batch(&a_ops);
                self.b.committed_batch(&b_ops);
                for (op, answer) in a_ops.into_iter().zip(a_answers) {
                    self.a.answer(op, answer);
                }
                for (op, answer) in b_ops.into_iter().zip(b_answers) {
                    self.b.answer(op, answer);
                }
                Ok(())
            }
            Err(error) => {
                if let Source::Own(own) = &mut self.source {
                    own.discard().await;
                }
                Err((error, a_ops, b_ops))
            }
        }
    }

    /// Tells every caller of a failed transaction, and logs the failure for
    /// each part that had operations in it.
    fn fail_all(&mut self, a_ops: Vec<A::Op>, b_ops: Vec<B::Op>, error: sqlx::Error) {
        for (name, operations) in [(A::NAME, a_ops.len()), (B::NAME, b_ops.len())] {
            if operations > 0 {
                warn!(%error, operations, "{name} transaction failed");
            }
        }
        let error = Arc::new(error);
        let error = &error;
        for op in a_ops {
            self.a.fail(op, error);
        }
        for op in b_ops {
            self.b.fail(op, error);
        }
    }
}

async fn transaction<A: Part, B: Part>(
    conn: &mut SqliteConnection,
    a: &mut A,
    b: &mut B,
    a_ops: &[A::Op],
    b_ops: &[B::Op],
) -> Result<(Vec<A::Answer>, Vec<B::Answer>), sqlx::Error> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    // Read once the file's write lock is held (`BEGIN IMMEDIATE` may wait
    // out another process's transaction): a claim's journal stamp and a
    // lease's deadline are then no earlier than the moment they take
    // effect, so a restart cannot leave a rate window, or a lease lapse,
    // early by the time spent waiting.
    let now = crate::domain::Timestamp::now().as_millis();
    let a_answers = a.run(&mut tx, a_ops, now).await?;
    let b_answers = b.run(&mut tx, b_ops, now).await?;
    tx.commit().await?;
    Ok((a_answers, b_answers))
}

/// Takes every queued job, commits them in one transaction, answers; until
/// a [`Job::Close`] or until every sender is gone.
pub(crate) async fn write_loop<A: Part, B: Part>(
    source: Source,
    a: A,
    b: B,
    mut receiver: mpsc::Receiver<Job<A, B>>,
) {
    let mut writer = Writer { source, a, b };
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closing = false;
    while !closing && receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut a_ops = Vec::new();
        let mut b_ops = Vec::new();
        for job in batch.drain(..) {
            match job {
                Job::A(op) => a_ops.push(op),
                Job::B(op) => b_ops.push(op),
                Job::Close => closing = true,
            }
        }
        let operations = a_ops.len() + b_ops.len();
        if operations == 0 && !writer.has_pending() {
            continue;
        }
        match writer.commit(a_ops, b_ops).await {
            Ok(()) => {}
            Err((error, a_ops, b_ops)) if operations > 1 && !sqlx_error_is_transient(&error) => {
                // One write the database refuses for good must not fail the
                // others that shared its transaction (a store's caller would
                // give its request up): write them one by one, so that only
                // the culprit hears the error.
                warn!(%error, operations, "batch refused; writing it one by one");
                for op in a_ops {
                    if let Err((error, a_ops, b_ops)) = writer.commit(vec![op], Vec::new()).await {
                        writer.fail_all(a_ops, b_ops, error);
                    }
                }
                for op in b_ops {
                    if let Err((error, a_ops, b_ops)) = writer.commit(Vec::new(), vec![op]).await {
                        writer.fail_all(a_ops, b_ops, error);
                    }
                }
            }
            Err((error, a_ops, b_ops)) => writer.fail_all(a_ops, b_ops, error),
        }
        // The answers may have left work behind (rows claimed for a pull
        // nobody waits for any more): committed now, not whenever the next
        // operation comes (at shutdown, none may), or those rows stay leased
        // until their deadline with their delivery counted. One try; a
        // failure leaves it to the next transaction.
        if writer.has_pending()
            && let Err((error, _, _)) = writer.commit(Vec::new(), Vec::new()).await
        {
            warn!(%error, "could not give back rows claimed for a pull nobody waits for; the next transaction will");
        }
    }
    // Whoever is still waiting gets an answer, not a hang.
    receiver.close();
    while let Ok(job) = receiver.try_recv() {
        match job {
            Job::A(op) => writer.a.closed(op),
            Job::B(op) => writer.b.closed(op),
            Job::Close => {}
        }
    }
    if let Source::Own(own) = writer.source {
        own.close().await;
    }
}
