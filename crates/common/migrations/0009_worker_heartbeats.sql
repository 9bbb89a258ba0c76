-- Each worker process beats here every second. The lease sweeper takes a request over
-- as soon as its owner's beats have stopped for the lapse, provided another worker has
-- been beating without a gap all that time: then the database was reachable and the
-- owner was not, so a database outage (after which every worker is silent) takes
-- nothing over. Without such evidence the lease TTL stays the bound. The fencing epoch
-- stays the only safety mechanism.
CREATE TABLE worker_heartbeats (
    worker_id     TEXT PRIMARY KEY,
    beat_at       TIMESTAMPTZ NOT NULL,
    -- The start of the current run of beats with no gap longer than two beats.
    beating_since TIMESTAMPTZ NOT NULL
);
