-- Custody: a receipt stands on a durable tree (invariant 9).

-- The snapshot holding a step's effects, committed with the receipt (and with its
-- lineage append), and the acquisition tier of the tree the step ran on. A successful
-- run step's receipt is reusable only on a tree at this snapshot or a descendant of it.
ALTER TABLE journal_receipts
    ADD COLUMN snapshot_id UUID REFERENCES project_snapshots (id),
    ADD COLUMN tree_tier   TEXT CHECK (tree_tier IN ('adopt', 'checkpoint', 'baseline', 'cold'));

-- Which request a tree belongs to, the workspaces directory it lives in (an identity
-- kept in that directory, not the worker id: one directory, one live worker), and the
-- snapshot the tree is at (restored from, adopted at, or last appended; NULL for a
-- baseline or cold tree, which holds no step's effects).
ALTER TABLE workspaces
    ADD COLUMN request_id   UUID REFERENCES execution_requests (id),
    ADD COLUMN directory_id UUID,
    ADD COLUMN snapshot_id  UUID REFERENCES project_snapshots (id);
CREATE INDEX workspaces_directory_idx ON workspaces (directory_id, path) WHERE state <> 'destroyed';

-- Who captures a snapshot: its request and lease epoch. The reaper fails a capture whose
-- owner can no longer commit it (the epoch moved on, or the lease lapsed), in minutes.
-- What the capture left out of the durable tree: counts per reason and the first paths.
ALTER TABLE project_snapshots
    ADD COLUMN request_id  UUID REFERENCES execution_requests (id),
    ADD COLUMN lease_epoch BIGINT,
    ADD COLUMN skipped     JSONB;

-- A restore only reads: it no longer marks its snapshot `restoring`. One interrupted
-- before this migration is usable again.
UPDATE project_snapshots SET status = 'ready' WHERE status = 'restoring';
