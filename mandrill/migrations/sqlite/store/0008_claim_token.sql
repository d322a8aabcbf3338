-- A claim keeps the token of the call that made it, and the earlier attempt
-- it counted as issued with an unknown outcome (NULL if none): a call whose
-- claim was committed but whose answer was lost tries again with the same
-- token, and is answered with the same attempt rather than taking its own
-- claim for another delivery's. NULL in rows claimed before: taken as
-- another call's.
ALTER TABLE requests ADD COLUMN claim_token INTEGER;
ALTER TABLE requests ADD COLUMN claim_unknown INTEGER;
