-- The store a snapshot's bytes live in, by the identity written inside the store (its
-- `store-id` object): every URL or mount path of one store shares it. NULL for rows
-- written before identities; the reaper keys those by their URL.
ALTER TABLE project_snapshots ADD COLUMN store_id UUID;
CREATE INDEX project_snapshots_capturing_store
    ON project_snapshots ((COALESCE(store_id::text, store_url)))
    WHERE status IN ('creating', 'uploading');

-- A quarantined snapshot's bytes are kept for their own period, counted from here.
ALTER TABLE project_snapshots ADD COLUMN quarantined_at TIMESTAMPTZ;
UPDATE project_snapshots SET quarantined_at = now() WHERE status = 'quarantined';
