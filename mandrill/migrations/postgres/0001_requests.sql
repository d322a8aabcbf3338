-- One row per restart request (by message_id), or per rejected payload.
-- The same shape as the SQLite schema, so both stores answer alike.
CREATE TABLE requests (
    id            BIGSERIAL PRIMARY KEY,
    -- NULL only for rejected payloads whose id could not be read. Unique, so
    -- that two instances cannot both record a first outcome for one request.
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
    received_at   BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    completed_at  BIGINT
);

CREATE INDEX requests_updated_at ON requests (updated_at);
