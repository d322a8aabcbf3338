-- One row per restart request (by message_id), or per rejected payload.
CREATE TABLE requests (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    -- NULL only for rejected payloads whose id could not be read.
    message_id    TEXT UNIQUE,
    instance_name TEXT,
    hostname      TEXT,
    requested_by  TEXT,
    reason        TEXT,
    status        TEXT NOT NULL
                  CHECK (status IN ('received', 'retrying', 'restarted', 'failed', 'rejected')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    -- Rejected payloads only: a lossy excerpt, for diagnosis.
    payload       TEXT,
    -- Milliseconds since the Unix epoch.
    received_at   INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    completed_at  INTEGER
);

CREATE INDEX requests_updated_at ON requests (updated_at);
