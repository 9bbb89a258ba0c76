-- The worker that wrote a step's intent (the lease holder at that epoch), so operators
-- see who ran each step. NULL on intents written before this column existed.
ALTER TABLE journal_intents ADD COLUMN worker_id TEXT;
