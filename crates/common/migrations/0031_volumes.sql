-- Volumes: storage on one worker's disk that a sandbox attaches (one sandbox at a
-- time) and that outlives its restarts; never snapshotted. A volume is bound to the
-- workspaces directory of the first worker that hosts a sandbox attaching it, and
-- every later placement of a sandbox attaching it is taken by that directory's worker.
CREATE TABLE volumes (
    id           UUID PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    name         TEXT NOT NULL,
    size_mb      INT NOT NULL CHECK (size_mb >= 1),
    state        TEXT NOT NULL DEFAULT 'available'
                 CHECK (state IN ('available', 'deleting', 'deleted')),
    directory_id UUID,
    attached_to  UUID REFERENCES sandboxes (id),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at   TIMESTAMPTZ,
    CHECK (state = 'available' OR attached_to IS NULL)
);
CREATE UNIQUE INDEX volumes_name_idx ON volumes (tenant_id, name) WHERE state <> 'deleted';
CREATE INDEX volumes_attached_idx ON volumes (attached_to) WHERE attached_to IS NOT NULL;
-- A fork's sandboxes go first to the worker whose directory staged their source's tree
-- (a copy-on-write snapshot, no restore): that directory, until the sweeper places them
-- anywhere.
ALTER TABLE sandboxes ADD COLUMN placement_directory UUID;
CREATE INDEX sandboxes_placement_directory_idx ON sandboxes (placement_directory)
    WHERE placement_directory IS NOT NULL;
-- Each worker's workspaces directory: a volume on a directory no live worker has is
-- not attached (nothing would place its sandbox).
ALTER TABLE worker_heartbeats ADD COLUMN directory_id UUID;
-- What a directory's worker looks for: its sandboxes to place and its volumes to delete.
CREATE INDEX volumes_directory_idx ON volumes (directory_id)
    WHERE attached_to IS NOT NULL OR state = 'deleting';
