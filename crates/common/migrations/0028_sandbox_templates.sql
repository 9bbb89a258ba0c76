-- Templates: a named snapshot published under a name, one immutable version at a time
-- (1, 2, …), that new sandboxes start from (`template_id` on create). A snapshot that
-- a template version names cannot be deleted.
CREATE TABLE sandbox_templates (
    id          UUID PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    name        TEXT NOT NULL,
    version     INT NOT NULL CHECK (version >= 1),
    snapshot_id UUID NOT NULL REFERENCES project_snapshots (id),
    description TEXT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name, version)
);
CREATE INDEX sandbox_templates_snapshot_idx ON sandbox_templates (snapshot_id);
ALTER TABLE sandboxes ADD COLUMN template_id UUID REFERENCES sandbox_templates (id);
