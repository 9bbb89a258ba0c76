-- Pause: an operator asks a running request to pause; its worker stops the step's
-- processes (SIGSTOP), captures a checkpoint, and only then records it paused. Resume
-- continues the processes; a pause that outlasts its limit behaves like a stop.
ALTER TABLE execution_requests
    ADD COLUMN pause_requested_at TIMESTAMPTZ,
    -- Set by the worker once the pause checkpoint is durable (or none was needed).
    ADD COLUMN paused_at          TIMESTAMPTZ,
    -- The checkpoint captured for the pause (NULL: the tree had nothing uncaptured and
    -- the lineage head already held it, or the capture failed and the hold keeps it).
    ADD COLUMN pause_checkpoint   JSONB;
