//! Admission: new runs, each with its execution request (the ticket) and its outbox
//! announcement, in the caller's transaction; and the record of an idempotent batch.

use crate::digest;
use crate::outbox;
use crate::run::{JobKind, JobMessage, RunSpec};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// Admits runs in the caller's transaction: each run, its execution request and its
/// outbox message, in bulk statements, all in `tenant`, by the token `operator` (an
/// idempotency key is kept per operator). Returns the new run ids in order.
pub async fn admit(
    conn: &mut PgConnection,
    specs: &[RunSpec],
    operator: Uuid,
    tenant: &str,
    idempotency_key: Option<&str>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let run_ids: Vec<Uuid> = specs.iter().map(|_| Uuid::new_v4()).collect();
    let agents: Vec<&str> = specs.iter().map(|s| s.agent.as_str()).collect();
    let repositories: Vec<Option<&str>> = specs.iter().map(|s| s.repository.as_deref()).collect();
    let refs: Vec<Option<&str>> = specs.iter().map(|s| s.git_ref.as_deref()).collect();
    let steps: Vec<serde_json::Value> = specs
        .iter()
        .map(|s| serde_json::to_value(s.effective_steps()).unwrap_or_default())
        .collect();
    let max_commands: Vec<i32> = specs
        .iter()
        .map(|s| clamp_i32(s.budgets.max_commands))
        .collect();
    let max_wall: Vec<i32> = specs
        .iter()
        .map(|s| clamp_i32(s.budgets.max_wall_seconds))
        .collect();
    let max_attempts: Vec<i32> = specs.iter().map(|s| clamp_i32(s.max_attempts())).collect();
    let deadlines: Vec<Option<DateTime<Utc>>> = specs.iter().map(|s| s.deadline).collect();
    let labels: Vec<serde_json::Value> = specs
        .iter()
        .map(|s| serde_json::to_value(&s.labels).unwrap_or_default())
        .collect();
    let flow = Flow::of(specs);
    let digests: Vec<String> = specs.iter().map(input_digest).collect();
    let keys: Vec<Option<String>> = specs
        .iter()
        .map(|_| idempotency_key.map(|k| format!("{}:{k}", operator.simple())))
        .collect();
    sqlx::query(
        "INSERT INTO runs (id, root_run_id, work_context_id, agent, operator_id, repository, git_ref, steps,
                           max_commands, max_wall_seconds, max_attempts, deadline, state,
                           idempotency_key, request_digest, tenant_id, labels, concurrency_key,
                           concurrency_limit, priority, rate_key, rate_per_second)
         SELECT id, id, id, agent, $12, repository, git_ref, steps, max_commands, max_wall_seconds,
                max_attempts, deadline, 'queued', idempotency_key, request_digest, $13, labels,
                concurrency_key, concurrency_limit, priority, rate_key, rate_per_second
           FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int[],
                       $7::int[], $8::int[], $9::timestamptz[], $10::text[], $11::text[], $14::jsonb[],
                       $15::text[], $16::int[], $17::int[], $18::text[], $19::int[])
             AS t(id, agent, repository, git_ref, steps, max_commands, max_wall_seconds,
                  max_attempts, deadline, idempotency_key, request_digest, labels, concurrency_key,
                  concurrency_limit, priority, rate_key, rate_per_second)",
    )
    .bind(&run_ids)
    .bind(&agents)
    .bind(&repositories)
    .bind(&refs)
    .bind(&steps)
    .bind(&max_commands)
    .bind(&max_wall)
    .bind(&max_attempts)
    .bind(&deadlines)
    .bind(&keys)
    .bind(&digests)
    .bind(operator)
    .bind(tenant)
    .bind(&labels)
    .bind(&flow.concurrency_key)
    .bind(&flow.concurrency_limit)
    .bind(&flow.priority)
    .bind(&flow.rate_key)
    .bind(&flow.rate_per_second)
    .execute(&mut *conn)
    .await?;
    let limits = Limits {
        max_attempts: &max_attempts,
        max_commands: &max_commands,
        max_wall: &max_wall,
    };
    tickets(conn, &run_ids, &limits, &flow.held).await?;
    Ok(run_ids)
}

/// The flow control of each run, as columns.
struct Flow {
    concurrency_key: Vec<Option<String>>,
    concurrency_limit: Vec<Option<i32>>,
    priority: Vec<Option<i32>>,
    rate_key: Vec<Option<String>>,
    rate_per_second: Vec<Option<i32>>,
    /// Whether the gate holds it.
    held: Vec<bool>,
}

impl Flow {
    fn of(specs: &[RunSpec]) -> Flow {
        Flow {
            concurrency_key: specs.iter().map(|s| s.concurrency_key.clone()).collect(),
            concurrency_limit: specs
                .iter()
                .map(|s| {
                    s.concurrency_key
                        .as_ref()
                        .map(|_| clamp_i32(s.concurrency_limit.unwrap_or(1)))
                })
                .collect(),
            priority: specs.iter().map(|s| s.priority).collect(),
            rate_key: specs
                .iter()
                .map(|s| s.rate_limit.as_ref().map(|r| r.key.clone()))
                .collect(),
            rate_per_second: specs
                .iter()
                .map(|s| s.rate_limit.as_ref().map(|r| clamp_i32(r.per_second)))
                .collect(),
            held: specs.iter().map(RunSpec::flow_controlled).collect(),
        }
    }
}

/// Each run's limits, as columns.
struct Limits<'a> {
    max_attempts: &'a [i32],
    max_commands: &'a [i32],
    max_wall: &'a [i32],
}

/// The runs' execution requests, queued, and the announcements of those the gate does
/// not hold (it announces the others when their flow control lets them start).
async fn tickets(
    conn: &mut PgConnection,
    run_ids: &[Uuid],
    limits: &Limits<'_>,
    held: &[bool],
) -> Result<(), sqlx::Error> {
    let request_ids: Vec<Uuid> = run_ids.iter().map(|_| Uuid::new_v4()).collect();
    sqlx::query(
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands, max_wall_seconds,
                                         held_by_gate)
         SELECT id, run_id, 'run', 'queued', max_attempts, max_commands, max_wall_seconds, held
           FROM UNNEST($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::int[], $6::bool[])
             AS t(id, run_id, max_attempts, max_commands, max_wall_seconds, held)",
    )
    .bind(&request_ids)
    .bind(run_ids)
    .bind(limits.max_attempts)
    .bind(limits.max_commands)
    .bind(limits.max_wall)
    .bind(held)
    .execute(&mut *conn)
    .await?;
    let messages: Vec<JobMessage> = run_ids
        .iter()
        .zip(&request_ids)
        .zip(held)
        .filter(|(_, held)| !**held)
        .map(|((run_id, request_id), _)| JobMessage {
            tenant: None,
            kind: JobKind::Run,
            run_id: *run_id,
            request_id: *request_id,
            action_id: None,
            attempt: Some(1),
        })
        .collect();
    if !messages.is_empty() {
        outbox::announce_many(conn, JobKind::Run, &messages).await?;
    }
    Ok(())
}

/// Records that `run_id` was admitted as a rerun of `earlier`, in the caller's
/// transaction.
pub async fn link_rerun(
    conn: &mut PgConnection,
    run_id: Uuid,
    earlier: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE runs SET rerun_of = $2 WHERE id = $1")
        .bind(run_id)
        .bind(earlier)
        .execute(conn)
        .await?;
    Ok(())
}

/// What an idempotency key binds: the input with its defaults filled in.
pub fn input_digest(spec: &RunSpec) -> String {
    digest::of(&spec.normalized())
}

fn clamp_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// Records the runs an idempotent batch admitted, in its transaction; a unique violation
/// means a concurrent batch with the same key won.
pub async fn save_batch(
    conn: &mut PgConnection,
    key: &str,
    digest: &str,
    run_ids: &[Uuid],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO batch_admissions (idempotency_key, request_digest, run_ids) VALUES ($1, $2, $3)",
    )
    .bind(key)
    .bind(digest)
    .bind(run_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// Admits a publication's own execution request on `run_id` (queued, with no command
/// budget: it runs no agent command) and announces it, in the caller's transaction.
pub async fn publication(
    conn: &mut PgConnection,
    request_id: Uuid,
    run_id: Uuid,
    (max_attempts, max_wall_seconds): (i32, i32),
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands, max_wall_seconds)
         VALUES ($1, $2, 'publication', 'queued', $3, 0, $4)",
    )
    .bind(request_id)
    .bind(run_id)
    .bind(max_attempts)
    .bind(max_wall_seconds)
    .execute(&mut *conn)
    .await?;
    let message = JobMessage {
        tenant: None,
        kind: JobKind::Publication,
        run_id,
        request_id,
        action_id: None,
        attempt: Some(1),
    };
    outbox::announce(conn, &message).await?;
    Ok(())
}
