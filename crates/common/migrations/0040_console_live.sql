-- The run change feed (`GET /api/v1/runs/events`) and the fleet overview's samples.

-- Each run row carries the id of the transaction that last wrote it. A reader keeps the
-- snapshot whose visible rows it has read, and reads next the rows its new snapshot sees
-- and that one did not: a transaction that commits after a later one is read when it
-- commits, never skipped. Rows written before this migration carry none and are never
-- replayed.
ALTER TABLE runs ADD COLUMN change_xid xid8;
ALTER TABLE runs ALTER COLUMN change_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX runs_change_xid_idx ON runs (change_xid);

CREATE FUNCTION runs_mark_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.change_xid := pg_current_xact_id();
    RETURN NEW;
END $$;
CREATE TRIGGER runs_mark_change BEFORE UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_mark_change();

-- A run shows its request's pause and flow-control hold, which change without its row:
-- those two changes mark the run too. Claims, charges and lease renewals do not.
CREATE FUNCTION runs_mark_request_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs SET change_xid = pg_current_xact_id() WHERE id = NEW.run_id;
    RETURN NULL;
END $$;
CREATE TRIGGER runs_mark_request_change AFTER UPDATE OF paused_at, held_by_gate ON execution_requests
    FOR EACH ROW
    WHEN (NEW.kind = 'run' AND (OLD.paused_at IS DISTINCT FROM NEW.paused_at
                                OR OLD.held_by_gate IS DISTINCT FROM NEW.held_by_gate))
    EXECUTE FUNCTION runs_mark_request_change();

-- The runs that ended in an interval, for the overview's throughput.
CREATE INDEX runs_finished_idx ON runs (finished_at) WHERE finished_at IS NOT NULL;

-- One sample of the fleet per interval, written by the scheduler that leads the
-- sampler and kept for a day (`GET /api/v1/overview`).
CREATE TABLE overview_samples (
    at                        TIMESTAMPTZ PRIMARY KEY,
    interval_seconds          INTEGER NOT NULL,
    completed                 INTEGER NOT NULL,
    failed                    INTEGER NOT NULL,
    cancelled                 INTEGER NOT NULL,
    queued                    INTEGER NOT NULL,
    held                      INTEGER NOT NULL,
    running                   INTEGER NOT NULL,
    needs_person              INTEGER NOT NULL,
    workers                   INTEGER NOT NULL,
    admission_to_start_p50_ms DOUBLE PRECISION,
    admission_to_start_p95_ms DOUBLE PRECISION
);
