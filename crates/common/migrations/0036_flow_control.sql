-- Flow control: a run may name a concurrency key (at most `concurrency_limit` of its
-- runs at once, across every worker), a priority, and a rate limit (at most
-- `rate_per_second` starts per second per key). Such a run's request is admitted
-- `held_by_gate`, with no announcement; the scheduler's gate releases it (announces it
-- through the outbox and records `gate_released_at`) when its key, its rate and the
-- workers' free slots allow, highest priority first.
ALTER TABLE runs
    ADD COLUMN concurrency_key TEXT,
    ADD COLUMN concurrency_limit INT,
    ADD COLUMN priority INT,
    ADD COLUMN rate_key TEXT,
    ADD COLUMN rate_per_second INT;

ALTER TABLE execution_requests
    ADD COLUMN held_by_gate BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN gate_released_at TIMESTAMPTZ;

CREATE INDEX execution_requests_held ON execution_requests (queued_at) WHERE held_by_gate;
CREATE INDEX runs_concurrency_key ON runs (concurrency_key) WHERE concurrency_key IS NOT NULL;
CREATE INDEX runs_rate_key ON runs (rate_key) WHERE rate_key IS NOT NULL;
