-- A tenant's layer of the step egress policy: `true` (the operator's policy as it is),
-- `false` (no step or sandbox of the tenant has the network) or `{"allow": [...]}`
-- (the operator's policy narrowed to these). No row: `true`. Set by a platform admin;
-- a run's or sandbox's own `network` narrows it further.
CREATE TABLE network_policy (
    tenant_id   TEXT PRIMARY KEY REFERENCES tenants (id),
    network     JSONB NOT NULL,
    revision    BIGINT NOT NULL DEFAULT 1,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by  UUID
);
