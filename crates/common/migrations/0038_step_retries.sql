-- A step that failed under a retry policy runs again after its backoff: its request is
-- queued, held by the gate until `release_after`, so no worker slot waits with it.
ALTER TABLE execution_requests ADD COLUMN release_after TIMESTAMPTZ;
