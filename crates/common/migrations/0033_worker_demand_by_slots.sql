-- A worker has job slots and sandbox slots apart (CAIRN_WORKER_CONCURRENCY and
-- CAIRN_SANDBOX_SLOTS), so an autoscaler reads each kind of work against its own slots:
-- `runs` (requests from their admission until they leave `executing`) and `sandboxes`
-- (those a worker hosts or is about to), one trigger each, and the larger wish wins.
-- Their sum, `demand`, counted a sandbox as a job slot and asked for too many workers;
-- it stays for a trigger written against it.
CREATE OR REPLACE VIEW cairn_worker_demand AS
SELECT d.runs + d.sandboxes AS demand, d.runs, d.sandboxes
  FROM (SELECT
          (SELECT count(*) FROM execution_requests WHERE state IN ('queued', 'executing')) AS runs,
          (SELECT count(*) FROM sandboxes WHERE state IN ('creating', 'running', 'paused')) AS sandboxes
       ) d;
