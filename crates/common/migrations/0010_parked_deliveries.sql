-- A delivery RabbitMQ pushed to a worker that then stalled (SIGSTOP, a frozen node)
-- waits there until the broker drops that worker's connection. Each worker reports in
-- its beat since when it has been waiting, with a free slot, for any delivery at all.
-- A request still queued long after it was announced, while a worker waited for work
-- after the announcement and got none, is parked elsewhere (RabbitMQ pushes a queued
-- message to a waiting consumer at once): the lease sweeper announces it again, and the
-- duplicate delivery is dropped at its claim.
ALTER TABLE worker_heartbeats ADD COLUMN starved_since TIMESTAMPTZ;
