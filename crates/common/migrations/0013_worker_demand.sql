-- The work that needs a worker slot now, for an autoscaler (KEDA's PostgreSQL trigger
-- reads `SELECT demand FROM cairn_worker_demand`). A worker acks a delivery at its
-- claim, so the queues show only work not yet started: scaled on them, the fleet
-- shrinks under running jobs. Here a request counts from its admission until it leaves
-- `executing` (a paused one keeps its slot), and a sandbox while a worker hosts it.
CREATE VIEW cairn_worker_demand AS
SELECT
    (SELECT count(*) FROM execution_requests WHERE state IN ('queued', 'executing'))
  + (SELECT count(*) FROM sandboxes WHERE state IN ('creating', 'running', 'paused'))
    AS demand;
-- The count reads only live requests, however many have ended.
CREATE INDEX execution_requests_active_idx ON execution_requests (state)
    WHERE state IN ('queued', 'executing');
