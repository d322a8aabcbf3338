-- A restart is claimed, and the claim recorded, before it is issued: the
-- audit record Chaos Monkey requires before a kill. `attempts` now counts
-- claimed restart attempts; `claim_until` is when the hold of the last claim
-- expires (NULL once its outcome is recorded), so that a redelivery can tell
-- "issued, outcome unknown" from "never issued".
ALTER TABLE requests ADD COLUMN claim_until BIGINT;

-- A rejected payload keeps the id salvaged from it here, never in
-- `message_id`: a malformed payload must not make a later valid request with
-- the same id count as done.
ALTER TABLE requests ADD COLUMN rejected_id TEXT;
UPDATE requests SET rejected_id = message_id, message_id = NULL WHERE status = 'rejected';

-- Retention prunes by completion time.
CREATE INDEX requests_completed_at ON requests (completed_at);

-- Real backends record what they printed and how long the host took to come
-- back; `unrecovered` is a final status. The statuses of the safety guards
-- are admitted already.
ALTER TABLE requests ADD COLUMN output TEXT;
ALTER TABLE requests ADD COLUMN recovered_after_ms BIGINT;
ALTER TABLE requests DROP CONSTRAINT requests_status_check;
ALTER TABLE requests ADD CONSTRAINT requests_status_check
    CHECK (status IN ('received', 'retrying', 'restarted', 'failed', 'rejected',
                      'unrecovered', 'denied', 'dry-run', 'expired'));
