-- Campaigns (`mandrill campaign start`): the group, who asked, and the
-- targets resolved when it started, each with its request's message id and
-- due time, as JSON (read whole by `campaign status` and `wait`, never
-- queried inside). Written before any request is published, so a campaign
-- whose publishing failed half-way is still found.
CREATE TABLE campaigns (
    id         TEXT   PRIMARY KEY,
    grp        TEXT   NOT NULL,
    -- Milliseconds since the Unix epoch.
    created_at BIGINT NOT NULL,
    requester  TEXT,
    -- [{"instance_name", "message_id", "due_at" (ms)}, ...]
    targets    TEXT   NOT NULL
);
