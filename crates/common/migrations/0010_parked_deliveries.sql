-- A delivery RabbitMQ pushed to a worker that then stalled (SIGSTOP, a frozen node), or
-- that waits behind a busy worker's running jobs, stays there until that worker frees a
-- slot or the broker drops its connection. The lease sweeper announces such a request
-- again (the duplicate delivery is dropped at its claim) when it is still queued long
-- after its announcement and either
-- - a worker waited for work, with a free slot, after the announcement and got none
--   (RabbitMQ pushes a queued message to a waiting consumer at once): each worker
--   reports since when it has waited, in its beat; or
-- - a run announced after it has been claimed already (a queue is first in, first out).
ALTER TABLE worker_heartbeats ADD COLUMN starved_since TIMESTAMPTZ;
-- The newest claimed announcement, read from the newest end.
CREATE INDEX execution_requests_queued_at_idx ON execution_requests (queued_at);
