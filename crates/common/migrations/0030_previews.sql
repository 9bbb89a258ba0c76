-- Previews: the ports of a sandbox a preview may reach, its services (started on every
-- start and resume), and where each worker takes the
-- scheduler's preview requests (its address and the key they carry; only a holder of
-- the database reads it, as every lease and token is).
ALTER TABLE sandboxes ADD COLUMN ports INTEGER[] NOT NULL DEFAULT '{}',
                      ADD COLUMN services JSONB NOT NULL DEFAULT '{}';
ALTER TABLE worker_heartbeats ADD COLUMN preview_url TEXT, ADD COLUMN preview_key TEXT;
ALTER TABLE sandbox_operations DROP CONSTRAINT sandbox_operations_kind_check,
    ADD CONSTRAINT sandbox_operations_kind_check
        CHECK (kind IN ('exec', 'read', 'write', 'list', 'snapshot', 'fork', 'service'));
