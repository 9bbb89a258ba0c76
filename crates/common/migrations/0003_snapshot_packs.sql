-- Snapshots store their chunks in packs (many chunks per object). Which packs each
-- snapshot's manifest references, so a pack is deleted only when no snapshot of its
-- store still references it. snapshot_chunks keeps the references of snapshots taken
-- in the first format (one object per chunk) until the reaper reclaims them.
CREATE TABLE snapshot_packs (
    snapshot_id  UUID NOT NULL REFERENCES project_snapshots(id),
    pack_id      UUID NOT NULL,
    PRIMARY KEY (snapshot_id, pack_id)
);
CREATE INDEX snapshot_packs_pack_idx ON snapshot_packs (pack_id);
