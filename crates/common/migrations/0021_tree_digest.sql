-- The digest of each snapshot's tree (its content, apart from where it is stored): what a
-- checkpoint retains as its source, and what a continuation's candidate compares with the
-- tree it would continue from.
ALTER TABLE project_snapshots ADD COLUMN tree_digest TEXT;
-- Never written: a request's source is the tree its receipts stand on.
ALTER TABLE execution_requests DROP COLUMN source_digest;
