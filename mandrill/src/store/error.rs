//! What can go wrong talking to a store, and whether it is worth retrying.

use std::sync::Arc;

/// What went wrong talking to a store. The worker branches on
/// [`StoreError::is_transient`]: a transient error is retried in place (and
/// pauses pulling), a permanent one gives the message up with the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database refused or failed the operation.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not make sense (e.g. an unknown status).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A batched operation failed; every caller of the batch is told, and
    /// none of a failed write batch was committed.
    #[error("database batch failed: {0}")]
    Batch(#[source] Arc<sqlx::Error>),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// A fault injected on purpose (tests, benchmarks).
    #[error("injected fault: {what}")]
    Injected {
        /// Whether it is to be treated as transient.
        transient: bool,
        /// What it pretends to be.
        what: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed: the database
    /// was unreachable, busy, locked or out of space. Encoding errors,
    /// constraint violations and values too long are permanent: retrying
    /// (or redelivering) would fail the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(error) => sqlx_error_is_transient(error),
            Self::Batch(error) => sqlx_error_is_transient(error),
            Self::Migrate(_) | Self::Corrupt(_) | Self::Closed => false,
            Self::Injected { transient, .. } => *transient,
        }
    }
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
