-- Restarts paused for one group (by an operator, or by a breached recovery
-- objective), shared by every instance: a claim for a host of a paused
-- group reads it in its own transaction, as it reads the kill switch, and
-- is deferred. A row is deleted only by `mandrill resume --group`.
CREATE TABLE group_pauses (
    grp     TEXT PRIMARY KEY,
    by_whom TEXT    NOT NULL,
    reason  TEXT    NOT NULL,
    -- Milliseconds since the Unix epoch.
    since   INTEGER NOT NULL
);
