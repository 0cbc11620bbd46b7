-- +goose Up
-- warmth: how far the warm-up of a replica's governor had come when it wrote
-- its row (ratecontrol.Learned.Warmth, a fraction of its rate). A replica
-- joining takes the highest warmth among the rows as fresh as a live lease,
-- so a restart or a rolling deploy does not ramp the fleet's sending from
-- zero again while the provider still sees its traffic.
ALTER TABLE quota_learned ADD COLUMN warmth double precision NOT NULL DEFAULT 0
    CHECK (warmth >= 0 AND warmth <= 1);

-- +goose Down
ALTER TABLE quota_learned DROP COLUMN warmth;
