-- The artifact store a step's live output goes to: its identity and its URL as the
-- worker reaches it. The API reads the output from there (and refuses when the store
-- it reaches there is another one), and the reaper reclaims it there. NULL for checks
-- and for intents written before live output.
ALTER TABLE journal_intents ADD COLUMN output_store uuid, ADD COLUMN output_store_url text;

-- When the reaper deleted a finished request's live output (`reclaim_after` after it
-- finished, like snapshots); the API then answers that it was reclaimed.
ALTER TABLE execution_requests ADD COLUMN output_reclaimed_at timestamptz;
