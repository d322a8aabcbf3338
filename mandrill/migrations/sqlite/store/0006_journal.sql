-- The restart journal: one row per claimed restart attempt, written in the
-- claim's own transaction (before the restart is issued), settled with the
-- attempt's outcome, deleted if the claim is given back unused. The
-- counting guards (rate limits, host cooldown, disruption budget) read it
-- in that same transaction, so they hold across instances.
CREATE TABLE restarts (
    message_id    TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    instance_name TEXT    NOT NULL,
    grp           TEXT    NOT NULL,
    -- Milliseconds since the Unix epoch.
    claimed_at    INTEGER NOT NULL,
    -- The attempt's status once known ('restarted', 'unrecovered', ...).
    outcome       TEXT,
    settled_at    INTEGER,
    -- What the guards said when they allowed it, in words.
    verdict       TEXT    NOT NULL,
    PRIMARY KEY (message_id, attempt)
);
CREATE INDEX restarts_group ON restarts (grp, claimed_at);
CREATE INDEX restarts_host ON restarts (instance_name, claimed_at);
CREATE INDEX restarts_claimed ON restarts (claimed_at);

-- Every guard's verdict that did not let a request through at once
-- (deferred, denied, expired, dry run), for `mandrill explain`.
CREATE TABLE decisions (
    id         INTEGER PRIMARY KEY,
    message_id TEXT    NOT NULL,
    at         INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    verdict    TEXT    NOT NULL,
    guard      TEXT    NOT NULL,
    reason     TEXT    NOT NULL
);
CREATE INDEX decisions_message ON decisions (message_id, id);

-- Deliveries a request spent deferred by a guard, so that waiting for a
-- guard never counts against broker.max_deliveries (a request deferred
-- overnight, redelivered every few minutes, is not a poison message).
CREATE TABLE deferrals (
    message_id TEXT    PRIMARY KEY,
    count      INTEGER NOT NULL
);
