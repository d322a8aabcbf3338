-- `mandrill campaign stop`: a campaign keeps who stopped it, when and why,
-- and its targets not yet issued are recorded `cancelled`, a final status;
-- one in flight is marked, so that it is not tried again.
--
-- Rebuilt, because SQLite cannot change a CHECK constraint in place: the
-- same columns, in the same order, with `cancelled` admitted.
CREATE TABLE requests_v13 (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id         TEXT UNIQUE,
    rejected_id        TEXT,
    instance_name      TEXT,
    hostname           TEXT,
    requested_by       TEXT,
    reason             TEXT,
    status             TEXT NOT NULL
                       CHECK (status IN ('received', 'retrying', 'restarted', 'failed',
                                         'rejected', 'unrecovered', 'denied', 'dry-run',
                                         'expired', 'cancelled')),
    attempts           INTEGER NOT NULL DEFAULT 0,
    claim_until        INTEGER,
    last_error         TEXT,
    output             TEXT,
    recovered_after_ms INTEGER,
    payload            TEXT,
    received_at        INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    completed_at       INTEGER,
    claim_token        INTEGER,
    claim_unknown      INTEGER,
    requester          TEXT,
    -- Set by a stop on a target whose restart was in flight: once that
    -- attempt ends, no claim is made again; the next delivery records it
    -- `cancelled` with these words.
    cancel_reason      TEXT
);

INSERT INTO requests_v13
    (id, message_id, rejected_id, instance_name, hostname, requested_by, reason, status,
     attempts, claim_until, last_error, output, recovered_after_ms, payload, received_at,
     updated_at, completed_at, claim_token, claim_unknown, requester)
SELECT id, message_id, rejected_id, instance_name, hostname, requested_by, reason, status,
       attempts, claim_until, last_error, output, recovered_after_ms, payload, received_at,
       updated_at, completed_at, claim_token, claim_unknown, requester
FROM requests;

DROP TABLE requests;
ALTER TABLE requests_v13 RENAME TO requests;
CREATE INDEX requests_updated_at ON requests (updated_at);
CREATE INDEX requests_completed_at ON requests (completed_at);

-- Milliseconds since the Unix epoch; NULL while the campaign runs. The
-- first stop is kept: stopping again cancels what has become cancellable
-- since, and says so, without rewriting who stopped it.
ALTER TABLE campaigns ADD COLUMN stopped_at INTEGER;
ALTER TABLE campaigns ADD COLUMN stopped_by TEXT;
ALTER TABLE campaigns ADD COLUMN stop_reason TEXT;
