//! (d) The PostgreSQL ceiling.

use std::time::Instant;

use crate::domain::RestartRequest;
use bytes::Bytes;

use super::{now_millis, parse, parse_rules, payloads};

/// Messages per PostgreSQL ceiling batch, as the store's writer batches.
const POSTGRES_BATCH: usize = 512;

/// (d) PostgreSQL: a database of its own with the store's schema (its
/// migrations, so its indexes), and `writers` loops, each on one
/// connection with the store's planner settings, over its share of the
/// messages in batches of 512: parse each; one transaction looks the batch
/// up (`JOIN unnest($1::text[])`, which uses the index) and writes the
/// receipts and claims (one `unnest` upsert) and the journal rows; a second
/// transaction (the restart sits between a claim and its outcome) records
/// the outcomes and settles the journal rows. Four statements and two
/// commits per batch.
pub(crate) async fn postgres(admin_url: &str, n: usize, writers: u32) -> f64 {
    use sqlx::postgres::PgConnectOptions;
    use std::str::FromStr as _;

    let database = crate::bench::throwaway_postgres::TestDatabase::create_on(
        admin_url,
        "mandrill_bench_ceiling",
    )
    .await;
    let options = PgConnectOptions::from_str(&database.url)
        .expect("postgres url")
        .options(crate::store::postgres::SESSION_SETTINGS);
    {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect_with(&options)
            .await
            .expect("ceiling database");
        crate::migrations::postgres()
            .run(&mut conn)
            .await
            .expect("ceiling schema");
        conn.close().await.expect("closes");
    }
    let payloads = payloads(n, false);
    let share = n.div_ceil(writers.max(1) as usize).max(1);
    let started = Instant::now();
    futures::future::join_all(
        payloads
            .chunks(share)
            .map(|share| postgres_writer(&options, share)),
    )
    .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    // The writers' connections are closed: the database can be dropped.
    drop(database);
    rate
}

async fn postgres_writer(options: &sqlx::postgres::PgConnectOptions, payloads: &[Bytes]) {
    use sqlx::Connection as _;

    let rules = parse_rules();
    let mut conn = sqlx::PgConnection::connect_with(options)
        .await
        .expect("ceiling connection");
    for batch in payloads.chunks(POSTGRES_BATCH) {
        let requests: Vec<RestartRequest> = batch.iter().map(|p| parse(p, &rules)).collect();
        let ids: Vec<String> = requests.iter().map(|r| r.message_id.to_string()).collect();
        let instances: Vec<&str> = requests.iter().map(|r| r.instance_name.as_str()).collect();
        let hosts: Vec<&str> = requests.iter().map(|r| r.hostname.as_str()).collect();
        let by: Vec<Option<&str>> = requests.iter().map(|r| r.requested_by.as_deref()).collect();
        let reasons: Vec<Option<&str>> = requests.iter().map(|r| r.reason.as_deref()).collect();
        let groups: Vec<&str> = requests.iter().map(|r| r.group()).collect();
        let now = now_millis();

        let mut tx = conn.begin().await.expect("begin");
        let found: Vec<(String, String, i32)> = sqlx::query_as(
            "SELECT r.message_id, r.status, r.attempts
             FROM requests r JOIN unnest($1::text[]) AS u(id) ON r.message_id = u.id",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .expect("lookup");
        assert!(found.is_empty(), "every message is new");
        sqlx::query(
            "INSERT INTO requests (message_id, instance_name, hostname, requested_by, reason,
                                   status, attempts, claim_until, received_at, updated_at)
             SELECT u.id, u.instance, u.host, u.by, u.reason, 'received', 1, $6, $7, $7
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                  AS u(id, instance, host, by, reason)
             ON CONFLICT (message_id) DO UPDATE SET
                 attempts = requests.attempts + 1, claim_until = excluded.claim_until,
                 updated_at = excluded.updated_at",
        )
        .bind(&ids)
        .bind(&instances)
        .bind(&hosts)
        .bind(&by)
        .bind(&reasons)
        .bind(now + 60_000)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("receipts and claims");
        sqlx::query(
            "INSERT INTO restarts (message_id, attempt, instance_name, grp, claimed_at, verdict)
             SELECT u.id, 1, u.instance, u.grp, $4, 'allowed'
             FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, instance, grp)",
        )
        .bind(&ids)
        .bind(&instances)
        .bind(&groups)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("journal");
        tx.commit().await.expect("claims commit");

        let mut tx = conn.begin().await.expect("begin");
        sqlx::query(
            "UPDATE requests SET status = 'restarted', claim_until = NULL, updated_at = $2,
                                 completed_at = $2
             FROM unnest($1::text[]) AS u(id)
             WHERE requests.message_id = u.id
               AND requests.status NOT IN ('restarted', 'failed', 'rejected')",
        )
        .bind(&ids)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("outcomes");
        sqlx::query(
            "UPDATE restarts SET outcome = 'restarted', settled_at = $2
             FROM unnest($1::text[]) AS u(id)
             WHERE restarts.message_id = u.id AND restarts.attempt = 1
               AND restarts.outcome IS NULL",
        )
        .bind(&ids)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("journal settled");
        tx.commit().await.expect("outcomes commit");
    }
    conn.close().await.expect("closes");
}
