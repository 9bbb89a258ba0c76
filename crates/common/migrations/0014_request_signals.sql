-- A request's cancel and pause requests reach the worker that holds it at once: every
-- change of them is notified on `cairn_request_signals` (the request's id), whichever
-- statement made it, and the worker's keeper reads them on that signal instead of at
-- its next lease renewal. A missed notification waits for that renewal.
CREATE FUNCTION cairn_notify_request_signal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_request_signals', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_requests_signal
    AFTER UPDATE OF cancel_requested_at, pause_requested_at ON execution_requests
    FOR EACH ROW
    WHEN (OLD.cancel_requested_at IS DISTINCT FROM NEW.cancel_requested_at
          OR OLD.pause_requested_at IS DISTINCT FROM NEW.pause_requested_at)
    EXECUTE FUNCTION cairn_notify_request_signal();

-- A receipt of a step stopped because its run was cancelled: it keeps the output so far
-- and the time it used, and it never counts as the step done.
ALTER TABLE journal_receipts ADD COLUMN cancelled boolean NOT NULL DEFAULT false;
