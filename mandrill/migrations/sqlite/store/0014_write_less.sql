-- Retention is the only reader of `completed_at` (`completed_at < ?1`,
-- which implies it is not NULL), so a request in progress needs no entry:
-- one index write less when a request's row is created, one less when its
-- outcome is recorded (docs/benchmarks.md, "SQLite").
DROP INDEX requests_completed_at;
CREATE INDEX requests_completed_at ON requests (completed_at) WHERE completed_at IS NOT NULL;
