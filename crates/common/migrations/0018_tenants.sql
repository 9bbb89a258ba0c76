-- Tenants (projects). Every run and sandbox belongs to one; what hangs off them
-- (execution requests, continuations, verification, journals, snapshots, operations)
-- belongs to the tenant of the run or sandbox it hangs off. A token belongs to one
-- tenant, or to none: a platform token, which reaches every tenant. What existed before
-- tenants belongs to `default`, and every token but the bootstrap admin joins it.
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by  UUID
);
INSERT INTO tenants (id) VALUES ('default');

ALTER TABLE api_tokens ADD COLUMN tenant_id TEXT REFERENCES tenants (id);
UPDATE api_tokens SET tenant_id = 'default' WHERE name <> 'bootstrap-admin';

ALTER TABLE runs ADD COLUMN tenant_id TEXT NOT NULL DEFAULT 'default' REFERENCES tenants (id);
ALTER TABLE sandboxes ADD COLUMN tenant_id TEXT NOT NULL DEFAULT 'default' REFERENCES tenants (id);
-- A tenant's lists, newest first, without reading another tenant's rows.
CREATE INDEX runs_tenant_created_idx ON runs (tenant_id, created_at DESC, id DESC);
CREATE INDEX sandboxes_tenant_created_idx ON sandboxes (tenant_id, created_at DESC, id DESC);

-- Each tenant has its own recovery policy; a new tenant starts from the defaults.
ALTER TABLE recovery_policy DROP CONSTRAINT recovery_policy_id_check;
ALTER TABLE recovery_policy ADD COLUMN tenant_id TEXT REFERENCES tenants (id);
UPDATE recovery_policy SET tenant_id = 'default';
ALTER TABLE recovery_policy DROP CONSTRAINT recovery_policy_pkey;
ALTER TABLE recovery_policy ALTER COLUMN tenant_id SET NOT NULL;
ALTER TABLE recovery_policy ADD PRIMARY KEY (tenant_id);
ALTER TABLE recovery_policy DROP COLUMN id;

-- Announcements already written name the tenant too, as every new one does.
UPDATE outbox SET payload = payload || '{"tenant": "default"}'::jsonb
 WHERE NOT payload ? 'tenant' AND payload ? 'run_id';
