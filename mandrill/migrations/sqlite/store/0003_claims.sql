-- Rebuilt, because SQLite cannot change a CHECK constraint in place.
--
-- A restart is claimed, and the claim recorded, before it is issued: the
-- audit record Chaos Monkey requires before a kill. `attempts` now counts
-- claimed restart attempts; `claim_until` is when the hold of the last claim
-- expires (NULL once its outcome is recorded), so that a redelivery can tell
-- "issued, outcome unknown" from "never issued".
--
-- A rejected payload keeps the id salvaged from it in `rejected_id`, never
-- in `message_id`: a malformed payload must not make a later valid request
-- with the same id count as done.
--
-- Real backends record what they printed (`output`) and how long the host
-- took to come back (`recovered_after_ms`); `unrecovered` is a final status.
-- The statuses of the safety guards are admitted already.
CREATE TABLE requests_v3 (
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
                                         'expired')),
    attempts           INTEGER NOT NULL DEFAULT 0,
    claim_until        INTEGER,
    last_error         TEXT,
    output             TEXT,
    recovered_after_ms INTEGER,
    payload            TEXT,
    received_at        INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    completed_at       INTEGER
);

INSERT INTO requests_v3
    (id, message_id, rejected_id, instance_name, hostname, requested_by, reason, status,
     attempts, last_error, payload, received_at, updated_at, completed_at)
SELECT id,
       CASE WHEN status = 'rejected' THEN NULL ELSE message_id END,
       CASE WHEN status = 'rejected' THEN message_id END,
       instance_name, hostname, requested_by, reason, status,
       attempts, last_error, payload, received_at, updated_at, completed_at
FROM requests;

DROP TABLE requests;
ALTER TABLE requests_v3 RENAME TO requests;
CREATE INDEX requests_updated_at ON requests (updated_at);
-- Retention prunes by completion time.
CREATE INDEX requests_completed_at ON requests (completed_at);
