-- The lease fence as one function, so that a worker can check it in the same round trip
-- as its BEGIN (`SELECT cairn_fence(...); BEGIN`): the check locks the leased row and
-- raises unless the lease is current. A raise aborts the implicit block, so the session
-- is left idle; a pass is taken into the transaction the BEGIN opens, row lock included.
-- SQLSTATEs: CF001 no such row, CF002 a newer epoch (its value is the DETAIL), CF003 the
-- owner changed or the deadline passed.
CREATE FUNCTION cairn_fence(leased TEXT, request UUID, held_epoch BIGINT, held_owner TEXT)
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    current_epoch BIGINT;
    current_owner TEXT;
    live BOOLEAN;
BEGIN
    -- Static statements, one per leased table, so that each plan is cached.
    IF leased = 'execution_requests' THEN
        SELECT lease_epoch, lease_owner, COALESCE(lease_deadline >= clock_timestamp(), FALSE)
          INTO current_epoch, current_owner, live
          FROM execution_requests WHERE id = request FOR UPDATE;
    ELSIF leased = 'sandboxes' THEN
        SELECT lease_epoch, lease_owner, COALESCE(lease_deadline >= clock_timestamp(), FALSE)
          INTO current_epoch, current_owner, live
          FROM sandboxes WHERE id = request FOR UPDATE;
    ELSE
        RAISE EXCEPTION 'cairn_fence: unknown leased table %', leased;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no leased row %', request USING ERRCODE = 'CF001';
    END IF;
    IF current_epoch <> held_epoch THEN
        RAISE EXCEPTION 'stale epoch % of %', held_epoch, request
            USING ERRCODE = 'CF002', DETAIL = current_epoch::TEXT;
    END IF;
    IF current_owner IS DISTINCT FROM held_owner OR NOT live THEN
        RAISE EXCEPTION 'lease on % expired', request USING ERRCODE = 'CF003';
    END IF;
END
$$;
