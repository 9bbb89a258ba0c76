-- Labels an operator puts on runs to find them again (`team: search`); lists and bulk
-- actions filter by containment (`labels @> '{"team": "search"}'`). A sandbox's labels
-- are its `metadata`, filtered the same way.
ALTER TABLE runs ADD COLUMN labels JSONB NOT NULL DEFAULT '{}';
CREATE INDEX runs_labels ON runs USING gin (labels jsonb_path_ops);

-- A rerun is a new run from an earlier run's spec, and names it.
ALTER TABLE runs ADD COLUMN rerun_of UUID REFERENCES runs (id);
CREATE INDEX runs_rerun_of ON runs (rerun_of) WHERE rerun_of IS NOT NULL;
