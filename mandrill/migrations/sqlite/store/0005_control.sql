-- The kill switch, shared by every instance that uses this database: while
-- `paused`, no restart is claimed (the claim reads it in its own
-- transaction), so `mandrill pause` stops every instance at once.
CREATE TABLE control (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    paused     INTEGER NOT NULL DEFAULT 0,
    by_whom    TEXT,
    reason     TEXT,
    -- Milliseconds since the Unix epoch.
    updated_at INTEGER NOT NULL DEFAULT 0
);
INSERT INTO control (id, paused, updated_at) VALUES (1, 0, 0);
