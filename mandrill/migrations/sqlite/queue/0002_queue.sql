-- The SQLite broker's queue: one row per message not yet settled.
-- STRICT, so that no row can hold a value of the wrong type: whatever is in
-- here, the broker can read it (payload contents are validated by the worker).
CREATE TABLE queue (
    -- AUTOINCREMENT: ids are never reused, so a stale delivery tag
    -- (id, delivery) can never match a later message.
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    payload       BLOB NOT NULL,
    -- Milliseconds since the Unix epoch.
    published_at  INTEGER NOT NULL,
    -- When the message may next be claimed: now when published, the lease
    -- deadline while leased, the redelivery time after a nack.
    visible_at    INTEGER NOT NULL,
    -- Claims so far.
    deliveries    INTEGER NOT NULL DEFAULT 0,
    -- The delivery number holding the lease; NULL when nobody holds it.
    lease         INTEGER
) STRICT;

CREATE INDEX queue_visible_at ON queue (visible_at);

-- Messages the broker gave up on, with the reason; `mandrill requeue` puts
-- them back into `queue`.
CREATE TABLE dead_letters (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    payload       BLOB NOT NULL,
    reason        TEXT NOT NULL,
    deliveries    INTEGER NOT NULL,
    published_at  INTEGER NOT NULL,
    dead_at       INTEGER NOT NULL
) STRICT;
