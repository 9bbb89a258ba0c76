-- The gate's reads of its keys (its standings, once a second, and each pass's count of a
-- key's runs out of the gate) start from the requests flow control has in hand, not from
-- every queued or executing one nor from every run of a key: the keyed runs that have
-- ended are never read, nor is a backlog of runs without a key, save those the gate
-- holds or released too (a run with only a priority, a step's retry held until its
-- backoff ends), one lookup of its run each. A keyed run's request is
-- admitted and queued again held by the gate, and leaves it only by a release, which
-- records `gate_released_at`: so every keyed request that is queued or executing is
-- held or was released, and is in this index. Keyed by state, whose few values btree
-- deduplicates: the index stays smaller than the one on every active request however
-- many keyed runs come and go between vacuums.
CREATE INDEX execution_requests_gated ON execution_requests (state)
    WHERE kind = 'run' AND state IN ('queued', 'executing')
      AND (held_by_gate OR gate_released_at IS NOT NULL);
