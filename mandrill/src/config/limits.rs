//! Upper and lower bounds of the settings, so that no value can make the
//! service panic or allocate without limit. Each says why.

use std::time::Duration;

/// Longest duration of any setting (see [`crate::settings::duration::MAX`]).
pub(crate) const MAX_DURATION: Duration = crate::settings::duration::MAX;
/// Longest `store.retention`.
pub(crate) const MAX_RETENTION: Duration = crate::settings::duration::long::MAX;
/// Shortest lease (`broker.ack_deadline`). A lease is extended every
/// third of it, and the extension must reach the broker (a SQLite group
/// commit with its fsync, a NATS round trip) before the lease runs out:
/// below a second, one slow fsync or scheduling stall lets a lease lapse
/// while its restart runs, and another consumer restarts the host again.
pub(crate) const MIN_ACK_DEADLINE: Duration = Duration::from_secs(1);
/// Most messages in flight: each holds a task and a lease, and the flow
/// control semaphore cannot count past `usize::MAX >> 3`.
pub(crate) const MAX_IN_FLIGHT: usize = 1_000_000;
/// Most messages asked for in one pull (brokers size buffers by it).
pub(crate) const MAX_PULL_BATCH: usize = 10_000;
/// Largest database pool: the pool sets up a slot per connection up
/// front, and PostgreSQL's own default limit is 100 connections.
pub(crate) const MAX_CONNECTIONS: u32 = 1_000;
/// Shortest `store.timeout`: below a second, one slow fsync or a busy
/// PostgreSQL fails calls that would have succeeded.
pub(crate) const MIN_STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest `store.timeout`: a store that has not answered in an hour is
/// not answering, and shutdown waits up to three of these.
pub(crate) const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Most `store.writers`.
pub(crate) const MAX_STORE_WRITERS: u32 = 64;
/// Most blocking restarts at once: tokio's blocking pool has 512 threads.
pub(crate) const MAX_BLOCKING_THREADS: usize = 512;
/// Largest payload accepted: NATS's own maximum `max_payload` (64 MiB).
pub(crate) const MAX_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Fastest demo publisher, per second.
pub(crate) const MAX_SIMULATE_RATE: f64 = 1_000_000.0;
/// Shortest stall threshold: a zero one counts every poll as a stall.
pub(crate) const MIN_STALL_THRESHOLD: Duration = Duration::from_millis(1);
