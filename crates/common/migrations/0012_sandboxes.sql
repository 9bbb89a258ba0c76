-- Sandboxes (the lifecycle seed): a workspace with a lifecycle of its own, placed through
-- the queue and owned by one worker at a time under the same fenced lease as a request
-- (`lease_epoch` is the fencing token of every write its owner makes).
CREATE TABLE sandboxes (
    id                UUID PRIMARY KEY,
    agent             TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN (
        'creating', 'running', 'stopped', 'paused', 'error', 'destroyed')),
    -- What the API asked of the owner: it carries the ask out, then moves `state`.
    desired           TEXT NOT NULL DEFAULT 'running' CHECK (desired IN (
        'running', 'stopped', 'paused', 'destroyed')),
    persistent        BOOLEAN NOT NULL,
    always_on         BOOLEAN NOT NULL,
    timeout_sec       INTEGER NOT NULL CHECK (timeout_sec BETWEEN 1 AND 86400),
    idle_timeout_sec  INTEGER NOT NULL CHECK (idle_timeout_sec >= 0),
    disk_mb           INTEGER NOT NULL CHECK (disk_mb >= 1),
    repository        TEXT,
    git_ref           TEXT,
    -- The snapshot a restore or a `source: "snapshot:<id>"` started it from.
    source_snapshot_id UUID REFERENCES project_snapshots (id),
    placement_attempt INTEGER NOT NULL DEFAULT 1,
    lease_epoch       BIGINT NOT NULL DEFAULT 0,
    lease_owner       TEXT,
    lease_deadline    TIMESTAMPTZ,
    claimed_at        TIMESTAMPTZ,
    -- The worker that last ran it (never shown: placement is not the caller's concern).
    worker_id         TEXT,
    workspace_id      UUID REFERENCES workspaces (id),
    -- The latest stop snapshot, kept for the sandbox's life.
    stop_snapshot_id  UUID REFERENCES project_snapshots (id),
    stop_reason       TEXT,
    error_reason      TEXT,
    paused_at         TIMESTAMPTZ,
    last_activity_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key   TEXT UNIQUE,
    request_digest    TEXT NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    stopped_at        TIMESTAMPTZ,
    destroyed_at      TIMESTAMPTZ
);
CREATE INDEX sandboxes_state_idx ON sandboxes (state, created_at, id);
-- The lease sweeper scans only leases that are held.
CREATE INDEX sandboxes_lease_idx ON sandboxes (lease_deadline) WHERE lease_owner IS NOT NULL;

-- Exec and file operations, journaled like steps: the intent (`started_at`, with the
-- owner's epoch) before it runs, the receipt (`result`) after, committed with the
-- snapshot that holds its effects (invariant 9).
CREATE TABLE sandbox_operations (
    id            UUID PRIMARY KEY,
    sandbox_id    UUID NOT NULL REFERENCES sandboxes (id),
    seq           BIGSERIAL,
    kind          TEXT NOT NULL CHECK (kind IN ('exec', 'read', 'write', 'list', 'snapshot', 'fork')),
    body          JSONB NOT NULL,
    state         TEXT NOT NULL DEFAULT 'pending' CHECK (state IN (
        'pending', 'running', 'done', 'interrupted')),
    lease_epoch   BIGINT,
    result        JSONB,
    snapshot_id   UUID REFERENCES project_snapshots (id),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at    TIMESTAMPTZ,
    finished_at   TIMESTAMPTZ
);
CREATE INDEX sandbox_operations_open_idx ON sandbox_operations (sandbox_id, seq)
    WHERE state IN ('pending', 'running');

-- Lifecycle POSTs that take an `Idempotency-Key` (resume and the like): the same key
-- with the same input answers the same result.
CREATE TABLE sandbox_idempotency (
    idempotency_key TEXT PRIMARY KEY,
    request_digest  TEXT NOT NULL,
    sandbox_id      UUID NOT NULL REFERENCES sandboxes (id),
    -- The operation a snapshot create or a fork became, whose receipt a replay answers.
    operation_id    UUID REFERENCES sandbox_operations (id),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Which sandbox (and owner epoch) captured a snapshot; a fork's capture is a snapshot of
-- its own kind (the source of its forks).
ALTER TABLE project_snapshots ADD COLUMN sandbox_id UUID REFERENCES sandboxes (id);
ALTER TABLE project_snapshots DROP CONSTRAINT project_snapshots_kind_check;
ALTER TABLE project_snapshots ADD CONSTRAINT project_snapshots_kind_check
    CHECK (kind IN ('baseline', 'checkpoint', 'stop', 'named', 'memory', 'fork'));
-- The sandbox a fork was taken from.
ALTER TABLE sandboxes ADD COLUMN forked_from UUID REFERENCES sandboxes (id);
CREATE INDEX project_snapshots_sandbox_idx ON project_snapshots (sandbox_id) WHERE sandbox_id IS NOT NULL;
