-- Previews: the ports of a sandbox a preview may reach, and where each worker takes the
-- scheduler's preview requests (its address and the key they carry; only a holder of
-- the database reads it, as every lease and token is).
ALTER TABLE sandboxes ADD COLUMN ports INTEGER[] NOT NULL DEFAULT '{}';
ALTER TABLE worker_heartbeats ADD COLUMN preview_url TEXT, ADD COLUMN preview_key TEXT;
