//! Finite ownership leases on execution requests and on sandboxes.
//!
//! The **epoch in PostgreSQL is the fencing token**: a claim increments the row's
//! `lease_epoch` (of `execution_requests`, or of `sandboxes`: see [`Leased`]) and records the owner and a deadline; every durable
//! write of a worker goes through [`Lease::begin_fenced`] (or [`Lease::fence`]), which rejects it with
//! [`LeaseError::StaleOwner`] once the epoch moved. A claim that takes the lease inside
//! its own transaction ([`Leases::take_in`]) needs no check: its row lock keeps every
//! other writer out until it commits. Redis holds a liveness key
//! (`{prefix}lease:{request}` = `epoch:owner`, with a TTL) so others can see who is
//! alive cheaply; Redis may lose every key at any time and nothing here depends on it
//! for safety.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use redis::Script;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// A newer owner exists: this holder must write nothing more.
    #[error("stale owner of request {}: held epoch {held_epoch}, current epoch {current_epoch}", request_id.simple())]
    StaleOwner {
        request_id: Uuid,
        held_epoch: i64,
        current_epoch: i64,
    },
    /// The lease ran past its deadline without a renewal.
    #[error("lease on request {} expired", request_id.simple())]
    Expired { request_id: Uuid },
    #[error("execution request {} does not exist", .0.simple())]
    NotFound(Uuid),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

/// What a lease is on: both kinds of row carry the same lease columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Leased {
    #[default]
    Request,
    Sandbox,
}

impl Leased {
    fn table(self) -> &'static str {
        match self {
            Leased::Request => "execution_requests",
            Leased::Sandbox => "sandboxes",
        }
    }
}

/// A held lease: the row (a request, or a sandbox), who holds it, its fencing epoch and
/// current deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub of: Leased,
    /// The request's id, or the sandbox's.
    pub request_id: Uuid,
    pub owner: String,
    pub epoch: i64,
    pub deadline: DateTime<Utc>,
}

/// Claims, renews and releases leases.
#[derive(Clone)]
pub struct Leases {
    pool: PgPool,
    redis: ConnectionManager,
    prefix: Arc<str>,
    ttl: Duration,
    of: Leased,
    /// Liveness keys being deleted: off the job's path, each bounded (see `settle`).
    releases: TaskTracker,
}

fn claim_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("lease/claim.lua")))
}

fn renew_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("lease/renew.lua")))
}

fn release_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("lease/release.lua")))
}

/// A claimed lease and the deadline of the one it replaced (`None` when nobody held it).
#[derive(Debug, Clone)]
pub struct Takeover {
    pub lease: Lease,
    pub previous_deadline: Option<DateTime<Utc>>,
}

impl Leases {
    pub fn new(pool: PgPool, redis: ConnectionManager, prefix: &str, ttl: Duration) -> Self {
        Leases {
            pool,
            redis,
            prefix: prefix.into(),
            ttl,
            of: Leased::Request,
            releases: TaskTracker::new(),
        }
    }

    /// The same leases on sandboxes.
    pub fn for_sandboxes(&self) -> Leases {
        Leases {
            of: Leased::Sandbox,
            ..self.clone()
        }
    }

    fn table(&self) -> &'static str {
        self.of.table()
    }

    /// How long a Redis liveness operation may take. Redis is advisory: a hung Redis
    /// must never hold up a claim, a renewal (the keeper would fence itself) or a
    /// completion.
    fn advisory_limit(&self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    /// Lets the leases `owner` still holds lapse now: a worker process that just
    /// started under the id of one that died (a restarted pod keeps its name) knows
    /// those leases belong to no live process, so the sweeper takes them over at once
    /// instead of after their TTL. The epoch moves when it does.
    pub async fn lapse_held_by(&self, owner: &str) -> Result<u64, sqlx::Error> {
        let lapsed = sqlx::query(&format!(
            "UPDATE {} SET lease_deadline = clock_timestamp()
              WHERE lease_owner = $1 AND lease_deadline > clock_timestamp()",
            self.table()
        ))
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(lapsed.rows_affected())
    }

    /// Lets this holder's lease lapse now, so the sweeper hands the job on at once
    /// rather than after the TTL. Best effort: the lease lapses anyway.
    pub async fn lapse(&self, lease: &Lease) {
        let _ = sqlx::query(&format!(
            "UPDATE {} SET lease_deadline = clock_timestamp()
              WHERE id = $1 AND lease_epoch = $2 AND lease_owner = $3",
            lease.of.table()
        ))
        .bind(lease.request_id)
        .bind(lease.epoch)
        .bind(&lease.owner)
        .execute(&self.pool)
        .await;
    }

    /// Waits for the liveness deletions still in flight (each bounded): at shutdown, or
    /// where a test reads the key next.
    pub async fn settle(&self) {
        self.releases.close();
        self.releases.wait().await;
        self.releases.reopen();
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The Redis key of a request's liveness lease.
    pub fn key(&self, request_id: Uuid) -> String {
        match self.of {
            Leased::Request => format!("{}lease:{}", self.prefix, request_id.simple()),
            Leased::Sandbox => format!("{}sandbox-lease:{}", self.prefix, request_id.simple()),
        }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    fn ttl_secs_f64(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    /// Claims a request if it is queued and nobody holds a live lease on it (a sandbox:
    /// if nobody holds one): epoch + 1, owner and deadline in PostgreSQL, then the Redis
    /// liveness key. `None` when someone else holds it, or when a request is not queued.
    /// Of concurrent contenders exactly one wins (the row update is atomic).
    pub async fn claim(&self, request_id: Uuid, owner: &str) -> Result<Option<Lease>, LeaseError> {
        Ok(self
            .claim_after(request_id, owner)
            .await?
            .map(|taken| taken.lease))
    }

    /// [`Leases::claim`], also returning the deadline of the lease it replaced (`None`
    /// when nobody held it): a step its last owner left running is charged up to then.
    #[tracing::instrument(skip_all, fields(request_id = %request_id.simple(), owner))]
    pub async fn claim_after(
        &self,
        request_id: Uuid,
        owner: &str,
    ) -> Result<Option<Takeover>, LeaseError> {
        let mut conn = self.pool.acquire().await?;
        let taken = self.take_in(&mut conn, request_id, owner).await?;
        if let Some(taken) = &taken {
            self.announce(&taken.lease).await;
        }
        Ok(taken)
    }

    /// [`Leases::claim_after`] on the caller's connection, without the Redis liveness
    /// key: a claim that takes the lease inside its own transaction writes the lease and
    /// what it decides in one commit (or neither), then [`Leases::announce`]s it.
    pub async fn take_in(
        &self,
        conn: &mut PgConnection,
        request_id: Uuid,
        owner: &str,
    ) -> Result<Option<Takeover>, LeaseError> {
        let table = self.table();
        // A delivery for a request no longer queued (a duplicate, or one announced
        // again) means no work: it takes no lease, so it neither moves the epoch nor
        // releases a lapsed owner's lease that the sweeper has yet to find. Nor does one
        // for a request flow control still holds: only the gate lets it start.
        let claimable = match self.of {
            Leased::Request => "AND e.state = 'queued' AND NOT e.held_by_gate",
            Leased::Sandbox => "",
        };
        let claimed: Option<(i64, DateTime<Utc>, Option<DateTime<Utc>>)> =
            sqlx::query_as(&format!(
                "UPDATE {table} e
                SET lease_epoch = e.lease_epoch + 1,
                    lease_owner = $2,
                    lease_deadline = clock_timestamp() + make_interval(secs => $3),
                    claimed_at = clock_timestamp(),
                    -- A pause recorded by an earlier owner is not this owner's: a pause
                    -- still requested is carried out again (captured, then recorded).
                    paused_at = NULL,
                    updated_at = clock_timestamp()
               FROM (SELECT id, lease_owner AS previous_owner, lease_deadline AS previous_deadline
                       FROM {table} WHERE id = $1) p
              WHERE e.id = p.id {claimable}
                AND (e.lease_owner IS NULL OR e.lease_deadline < clock_timestamp())
          RETURNING e.lease_epoch, e.lease_deadline,
                    CASE WHEN p.previous_owner IS NULL THEN NULL ELSE p.previous_deadline END"
            ))
            .bind(request_id)
            .bind(owner)
            .bind(self.ttl_secs_f64())
            .fetch_optional(&mut *conn)
            .await?;
        let Some((epoch, deadline, previous)) = claimed else {
            let exists: Option<(i64,)> =
                sqlx::query_as(&format!("SELECT lease_epoch FROM {table} WHERE id = $1"))
                    .bind(request_id)
                    .fetch_optional(&mut *conn)
                    .await?;
            return match exists {
                Some(_) => Ok(None),
                None => Err(LeaseError::NotFound(request_id)),
            };
        };
        let lease = Lease {
            of: self.of,
            request_id,
            owner: owner.to_string(),
            epoch,
            deadline,
        };
        Ok(Some(Takeover {
            lease,
            previous_deadline: previous,
        }))
    }

    /// Extends a held lease. Fails with [`LeaseError::Expired`] once the deadline has
    /// passed (even if nobody claimed it since) and with [`LeaseError::StaleOwner`] once
    /// another owner claimed it: either way the holder must fence itself.
    pub async fn renew(&self, lease: &mut Lease) -> Result<(), LeaseError> {
        let renewed: Option<(DateTime<Utc>,)> = sqlx::query_as(&format!(
            "UPDATE {}
                SET lease_deadline = clock_timestamp() + make_interval(secs => $4)
              WHERE id = $1 AND lease_epoch = $2 AND lease_owner = $3
                AND lease_deadline >= clock_timestamp()
          RETURNING lease_deadline",
            lease.of.table()
        ))
        .bind(lease.request_id)
        .bind(lease.epoch)
        .bind(&lease.owner)
        .bind(self.ttl_secs_f64())
        .fetch_optional(&self.pool)
        .await?;
        match renewed {
            Some((deadline,)) => {
                lease.deadline = deadline;
                self.extend_liveness(lease).await;
                Ok(())
            }
            None => Err(self.why_not_held(lease).await?),
        }
    }

    /// Gives a lease up: compare-and-delete of the Redis key, then the PostgreSQL owner
    /// is cleared if (and only if) this holder still owns the epoch.
    pub async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let mut conn = self.pool.acquire().await?;
        self.release_in(&mut conn, lease).await?;
        drop(conn);
        self.clear_liveness(lease);
        Ok(())
    }

    /// Clears the PostgreSQL owner inside the caller's transaction (so a final state
    /// write and the release commit together). Call [`Leases::clear_liveness`] after the
    /// commit.
    pub async fn release_in(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(), LeaseError> {
        let cleared = sqlx::query(&format!(
            "UPDATE {}
                SET lease_owner = NULL, lease_deadline = NULL, updated_at = clock_timestamp()
              WHERE id = $1 AND lease_epoch = $2 AND lease_owner = $3",
            lease.of.table()
        ))
        .bind(lease.request_id)
        .bind(lease.epoch)
        .bind(&lease.owner)
        .execute(&mut *conn)
        .await?;
        if cleared.rows_affected() == 0 {
            return Err(stale_or_missing(&mut *conn, lease).await?);
        }
        Ok(())
    }

    /// Who Redis says holds a request: `(epoch, owner)`. Advisory only.
    pub async fn liveness(&self, request_id: Uuid) -> Option<(i64, String)> {
        let mut redis = self.redis.clone();
        let get = redis::cmd("GET").arg(self.key(request_id)).to_owned();
        let value: Option<String> = self
            .advisory("read a liveness key", get.query_async(&mut redis))
            .await
            .flatten();
        let value = value?;
        let (epoch, owner) = value.split_once(':')?;
        Some((epoch.parse().ok()?, owner.to_string()))
    }

    /// Runs a liveness script on the lease's key with its epoch, owner and TTL.
    async fn run_liveness(&self, script: &redis::Script, lease: &Lease) -> redis::RedisResult<i64> {
        let mut redis = self.redis.clone();
        script
            .key(self.key(lease.request_id))
            .arg(lease.epoch)
            .arg(&lease.owner)
            .arg(self.ttl_ms())
            .invoke_async(&mut redis)
            .await
    }

    /// Runs a Redis operation as advice: bounded by [`Leases::advisory_limit`], and a
    /// failure is logged, never returned (PostgreSQL decides ownership).
    async fn advisory<T>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Option<T> {
        advisory(self.advisory_limit(), what, op).await
    }

    /// Sets the Redis liveness key of a lease just taken, or put it back (advice only:
    /// a failure is logged).
    pub async fn announce(&self, lease: &Lease) {
        let set = self.run_liveness(claim_script(), lease);
        match self.advisory("set a liveness key", set).await {
            Some(1) | None => {}
            Some(_) => tracing::warn!(
                request_id = %lease.request_id.simple(),
                "Redis shows a newer holder than PostgreSQL; PostgreSQL decides"
            ),
        }
    }

    async fn extend_liveness(&self, lease: &Lease) {
        let extend = self.run_liveness(renew_script(), lease);
        match self.advisory("extend a liveness key", extend).await {
            Some(1) | None => {}
            // The key is gone (Redis restarted or lost its keys): PostgreSQL still says
            // we own the lease, so put the liveness key back.
            Some(-1) => self.announce(lease).await,
            Some(_) => {
                tracing::warn!(request_id = %lease.request_id.simple(), "Redis liveness key held by another owner")
            }
        }
    }

    /// Compare-and-delete of the Redis liveness key, off the caller's path: a job that
    /// has committed its outcome never waits on Redis (the key expires anyway).
    pub fn clear_liveness(&self, lease: &Lease) {
        let mut redis = self.redis.clone();
        let key = self.key(lease.request_id);
        let (epoch, owner) = (lease.epoch, lease.owner.clone());
        let limit = self.advisory_limit();
        self.releases.spawn(async move {
            let mut script = release_script().key(key);
            script.arg(epoch).arg(owner);
            let delete = script.invoke_async::<i64>(&mut redis);
            advisory(limit, "delete a liveness key", delete).await;
        });
    }

    async fn why_not_held(&self, lease: &Lease) -> Result<LeaseError, LeaseError> {
        let mut conn = self.pool.acquire().await?;
        stale_or_missing(&mut conn, lease).await
    }
}

async fn stale_or_missing(
    conn: &mut PgConnection,
    lease: &Lease,
) -> Result<LeaseError, LeaseError> {
    let row: Option<(i64,)> = sqlx::query_as(&format!(
        "SELECT lease_epoch FROM {} WHERE id = $1",
        lease.of.table()
    ))
    .bind(lease.request_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match row {
        None => LeaseError::NotFound(lease.request_id),
        Some((current,)) if current != lease.epoch => LeaseError::StaleOwner {
            request_id: lease.request_id,
            held_epoch: lease.epoch,
            current_epoch: current,
        },
        Some(_) => LeaseError::Expired {
            request_id: lease.request_id,
        },
    })
}

impl Lease {
    /// Checks the fence inside the caller's transaction: locks the request row and
    /// fails unless this lease's epoch and owner are current and its deadline has not
    /// passed. A claimant has to wait for the row lock, so everything the transaction
    /// writes commits before any newer owner exists, or not at all.
    pub async fn fence(&self, conn: &mut PgConnection) -> Result<(), LeaseError> {
        // The same check as the one-trip begin: one implementation, `cairn_fence`.
        sqlx::query("SELECT cairn_fence($1, $2, $3, $4)")
            .bind(self.of.table())
            .bind(self.request_id)
            .bind(self.epoch)
            .bind(&self.owner)
            .execute(conn)
            .await
            .map(|_| ())
            .map_err(|e| self.fence_refusal(e))
    }

    /// Whether this lease was let go by its own holder: the same epoch and no owner (a
    /// takeover or a fence moves the epoch).
    pub async fn released_by_holder(&self, pool: &PgPool) -> bool {
        let released: Result<Option<bool>, _> = sqlx::query_scalar(&format!(
            "SELECT lease_epoch = $2 AND lease_owner IS NULL FROM {} WHERE id = $1",
            self.of.table()
        ))
        .bind(self.request_id)
        .bind(self.epoch)
        .fetch_optional(pool)
        .await;
        matches!(released, Ok(Some(true)))
    }

    /// Whether this lease is still the request's (its epoch and owner), read outside any
    /// transaction: after a write whose connection failed, `true` means the write did
    /// not land, because every final write releases or moves the lease.
    pub async fn still_held(&self, pool: &PgPool) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM {}
                             WHERE id = $1 AND lease_epoch = $2 AND lease_owner = $3)",
            self.of.table()
        ))
        .bind(self.request_id)
        .bind(self.epoch)
        .bind(&self.owner)
        .fetch_one(pool)
        .await
    }

    /// Begins a transaction whose writes are fenced by this lease: every durable worker
    /// write goes through here (or through [`Lease::fence`] on an open transaction).
    ///
    /// Do not cancel this future (a `select!` or a timeout around it): dropped after
    /// its query went out, the connection would go back to the pool inside the new
    /// transaction, holding the leased row until the session's idle-in-transaction
    /// timeout. Each refusal is an `ERROR` in PostgreSQL's log (SQLSTATE `CF00x`).
    pub async fn begin_fenced(
        &self,
        pool: &PgPool,
    ) -> Result<Transaction<'static, Postgres>, LeaseError> {
        let Some(statement) = self.fenced_begin() else {
            let mut tx = pool.begin().await?;
            self.fence(&mut tx).await?;
            return Ok(tx);
        };
        pool.begin_with(statement)
            .await
            .map_err(|e| self.fence_refusal(e))
    }

    /// The fence check and the BEGIN as one simple query (one round trip): the check
    /// runs first, in an implicit block that a refusal aborts (the session is left
    /// idle) and that a BEGIN after it takes into the transaction, with its row lock.
    /// The values are written into the text, as simple queries take no parameters, so
    /// an owner with any character that would need quoting takes the two-trip path.
    fn fenced_begin(&self) -> Option<String> {
        let plain = |c: char| c.is_ascii_alphanumeric() || "-_.:@/".contains(c);
        self.owner.chars().all(plain).then(|| {
            format!(
                "SELECT cairn_fence('{}', '{}', {}, '{}'); BEGIN",
                self.of.table(),
                self.request_id,
                self.epoch,
                self.owner
            )
        })
    }

    /// The lease error a refusal of `cairn_fence` stands for; any other error is the
    /// database's (a lost connection is not a lost lease, and is retried as a fault).
    fn fence_refusal(&self, error: sqlx::Error) -> LeaseError {
        let Some(db) = error.as_database_error() else {
            return LeaseError::Db(error);
        };
        let request_id = self.request_id;
        match db.code().as_deref() {
            Some("CF001") => LeaseError::NotFound(request_id),
            Some("CF002") => LeaseError::StaleOwner {
                request_id,
                held_epoch: self.epoch,
                current_epoch: db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|e| e.detail()?.parse().ok())
                    .unwrap_or(i64::MAX),
            },
            Some("CF003") => LeaseError::Expired { request_id },
            _ => LeaseError::Db(error),
        }
    }
}

/// Runs a Redis operation as advice, within `limit`; a failure or a timeout is logged.
async fn advisory<T>(
    limit: Duration,
    what: &str,
    op: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Option<T> {
    match tokio::time::timeout(limit, op).await {
        Ok(Ok(value)) => Some(value),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, what, "Redis did not do it; Redis is advisory");
            None
        }
        Err(_) => {
            tracing::warn!(
                ?limit,
                what,
                "Redis did not answer in time; Redis is advisory"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(owner: &str) -> Lease {
        Lease {
            of: Leased::Request,
            request_id: Uuid::nil(),
            owner: owner.into(),
            epoch: 7,
            deadline: Utc::now(),
        }
    }

    /// Only owners that need no quoting are written into the query's text.
    #[test]
    fn a_fenced_begin_is_one_query_only_for_owners_that_need_no_quoting() {
        assert_eq!(
            lease("host-1.example:4242/w_@a").fenced_begin().as_deref(),
            Some(
                "SELECT cairn_fence('execution_requests', '00000000-0000-0000-0000-000000000000', 7, 'host-1.example:4242/w_@a'); BEGIN"
            )
        );
        for owner in [
            "o'brien",
            "back\\slash",
            "a b",
            "semi;colon",
            "naïve",
            "new\nline",
            "$$",
        ] {
            assert_eq!(lease(owner).fenced_begin(), None, "{owner:?}");
        }
    }
}
