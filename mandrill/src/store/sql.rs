//! The statements every SQL store runs alike, written once.
//!
//! Parameters are written `$n`: PostgreSQL's form, which sqlx's SQLite
//! driver binds by number too.
//!
//! One statement per concern, shared by both SQL stores, so one file past
//! 400 lines.

use std::sync::LazyLock;

use crate::domain::Status;

/// Whether the latest issued journal row `r` of a host (`latest_issued!`)
/// still counts it as disrupted: a restart in flight or ended without a
/// verified recovery, or one ended `restarted` later than the parameter
/// `$settled` (the settle: without a probe, "restarted" means issued, not
/// back). One rule for the group's budget, the zone's and the status's
/// count.
macro_rules! disrupting {
    ($settled:literal) => {
        concat!(
            "(r.outcome IS NULL OR r.outcome NOT IN ('restarted', 'dry-run', 'expired', 'denied')
          OR (r.outcome = 'restarted' AND r.settled_at > ",
            $settled,
            "))"
        )
    };
}

/// Whether journal row `r` is its host's latest *issued* claim (an
/// attempt whose outcome is not in, or that issued a restart). A dry run,
/// a denial or an expiry issued nothing, so it never hides an earlier
/// restart that still disrupts the host; a released claim has no row. One
/// rule for the group's budget, the zone's and the status's count.
macro_rules! latest_issued {
    () => {
        "r.claimed_at = (SELECT MAX(x.claimed_at) FROM restarts x
                            WHERE x.instance_name = r.instance_name
                              AND (x.outcome IS NULL
                                   OR x.outcome NOT IN ('dry-run', 'expired', 'denied')))"
    };
}

/// The columns of [`USAGE_SQL`], which [`USAGE_SUBJECT_SQL`] extends.
macro_rules! usage_columns {
    () => {
        concat!(
            "SELECT
    (SELECT COUNT(*) FROM restarts WHERE grp = $1 AND claimed_at > $3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MIN(claimed_at) FROM restarts WHERE grp = $1 AND claimed_at > $3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT COUNT(*) FROM restarts WHERE claimed_at > $3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MIN(claimed_at) FROM restarts WHERE claimed_at > $3
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MAX(claimed_at) FROM restarts WHERE instance_name = $2
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT COUNT(DISTINCT r.instance_name) FROM restarts r
      WHERE r.grp = $1 AND r.instance_name <> $2 AND r.claimed_at > $4
        AND ",
            latest_issued!(),
            " AND ",
            disrupting!("$5"),
            ")"
        )
    };
}

/// What the counting guards read in the claim's transaction, in one
/// statement: `$1` group, `$2` instance, `$3` start of the rate window,
/// `$4` start of the budget's memory, `$5` the settle's start
/// ([`UsageBinds`](super::UsageBinds)). The claim being decided has no
/// journal row yet. Read as [`UsageRow`](super::UsageRow).
///
/// No row is left out for being later than this claim's `now`. A claim
/// reads its clock once the guards' locks are held (the writer's `BEGIN
/// IMMEDIATE`, the advisory locks), so its stamp is never earlier than it
/// takes effect; clocks of several instances still differ, and a row
/// stamped later by another instance counts: the host's cooldown runs from
/// it (a later stamp only holds the host longer).
pub(crate) const USAGE_SQL: &str = usage_columns!();

/// [`USAGE_SQL`] and what the zone budget and the requester quota read,
/// for a request they apply to (one with a zone, or a requester; the other
/// is bound NULL and matches no row): `$6` zone, `$7` requester, `$8`
/// start of the requester's window. The zone's disrupted hosts are other
/// hosts, of any group, whose latest issued row is in the zone and
/// disrupting as for the group's budget; the requester's claims exclude
/// the same outcomes as the rate limits. Read as
/// [`UsageSubjectRow`](super::UsageSubjectRow). A separate statement, so
/// that a request neither applies to reads no more than before.
pub(crate) const USAGE_SUBJECT_SQL: &str = concat!(
    usage_columns!(),
    ",
    (SELECT COUNT(DISTINCT r.instance_name) FROM restarts r
      WHERE r.zone = $6 AND r.instance_name <> $2 AND r.claimed_at > $4
        AND ",
    latest_issued!(),
    " AND ",
    disrupting!("$5"),
    "),
    (SELECT COUNT(*) FROM restarts WHERE requester = $7 AND claimed_at > $8
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))),
    (SELECT MIN(claimed_at) FROM restarts WHERE requester = $7 AND claimed_at > $8
        AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied')))"
);

/// Where the claims that hold a host are found: journal rows `r` whose
/// outcome is not in, of a request `q` whose hold (`claim_until`, lifted
/// when the latest attempt's outcome is recorded) ends after `{now}`. A
/// claim whose handler died stops holding the host when its hold ends, as
/// it stops holding its own request. Found through `restarts_host`
/// (`instance_name, claimed_at`): a host has few journal rows.
pub(crate) fn held_hosts_where(now: &str) -> String {
    format!(
        "FROM restarts r JOIN requests q ON q.message_id = r.message_id
         WHERE r.outcome IS NULL AND q.claim_until > {now}"
    )
}

/// The claims that hold the hosts of the array `$1` ([`held_hosts_where`],
/// `$2` now), as [`HeldRow`]: the PostgreSQL store's read (the SQLite
/// store folds the same read into its read of the claims' rows).
pub(crate) static HELD_HOSTS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT r.instance_name, r.message_id, q.claim_until {}
           AND r.instance_name IN (SELECT unnest($1::text[]))",
        held_hosts_where("$2")
    )
});

/// A row of [`HELD_HOSTS_SQL`]: host, message id, end of its hold.
pub(crate) type HeldRow = (String, String, i64);

/// Records a decision unless it repeats the request's latest one (a
/// request deferred a hundred times by the same closed window tells it
/// once), and at most 100 per request. `$1` message id, `$2` at, `$3`
/// attempt, `$4` verdict, `$5` guard, `$6` reason.
pub(crate) const DECISION_SQL: &str = "INSERT INTO decisions
        (message_id, at, attempt, verdict, guard, reason)
    SELECT $1, $2, $3, $4, $5, $6
    WHERE NOT EXISTS (
            SELECT 1 FROM (SELECT verdict, guard, reason FROM decisions
                           WHERE message_id = $1 ORDER BY id DESC LIMIT 1) AS latest
            WHERE latest.verdict = $4 AND latest.guard = $5 AND latest.reason = $6)
      AND (SELECT COUNT(*) FROM decisions WHERE message_id = $1) < 100";

/// Counts one deferred delivery of a request: `$1` message id.
pub(crate) const DEFERRAL_SQL: &str = "INSERT INTO deferrals (message_id, count) VALUES ($1, 1)
    ON CONFLICT (message_id) DO UPDATE SET count = deferrals.count + 1";

/// Restarts per group since `$1`, for [`super::Store::group_usage`].
pub(crate) const GROUP_RESTARTS_SQL: &str = "SELECT grp, COUNT(*) FROM restarts
    WHERE claimed_at > $1 AND (outcome IS NULL OR outcome NOT IN ('dry-run', 'expired', 'denied'))
    GROUP BY grp";

/// Disrupted hosts per group (as [`USAGE_SQL`] counts them) among the
/// journal rows since `$1`, still settling if restarted after `$2`.
pub(crate) const GROUP_DISRUPTED_SQL: &str = concat!(
    "SELECT r.grp, COUNT(DISTINCT r.instance_name)
    FROM restarts r
    WHERE r.claimed_at > $1 AND ",
    latest_issued!(),
    " AND ",
    disrupting!("$2"),
    "
    GROUP BY r.grp"
);

/// A request's journal rows, for [`super::Story`]: `$1` message id.
pub(crate) const STORY_ATTEMPTS_SQL: &str = "SELECT CAST(attempt AS BIGINT), grp, claimed_at,
        verdict, outcome, settled_at, requester
    FROM restarts WHERE message_id = $1 ORDER BY attempt";

/// A request's decisions, for [`super::Story`]: `$1` message id.
pub(crate) const STORY_DECISIONS_SQL: &str = "SELECT at, CAST(attempt AS BIGINT), verdict, guard,
        reason
    FROM decisions WHERE message_id = $1 ORDER BY id";

/// A row of [`STORY_ATTEMPTS_SQL`].
pub(crate) type AttemptRow = (
    i64,
    String,
    i64,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
);

/// A row of [`STORY_DECISIONS_SQL`].
pub(crate) type DecisionRow = (i64, i64, String, String, String);

/// The journal's rows claimed at `$1` or later, for
/// [`super::Store::report`], as [`ReportAttemptRow`]. The request's
/// recovery time and last error belong to its latest attempt, so only
/// that attempt's row carries them. The instance is the one asked for (the
/// journal's is the machine counted: an alias's first name).
pub(crate) const REPORT_ATTEMPTS_SQL: &str = "SELECT r.message_id, CAST(r.attempt AS BIGINT),
        COALESCE(q.instance_name, r.instance_name), r.grp, COALESCE(r.requester, q.requested_by), r.claimed_at, r.outcome,
        r.settled_at,
        CASE WHEN r.attempt = q.attempts THEN q.recovered_after_ms END,
        CASE WHEN r.attempt = q.attempts THEN q.last_error END,
        COALESCE(r.outcome IS NULL AND (r.attempt < q.attempts OR q.completed_at IS NOT NULL),
                 FALSE)
    FROM restarts r LEFT JOIN requests q ON q.message_id = r.message_id
    WHERE r.claimed_at >= $1
    ORDER BY r.claimed_at, r.message_id, r.attempt";

/// The decisions recorded at `$1` or later, for [`super::Store::report`],
/// as [`ReportDecisionRow`], with the request's host, requester and the
/// group of its latest claimed attempt where they are known.
pub(crate) const REPORT_DECISIONS_SQL: &str = "SELECT d.message_id, d.at, d.verdict, d.guard,
        d.reason, q.instance_name, q.requested_by,
        (SELECT r.grp FROM restarts r WHERE r.message_id = d.message_id
         ORDER BY r.attempt DESC LIMIT 1),
        q.requester
    FROM decisions d LEFT JOIN requests q ON q.message_id = d.message_id
    WHERE d.at >= $1
    ORDER BY d.at, d.id";

/// A row of [`REPORT_ATTEMPTS_SQL`]: message id, attempt, instance, group,
/// requester, claimed, outcome, settled, recovery (ms), last error,
/// whether its outcome was lost.
pub(crate) type ReportAttemptRow = (
    String,
    i64,
    String,
    String,
    Option<String>,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    bool,
);

/// A row of [`REPORT_DECISIONS_SQL`]: message id, at, verdict, guard,
/// reason, instance, requested by, group, verified requester.
pub(crate) type ReportDecisionRow = (
    String,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The columns of a history entry after its id, in the order of
/// [`EntryRow`]; `attempts` cast so that both drivers read 64 bits.
macro_rules! entry_columns {
    () => {
        "instance_name, hostname, requested_by, reason, status, CAST(attempts AS BIGINT),
        last_error, output, recovered_after_ms, received_at, updated_at, completed_at,
        requester"
    };
}

/// The most recently updated entries, newest first: `$1` how many. A
/// rejection shows the id salvaged from its payload, if any.
pub(crate) const HISTORY_SQL: &str = concat!(
    "SELECT COALESCE(message_id, rejected_id), ",
    entry_columns!(),
    " FROM requests ORDER BY updated_at DESC, id DESC LIMIT $1"
);

/// A page of the history read whole (`history`, `history --json`): the
/// entries [`HISTORY_SQL`] lists after the last one told (`$1` its
/// `updated_at`, `$2` its row id; `i64::MAX` for the first page), at most
/// `$3` of them, each on one row per decision (`$4`: whether to join them;
/// as recorded) or on one row without. Decisions go to a request's own
/// record, never to a payload rejected under its id. Columns: an
/// [`EntryRow`], the row id, then a [`DecisionRow`] or nulls.
pub(crate) const HISTORY_PAGE_SQL: &str = concat!(
    "SELECT q.*, d.at, CAST(d.attempt AS BIGINT), d.verdict, d.guard, d.reason FROM (",
    "SELECT COALESCE(message_id, rejected_id) AS shown_id, ",
    entry_columns!(),
    ", id AS row_id, message_id AS own_id FROM requests
        WHERE updated_at <= $1 AND (updated_at < $1 OR id < $2)
        ORDER BY updated_at DESC, id DESC LIMIT $3) q
    LEFT JOIN decisions d ON $4 AND d.message_id = q.own_id
    ORDER BY q.updated_at DESC, q.row_id DESC, d.id"
);

/// One request's entry: `$1` message id.
pub(crate) const ENTRY_SQL: &str = concat!(
    "SELECT message_id, ",
    entry_columns!(),
    " FROM requests WHERE message_id = $1"
);

/// The latest rejected payload that gave `$1` as its id, when no request
/// has it: `mandrill explain` tells a rejection's story too. Asked only
/// after [`ENTRY_SQL`] found nothing, so that the common read stays on the
/// `message_id` index.
pub(crate) const REJECTED_ENTRY_SQL: &str = concat!(
    "SELECT rejected_id, ",
    entry_columns!(),
    " FROM requests WHERE message_id IS NULL AND rejected_id = $1 ORDER BY id DESC LIMIT 1"
);

/// A row of [`HISTORY_SQL`], [`ENTRY_SQL`] or [`REJECTED_ENTRY_SQL`]: message id, instance,
/// host, requested by, reason, status, attempts, last error, output,
/// recovery (ms), received, updated, completed, verified requester.
pub(crate) type EntryRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
    Option<String>,
);

/// A request's deferred deliveries: `$1` message id.
pub(crate) const DEFERRALS_SQL: &str =
    "SELECT CAST(count AS BIGINT) FROM deferrals WHERE message_id = $1";

/// The control row: the kill switch and the leash, as [`SwitchRow`].
pub(crate) const SWITCH_SQL: &str = "SELECT paused, by_whom, reason, updated_at, \
     leashed, leash_by, leash_reason, leash_updated_at FROM control WHERE id = 1";

/// Turns the kill switch: `$1` paused, `$2` by whom, `$3` why, `$4` now.
pub(crate) const SET_SWITCH_SQL: &str =
    "UPDATE control SET paused = $1, by_whom = $2, reason = $3, updated_at = $4 WHERE id = 1";

/// Turns the kill switch as [`SET_SWITCH_SQL`] does (`$1`–`$4`), only if
/// `paused` is `$5` and, when `$5` is true, `by_whom` is `$6`.
pub(crate) const SET_SWITCH_IF_SQL: &str = "UPDATE control SET paused = $1, by_whom = $2, reason = $3, updated_at = $4 \
     WHERE id = 1 AND paused = $5 AND (NOT $5 OR by_whom = $6)";

/// Turns the leash for every instance: `$1` leashed, `$2` by whom, `$3`
/// why, `$4` now.
pub(crate) const SET_LEASH_SQL: &str = "UPDATE control SET leashed = $1, leash_by = $2, \
     leash_reason = $3, leash_updated_at = $4 WHERE id = 1";

/// A row of [`SWITCH_SQL`]: paused, by whom, why, since (ms); then the
/// leash (`NULL` until an operator turned it), by whom, why, since (ms).
pub(crate) type SwitchRow = (
    bool,
    Option<String>,
    Option<String>,
    i64,
    Option<bool>,
    Option<String>,
    Option<String>,
    i64,
);

/// Every group pause, as [`GroupPauseRow`].
pub(crate) const GROUP_PAUSES_SQL: &str =
    "SELECT grp, by_whom, reason, since FROM group_pauses ORDER BY grp";

/// The pause of group `$1`, if any, as [`GroupPauseRow`].
pub(crate) const GROUP_PAUSE_SQL: &str =
    "SELECT grp, by_whom, reason, since FROM group_pauses WHERE grp = $1";

/// A row of [`GROUP_PAUSES_SQL`]: group, by whom, why, since (ms).
pub(crate) type GroupPauseRow = (String, String, String, i64);

/// Pauses group `$1` unless it is paused already (the first cause stays):
/// `$2` by whom, `$3` why, `$4` now.
pub(crate) const PAUSE_GROUP_SQL: &str = "INSERT INTO group_pauses (grp, by_whom, reason, since)
    VALUES ($1, $2, $3, $4) ON CONFLICT (grp) DO NOTHING";

/// Lifts the pause of group `$1`.
pub(crate) const RESUME_GROUP_SQL: &str = "DELETE FROM group_pauses WHERE grp = $1";

/// The last `$2` verified restarts of group `$1`, newest claim first: the
/// time the host took to come back, or NULL if it never did
/// (`unrecovered`). A restart nobody probed has no recovery time and is
/// not one of them.
pub(crate) const RECOVERIES_SQL: &str = "SELECT r.recovered_after_ms
    FROM restarts j JOIN requests r ON r.message_id = j.message_id
    WHERE j.grp = $1
      AND (j.outcome = 'unrecovered'
           OR (j.outcome = 'restarted' AND r.recovered_after_ms IS NOT NULL))
    ORDER BY j.claimed_at DESC LIMIT $2";

/// Records a payload dead-lettered (malformed, or refused for another
/// request's id): `$1` the id read from it (or NULL), `$2` why, `$3` an
/// excerpt, `$4` now; what it asked, as far as it was read: `$5` instance,
/// `$6` requested by, `$7` reason, `$8` the signer if verified.
pub(crate) const REJECTION_SQL: &str = "INSERT INTO requests
         (rejected_id, status, attempts, last_error, payload, received_at, updated_at, completed_at,
          instance_name, requested_by, reason, requester)
     VALUES ($1, 'rejected', 1, $2, $3, $4, $4, $4, $5, $6, $7, $8)";

/// The outcomes of attempts that issued no restart, so count against no
/// limit: the statements above list them by name (`('dry-run', 'expired',
/// 'denied')`; a test holds them to this), the memory store reads this.
pub(crate) const NOT_ISSUED: [Status; 3] = Status::NOT_ISSUED;

/// The statuses that no later outcome replaces, as an SQL list
/// (`('restarted', 'failed', …)`), derived from [`Status::is_final`].
pub(crate) static FINAL_STATUSES: LazyLock<String> =
    LazyLock::new(|| sql_list(Status::ALL.into_iter().filter(|s| s.is_final())));

/// The statuses a request may still change from: the rest.
pub(crate) static OPEN_STATUSES: LazyLock<String> =
    LazyLock::new(|| sql_list(Status::ALL.into_iter().filter(|s| !s.is_final())));

fn sql_list(statuses: impl Iterator<Item = Status>) -> String {
    let names: Vec<String> = statuses.map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", names.join(", "))
}

/// Gives back a claimed attempt that was never issued, when it is the
/// latest claim, still held, of a request not final, made with the
/// claiming call's token: `$1` message id, `$2` attempt, `$3` now, `$4`
/// the token. Returns a row when it did.
pub(crate) static RELEASE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE requests SET attempts = attempts - 1, claim_until = NULL, updated_at = $3
         WHERE message_id = $1 AND attempts = $2 AND $2 > 0 AND claim_until IS NOT NULL
           AND claim_token = $4 AND status IN {}
         RETURNING 1",
        *OPEN_STATUSES
    )
});

/// The journal row of a claim [`RELEASE_SQL`] gave back: `$1` message id,
/// `$2` attempt.
pub(crate) const RELEASE_JOURNAL_SQL: &str =
    "DELETE FROM restarts WHERE message_id = $1 AND attempt = $2 AND outcome IS NULL";

/// Creates a request's row if it has none: `$1` id, `$2` instance, `$3`
/// host, `$4` requested by, `$5` requester (verified signer), `$6`
/// reason, `$7` now. Cast, so that both drivers bind alike.
pub(crate) static INSERT_REQUEST_SQL: LazyLock<String> = LazyLock::new(|| {
    insert_requests(
        "SELECT CAST($1 AS TEXT) AS id, CAST($2 AS TEXT) AS instance_name,
                CAST($3 AS TEXT) AS hostname, CAST($4 AS TEXT) AS requested_by,
                CAST($5 AS TEXT) AS requester, CAST($6 AS TEXT) AS reason,
                CAST($7 AS BIGINT) AS at",
    )
});

/// [`INSERT_REQUEST_SQL`], answering in the same statement who asked and
/// for what as the row records it ([`IdentityRow`]): the row it created,
/// or the one there already, which a no-op update returns (the one way an
/// upsert returns an existing row on both drivers).
pub(crate) static RECORD_REQUEST_SQL: LazyLock<String> = LazyLock::new(|| {
    let upsert = INSERT_REQUEST_SQL.replace(
        "ON CONFLICT (message_id) DO NOTHING",
        "ON CONFLICT (message_id) DO UPDATE SET message_id = excluded.message_id
         RETURNING instance_name, requested_by, requester, reason",
    );
    assert_ne!(
        upsert, *INSERT_REQUEST_SQL,
        "the upsert's tail is where it was"
    );
    upsert
});

/// A row of [`RECORD_REQUEST_SQL`]: instance, requested by, requester,
/// reason.
pub(crate) type IdentityRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A request's identity from the columns it is stored in.
pub(crate) fn identity_from(
    (instance, requested_by, requester, reason): IdentityRow,
) -> super::Identity {
    super::Identity {
        instance: instance.unwrap_or_default(),
        requested_by,
        requester,
        reason,
    }
}

/// A request's `received_at`: `$1` message id.
pub(crate) const RECEIVED_AT_SQL: &str = "SELECT received_at FROM requests WHERE message_id = $1";

/// Creates the rows of requests that have none. `rows` is a `SELECT` that
/// names its columns `id`, `instance_name`, `hostname`, `requested_by`,
/// `requester` (the verified signer, or NULL), `reason` and `at` (when
/// received); each driver builds it from its own kind of batch (`unnest`
/// arrays, `json_each`, plain parameters).
pub(crate) fn insert_requests(rows: &str) -> String {
    // `WHERE true`: without it SQLite reads `ON CONFLICT` as a join's.
    format!(
        "INSERT INTO requests
             (message_id, instance_name, hostname, requested_by, requester, reason, status,
              attempts, received_at, updated_at)
         SELECT new.id, new.instance_name, new.hostname, new.requested_by, new.requester,
                new.reason, 'received', 0, new.at, new.at
         FROM ({rows}) AS new WHERE true
         ON CONFLICT (message_id) DO NOTHING"
    )
}

/// Writes claimed attempts into the restart journal (a claim given back
/// and claimed again replaces its row). `rows` is a `SELECT` that names its
/// columns `id`, `attempt`, `instance_name` (the machine the counting
/// guards count: `RestartRequest::machine`, an alias's first name), `grp`, `zone`, `requester`
/// (the request's, NULL when it has none), `verdict` and `at` (when
/// claimed).
pub(crate) fn upsert_journal(rows: &str) -> String {
    format!(
        "INSERT INTO restarts
             (message_id, attempt, instance_name, grp, zone, requester, claimed_at, verdict)
         SELECT new.id, new.attempt, new.instance_name, new.grp, new.zone, new.requester,
                new.at, new.verdict
         FROM ({rows}) AS new WHERE true
         ON CONFLICT (message_id, attempt) DO UPDATE SET
             claimed_at = excluded.claimed_at, verdict = excluded.verdict,
             zone = excluded.zone, requester = excluded.requester,
             outcome = NULL, settled_at = NULL"
    )
}

/// What recording an outcome sets on a request's row `old` (which must not
/// be final: see [`not_final`]): `new` names the outcome's `status`,
/// `attempts` (the attempt it ends), `last_error`, `output`,
/// `recovered_after_ms` and `completed_at`; `now` is when. The attempt
/// count never goes down, and the hold is lifted only by the latest
/// attempt's outcome.
pub(crate) fn outcome_set(new: &str, old: &str, now: &str) -> String {
    format!(
        "status = {new}.status,
         output = {new}.output,
         recovered_after_ms = {new}.recovered_after_ms,
         claim_until = CASE WHEN {new}.attempts >= {old}.attempts
                            THEN NULL ELSE {old}.claim_until END,
         attempts = CASE WHEN {new}.attempts > {old}.attempts
                         THEN {new}.attempts ELSE {old}.attempts END,
         last_error = {new}.last_error,
         updated_at = {now},
         completed_at = {new}.completed_at"
    )
}

/// The condition that `row` records the request `new` describes (columns
/// `instance_name`, `requested_by`, `requester`, `reason`): the equality
/// [`identity_conflict`](super::identity_conflict) asks for, as the SQLite
/// store's outcome statements gate their writes with it (`IS`: NULL
/// equals NULL). A row it leaves out is told apart by that rule.
pub(crate) fn same_identity(row: &str, new: &str) -> String {
    format!(
        "{row}.instance_name IS {new}.instance_name AND {row}.requested_by IS {new}.requested_by
         AND {row}.requester IS {new}.requester AND {row}.reason IS {new}.reason"
    )
}

/// The condition that `row`'s status is not final.
pub(crate) fn not_final(row: &str) -> String {
    format!("{row}.status NOT IN {}", *FINAL_STATUSES)
}

#[cfg(test)]
mod tests;
