-- The request state machine (issue: terminal is final; windows, budgets, keys).

-- An action whose window ended before any worker claimed it expires: it admitted
-- nothing and frees its checkpoint (or retained report) for another review.
ALTER TABLE continuation_actions DROP CONSTRAINT continuation_actions_status_check;
ALTER TABLE continuation_actions ADD CONSTRAINT continuation_actions_status_check CHECK (status IN (
    'queued', 'executing', 'completed', 'failed', 'needs_reconciliation', 'expired'));
ALTER TABLE continuation_actions DROP CONSTRAINT continuation_actions_request_id_kind_checkpoint_ref_key;
CREATE UNIQUE INDEX continuation_actions_one_per_checkpoint
    ON continuation_actions (request_id, kind, checkpoint_ref) WHERE status <> 'expired';

-- Wall time of an interrupted step is charged once, from its intent's start to when its
-- end is known: an intent is open until its receipt or that charge closes it. Intents
-- written before this migration are closed as they stand (nothing is charged again).
ALTER TABLE journal_intents ADD COLUMN ended_at TIMESTAMPTZ;
UPDATE journal_intents i
   SET ended_at = COALESCE((SELECT r.finished_at FROM journal_receipts r
                             WHERE r.request_id = i.request_id AND r.step_key = i.step_key), i.started_at);
CREATE INDEX journal_intents_open_idx ON journal_intents (request_id) WHERE ended_at IS NULL;

-- A batch admission with an Idempotency-Key: the same key and body replay its run ids.
CREATE TABLE batch_admissions (
    idempotency_key TEXT PRIMARY KEY,
    request_digest  TEXT NOT NULL,
    run_ids         UUID[] NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
