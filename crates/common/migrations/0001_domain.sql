-- Cairn's domain: one schema for the scheduler, workers and the reaper.
-- PostgreSQL is the source of truth; RabbitMQ only delivers and Redis only says who is alive.

-- Saved-work recovery policy: a single row, every continuation kind off by default.
CREATE TABLE recovery_policy (
    id                               SMALLINT PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    enabled                          BOOLEAN NOT NULL DEFAULT FALSE,
    allow_checkpoint_continuation    BOOLEAN NOT NULL DEFAULT FALSE,
    allow_final_outcome_continuation BOOLEAN NOT NULL DEFAULT FALSE,
    maximum_window_seconds           INTEGER NOT NULL DEFAULT 3600
        CHECK (maximum_window_seconds BETWEEN 1 AND 7200),
    revision                         BIGINT NOT NULL DEFAULT 1,
    updated_at                       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by                       UUID
);
INSERT INTO recovery_policy (id) VALUES (1);

-- Bearer tokens: only a SHA-256 of the secret is stored.
CREATE TABLE api_tokens (
    id          UUID PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
    token_hash  BYTEA NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);

-- A run is one admitted piece of work: a plan of steps in a workspace.
CREATE TABLE runs (
    id               UUID PRIMARY KEY,
    -- The work context of a reviewed continuation is its root run.
    root_run_id      UUID NOT NULL,
    -- One accepted commitment keeps its task id across automatic attempts.
    task_id          UUID NOT NULL,
    agent            TEXT NOT NULL,
    operator_id      UUID REFERENCES api_tokens (id),
    repository       TEXT,
    git_ref          TEXT,
    steps            JSONB NOT NULL,
    max_commands     INTEGER NOT NULL CHECK (max_commands >= 0),
    max_wall_seconds INTEGER NOT NULL CHECK (max_wall_seconds >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    deadline         TIMESTAMPTZ,
    state            TEXT NOT NULL CHECK (state IN (
        'queued', 'running', 'awaiting_verification', 'stopped_at_checkpoint',
        'needs_reconciliation', 'completed', 'failed', 'cancelled')),
    idempotency_key  TEXT UNIQUE,
    request_digest   TEXT NOT NULL,
    cancel_requested_at TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ
);
CREATE INDEX runs_state_created_idx ON runs (state, created_at, id);
CREATE INDEX runs_created_idx ON runs (created_at, id);

-- The execution request is the ticket: attempts, budgets, charged usage and the lease
-- epoch (the fencing token) live here. Continuations resume the same ticket.
CREATE TABLE execution_requests (
    id                  UUID PRIMARY KEY,
    run_id              UUID NOT NULL REFERENCES runs (id),
    kind                TEXT NOT NULL CHECK (kind IN ('run', 'verification')),
    state               TEXT NOT NULL CHECK (state IN (
        'queued', 'executing', 'awaiting_verification', 'stopped_at_checkpoint',
        'needs_reconciliation', 'completed', 'failed', 'cancelled')),
    attempt             INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 1),
    lease_epoch         BIGINT NOT NULL DEFAULT 0,
    lease_owner         TEXT,
    lease_deadline      TIMESTAMPTZ,
    max_commands        INTEGER NOT NULL,
    max_wall_seconds    INTEGER NOT NULL,
    used_commands       INTEGER NOT NULL DEFAULT 0,
    used_wall_ms        BIGINT NOT NULL DEFAULT 0,
    used_cpu_ms         BIGINT NOT NULL DEFAULT 0,
    stop_reason         TEXT,
    reconciliation_step TEXT,
    resume_context      JSONB,
    -- The retained checkpoint: sequence, digest of the journal at the stop, source digest.
    checkpoint          JSONB,
    -- The digest of the request's workspace source as a worker last observed it.
    source_digest       TEXT,
    cancel_requested_at TIMESTAMPTZ,
    admitted_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When the request last became queued (admission, a new attempt, a continuation).
    queued_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    claimed_at          TIMESTAMPTZ,
    finished_at         TIMESTAMPTZ,
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX execution_requests_run_idx ON execution_requests (run_id);
-- The lease sweeper scans only leases that are held.
CREATE INDEX execution_requests_lease_idx ON execution_requests (lease_deadline)
    WHERE lease_owner IS NOT NULL;

-- The journal: an intent before a step starts, a receipt after it ends. Both are
-- fenced writes; one of each per request and step.
CREATE TABLE journal_intents (
    request_id   UUID NOT NULL REFERENCES execution_requests (id),
    step_key     TEXT NOT NULL,
    step_index   INTEGER NOT NULL,
    idempotent   BOOLEAN NOT NULL,
    lease_epoch  BIGINT NOT NULL,
    attempt      INTEGER NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, step_key)
);

CREATE TABLE journal_receipts (
    request_id      UUID NOT NULL REFERENCES execution_requests (id),
    step_key        TEXT NOT NULL,
    lease_epoch     BIGINT NOT NULL,
    attempt         INTEGER NOT NULL,
    exit_code       INTEGER,
    signal          INTEGER,
    timed_out       BOOLEAN NOT NULL DEFAULT FALSE,
    wall_ms         BIGINT NOT NULL,
    cpu_ms          BIGINT NOT NULL,
    output_digest   TEXT NOT NULL,
    stdout_tail     TEXT NOT NULL DEFAULT '',
    stderr_tail     TEXT NOT NULL DEFAULT '',
    output_artifact TEXT,
    finished_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, step_key),
    FOREIGN KEY (request_id, step_key) REFERENCES journal_intents (request_id, step_key)
);

-- Other journal entries (reuse intents and receipts, acceptance records).
CREATE TABLE journal_entries (
    id          BIGSERIAL PRIMARY KEY,
    request_id  UUID NOT NULL REFERENCES execution_requests (id),
    entry_kind  TEXT NOT NULL,
    lease_epoch BIGINT NOT NULL,
    body        JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX journal_entries_request_idx ON journal_entries (request_id, id);

-- A run's typed final report is retained, and consumed at most once.
CREATE TABLE final_reports (
    request_id     UUID PRIMARY KEY REFERENCES execution_requests (id),
    outcome        TEXT NOT NULL CHECK (outcome IN ('complete', 'blocked', 'clarification', 'failed')),
    followup_kind  TEXT,
    body           JSONB NOT NULL,
    lease_epoch    BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE report_consumptions (
    request_id   UUID PRIMARY KEY REFERENCES final_reports (request_id),
    action_id    UUID,
    consumed_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Reviewed continuation actions: caller-owned ids, one saved decision per checkpoint.
CREATE TABLE continuation_actions (
    id                 UUID PRIMARY KEY,
    kind               TEXT NOT NULL CHECK (kind IN ('checkpoint_continuation', 'final_outcome_continuation')),
    run_id             UUID NOT NULL REFERENCES runs (id),
    request_id         UUID NOT NULL REFERENCES execution_requests (id),
    -- What the action continues from (the checkpoint or the retained report).
    checkpoint_ref     TEXT NOT NULL,
    operator_id        UUID REFERENCES api_tokens (id),
    input              JSONB NOT NULL,
    input_digest       TEXT NOT NULL,
    candidate_digest   TEXT NOT NULL,
    witness_digest     TEXT NOT NULL,
    admission_seal     TEXT NOT NULL,
    valid_for_seconds  INTEGER NOT NULL CHECK (valid_for_seconds BETWEEN 1 AND 7200),
    window_ends_at     TIMESTAMPTZ NOT NULL,
    status             TEXT NOT NULL CHECK (status IN (
        'queued', 'executing', 'completed', 'failed', 'needs_reconciliation')),
    claimed_epoch      BIGINT,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (request_id, kind, checkpoint_ref)
);

-- Verification handoffs: a frozen list of checks, and the adoptions that admit them.
CREATE TABLE verification_handoffs (
    id               UUID PRIMARY KEY,
    run_id           UUID NOT NULL REFERENCES runs (id),
    request_id       UUID NOT NULL REFERENCES execution_requests (id),
    commands         JSONB NOT NULL,
    commands_digest  TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'adopted', 'passed', 'failed')),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE verification_adoptions (
    id                     UUID PRIMARY KEY,
    run_id                 UUID NOT NULL REFERENCES runs (id),
    handoff_id             UUID NOT NULL REFERENCES verification_handoffs (id),
    execution_request_id   UUID REFERENCES execution_requests (id),
    operator_id            UUID REFERENCES api_tokens (id),
    input                  JSONB NOT NULL,
    input_digest           TEXT NOT NULL,
    created_at             TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE verification_results (
    id                    UUID PRIMARY KEY,
    adoption_id           UUID NOT NULL REFERENCES verification_adoptions (id),
    command_index         INTEGER NOT NULL,
    command_digest        TEXT NOT NULL,
    purpose               TEXT NOT NULL,
    confined              BOOLEAN NOT NULL,
    reusable              BOOLEAN NOT NULL,
    scope_digest          TEXT NOT NULL,
    exit_code             INTEGER,
    passed                BOOLEAN NOT NULL,
    output_digest         TEXT NOT NULL,
    reused_from           UUID REFERENCES verification_results (id),
    started_at            TIMESTAMPTZ NOT NULL,
    finished_at           TIMESTAMPTZ NOT NULL,
    UNIQUE (adoption_id, command_index)
);

-- Workspaces follow the sandbox lifecycle.
CREATE TABLE workspaces (
    id            UUID PRIMARY KEY,
    run_id        UUID REFERENCES runs (id),
    task_id       UUID,
    agent         TEXT NOT NULL,
    backend       TEXT NOT NULL,
    persistent    BOOLEAN NOT NULL DEFAULT TRUE,
    state         TEXT NOT NULL CHECK (state IN (
        'creating', 'running', 'stopped', 'paused', 'error', 'destroyed')),
    host          TEXT,
    path          TEXT,
    -- The agent's credential generation when the tree was created; rotation ends reuse.
    credential_generation BIGINT NOT NULL DEFAULT 0,
    paused_at     TIMESTAMPTZ,
    error_reason  TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    destroyed_at  TIMESTAMPTZ
);

-- Durable holds keep a live tree from being released before it is captured.
CREATE TABLE holds (
    id                   UUID PRIMARY KEY,
    workspace_id         UUID NOT NULL REFERENCES workspaces (id),
    run_id               UUID REFERENCES runs (id),
    task_id              UUID,
    agent                TEXT NOT NULL,
    reason               TEXT NOT NULL,
    expires_at           TIMESTAMPTZ NOT NULL,
    capture_in_progress  BOOLEAN NOT NULL DEFAULT FALSE,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at             TIMESTAMPTZ,
    end_reason           TEXT
);
CREATE INDEX holds_active_idx ON holds (expires_at) WHERE ended_at IS NULL;
CREATE INDEX holds_run_idx ON holds (run_id) WHERE ended_at IS NULL;

-- Snapshot metadata: baselines, checkpoints and sandbox snapshots. The bytes live in
-- the artifact store named by store_url, which cleanup uses (never the current config).
CREATE TABLE project_snapshots (
    id                     UUID PRIMARY KEY,
    kind                   TEXT NOT NULL CHECK (kind IN ('baseline', 'checkpoint', 'stop', 'named', 'memory')),
    status                 TEXT NOT NULL CHECK (status IN (
        'creating', 'uploading', 'ready', 'restoring', 'failed', 'quarantined', 'deleted')),
    retention              TEXT NOT NULL DEFAULT 'current' CHECK (retention IN (
        'current', 'superseded', 'retired', 'pending_operator_repair', 'reclaimed')),
    agent                  TEXT NOT NULL,
    repository             TEXT,
    backend                TEXT NOT NULL,
    base_image             TEXT,
    canonical_ref          TEXT,
    work_context_id        UUID,
    sequence               BIGINT,
    predecessor_id         UUID REFERENCES project_snapshots (id),
    workspace_id           UUID REFERENCES workspaces (id),
    name                   TEXT,
    store_url              TEXT NOT NULL,
    manifest_key           TEXT,
    size_bytes             BIGINT NOT NULL DEFAULT 0,
    credential_generation  BIGINT NOT NULL DEFAULT 0,
    created_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    retired_at             TIMESTAMPTZ,
    retire_reason          TEXT,
    repair_reason          TEXT,
    repair_attempts        INTEGER NOT NULL DEFAULT 0,
    next_repair_at         TIMESTAMPTZ,
    UNIQUE (work_context_id, sequence)
);
CREATE INDEX project_snapshots_baseline_idx
    ON project_snapshots (agent, repository, backend, base_image, canonical_ref)
    WHERE kind = 'baseline';
CREATE INDEX project_snapshots_retention_idx ON project_snapshots (retention, retired_at);
-- The reaper's scans: what may be reclaimed, and what is due for a repair retry.
CREATE INDEX project_snapshots_reclaim_idx ON project_snapshots (COALESCE(retired_at, created_at))
    WHERE status <> 'deleted' AND (retention IN ('retired', 'superseded') OR status IN ('failed', 'quarantined'));
CREATE INDEX project_snapshots_repair_idx ON project_snapshots (next_repair_at)
    WHERE retention = 'pending_operator_repair';
CREATE INDEX project_snapshots_agent_idx ON project_snapshots (agent, credential_generation)
    WHERE retention = 'current';

-- Which chunks each snapshot's manifest references, so a chunk is deleted only when no
-- manifest in its store references it any more.
CREATE TABLE snapshot_chunks (
    snapshot_id  UUID NOT NULL REFERENCES project_snapshots (id),
    chunk_id     TEXT NOT NULL,
    PRIMARY KEY (snapshot_id, chunk_id)
);
CREATE INDEX snapshot_chunks_chunk_idx ON snapshot_chunks (chunk_id);

-- The head of each checkpoint lineage; appends compare-and-set against it.
CREATE TABLE lineage_heads (
    work_context_id  UUID PRIMARY KEY,
    agent            TEXT NOT NULL,
    head_id          UUID NOT NULL REFERENCES project_snapshots (id),
    sequence         BIGINT NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    retired_at       TIMESTAMPTZ
);

-- Every acquisition attempt and its outcome.
CREATE TABLE snapshot_restores (
    id            UUID PRIMARY KEY,
    request_id    UUID REFERENCES execution_requests (id),
    workspace_id  UUID REFERENCES workspaces (id),
    tier          TEXT NOT NULL CHECK (tier IN ('adopt', 'checkpoint', 'baseline', 'cold')),
    snapshot_id   UUID REFERENCES project_snapshots (id),
    outcome       TEXT NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'skipped')),
    reason        TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Credential generations per agent: rotation retires snapshots taken under older ones.
CREATE TABLE credential_generations (
    agent        TEXT PRIMARY KEY,
    generation   BIGINT NOT NULL DEFAULT 0,
    rotated_at   TIMESTAMPTZ
);

-- The transactional outbox: written with the state it announces, published by the relay
-- with publisher confirms, marked published only after the broker confirmed it.
CREATE TABLE outbox (
    id             BIGSERIAL PRIMARY KEY,
    message_id     UUID NOT NULL UNIQUE,
    routing_key    TEXT NOT NULL,
    payload        JSONB NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at   TIMESTAMPTZ,
    attempts       INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT
);
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE published_at IS NULL;

-- Wake the relay as soon as a message is written.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_outbox', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Leader election bookkeeping and the reaper's last sweep, for operators.
CREATE TABLE sweeps (
    id            BIGSERIAL PRIMARY KEY,
    component     TEXT NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    finished_at   TIMESTAMPTZ,
    dry_run       BOOLEAN NOT NULL DEFAULT FALSE,
    summary       JSONB NOT NULL DEFAULT '{}'::jsonb
);
