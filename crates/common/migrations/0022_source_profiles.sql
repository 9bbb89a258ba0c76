-- Registered source profiles: the implementations a continuation may run on. A profile
-- is the digest of what a continuation's correctness depends on (Cairn's version, the
-- snapshot manifest format, the journal format, the continuation protocol). A
-- continuation is admitted only while the current implementation's profile is
-- `qualified`, and its retained checkpoint was taken under a qualified profile.
CREATE TABLE source_profiles (
    profile_digest TEXT PRIMARY KEY CHECK (profile_digest ~ '^[0-9a-f]{64}$'),
    profile        JSONB NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('qualified', 'revoked')),
    note           TEXT NOT NULL DEFAULT '',
    revision       BIGINT NOT NULL DEFAULT 1,
    -- NULL: registered by the first scheduler of an install, for the release it runs.
    updated_by     UUID,
    registered_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
