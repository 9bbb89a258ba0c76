-- A sandbox's machine id, host name and SSH host key, made by the first worker that
-- runs it and kept for its life; a fork, restore or template's sandbox gets its own.
ALTER TABLE sandboxes ADD COLUMN identity JSONB;
