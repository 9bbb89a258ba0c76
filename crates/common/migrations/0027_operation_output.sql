-- An exec's live output goes to the artifact store as it prints (the key layout of a
-- step's, under the operation's id): where it went, and when retention deleted it.
ALTER TABLE sandbox_operations
    ADD COLUMN output_store UUID,
    ADD COLUMN output_store_url TEXT,
    ADD COLUMN output_reclaimed_at TIMESTAMPTZ;
CREATE INDEX sandbox_operations_output_idx ON sandbox_operations (finished_at)
    WHERE output_store_url IS NOT NULL AND output_reclaimed_at IS NULL;
