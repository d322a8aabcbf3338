//! (b) The SQLite ceiling.

use std::time::{Duration, Instant};

use super::{now_millis, parse, parse_rules, payloads};

/// The SQLite ceiling's tables: the shapes of the queue's and the store's
/// (columns, keys, indexes), without `AUTOINCREMENT` and with no JSON on
/// the hot path, as the real writer must write.
pub(super) const SQLITE_SCHEMA: &str = "
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
CREATE INDEX requests_completed_at ON requests (completed_at) WHERE completed_at IS NOT NULL;
CREATE TABLE restarts (
    message_id TEXT NOT NULL, attempt INTEGER NOT NULL, instance_name TEXT NOT NULL,
    grp TEXT NOT NULL, claimed_at INTEGER NOT NULL, outcome TEXT, settled_at INTEGER,
    verdict TEXT NOT NULL, PRIMARY KEY (message_id, attempt)
);
CREATE INDEX restarts_group ON restarts (grp, claimed_at);
CREATE INDEX restarts_host ON restarts (instance_name, claimed_at);
CREATE INDEX restarts_claimed ON restarts (claimed_at);
";

/// The writer's checkpoint interval (`crate::sqlite::WAL_AUTOCHECKPOINT_PAGES`,
/// crate-private): the ceilings must checkpoint as often as the writer.
pub(super) const WAL_AUTOCHECKPOINT_PAGES: i64 = 4000;

/// Messages a ceiling transaction takes, as the queue's writer batches.
pub(super) const SQLITE_BATCH: usize = 1024;

/// How a SQLite ceiling commits its batch.
#[derive(Clone, Copy)]
pub(crate) enum Commits {
    /// (b): the batch's whole work in one transaction.
    One,
    /// (b) with the pipeline's durable steps: the pull's lease, then the
    /// receipts and claims (durable before any restart is issued), then
    /// the outcomes with their acks, each committed before the next.
    Three,
}

/// (b) SQLite: one writer (rusqlite, on a thread of its own) on a fresh
/// file with the real writer's pragmas (WAL, `synchronous = FULL`, 10 s busy
/// timeout, its checkpoint interval). The queue is filled first, untimed, as the pipeline's is; then
/// each batch takes up to 1024 visible messages and, for each, parses
/// it and writes its receipt (the request row), its claim (attempt counted,
/// claim deadline, journal row), its outcome (request and journal row
/// settled) and its ack (the queue row deleted), with prepared statements
/// of one row each; `commits` says how the batch is committed.
pub(crate) async fn sqlite(n: usize, dir: &std::path::Path, commits: Commits) -> f64 {
    let path = dir.join(match commits {
        Commits::One => "ceiling.db",
        Commits::Three => "ceiling-durable.db",
    });
    tokio::task::spawn_blocking(move || sqlite_blocking(n, &path, commits))
        .await
        .expect("the SQLite ceiling finishes")
}

fn sqlite_blocking(n: usize, path: &std::path::Path, commits: Commits) -> f64 {
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
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
        .expect("wal_autocheckpoint");
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
            for payload in payloads(n, false) {
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
        let mut tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        let batch: Vec<(i64, Vec<u8>)> = match commits {
            Commits::One => tx.prepare_cached(
                "SELECT id, payload FROM queue WHERE visible_at <= ?1 ORDER BY visible_at LIMIT ?2",
            ),
            // Leased as the broker's pull leases: counted and hidden.
            Commits::Three => tx.prepare_cached(
                "UPDATE queue SET deliveries = deliveries + 1, lease = deliveries + 1,
                                  visible_at = ?1 + 60000
                 WHERE id IN (SELECT id FROM queue WHERE visible_at <= ?1
                              ORDER BY visible_at LIMIT ?2)
                 RETURNING id, payload",
            ),
        }
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
        if let Commits::Three = commits {
            tx.commit().expect("the pull commits");
            tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
        }
        let mut claimed = Vec::with_capacity(batch.len());
        for (queue_id, payload) in &batch {
            let request = parse(payload, &rules);
            let id = request.message_id.to_string();
            let attempt = receipt_and_claim(&tx, &id, &request, now);
            if let Commits::One = commits {
                outcome_and_ack(&tx, &id, attempt, *queue_id, now);
            } else {
                claimed.push((id, attempt, *queue_id));
            }
        }
        if let Commits::Three = commits {
            tx.commit().expect("the claims commit");
            tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
            for (id, attempt, queue_id) in &claimed {
                outcome_and_ack(&tx, id, *attempt, *queue_id, now);
            }
        }
        tx.commit().expect("commit");
        done += batch.len();
    }
    assert_eq!(done, n);
    n as f64 / started.elapsed().as_secs_f64()
}

/// The receipt (the request row) and the claim (attempt counted, claim
/// deadline, journal row); the attempt claimed.
fn receipt_and_claim(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    request: &crate::domain::RestartRequest,
    now: i64,
) -> i64 {
    use rusqlite::params;

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
    attempt
}

/// The outcome (request and journal row settled) and the ack (the queue
/// row deleted).
fn outcome_and_ack(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    attempt: i64,
    queue_id: i64,
    now: i64,
) {
    use rusqlite::params;

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
