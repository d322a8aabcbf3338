-- A request's row keeps its verified requester (the signer; NULL for an
-- unsigned request), with the instance, `requested_by` and reason it
-- already keeps: who asked and for what. A payload under a recorded
-- `message_id` that asks anything else is refused, never joined to the
-- row. A rejected payload's row keeps the signer only when its signature
-- was verified. Rows recorded before take the signer of their latest
-- claim, if one was signed; a row never claimed counts as unsigned (a
-- signed request still waiting unclaimed across the upgrade is refused
-- when redelivered, and recorded so: publish it again).
ALTER TABLE requests ADD COLUMN requester TEXT;
UPDATE requests SET requester = (
    SELECT r.requester FROM restarts r
    WHERE r.message_id = requests.message_id AND r.requester IS NOT NULL
    ORDER BY r.attempt DESC LIMIT 1)
WHERE message_id IS NOT NULL;
