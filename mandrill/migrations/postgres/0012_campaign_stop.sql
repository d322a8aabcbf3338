-- `mandrill campaign stop`: a campaign keeps who stopped it, when and why,
-- and its targets not yet issued are recorded `cancelled`, a final status;
-- one in flight is marked (`cancel_reason`), so that once that attempt
-- ends no claim is made again: the next delivery records it `cancelled`.
ALTER TABLE requests ADD COLUMN cancel_reason TEXT;
ALTER TABLE requests DROP CONSTRAINT requests_status_check;
ALTER TABLE requests ADD CONSTRAINT requests_status_check
    CHECK (status IN ('received', 'retrying', 'restarted', 'failed', 'rejected',
                      'unrecovered', 'denied', 'dry-run', 'expired', 'cancelled'));

-- Milliseconds since the Unix epoch; NULL while the campaign runs. The
-- first stop is kept: stopping again cancels what has become cancellable
-- since, and says so, without rewriting who stopped it.
ALTER TABLE campaigns ADD COLUMN stopped_at BIGINT;
ALTER TABLE campaigns ADD COLUMN stopped_by TEXT;
ALTER TABLE campaigns ADD COLUMN stop_reason TEXT;
