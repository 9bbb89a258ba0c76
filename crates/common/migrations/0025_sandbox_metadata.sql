-- A sandbox's metadata: the caller's labels (`{"team": "search"}`), set at creation,
-- copied to its forks, shown with it and filtered on when listing.
ALTER TABLE sandboxes ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'::jsonb;
CREATE INDEX sandboxes_metadata ON sandboxes USING gin (metadata jsonb_path_ops);
