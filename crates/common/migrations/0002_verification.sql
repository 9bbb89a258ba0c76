-- Verification handoffs: the source a handoff froze, the adoption's own lifecycle, and
-- every result with the scope it ran in, so a later verification can decide reuse.

-- The digest of the workspace source when the run's final report was written.
ALTER TABLE final_reports ADD COLUMN source_digest TEXT;

ALTER TABLE verification_handoffs
    ADD COLUMN agent         TEXT,
    ADD COLUMN source_digest TEXT,
    ADD COLUMN updated_at    TIMESTAMPTZ NOT NULL DEFAULT now();
-- At most one open handoff per request.
CREATE UNIQUE INDEX verification_handoffs_open_idx ON verification_handoffs (request_id)
    WHERE state IN ('pending', 'adopted');
CREATE INDEX verification_handoffs_run_idx ON verification_handoffs (run_id, created_at);

ALTER TABLE verification_adoptions
    ADD COLUMN agent             TEXT NOT NULL DEFAULT '',
    ADD COLUMN policy_digest     TEXT NOT NULL DEFAULT '',
    ADD COLUMN candidate         JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- Command digests the operator declared independent of time and external state.
    ADD COLUMN reusable_digests  TEXT[] NOT NULL DEFAULT '{}',
    ADD COLUMN status            TEXT NOT NULL DEFAULT 'queued' CHECK (status IN (
        'queued', 'executing', 'completed', 'failed', 'cancelled')),
    ADD COLUMN claimed_epoch     BIGINT,
    ADD COLUMN stop_reason       TEXT,
    ADD COLUMN updated_at        TIMESTAMPTZ NOT NULL DEFAULT now();
CREATE INDEX verification_adoptions_request_idx ON verification_adoptions (execution_request_id, status);

ALTER TABLE verification_results
    ADD COLUMN request_id          UUID REFERENCES execution_requests (id),
    ADD COLUMN agent               TEXT NOT NULL DEFAULT '',
    ADD COLUMN repository          TEXT,
    ADD COLUMN attempt             INTEGER NOT NULL DEFAULT 1,
    ADD COLUMN lease_epoch         BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN step_key            TEXT,
    ADD COLUMN source_digest       TEXT NOT NULL DEFAULT '',
    ADD COLUMN dependency_digest   TEXT NOT NULL DEFAULT '',
    ADD COLUMN environment_digest  TEXT NOT NULL DEFAULT '',
    ADD COLUMN runner_digest       TEXT NOT NULL DEFAULT '',
    ADD COLUMN timed_out           BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN wall_ms             BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN stdout_tail         TEXT NOT NULL DEFAULT '',
    ADD COLUMN stderr_tail         TEXT NOT NULL DEFAULT '',
    -- Why a check ran fresh instead of being reused (`not_declared`, `source_changed`, …).
    ADD COLUMN fresh_reason        TEXT,
    ADD COLUMN recorded_at         TIMESTAMPTZ NOT NULL DEFAULT now();
-- A later verification looks for an original passed, confined, reusable result.
CREATE INDEX verification_results_reuse_idx
    ON verification_results (command_digest, agent, finished_at DESC)
    WHERE passed AND confined AND reusable AND reused_from IS NULL;
