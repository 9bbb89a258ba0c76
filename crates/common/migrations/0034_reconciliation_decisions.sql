-- An operator's decision on a step whose outcome is unknown (its run needs a person):
-- the effect happened (`mark_done`: a receipt by a person), it did not (`mark_not_done`:
-- the step runs again on the same request), or the run fails (`fail_run`). The id is
-- the caller's, saved before the one POST, so a repeat answers the same receipt.
CREATE TABLE reconciliation_decisions (
    id            UUID PRIMARY KEY,
    run_id        UUID NOT NULL REFERENCES runs (id),
    request_id    UUID NOT NULL REFERENCES execution_requests (id),
    step_key      TEXT NOT NULL,
    decision      TEXT NOT NULL CHECK (decision IN ('mark_done', 'mark_not_done', 'fail_run')),
    reason        TEXT NOT NULL,
    -- The token that decided, and its name then: the journal says who.
    decided_by    UUID NOT NULL,
    decided_by_name TEXT NOT NULL,
    -- The lease epoch the decision fenced out (the request's epoch moves past it).
    fenced_epoch  BIGINT NOT NULL,
    -- What the run did next: `queued` (every uncertain step decided: it continues),
    -- `waiting` (other uncertain steps still need a decision) or `failed`.
    outcome       TEXT NOT NULL CHECK (outcome IN ('queued', 'waiting', 'failed')),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX reconciliation_decisions_by_run ON reconciliation_decisions (run_id, created_at);

-- A receipt a person recorded (`mark_done`) names its decision: it stands on the tree
-- its run continues from, which holds no effect of the step's own.
ALTER TABLE journal_receipts ADD COLUMN decision_id UUID REFERENCES reconciliation_decisions (id);
