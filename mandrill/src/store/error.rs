//! What can go wrong talking to a store, and whether it is worth retrying.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::causes::WithCauses;

/// What went wrong talking to a store. The worker branches on
/// [`StoreError::is_transient`]: a transient error is retried in place (and
/// pauses pulling), a permanent one gives the message up with the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StoreError {
    /// The database refused or failed the operation.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not make sense (e.g. an unknown status).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A batched operation failed; every caller of the batch is told, and
    /// none of a failed write batch was committed.
    #[error("database batch failed")]
    Batch(#[source] Arc<sqlx::Error>),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// This store does not keep what was asked for (a test double).
    #[error("this store does not keep {0}")]
    Unsupported(&'static str),
    /// The store did not answer within `store.timeout` (a database that
    /// hangs rather than fails: stopped, or behind a network black hole).
    /// What was asked may or may not have been done: a write may still
    /// commit. Transient: the same call is retried.
    #[error("the store did not answer within {}; the outcome is unknown", humantime::format_duration(*after))]
    TimedOut {
        /// The bound that passed.
        after: Duration,
    },
}

impl StoreError {
    /// The error followed by its causes (`error: cause: cause's cause`),
    /// for a log line or a message that must stand alone: the message
    /// itself does not repeat its source.
    pub(crate) fn with_causes(&self) -> impl fmt::Display + '_ {
        WithCauses(self)
    }

    /// Whether retrying the same operation later may succeed: the database
    /// was unreachable, busy, locked or out of space. Encoding errors,
    /// constraint violations and values too long are permanent: retrying
    /// (or redelivering) would fail the same way.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Database(error) => sqlx_error_is_transient(error),
            Self::Batch(error) => sqlx_error_is_transient(error),
            Self::TimedOut { .. } => true,
            Self::Migrate(_) | Self::Corrupt(_) | Self::Closed | Self::Unsupported(_) => false,
        }
    }

    /// Whether what was asked may have been done all the same: the call
    /// timed out waiting for an answer. Every other error means it was not
    /// (a failed transaction is rolled back).
    pub(crate) fn outcome_unknown(&self) -> bool {
        matches!(self, Self::TimedOut { .. })
    }
}

/// How long one store call may take when `store.timeout` is not set.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `call`, or [`StoreError::TimedOut`] once `timeout` has passed (the
/// call is dropped). What bounds every call of the SQL stores, whatever
/// the database does: a server that stops answering enforces none of its
/// own timeouts.
///
/// A combinator, not an `async fn`: an `async fn` keeps the future it is
/// given as an argument beside the copy it awaits, so each such level
/// doubles what a waiting call holds (see [`ask`]).
pub(crate) fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> impl Future<Output = Result<T, StoreError>> {
    use futures::FutureExt as _;
    tokio::time::timeout(timeout, call)
        .map(move |ran| ran.unwrap_or(Err(StoreError::TimedOut { after: timeout })))
}

/// Asks one of a store's tasks (a writer, the lookup task) and waits for
/// its answer, all [`within`] `timeout`: `job` builds the job around the
/// reply channel, and it is queued on `tasks`. A task that has stopped,
/// refusing the job or dropping it unanswered, is [`StoreError::Closed`].
///
/// Every message in flight waits on one of these for a batch to commit,
/// so what it holds is memory per message: the job once (built before
/// the first poll, sent into a reserved slot where `Sender::send` would
/// keep a second copy while it waits for room), the reply's receiver and
/// the timer. Nested `async fn`s, each holding the future it was given
/// beside the one it awaits, made a claim's ~3.8 KB on the PostgreSQL
/// store (docs/benchmarks.md, "Memory per message in flight").
pub(crate) fn ask<'a, T: 'a, Job: Send + 'a>(
    timeout: Duration,
    tasks: &'a mpsc::Sender<Job>,
    job: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Job,
) -> impl Future<Output = Result<T, StoreError>> + 'a {
    let (reply, answer) = oneshot::channel();
    let job = job(reply);
    within(timeout, async move {
        let Ok(slot) = tasks.reserve().await else {
            return Err(StoreError::Closed);
        };
        slot.send(job);
        answer.await.map_err(|_| StoreError::Closed)?
    })
}

/// Classifies a driver error; see [`StoreError::is_transient`]. What is not
/// known to be permanent is treated as transient: retrying in place costs
/// time, never a restart.
pub(crate) fn sqlx_error_is_transient(error: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match error {
        E::Database(db) => {
            use sqlx::error::ErrorKind;
            if matches!(
                db.kind(),
                ErrorKind::UniqueViolation
                    | ErrorKind::ForeignKeyViolation
                    | ErrorKind::NotNullViolation
                    | ErrorKind::CheckViolation
            ) {
                return false;
            }
            let code = db.code().unwrap_or_default();
            if db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                // SQLSTATE classes: 22 data exception (invalid byte sequence,
                // string too long), 23 integrity, 42 syntax or access rule,
                // 54 program limit exceeded.
                !matches!(code.get(..2), Some("22" | "23" | "42" | "54"))
            } else {
                // SQLite's primary result code is the low byte: 18 TOOBIG,
                // 19 CONSTRAINT, 20 MISMATCH, 25 RANGE, 1 ERROR (bad SQL).
                let primary = code.parse::<i64>().map_or(-1, |c| c & 0xff);
                !matches!(primary, 1 | 18 | 19 | 20 | 25)
            }
        }
        E::Configuration(_)
        | E::InvalidArgument(_)
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Encode(_)
        | E::Decode(_)
        | E::TypeNotFound { .. }
        | E::RowNotFound
        | E::PoolClosed
        | E::Migrate(_) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver errors the worker's tests stand in for an outage and a
    /// refusal are classified as those (real database errors are
    /// classified in each SQL store's tests).
    #[test]
    fn io_and_pool_timeouts_are_transient_and_encoding_errors_permanent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(StoreError::Database(sqlx::Error::Io(refused)).is_transient());
        assert!(StoreError::Database(sqlx::Error::PoolTimedOut).is_transient());
        assert!(StoreError::Batch(Arc::new(sqlx::Error::PoolTimedOut)).is_transient());
        let encode = sqlx::Error::Encode("invalid byte sequence for encoding UTF8: 0x00".into());
        let error = StoreError::Database(encode);
        assert!(!error.is_transient());
        // The cause stays a source, not only words in the message.
        let source = std::error::Error::source(&error).expect("a source");
        assert!(
            source.to_string().contains("invalid byte sequence"),
            "{source}"
        );
        assert!(!StoreError::Closed.is_transient());
        // A call that timed out is retried, and says its outcome is unknown.
        let timed_out = StoreError::TimedOut {
            after: Duration::from_secs(10),
        };
        assert!(timed_out.is_transient() && timed_out.outcome_unknown());
        assert!(!StoreError::Database(sqlx::Error::PoolTimedOut).outcome_unknown());
        assert_eq!(
            timed_out.to_string(),
            "the store did not answer within 10s; the outcome is unknown"
        );
    }

    /// The cause is the source, not also words in the message, so that a
    /// chain shows it once: a log line (`with_causes`), and the binary's
    /// last word (`anyhow`'s chain, through the same helper). It showed
    /// three times: in `StoreError`'s message, in sqlx's (which writes its
    /// source into its own), and as the source.
    #[test]
    fn a_cause_shows_once_in_the_error_chain() {
        let cause = "invalid byte sequence for encoding UTF8: 0x00";
        let error = || StoreError::Database(sqlx::Error::Encode(cause.into()));
        assert_eq!(error().to_string(), "database error");
        let line = error().with_causes().to_string();
        assert_eq!(
            line,
            format!("database error: error occurred while encoding a value: {cause}")
        );
        let top = anyhow::Error::new(error()).context("cannot record");
        let top = crate::causes::WithCauses(&*top).to_string();
        assert_eq!(top.matches(cause).count(), 1, "{top}");
        let batch = StoreError::Batch(Arc::new(sqlx::Error::Encode(cause.into())));
        let line = batch.with_causes().to_string();
        assert_eq!(line.matches(cause).count(), 1, "{line}");
    }
}
