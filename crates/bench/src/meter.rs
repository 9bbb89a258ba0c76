//! What a scenario cost the machine, read before and after it: of one database, the
//! transactions (`pg_stat_database`) and statements (`pg_stat_statements`, when the
//! server loads it); of the whole server, WAL flushes (`pg_stat_wal`) and CPU time (every
//! `postgres` process, and what the postmaster reaped). Statistics a backend has not
//! yet flushed are not counted: read after the scenario's connections are closed.

use anyhow::Context;

/// The marker in the bench's own queries (and the peer drivers' polling), which
/// statement counts leave out and transaction counts subtract (each is a transaction of
/// its own). It sits inside the statement: `pg_stat_statements` keeps no leading
/// comment.
pub const OWN: &str = "/* cairn-bench */";

/// One reading of the counters.
#[derive(Clone, Copy, Default)]
pub struct Reading {
    transactions: i64,
    statements: Option<i64>,
    /// Calls of the marked statements.
    own: Option<i64>,
    wal_flushes: i64,
    postgres_ticks: u64,
}

/// A scenario's cost per job.
pub struct Cost {
    pub transactions: f64,
    /// `None` without `pg_stat_statements`.
    pub statements: Option<f64>,
    pub wal_flushes: f64,
    pub postgres_cpu_ms: f64,
}

/// One statement's share of a scenario, per job.
pub struct Statement {
    pub calls: f64,
    /// PostgreSQL's execution time per call, in µs.
    pub mean_us: f64,
    /// The statement's text, its white space folded, cut to 70 characters.
    pub text: String,
}

/// Reads the counters through `admin` (a connection to the `postgres` database).
pub struct Meter {
    admin: sqlx::PgPool,
    statements: bool,
    ms_per_tick: f64,
}

impl Meter {
    pub async fn connect(postgres: &str) -> anyhow::Result<Meter> {
        let admin =
            sqlx::PgPool::connect(&format!("{}/postgres", postgres.trim_end_matches('/'))).await?;
        let preloaded: String = sqlx::query_scalar("SHOW shared_preload_libraries")
            .fetch_one(&admin)
            .await?;
        let statements = preloaded
            .split(',')
            .any(|l| l.trim() == "pg_stat_statements");
        if statements {
            sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(&admin)
                .await?;
        }
        Ok(Meter {
            admin,
            statements,
            ms_per_tick: 1000.0 / clock_ticks()?,
        })
    }

    /// Why statements are not counted, if they are not.
    pub fn statements_missing(&self) -> Option<&'static str> {
        (!self.statements).then_some(
            "statements not counted: this PostgreSQL does not load pg_stat_statements (ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements', then restart it)",
        )
    }

    /// The counters now; `database` need not exist yet. With `settle`, after its
    /// backends have gone.
    pub async fn read(&self, database: &str, settle: bool) -> anyhow::Result<Reading> {
        if settle {
            self.settle(database).await?;
        }
        let transactions: Option<i64> = sqlx::query_scalar(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
        )
        .bind(database)
        .fetch_optional(&self.admin)
        .await?;
        let (statements, own) = if self.statements {
            let (calls, own): (Option<i64>, Option<i64>) = sqlx::query_as(&format!(
                "SELECT sum(calls) FILTER (WHERE s.query NOT LIKE '%{OWN}%')::int8,
                        sum(calls) FILTER (WHERE s.query LIKE '%{OWN}%')::int8
                   FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                  WHERE d.datname = $1"
            ))
            .bind(database)
            .fetch_one(&self.admin)
            .await?;
            (Some(calls.unwrap_or(0)), Some(own.unwrap_or(0)))
        } else {
            (None, None)
        };
        let wal_flushes: i64 = sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal")
            .fetch_one(&self.admin)
            .await?;
        Ok(Reading {
            transactions: transactions.unwrap_or(0),
            statements,
            own,
            wal_flushes,
            postgres_ticks: postgres_ticks()?,
        })
    }

    /// The statements of `database` called at least once per two of `jobs` (so the
    /// start's are left out), by total execution time, counted since the database was
    /// made (its start included); empty without `pg_stat_statements`.
    pub async fn statements(&self, database: &str, jobs: usize) -> anyhow::Result<Vec<Statement>> {
        if !self.statements {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, f64, String)> = sqlx::query_as(&format!(
            "SELECT s.calls, s.total_exec_time, s.query
               FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
              WHERE d.datname = $1 AND s.calls >= $2 AND s.query NOT LIKE '%{OWN}%'
              ORDER BY s.total_exec_time DESC"
        ))
        .bind(database)
        .bind((jobs / 2) as i64)
        .fetch_all(&self.admin)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(calls, total_ms, query)| Statement {
                calls: calls as f64 / jobs as f64,
                mean_us: total_ms * 1000.0 / calls as f64,
                text: query
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(70)
                    .collect(),
            })
            .collect())
    }

    /// Waits (up to 10 s) until no backend is connected to `database`: a backend
    /// flushes its statistics when it exits.
    async fn settle(&self, database: &str) -> anyhow::Result<()> {
        for _ in 0..100 {
            let backends: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(database)
            .fetch_one(&self.admin)
            .await?;
            if backends == 0 {
                // A backend leaves pg_stat_activity just before it flushes.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        eprintln!("cairn-bench: backends of {database} still connected after 10 s: their statistics may be missing");
        Ok(())
    }

    /// The cost per job between two readings, less the transactions of the marked
    /// statements (without `pg_stat_statements`: less `own_transactions`).
    pub fn cost(
        &self,
        before: Reading,
        after: Reading,
        jobs: usize,
        own_transactions: u64,
    ) -> Cost {
        let per = |n: i64| n as f64 / jobs as f64;
        let own = match (after.own, before.own) {
            (Some(after), Some(before)) => after - before,
            _ => own_transactions as i64,
        };
        Cost {
            transactions: per(after.transactions - before.transactions - own),
            statements: after
                .statements
                .zip(before.statements)
                .map(|(a, b)| per(a - b)),
            wal_flushes: per(after.wal_flushes - before.wal_flushes),
            postgres_cpu_ms: per(after.postgres_ticks.saturating_sub(before.postgres_ticks) as i64)
                * self.ms_per_tick,
        }
    }

    pub async fn drop_database(&self, database: &str) -> anyhow::Result<()> {
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
        ))
        .execute(&self.admin)
        .await?;
        Ok(())
    }

    pub fn ms_per_tick(&self) -> f64 {
        self.ms_per_tick
    }

    pub async fn close(self) {
        self.admin.close().await;
    }
}

/// Clock ticks per second, the unit of `/proc/<pid>/stat`'s times.
pub fn clock_ticks() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("getconf CLK_TCK")?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK printed no number")
}

/// What `/proc/<pid>/stat` says of a process.
struct Stat {
    comm: String,
    ppid: u32,
    /// Its own CPU ticks, user and system.
    own: u64,
    /// The CPU ticks of the children it reaped.
    reaped: u64,
}

/// Reads a stat line; the command may hold spaces and ')'.
fn parse_stat(stat: &str) -> Option<Stat> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the command: state is 0, ppid 1, … utime 11, stime 12, cutime 13, cstime 14.
    let field = |i: usize| -> u64 { fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0) };
    Some(Stat {
        comm: stat.get(open + 1..close)?.to_string(),
        ppid: u32::try_from(field(1)).unwrap_or(0),
        own: field(11) + field(12),
        reaped: field(13) + field(14),
    })
}

/// A process's CPU ticks: its own (user + system) and its reaped children's.
pub fn process_ticks(pid: u32) -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let stat = parse_stat(&stat).context("a /proc stat line")?;
    Ok((stat.own, stat.reaped))
}

/// PostgreSQL's CPU ticks: every `postgres` process's own, and the children the
/// postmaster (the one whose parent is not `postgres`) reaped: backends that exited.
fn postgres_ticks() -> anyhow::Result<u64> {
    let mut processes = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // A process may exit between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some(stat) = parse_stat(&stat).filter(|s| s.comm == "postgres") {
            processes.push((pid, stat));
        }
    }
    let pids: std::collections::HashSet<u32> = processes.iter().map(|p| p.0).collect();
    Ok(processes
        .iter()
        .map(|(_, s)| s.own + if pids.contains(&s.ppid) { 0 } else { s.reaped })
        .sum())
}

#[cfg(test)]
mod tests {
    use super::parse_stat;

    #[test]
    fn a_command_with_spaces_and_parentheses_is_read_whole() {
        let stat = parse_stat("42 (a b) c) S 1 42 42 0 -1 0 0 0 0 0 7 3 5 1 20").expect("parsed");
        assert_eq!(stat.comm, "a b) c");
        // utime 7 + stime 3; cutime 5 + cstime 1.
        assert_eq!((stat.ppid, stat.own, stat.reaped), (1, 10, 6));
    }
}
