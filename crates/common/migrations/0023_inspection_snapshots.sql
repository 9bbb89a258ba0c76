-- A failed step's tree, kept for an operator to look at: an `inspection` snapshot. It
-- is never appended to a lineage (no continuation can adopt it) and is retired when it
-- is made, so the reclaim rule deletes its bytes 7 days later.
ALTER TABLE project_snapshots DROP CONSTRAINT project_snapshots_kind_check;
ALTER TABLE project_snapshots ADD CONSTRAINT project_snapshots_kind_check
    CHECK (kind IN ('baseline', 'checkpoint', 'stop', 'named', 'memory', 'fork', 'inspection'));
