-- The step sandbox (invariant 10): what each step and verification check ran in, and
-- the limit that ended it, if one did.
ALTER TABLE journal_receipts ADD COLUMN sandbox jsonb, ADD COLUMN limit_breached text;
ALTER TABLE verification_results ADD COLUMN sandbox jsonb, ADD COLUMN limit_breached text;
