-- What each worker offers: slots for jobs (runs, continuations, verifications) and,
-- apart from them, slots for sandboxes. Null for a worker of an earlier version.
ALTER TABLE worker_heartbeats ADD COLUMN run_slots INT, ADD COLUMN sandbox_slots INT;
