-- The leash, beside the kill switch in the one control row: NULL until an
-- operator turns it (`mandrill leash`, `mandrill unleash`); from then on
-- every instance using this database obeys it, each claim reading it in
-- its own transaction with the switch.
ALTER TABLE control ADD COLUMN leashed INTEGER;
ALTER TABLE control ADD COLUMN leash_by TEXT;
ALTER TABLE control ADD COLUMN leash_reason TEXT;
-- Milliseconds since the Unix epoch.
ALTER TABLE control ADD COLUMN leash_updated_at INTEGER NOT NULL DEFAULT 0;
