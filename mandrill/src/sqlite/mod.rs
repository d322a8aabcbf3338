//! The SQLite adapter: a queue ([`SqliteBroker`], behind the broker seam,
//! in `queue/`) and a store ([`SqliteStore`], behind the store seam, in
//! `store/`), and what they share: the connect options, the migration run,
//! and one group-commit writer per database file (`writer.rs`).
//!
//! By default the queue and the store are the same file. They then share
//! one writer task (found in a registry keyed by the file's canonical path),
//! so that a message's outcome and its ack commit in one transaction (the
//! queue's [`JointAck`](crate::domain::JointAck) holds a [`FileAck`], which the store opens), and so
//! that two writers of one process never wait for each other's write lock.
//! Several processes on one file each have their own writer;
//! `BEGIN IMMEDIATE` and the busy timeout order them.
//!
//! The writer stays on sqlx rather than rusqlite on a thread of its own,
//! by measurement (the benchmark's `ceiling_sqlite_sqlx_*` fields): (b)'s work through sqlx in multi-row statements, as the writer
//! writes, runs at ~0.85 of rusqlite's one-row ceiling, and the pipeline at
//! ~0.5 of that sqlx twin. Most of the gap is the writer's own work (three
//! commits per message: lease, claim, outcome with ack), which a driver
//! change does not remove; sqlx one row per statement is ~4x slower (a
//! round trip to sqlx's worker thread per statement), which is why every
//! hot statement takes many rows. sqlx also keeps one driver (and one set of
//! SQL and error classification) for the reads, both parts and PostgreSQL.
//! rusqlite links the same `libsqlite3-sys`, so the switch stays open.

mod queue;
mod store;
pub(crate) mod writer;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::migrate::{MigrateError, Migrator};

pub(crate) use crate::migrations::{
    sqlite_queue as queue_migrations, sqlite_store as store_migrations,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use tokio::sync::{Mutex, Notify, mpsc};
use tokio_util::task::TaskTracker;
use tracing::debug;

use queue::QueuePart;
pub(crate) use queue::SqliteSettings;
pub use queue::{SqliteBroker, SqliteOptions};
pub(crate) use store::SqliteStore;
use store::StorePart;
use writer::{Job, MAX_BATCH, Source, WriterConnection, write_loop};

/// WAL pages (4 KiB each) after which a commit checkpoints the WAL into the
/// database file: 16 MiB, four times SQLite's default. The writer's hot
/// pages (index leaves, the queue's) are dirtied by nearly every commit;
/// each checkpoint copies them once however many commits wrote them, so
/// checkpointing a quarter as often saves most of those copies (and their
/// fsyncs of the database file). Durability does not depend on it: every
/// commit is fsynced into the WAL first.
pub(crate) const WAL_AUTOCHECKPOINT_PAGES: u32 = 4000;

/// The options every connection uses: WAL so that readers never block the
/// writer, `synchronous = FULL` so that a commit survives power loss, a
/// busy timeout so that several processes on one file wait for each other's
/// write transactions, and checkpoints every
/// [`WAL_AUTOCHECKPOINT_PAGES`] (only a connection that commits ever
/// checkpoints, so this is the writer's setting).
pub(crate) fn connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .pragma("temp_store", "memory")
        .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES.to_string())
        .statement_cache_capacity(STATEMENT_CACHE))
}

/// Prepared statements a connection keeps: the writer's batch statements
/// come in nine lengths each ([`runs`]), about ten kinds of them, beside
/// the fixed ones; sqlx's default of 100 would evict some.
const STATEMENT_CACHE: usize = 256;

/// `items` in runs whose lengths are powers of two, largest first, none
/// longer than `max`. A batch's statement carries one `VALUES` row (or
/// `IN` entry) per item, so each length is a statement of its own, and
/// SQLite parses every statement its connection has not prepared: with
/// any length a batch could have, the writer parsed most of its
/// statements again (a tenth of its thread's time on the benchmark).
/// With a few lengths, each is prepared once per connection; a batch takes
/// at most a few more statements, in the same transaction.
pub(crate) fn runs<T>(items: &[T], max: usize) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        let len = rest.len().min(max);
        if len == 0 {
            return None;
        }
        // The largest power of two not over `len`.
        let (run, tail) = rest.split_at(1 << len.ilog2());
        rest = tail;
        Some(run)
    })
}

/// A pool on the file `options` name, opened as [`open_busy`] opens.
pub(crate) async fn open_pool(
    pool: sqlx::sqlite::SqlitePoolOptions,
    options: &SqliteConnectOptions,
) -> Result<SqlitePool, sqlx::Error> {
    open_busy(|| pool.clone().connect_with(options.clone())).await
}

/// Runs `open` again while SQLite answers busy at once. Processes starting
/// together on a file that does not exist yet each create it and set its
/// journal mode; SQLite refuses a lock that could deadlock at once, without
/// the busy timeout, so one of them can fail to open. Opened again a moment
/// later, it finds the file set up. A few seconds in all, as [`migrate`]
/// (`brokers_and_stores_creating_one_file_together_all_open_it`).
pub(crate) async fn open_busy<T, F>(mut open: impl FnMut() -> F) -> Result<T, sqlx::Error>
where
    F: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    const TRIES: u32 = 20;
    let mut tried = 1;
    loop {
        match open().await {
            Err(error) if tried < TRIES && is_busy(&error) => {
                debug!(%error, tried, "the database file is busy being set up; opening it again");
                let pause =
                    Duration::from_millis(20 * u64::from(tried)).min(Duration::from_millis(250));
                tokio::time::sleep(pause).await;
                tried += 1;
            }
            other => return other,
        }
    }
}

/// Whether `error` is SQLite's busy (`SQLITE_BUSY` or one of its extended
/// codes) or locked.
fn is_busy(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(error) = error else {
        return false;
    };
    let code = error.code().and_then(|code| code.parse::<i32>().ok());
    matches!(code.map(|code| code & 0xff), Some(5 | 6))
}

/// Brings the schema `migrator` describes up to date.
///
/// Processes starting together on one file migrate it at the same moment:
/// sqlx runs each migration in its own transaction, so the loser of a race
/// fails (a version already recorded, a table already there, the file
/// busy). Run again, it sees the winner's work. Retried with a growing
/// pause, a few seconds in all, so that a real problem still fails start-up
/// promptly (`stores_opening_one_fresh_file_together_all_migrate_it`).
pub(crate) async fn migrate(pool: &SqlitePool, migrator: &Migrator) -> Result<(), MigrateError> {
    const TRIES: u32 = 20;
    let mut tried = 1;
    loop {
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            Err(error) if tried < TRIES => {
                debug!(%error, tried, "migration failed; another process may be migrating; trying again");
                let pause =
                    Duration::from_millis(20 * u64::from(tried)).min(Duration::from_millis(250));
                tokio::time::sleep(pause).await;
                tried += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// The writer of one database file, shared by whoever opened it (the queue,
/// the store, or both).
pub(crate) struct FileWriter {
    jobs: mpsc::Sender<Job<QueuePart, StorePart>>,
    /// The writer task.
    tasks: TaskTracker,
    /// Woken after a commit that published or nacked, so that a pull in
    /// this process returns at once.
    pub(crate) available: Arc<Notify>,
    /// The registry's key; `None` for a private writer (in-memory).
    key: Option<PathBuf>,
    /// Users that have not closed it yet; guarded by the registry's lock.
    users: std::sync::atomic::AtomicUsize,
}

impl fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileWriter")
            .field("key", &self.key)
            .finish()
    }
}

/// Open writers by canonical path. Weak: a writer whose users are all gone
/// (dropped without closing) stops, and a later open starts a new one.
static REGISTRY: LazyLock<Mutex<HashMap<PathBuf, Weak<FileWriter>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

impl FileWriter {
    /// The writer of the file `options` name (which must exist), shared with
    /// whoever else of this process has it open.
    pub(crate) async fn open(options: &SqliteConnectOptions) -> Result<Arc<Self>, sqlx::Error> {
        let path = std::fs::canonicalize(options.get_filename())
            .unwrap_or_else(|_| options.get_filename().to_path_buf());
        let mut registry = REGISTRY.lock().await;
        if let Some(writer) = registry.get(&path).and_then(Weak::upgrade)
            && !writer.jobs.is_closed()
            && writer.users.load(std::sync::atomic::Ordering::Acquire) > 0
        {
            writer
                .users
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            return Ok(writer);
        }
        let own = WriterConnection::open(options.clone()).await?;
        let writer = Self::start(Source::Own(Box::new(own)), Some(path.clone()));
        registry.retain(|_, writer| writer.strong_count() > 0);
        registry.insert(path, Arc::downgrade(&writer));
        Ok(writer)
    }

    /// A writer of its own writing through `pool`'s one connection: an
    /// in-memory database exists once per connection.
    pub(crate) fn private(pool: SqlitePool) -> Arc<Self> {
        Self::start(Source::Pool(pool), None)
    }

    fn start(source: Source, key: Option<PathBuf>) -> Arc<Self> {
        let (jobs, receiver) = mpsc::channel(MAX_BATCH * 4);
        let available = Arc::new(Notify::new());
        let tasks = TaskTracker::new();
        tasks.spawn(write_loop(
            source,
            QueuePart::new(available.clone()),
            StorePart,
            receiver,
        ));
        tasks.close();
        Arc::new(Self {
            jobs,
            tasks,
            available,
            key,
            users: std::sync::atomic::AtomicUsize::new(1),
        })
    }

    /// Queues one job; `false` if the writer has stopped.
    ///
    /// A slot is reserved, then the job sent into it: `Sender::send` would
    /// hold a second copy of the job while it waits for room.
    pub(crate) async fn send(&self, job: Job<QueuePart, StorePart>) -> bool {
        let Ok(slot) = self.jobs.reserve().await else {
            return false;
        };
        slot.send(job);
        true
    }

    /// Where jobs are queued, for a caller that waits on them as
    /// [`crate::store::ask`] does; a writer that has stopped refuses them.
    pub(crate) fn jobs(&self) -> &mpsc::Sender<Job<QueuePart, StorePart>> {
        &self.jobs
    }

    /// One user is done with the writer: the last one stops it, after the
    /// jobs queued so far, and waits for it.
    pub(crate) async fn close(&self) {
        let last = match &self.key {
            Some(key) => {
                let mut registry = REGISTRY.lock().await;
                let last = self.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1;
                if last
                    && registry
                        .get(key)
                        .is_some_and(|w| std::ptr::eq(w.as_ptr(), self))
                {
                    registry.remove(key);
                }
                last
            }
            None => true,
        };
        if last {
            // Fails only if the writer already stopped, which is what we want.
            let _ = self.jobs.send(Job::Close).await;
            self.tasks.wait().await;
        }
    }
}

/// What the queue puts in a [`JointAck`](crate::domain::JointAck): the
/// delivery to ack, and the writer of its file. The store acks it in its
/// outcome's transaction only when it writes that same file.
#[derive(Debug, Clone)]
pub(crate) struct FileAck {
    writer: Weak<FileWriter>,
    claim: queue::Claim,
}

impl FileAck {
    fn new(writer: &Arc<FileWriter>, claim: queue::Claim) -> Self {
        Self {
            writer: Arc::downgrade(writer),
            claim,
        }
    }

    /// The delivery to ack, if the ack belongs to the file `writer` writes.
    fn claim_for(&self, writer: &Arc<FileWriter>) -> Option<queue::Claim> {
        std::ptr::eq(self.writer.as_ptr(), Arc::as_ptr(writer)).then_some(self.claim)
    }
}

#[cfg(test)]
mod tests;
