-- A sandbox's own network policy (`network` on create: true, false, or an allow list
-- that narrows the worker's); NULL: the worker's default. Its execs enter one held
-- namespace, so the policy is the sandbox's, not each exec's.
ALTER TABLE sandboxes ADD COLUMN network jsonb;
