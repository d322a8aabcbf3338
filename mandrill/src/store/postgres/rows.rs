//! How the store's transactions and columns look to every file that
//! writes rows: the transaction type, and attempt numbers as stored.

/// A transaction on the store's database.
pub(super) type Tx<'c> = sqlx::Transaction<'c, sqlx::Postgres>;

/// An attempt number as stored (`INTEGER`).
pub(super) fn attempts(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}
