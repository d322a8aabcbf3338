-- Writing less per request (docs/benchmarks.md, "PostgreSQL").
--
-- Room on each page for a row's next version, so that PostgreSQL can write
-- it there without touching any index (a heap-only tuple): a claim updates
-- the row its batch has just created, with the same `updated_at`, and an
-- outcome settles its journal row without changing an indexed column. At
-- the default (100) every page is full when written, so each such update
-- added an entry to every index of its table. Applies to pages written
-- from now on; nothing is rewritten.
ALTER TABLE requests SET (fillfactor = 50);
ALTER TABLE restarts SET (fillfactor = 50);

-- Retention is the only reader of `completed_at` (`completed_at < $1`,
-- which implies it is not NULL), so a request in progress needs no entry.
DROP INDEX requests_completed_at;
CREATE INDEX requests_completed_at ON requests (completed_at) WHERE completed_at IS NOT NULL;
