//! Group commit for PostgreSQL: claims and outcomes are queued to a few
//! writer tasks, each of which takes every queued write, commits them in one
//! transaction ([`super::batch`]) and answers each caller only after that
//! commit; a failed transaction fails each of its callers. Claims that a
//! counting guard must check never come here: they keep their own
//! transaction and its advisory locks ([`super::claims`]).

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, Postgres};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::batch::{Answer, Write, commit_batch};
use crate::store::{StoreError, sqlx_error_is_transient};

/// Most writes committed in one transaction.
pub(super) const MAX_BATCH: usize = 512;

/// The writer tasks' shared queue: whichever writer is free takes every
/// write waiting, so that one commits while the next gathers its batch.
pub(super) type Queue = Arc<Mutex<mpsc::Receiver<Write>>>;

/// Takes batches from `queue` and commits them until `closing`; then
/// commits what is still queued and stops. A batch that takes longer than
/// `timeout` fails (see [`commit`]).
pub(super) async fn write_loop(
    pool: PgPool,
    queue: Queue,
    closing: CancellationToken,
    timeout: Duration,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut held = Held {
        pool,
        conn: None,
        timeout,
    };
    loop {
        {
            let mut receiver = queue.lock().await;
            if closing.is_cancelled() {
                // Whatever is queued is still written; later sends fail
                // once every writer has dropped the queue.
                while batch.len() < MAX_BATCH
                    && let Ok(write) = receiver.try_recv()
                {
                    batch.push(write);
                }
                if batch.is_empty() {
                    break;
                }
            } else {
                tokio::select! {
                    biased;
                    received = receiver.recv_many(&mut batch, MAX_BATCH) => {
                        if received == 0 {
                            break;
                        }
                    }
                    () = closing.cancelled() => continue,
                }
            }
        }
        commit_and_answer(&mut held, &mut batch).await;
    }
    // Closed, not dropped: a dropped pool connection goes back to the pool
    // from a task of its own, after the store's `pool.close()` may have
    // returned, and its session then stays open.
    if let Some(conn) = held.conn.take() {
        let _ = conn.close().await;
    }
}

/// Commits `batch` (emptying it) and answers each of its callers.
async fn commit_and_answer(held: &mut Held, batch: &mut Vec<Write>) {
    match commit(held, batch).await {
        Err(Failed::TimedOut) => {
            warn!(timeout = ?held.timeout, writes = batch.len(), "store transaction timed out");
            let after = held.timeout;
            for write in batch.drain(..) {
                reply(write, Err(StoreError::TimedOut { after }));
            }
        }
        Ok(answers) => {
            for (write, answer) in batch.drain(..).zip(answers) {
                reply(write, Ok(answer));
            }
        }
        Err(Failed::Database(error)) if batch.len() > 1 && !sqlx_error_is_transient(&error) => {
            // One write the database refuses for good must not fail the
            // others that shared its transaction (each caller would give its
            // request up): write them one by one, so that only the culprit
            // hears the error.
            warn!(%error, writes = batch.len(), "store batch refused; writing it one by one");
            for write in batch.drain(..) {
                let single = [write];
                let result = commit(held, &single).await;
                let [write] = single;
                let after = held.timeout;
                reply(
                    write,
                    result
                        .map(|mut answers| answers.remove(0))
                        .map_err(|failed| match failed {
                            Failed::Database(error) => StoreError::Batch(Arc::new(error)),
                            Failed::TimedOut => StoreError::TimedOut { after },
                        }),
                );
            }
        }
        Err(Failed::Database(error)) => {
            warn!(%error, writes = batch.len(), "store transaction failed");
            let error = Arc::new(error);
            for write in batch.drain(..) {
                reply(write, Err(StoreError::Batch(error.clone())));
            }
        }
    }
}

fn reply(write: Write, answer: Result<Answer, StoreError>) {
    // A caller that stopped waiting (its handler was aborted) is no
    // error: what it asked for is committed either way.
    match (write, answer) {
        (Write::Claim { reply, .. }, Ok(Answer::Claim(claim))) => {
            let _ = reply.send(Ok(claim));
        }
        (Write::Outcome { reply, .. }, Ok(Answer::Outcome(recorded))) => {
            let _ = reply.send(Ok(recorded));
        }
        (Write::Claim { reply, .. }, Err(error)) => {
            let _ = reply.send(Err(error));
        }
        (Write::Outcome { reply, .. }, Err(error)) => {
            let _ = reply.send(Err(error));
        }
        (write, Ok(answer)) => {
            // commit_batch answers each write with its own kind.
            let error = StoreError::Corrupt(format!("store writer mismatched answer {answer:?}"));
            reply(write, Err(error));
        }
    }
}

/// A writer's connection, kept from one batch to the next: taken from the
/// pool for each batch, it cost two round trips more (sqlx pings a
/// connection as it is taken and again as it is given back). The store
/// leaves one connection per writer for this (see `PostgresStore::direct`).
/// Given back after a failed batch, so that a broken one is not used again.
struct Held {
    pool: PgPool,
    conn: Option<PoolConnection<Postgres>>,
    /// The most one batch may take.
    timeout: Duration,
}

/// Why a batch was not committed.
enum Failed {
    Database(sqlx::Error),
    /// No answer within the timeout: it may still commit.
    TimedOut,
}

/// Runs `batch` in one transaction; any error rolls all of it back. At
/// most the writer's timeout: past it the batch is failed and its
/// connection dropped, neither used again nor given back to the pool
/// (whose check of it would wait on the same silent server); the server
/// ends that session's transaction by its own idle timeout.
async fn commit(held: &mut Held, batch: &[Write]) -> Result<Vec<Answer>, Failed> {
    let timeout = held.timeout;
    let run = async {
        let conn = match &mut held.conn {
            Some(conn) => conn,
            None => held.conn.insert(held.pool.acquire().await?),
        };
        let mut tx = conn.begin().await?;
        let answers = commit_batch(&mut tx, batch).await?;
        tx.commit().await?;
        Ok(answers)
    };
    let ran = tokio::time::timeout(timeout, run).await;
    let result = match ran {
        Ok(result) => result.map_err(Failed::Database),
        Err(_elapsed) => {
            if let Some(conn) = held.conn.take() {
                drop(conn.detach());
            }
            Err(Failed::TimedOut)
        }
    };
    if result.is_err() {
        held.conn = None;
    }
    result
}
