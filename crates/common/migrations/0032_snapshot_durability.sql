-- Off-host durability: the node that wrote a snapshot, and the node of a process that
-- read it back from its store. A sandbox's snapshot is `replicated` only once a node
-- other than its writer's has read it: until then its bytes may be on one host only.
ALTER TABLE project_snapshots ADD COLUMN writer_node TEXT,
                              ADD COLUMN verified_node TEXT,
                              ADD COLUMN verified_at TIMESTAMPTZ,
                              ADD COLUMN verify_failed_at TIMESTAMPTZ;
-- The reaper's scan for snapshots to read back, newest first.
CREATE INDEX project_snapshots_unverified_idx ON project_snapshots (created_at DESC)
    WHERE verified_at IS NULL AND status = 'ready' AND sandbox_id IS NOT NULL
      AND retention = 'current' AND writer_node IS NOT NULL;
