-- Restarts paused for one group (by an operator, or by a breached recovery
-- objective), shared by every instance: a claim for a host of a paused
-- group reads it in its own transaction, after taking the kill switch's
-- share lock; a pause takes that lock exclusively first, so it waits for
-- the claims in progress and every later claim sees it. A row is deleted
-- only by `mandrill resume --group`.
CREATE TABLE group_pauses (
    grp     TEXT PRIMARY KEY,
    by_whom TEXT   NOT NULL,
    reason  TEXT   NOT NULL,
    -- Milliseconds since the Unix epoch.
    since   BIGINT NOT NULL
);
