-- The request's zone (from the operator's inventory) and its verified
-- requester (the signer), written with each claim: the zone budget counts
-- a zone's disrupted hosts over all groups, the requester quota a
-- requester's restarts. NULL when the request has none; such a row is
-- never counted in them.
ALTER TABLE restarts ADD COLUMN zone TEXT;
ALTER TABLE restarts ADD COLUMN requester TEXT;
-- Partial: only those limits read them, always with a value, and a row
-- without one (the unsigned, zoneless hot path) writes no index entry.
CREATE INDEX restarts_zone ON restarts (zone, claimed_at) WHERE zone IS NOT NULL;
CREATE INDEX restarts_requester ON restarts (requester, claimed_at) WHERE requester IS NOT NULL;
