-- Publication: a completed run's result delivered as a patch artifact in the artifact
-- store, with its receipt. Each publication is an execution request of its own (kind
-- `publication`) on the run, so the run's execution-request list shows it, and a worker
-- claims it under a fenced lease like any job.
ALTER TABLE execution_requests DROP CONSTRAINT execution_requests_kind_check;
ALTER TABLE execution_requests ADD CONSTRAINT execution_requests_kind_check
    CHECK (kind IN ('run', 'verification', 'publication'));

CREATE TABLE publications (
    -- The caller-owned id: the publication's execution request.
    request_id         UUID PRIMARY KEY REFERENCES execution_requests (id),
    run_id             UUID NOT NULL REFERENCES runs (id),
    operator_id        UUID,
    input_digest       TEXT NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The delivery receipt, written with the request's completion.
    artifact_key       TEXT,
    store_url          TEXT,
    sha256             TEXT,
    bytes              BIGINT,
    files_changed      INTEGER,
    base               TEXT,
    final_snapshot_id  UUID,
    delivered_at       TIMESTAMPTZ
);
CREATE INDEX publications_run_idx ON publications (run_id);

-- A delivery hold on a run: while it stands, nothing of the run is published. Set and
-- cleared by an admin; accepting a report never clears it.
CREATE TABLE delivery_holds (
    run_id      UUID PRIMARY KEY REFERENCES runs (id),
    reason      TEXT NOT NULL,
    set_by      UUID,
    set_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
