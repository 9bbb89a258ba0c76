-- A run waiting out a step's retry backoff (held until `release_after`) is no demand
-- for a worker until then.
CREATE OR REPLACE VIEW cairn_worker_demand AS
SELECT d.runs + d.sandboxes AS demand, d.runs, d.sandboxes
  FROM (SELECT
          (SELECT count(*) FROM execution_requests
            WHERE state IN ('queued', 'executing') AND NOT held_by_gate)
          + (SELECT COALESCE(sum(h.wanted), 0)::bigint FROM (
               SELECT CASE WHEN r.concurrency_key IS NULL THEN count(*)
                           ELSE LEAST(count(*), GREATEST(min(r.concurrency_limit) - (
                                  SELECT count(*) FROM execution_requests o JOIN runs ro ON ro.id = o.run_id
                                   WHERE ro.tenant_id = r.tenant_id AND ro.concurrency_key = r.concurrency_key
                                     AND NOT o.held_by_gate AND o.state IN ('queued', 'executing')), 0))
                      END AS wanted
                 FROM execution_requests e JOIN runs r ON r.id = e.run_id
                WHERE e.held_by_gate AND e.state = 'queued'
                  AND (e.release_after IS NULL OR e.release_after <= now())
                GROUP BY r.tenant_id, r.concurrency_key) h) AS runs,
          (SELECT count(*) FROM sandboxes WHERE state IN ('creating', 'running', 'paused')) AS sandboxes
       ) d;
