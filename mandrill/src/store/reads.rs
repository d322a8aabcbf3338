//! The reads both SQL stores make alike, and the one small write they make
//! inside other transactions (a decision), written once: the statements
//! are in [`super::sql`], and one macro expands these functions for each
//! driver (a generic version needs a bound for every type it decodes).
//!
//! The SQLite store calls `reads::sqlite::*`, the PostgreSQL store
//! `reads::postgres::*`, each with its pool.
//!
//! Past 400 lines as one piece: one macro body, expanded once per driver.

macro_rules! reads_for {
    ($driver:ident, $db:ty) => {
        pub(crate) mod $driver {
            use std::collections::BTreeMap;

            use sqlx::Pool;
            use uuid::Uuid;

            use crate::domain::RestartRequest;
            use crate::safety::limits::{Limits, Subject, Usage};
            use crate::store::history::{entry_from, group_usage_from, report_from, story_from};
            use crate::store::sql::{
                DEFERRALS_SQL, ENTRY_SQL, EntryRow, GROUP_DISRUPTED_SQL, GROUP_PAUSES_SQL,
                GROUP_RESTARTS_SQL, GroupPauseRow, HISTORY_SQL, IdentityRow, RECEIVED_AT_SQL,
                RECORD_REQUEST_SQL, RECOVERIES_SQL, REJECTED_ENTRY_SQL, REPORT_ATTEMPTS_SQL,
                REPORT_DECISIONS_SQL, STORY_ATTEMPTS_SQL, STORY_DECISIONS_SQL, SWITCH_SQL,
                SwitchRow, USAGE_SQL, USAGE_SUBJECT_SQL, identity_from,
            };
            use crate::store::{
                DECISION_SQL, DEFERRAL_SQL, Decision, GroupPause, GroupUsage, HistoryEntry,
                Recorded, ReportData, StoreError, Story, Switch, Timestamp, UsageRow, UsageStarts,
                UsageSubjectRow, group_pause_from, identity_conflict, switch_from, usage_binds,
                usage_from, usage_subject_from, within,
            };

            /// What the counting guards read for a claim of `request`, in
            /// the claim's own transaction (`conn`).
            pub(crate) async fn usage(
                conn: &mut <$db as sqlx::Database>::Connection,
                request: &RestartRequest,
                limits: &Limits,
                now: i64,
            ) -> Result<Usage, sqlx::Error> {
                let binds = usage_binds(limits, now);
                let subject = Subject::of(request);
                // Only what the limits use: a request without a zone or a
                // requester, or with those limits off, reads USAGE_SQL alone.
                let zone = subject.zone.filter(|_| limits.counts_zone(subject));
                let requester = subject
                    .requester
                    .filter(|_| limits.counts_requester(subject));
                if zone.is_none() && requester.is_none() {
                    let row: UsageRow = sqlx::query_as(USAGE_SQL)
                        .bind(request.group())
                        .bind(request.machine())
                        .bind(binds.window_start)
                        .bind(binds.memory_start)
                        .bind(binds.settled_after)
                        .fetch_one(conn)
                        .await?;
                    return Ok(usage_from(row));
                }
                let row: UsageSubjectRow = sqlx::query_as(USAGE_SUBJECT_SQL)
                    .bind(request.group())
                    .bind(request.machine())
                    .bind(binds.window_start)
                    .bind(binds.memory_start)
                    .bind(binds.settled_after)
                    .bind(zone)
                    .bind(requester)
                    .bind(binds.requester_start)
                    .fetch_one(conn)
                    .await?;
                Ok(usage_subject_from(row))
            }

            /// Records a guard's decision about a request (and counts it,
            /// if it deferred a delivery) in `conn`'s transaction. NUL
            /// becomes U+FFFD: PostgreSQL text cannot hold it.
            pub(crate) async fn insert_decision(
                conn: &mut <$db as sqlx::Database>::Connection,
                message_id: Uuid,
                attempt: u32,
                decision: Decision<'_>,
                now: i64,
            ) -> Result<(), sqlx::Error> {
                if decision.verdict == "deferred" {
                    sqlx::query(DEFERRAL_SQL)
                        .bind(message_id.to_string())
                        .execute(&mut *conn)
                        .await?;
                }
                sqlx::query(DECISION_SQL)
                    .bind(message_id.to_string())
                    .bind(now)
                    .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
                    .bind(decision.verdict)
                    .bind(decision.guard)
                    .bind(decision.reason.replace('\0', "\u{fffd}"))
                    .execute(conn)
                    .await?;
                Ok(())
            }

            /// See [`crate::store::Store::record_decision`]: in `conn`'s
            /// transaction, the request's row created if it has none, its
            /// identity read and judged ([`identity_conflict`]), and the
            /// decision recorded only if the row is the request's own.
            pub(crate) async fn record_decision(
                conn: &mut <$db as sqlx::Database>::Connection,
                request: &RestartRequest,
                attempt: u32,
                decision: Decision<'_>,
                now: i64,
            ) -> Result<Recorded, sqlx::Error> {
                // One statement: the row created if need be, and its
                // identity read back.
                let recorded: IdentityRow = sqlx::query_as(&RECORD_REQUEST_SQL)
                    .bind(request.message_id.to_string())
                    .bind(request.instance_name.as_str())
                    .bind(request.hostname.as_str())
                    .bind(request.requested_by.as_deref())
                    .bind(request.requester.as_deref())
                    .bind(request.reason.as_deref())
                    .bind(now)
                    .fetch_one(&mut *conn)
                    .await?;
                if let Some(conflict) = identity_conflict(&identity_from(recorded), request) {
                    return Ok(Recorded::Conflict(conflict));
                }
                insert_decision(conn, request.message_id, attempt, decision, now).await?;
                Ok(Recorded::Recorded)
            }

            /// See [`crate::store::Store::history`].
            pub(crate) async fn history(
                pool: &Pool<$db>,
                limit: usize,
            ) -> Result<Vec<HistoryEntry>, StoreError> {
                let rows: Vec<EntryRow> = sqlx::query_as(HISTORY_SQL)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(pool)
                    .await?;
                rows.into_iter().map(entry_from).collect()
            }

            /// See [`crate::store::Store::each_history`]: pages of
            /// [`HISTORY_PAGE_SQL`] in one read transaction (one snapshot;
            /// `setup` is the driver's statements that make it one), each
            /// page a statement bounded by `timeout`.
            pub(crate) async fn each_history(
                pool: &Pool<$db>,
                setup: &[&str],
                timeout: std::time::Duration,
                limit: usize,
                decisions: bool,
                each: crate::store::EachEntry<'_>,
            ) -> Result<(), StoreError> {
                use sqlx::{FromRow, Row};

                use crate::store::history::decision_from;
                use crate::store::sql::HISTORY_PAGE_SQL;
                // Small in tests, so that every store test reads pages.
                const PAGE: usize = if cfg!(test) { 7 } else { 1_000 };

                let mut tx = within(timeout, async {
                    let mut tx = pool.begin().await?;
                    for statement in setup {
                        sqlx::query(statement).execute(&mut *tx).await?;
                    }
                    Ok(tx)
                })
                .await?;
                let (mut told, mut after) = (0, (i64::MAX, i64::MAX));
                while told < limit {
                    let page = PAGE.min(limit - told);
                    let rows = within(timeout, async {
                        Ok(sqlx::query(HISTORY_PAGE_SQL)
                            .bind(after.0)
                            .bind(after.1)
                            .bind(i64::try_from(page).unwrap_or(i64::MAX))
                            .bind(decisions)
                            .fetch_all(&mut *tx)
                            .await?)
                    })
                    .await?;
                    let mut entries = 0;
                    let mut rows = rows.into_iter().peekable();
                    while let Some(row) = rows.next() {
                        let row_id: i64 = row.try_get(14)?;
                        let entry = entry_from(EntryRow::from_row(&row)?)?;
                        after = (entry.updated_at.as_millis(), row_id);
                        let mut decided = Vec::new();
                        let mut next = Some(row);
                        while let Some(row) = next {
                            if let Some(at) = row.try_get::<Option<i64>, _>(16)? {
                                decided.push(decision_from((
                                    at,
                                    row.try_get(17)?,
                                    row.try_get(18)?,
                                    row.try_get(19)?,
                                    row.try_get(20)?,
                                )));
                            }
                            next =
                                rows.next_if(|row| row.try_get::<i64, _>(14).ok() == Some(row_id));
                        }
                        entries += 1;
                        if !each(entry, decided) {
                            return Ok(());
                        }
                    }
                    told += entries;
                    if entries < page {
                        break;
                    }
                }
                Ok(())
            }

            /// See [`crate::store::Store::story`].
            pub(crate) async fn story(
                pool: &Pool<$db>,
                message_id: Uuid,
            ) -> Result<Option<Story>, StoreError> {
                let id = message_id.to_string();
                let mut row = sqlx::query_as::<_, EntryRow>(ENTRY_SQL)
                    .bind(&id)
                    .fetch_optional(pool)
                    .await?;
                if row.is_none() {
                    row = sqlx::query_as::<_, EntryRow>(REJECTED_ENTRY_SQL)
                        .bind(&id)
                        .fetch_optional(pool)
                        .await?;
                }
                let entry = row.map(entry_from).transpose()?;
                let attempts = sqlx::query_as(STORY_ATTEMPTS_SQL)
                    .bind(&id)
                    .fetch_all(pool)
                    .await?;
                let decisions = sqlx::query_as(STORY_DECISIONS_SQL)
                    .bind(&id)
                    .fetch_all(pool)
                    .await?;
                Ok(story_from(message_id, entry, attempts, decisions))
            }

            /// See [`crate::store::Store::record_campaign`].
            pub(crate) async fn record_campaign(
                pool: &Pool<$db>,
                campaign: &crate::store::Campaign,
            ) -> Result<(), StoreError> {
                let (id, group, created_at, requester, targets, ..) = campaign.to_row();
                sqlx::query(crate::store::campaigns::INSERT_CAMPAIGN_SQL)
                    .bind(id)
                    .bind(group)
                    .bind(created_at)
                    .bind(requester)
                    .bind(targets)
                    .execute(pool)
                    .await?;
                Ok(())
            }

            /// See [`crate::store::Store::stop_campaign`]: one
            /// transaction, its first statement a write (so that SQLite
            /// takes the write lock before it reads). Each target's row is
            /// created if missing, left alone if another request took its
            /// id first, marked unless final, then cancelled
            /// unless held by a claim; in message id order, so that two stops lock rows
            /// in one order.
            pub(crate) async fn stop_campaign(
                pool: &Pool<$db>,
                id: Uuid,
                by: &str,
                reason: &str,
            ) -> Result<Option<(crate::store::Campaign, Vec<Uuid>)>, StoreError> {
                use crate::store::campaigns::{
                    CAMPAIGN_SQL, CANCEL_TARGET_SQL, CampaignRow, MARK_TARGET_SQL,
                    STOP_CAMPAIGN_SQL, cancellation, target_identity,
                };
                let now = Timestamp::now().as_millis();
                let mut tx = pool.begin().await?;
                sqlx::query(STOP_CAMPAIGN_SQL)
                    .bind(id.to_string())
                    .bind(now)
                    .bind(by)
                    .bind(reason)
                    .execute(&mut *tx)
                    .await?;
                let row: Option<CampaignRow> = sqlx::query_as(CAMPAIGN_SQL)
                    .bind(id.to_string())
                    .fetch_optional(&mut *tx)
                    .await?;
                // No campaign: nothing written (the update matched no row).
                let Some(row) = row else { return Ok(None) };
                let campaign = crate::store::Campaign::from_row(row)?;
                let Some(stop) = &campaign.stopped else {
                    return Err(StoreError::Corrupt(format!(
                        "campaign {id} was not stopped"
                    )));
                };
                let words = cancellation(id, stop);
                let mut order: Vec<usize> = (0..campaign.targets.len()).collect();
                order.sort_by_key(|&index| campaign.targets[index].message_id);
                let mut cancelled = Vec::new();
                for index in order {
                    let message_id = campaign.targets[index].message_id.to_string();
                    let identity = target_identity(&campaign, index);
                    let recorded: IdentityRow = sqlx::query_as(&RECORD_REQUEST_SQL)
                        .bind(&message_id)
                        .bind(&identity.instance)
                        .bind(&identity.instance)
                        .bind(identity.requested_by.as_deref())
                        .bind(identity.requester.as_deref())
                        .bind(identity.reason.as_deref())
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await?;
                    // Another request took the target's id first: it is
                    // not the campaign's, and the stop leaves it alone.
                    if identity_from(recorded) != identity {
                        continue;
                    }
                    sqlx::query(&MARK_TARGET_SQL)
                        .bind(&message_id)
                        .bind(&words)
                        .execute(&mut *tx)
                        .await?;
                    let done = sqlx::query(&CANCEL_TARGET_SQL)
                        .bind(&message_id)
                        .bind(&words)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    if done.rows_affected() == 1 {
                        cancelled.push(campaign.targets[index].message_id);
                    }
                }
                tx.commit().await?;
                Ok(Some((campaign, cancelled)))
            }

            /// See [`crate::store::Store::decisions`].
            pub(crate) async fn decisions(
                pool: &Pool<$db>,
                message_id: Uuid,
            ) -> Result<Vec<crate::store::DecisionRecord>, StoreError> {
                let rows = sqlx::query_as(STORY_DECISIONS_SQL)
                    .bind(message_id.to_string())
                    .fetch_all(pool)
                    .await?;
                Ok(crate::store::history::decisions_from(rows))
            }

            /// See [`crate::store::Store::campaign`].
            pub(crate) async fn campaign(
                pool: &Pool<$db>,
                id: Uuid,
            ) -> Result<Option<crate::store::Campaign>, StoreError> {
                let row: Option<crate::store::campaigns::CampaignRow> =
                    sqlx::query_as(crate::store::campaigns::CAMPAIGN_SQL)
                        .bind(id.to_string())
                        .fetch_optional(pool)
                        .await?;
                row.map(crate::store::Campaign::from_row).transpose()
            }

            /// See [`crate::store::Store::group_usage`].
            pub(crate) async fn group_usage(
                pool: &Pool<$db>,
                starts: UsageStarts,
            ) -> Result<BTreeMap<String, GroupUsage>, StoreError> {
                let restarts = sqlx::query_as(GROUP_RESTARTS_SQL)
                    .bind(starts.window.as_millis())
                    .fetch_all(pool)
                    .await?;
                let disrupted = sqlx::query_as(GROUP_DISRUPTED_SQL)
                    .bind(starts.memory.as_millis())
                    .bind(starts.settled_after.as_millis())
                    .fetch_all(pool)
                    .await?;
                Ok(group_usage_from(restarts, disrupted))
            }

            /// See [`crate::store::Store::report`].
            pub(crate) async fn report(
                pool: &Pool<$db>,
                since: Timestamp,
            ) -> Result<ReportData, StoreError> {
                let attempts = sqlx::query_as(REPORT_ATTEMPTS_SQL)
                    .bind(since.as_millis())
                    .fetch_all(pool)
                    .await?;
                let decisions = sqlx::query_as(REPORT_DECISIONS_SQL)
                    .bind(since.as_millis())
                    .fetch_all(pool)
                    .await?;
                Ok(ReportData {
                    campaigns: campaigns_since(pool, since).await?,
                    ..report_from(attempts, decisions)?
                })
            }

            /// See [`crate::store::Store::campaigns_since`].
            pub(crate) async fn campaigns_since(
                pool: &Pool<$db>,
                since: Timestamp,
            ) -> Result<Vec<crate::store::Campaign>, StoreError> {
                let rows: Vec<crate::store::campaigns::CampaignRow> =
                    sqlx::query_as(crate::store::campaigns::CAMPAIGNS_SINCE_SQL)
                        .bind(since.as_millis())
                        .fetch_all(pool)
                        .await?;
                rows.into_iter()
                    .map(crate::store::Campaign::from_row)
                    .collect()
            }

            /// A request's `received_at`, which must have a row.
            pub(crate) async fn received_at(
                pool: &Pool<$db>,
                message_id: Uuid,
            ) -> Result<Timestamp, StoreError> {
                let (received,): (i64,) = sqlx::query_as(RECEIVED_AT_SQL)
                    .bind(message_id.to_string())
                    .fetch_one(pool)
                    .await?;
                Ok(Timestamp::from_millis(received))
            }

            /// See [`crate::store::Store::deferrals`].
            pub(crate) async fn deferrals(
                pool: &Pool<$db>,
                message_id: Uuid,
            ) -> Result<u32, StoreError> {
                let count: Option<i64> = sqlx::query_scalar(DEFERRALS_SQL)
                    .bind(message_id.to_string())
                    .fetch_optional(pool)
                    .await?;
                Ok(count.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)))
            }

            /// See [`crate::store::Store::switch`].
            pub(crate) async fn switch(pool: &Pool<$db>) -> Result<Switch, StoreError> {
                let row: SwitchRow = sqlx::query_as(SWITCH_SQL).fetch_one(pool).await?;
                Ok(switch_from(row))
            }

            /// See [`crate::store::Store::group_pauses`].
            pub(crate) async fn group_pauses(
                pool: &Pool<$db>,
            ) -> Result<Vec<GroupPause>, StoreError> {
                let rows: Vec<GroupPauseRow> =
                    sqlx::query_as(GROUP_PAUSES_SQL).fetch_all(pool).await?;
                Ok(rows.into_iter().map(group_pause_from).collect())
            }

            /// See [`crate::store::Store::recent_recoveries`].
            pub(crate) async fn recent_recoveries(
                pool: &Pool<$db>,
                group: &str,
                limit: u32,
            ) -> Result<Vec<Option<std::time::Duration>>, StoreError> {
                let rows: Vec<(Option<i64>,)> = sqlx::query_as(RECOVERIES_SQL)
                    .bind(group)
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(|(after,)| {
                        after.map(|ms| std::time::Duration::from_millis(ms.max(0).unsigned_abs()))
                    })
                    .collect())
            }
        }
    };
}

reads_for!(postgres, sqlx::Postgres);
reads_for!(sqlite, sqlx::Sqlite);

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

    use crate::domain::Timestamp;
    use crate::safety::limits::Limits;
    use crate::sqlite::SqliteStore;
    use crate::store::{ClaimTerms, Decision, Store, contract};

    /// The shared reads, through a pool of their own on a database the
    /// SQLite store wrote, read what the store reads (through them too);
    /// the claim's usage read and the shared decision insert agree with
    /// what the store tells.
    #[tokio::test]
    async fn the_shared_reads_read_what_the_sqlite_store_reads() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = SqliteStore::connect(&url, 2).await.unwrap();
        contract::all(&store).await;
        let pool = SqlitePool::connect_with(SqliteConnectOptions::from_str(&url).unwrap())
            .await
            .unwrap();
        let history = store.history(1000).await.unwrap();
        assert!(history.len() > 5);
        assert_eq!(super::sqlite::history(&pool, 1000).await.unwrap(), history);
        for entry in &history {
            let Some(id) = entry.message_id else { continue };
            assert_eq!(
                super::sqlite::story(&pool, id).await.unwrap(),
                store.story(id).await.unwrap()
            );
            assert_eq!(
                super::sqlite::deferrals(&pool, id).await.unwrap(),
                store.deferrals(id).await.unwrap()
            );
        }
        let since = Timestamp::from_millis(0);
        assert_eq!(
            super::sqlite::group_usage(&pool, crate::store::UsageStarts::since(since))
                .await
                .unwrap(),
            store
                .group_usage(crate::store::UsageStarts::since(since))
                .await
                .unwrap()
        );
        assert_eq!(
            super::sqlite::switch(&pool).await.unwrap(),
            store.switch().await.unwrap()
        );
        assert_eq!(
            super::sqlite::report(&pool, since).await.unwrap(),
            store.report(since).await.unwrap()
        );
        // The claim's read of the journal counts what group usage counts
        // (the contract pruned the journal: two claims in flight).
        let terms = ClaimTerms {
            max_attempts: 1,
            hold: Duration::from_secs(3600),
            limits: Limits::NONE,
        };
        let claimed = [
            contract::request("herd-0010"),
            contract::request("herd-0011"),
        ];
        for request in &claimed {
            store
                .claim_restart(request, terms, crate::store::ClaimToken::new())
                .await
                .unwrap();
        }
        let limits = Limits {
            window: Duration::from_secs(3600),
            forget_after: Duration::from_secs(3600),
            ..Limits::NONE
        };
        let now = Timestamp::now().as_millis();
        let mut conn = pool.acquire().await.unwrap();
        let usage = super::sqlite::usage(&mut conn, &contract::request("herd-0009"), &limits, now)
            .await
            .unwrap();
        let hour_ago = Timestamp::from_millis(now - 3_600_000);
        let groups = store
            .group_usage(crate::store::UsageStarts::since(hour_ago))
            .await
            .unwrap();
        assert_eq!(usage.group_claims, groups["herd"].restarts);
        assert_eq!(usage.group_claims, 2);
        let all: u32 = groups.values().map(|group| group.restarts).sum();
        assert_eq!(usage.global_claims, all);
        // A decision written through the shared insert is the store's own.
        let herd = &claimed[0];
        let decision = Decision {
            verdict: "deferred",
            guard: "calendar",
            reason: "closed until\0 monday",
        };
        for _ in 0..2 {
            super::sqlite::insert_decision(&mut conn, herd.message_id, 1, decision, now)
                .await
                .unwrap();
        }
        let story = store.story(herd.message_id).await.unwrap().unwrap();
        assert_eq!(story.decisions.len(), 1, "{:?}", story.decisions);
        assert_eq!(story.decisions[0].reason, "closed until\u{fffd} monday");
        assert_eq!(story.decisions[0].attempt, 1);
        assert_eq!(store.deferrals(herd.message_id).await.unwrap(), 2);
        drop(conn);
        pool.close().await;
        store.close().await;
    }
}
