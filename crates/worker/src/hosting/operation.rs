//! One exec or file operation, in the sandbox's step sandbox, journaled like a step:
//! the intent (running, with this owner's epoch) before it starts, then its receipt,
//! committed with the checkpoint holding its effects when it may change the tree.
//!
//! File operations run as sandboxed commands (`cat`, `find`, a copy from the sandbox's
//! home), so a path resolves in the step sandbox's view: a link out of the tree leads
//! nowhere the step could not reach itself.

use super::staged::Staged;
use super::tree::{self, SandboxTree, Seal};
use super::{HostError, SandboxRow};
use crate::context::Worker;
use crate::isolation;
use crate::live_output::LiveOutput;
use crate::step::{self, StepCommand, StepOutcome};
use crate::workspace::Workspace;
use base64::Engine;
use cairn_common::lease::Lease;
use cairn_common::retry::{self, Delays};
use cairn_common::sandbox::service::{ServiceSpec, LAUNCHER};
use cairn_common::sandbox::spec::MAX_FILE_BYTES;
use cairn_common::sandbox::{operations, ExecSpec, Operation};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What an operation needs of the sandbox's owner: its worker, lease and row, whether
/// the lease is lost, and the namespaces its commands enter.
pub struct Owner<'a> {
    pub worker: &'a Worker,
    pub lease: &'a Lease,
    pub row: &'a SandboxRow,
    pub lost: &'a CancellationToken,
    pub session: Option<&'a isolation::Session>,
}

impl Owner<'_> {
    /// Runs a command of the sandbox: inside its held namespaces when it has them.
    pub async fn run_command(
        &self,
        command: &StepCommand,
        stop: &CancellationToken,
    ) -> Result<StepOutcome, step::StepError> {
        match self.session {
            Some(session) => step::run_in(command, session, &self.worker.isolation, stop).await,
            None => step::run(command, &self.worker.isolation, stop).await,
        }
    }
}

/// How many times the commit of an operation's effects is tried.
const COMMIT_TRIES: usize = 3;
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

/// The sandbox's tree, shared by the operations that run at once: each command runs in
/// its paths, and each commit has it alone.
pub type SharedTree<'t> = tokio::sync::Mutex<&'t mut SandboxTree>;

/// Carries out one operation and writes its receipt; `leaving` ends its command (the
/// sandbox is leaving this worker).
pub async fn perform(
    host: &Owner<'_>,
    tree: &SharedTree<'_>,
    id: Uuid,
    operation: Result<Operation, serde_json::Error>,
    (drain, leaving): (&CancellationToken, &CancellationToken),
) -> Result<(), HostError> {
    let pool = &host.worker.pool;
    let mut tx = host.lease.begin_fenced(pool).await?;
    let settings = &host.worker.custody.settings;
    let store = Some((settings.store_id, settings.store.store().url()));
    let started = operations::start(&mut tx, id, host.lease.epoch, host.row.id, store).await?;
    tx.commit().await?;
    if !started {
        return Ok(());
    }
    let kind = operation.as_ref().map_or("undecodable", Operation::kind);
    host.worker
        .metrics
        .sandbox_operations
        .get_or_create(&crate::metrics::KindLabel {
            kind: kind.to_string(),
        })
        .inc();
    if let Ok(Operation::Snapshot(_) | Operation::Fork(_)) = &operation {
        let mut tree = tree.lock().await;
        return capture(host, &mut tree, id, operation.as_ref().ok()).await;
    }
    let stop = leaving.child_token();
    let watch = tokio::spawn(watch(
        host.worker.pool.clone(),
        host.row.id,
        stop.clone(),
        drain.clone(),
    ));
    let workspace = tree.lock().await.live.workspace.clone();
    let (result, changes) = match &operation {
        Ok(operation) => (
            run(host, &workspace, id, operation, &stop).await,
            operation.changes_tree(),
        ),
        Err(e) => (
            json!({"error": format!("undecodable operation: {e}")}),
            false,
        ),
    };
    watch.abort();
    if host.lost.is_cancelled() {
        return Err(HostError::Lost(cairn_common::lease::LeaseError::Expired {
            request_id: host.row.id,
        }));
    }
    if !changes {
        let mut tx = host.lease.begin_fenced(pool).await?;
        let ended = operations::Ended::Done {
            result: &result,
            snapshot_id: None,
        };
        operations::finish(&mut tx, id, host.lease.epoch, ended).await?;
        tx.commit().await?;
        return Ok(());
    }
    let mut tree = tree.lock().await;
    commit_effects(host, &mut tree, id, &result).await
}

/// Commits an operation's receipt with the checkpoint of its effects, tried again while
/// the capture or the database fails; then the operation ends without a receipt (no
/// receipt without a durable tree) and says so.
async fn commit_effects(
    host: &Owner<'_>,
    tree: &mut SandboxTree,
    id: Uuid,
    result: &Value,
) -> Result<(), HostError> {
    let (min, max) = (Duration::from_millis(300), Duration::from_secs(3));
    let mut delays = Delays::tries(min, max, COMMIT_TRIES);
    let last = loop {
        let seal = Seal::Operation { id, result };
        let error = match tree::commit(host.worker, host.lease, host.row, tree, seal).await {
            Ok(_) => return Ok(()),
            Err(e @ (HostError::Capture(_) | HostError::Db(_) | HostError::Transient(_))) => e,
            Err(e) => return Err(e),
        };
        // A commit whose reply was lost may have landed (custody could not read it
        // back): its receipt says, before the tree is captured again.
        if let HostError::Db(_) = error {
            if let Some(snapshot) = receipted_after_all(host, id).await {
                tree.live.moved_to(snapshot);
                return Ok(());
            }
        }
        tracing::warn!(error = %error, "committing an operation's effects failed");
        if delays.wait(host.lost).await.is_none() {
            break error.to_string();
        }
    };
    let mut tx = host.lease.begin_fenced(&host.worker.pool).await?;
    let error = format!("its effects could not be captured: {last}");
    let ended = operations::Ended::Interrupted {
        error: &error,
        ran: result,
    };
    operations::finish(&mut tx, id, host.lease.epoch, ended).await?;
    tx.commit().await?;
    Ok(())
}

/// The snapshot of an operation's receipt that landed after all, read back until the
/// database answers, within the lease TTL, or until the lease is lost.
async fn receipted_after_all(host: &Owner<'_>, id: Uuid) -> Option<Uuid> {
    let mut delays = host.worker.custody.settings.write_delays();
    let (pool, epoch) = (&host.worker.pool, host.lease.epoch);
    let mut landed = || operations::receipted(pool, id, epoch);
    let lost = || host.lost.is_cancelled();
    let answer = retry::read_back(&mut delays, "an operation's receipt", &lost, &mut landed);
    answer.await.flatten()
}

/// A snapshot resource (or a fork's capture and its sandboxes). The sandbox takes no
/// other operation in turn meanwhile, the tree is this capture's alone, and its
/// processes (an exec beside the others too) are frozen, so the capture is consistent;
/// its receipt says how long that lasted.
async fn capture(
    host: &Owner<'_>,
    tree: &mut SandboxTree,
    id: Uuid,
    operation: Option<&Operation>,
) -> Result<(), HostError> {
    let started = std::time::Instant::now();
    let (name, fork) = match operation {
        Some(Operation::Snapshot(spec)) => (spec.name.as_deref(), None),
        Some(Operation::Fork(spec)) => (None, Some(spec)),
        _ => (None, None),
    };
    let seal = Seal::Resource {
        id,
        name,
        fork,
        started,
    };
    // The processes the sandbox keeps in the background are frozen for the capture, so
    // that it is of one moment; they continue the moment it is taken.
    if let Some(session) = &host.session {
        session.freeze(true);
    }
    let committed = tree::commit(host.worker, host.lease, host.row, tree, seal).await;
    if let Some(session) = &host.session {
        session.freeze(false);
    }
    // Staged after the thaw (the freeze is the capture's alone): what the source
    // changes meanwhile, each fork's cut finds against the capture's manifest, and it
    // restores instead. Only where the forks were kept for this worker.
    let forks = match (&committed, fork) {
        (Ok(snapshot), Some(_)) => forks_here(host, *snapshot).await,
        _ => Vec::new(),
    };
    let takes = match forks.is_empty() {
        true => 0,
        false => tree::staged_forks(host.worker, tree),
    };
    let staged = match &committed {
        Ok(snapshot) if !forks.is_empty() && takes > 0 => stage(host, tree, *snapshot).await,
        _ => false,
    };
    // Those it has a slot for are handed over before the rest are announced.
    let left = if staged {
        hand_over(host, forks, takes)
    } else {
        forks
    };
    if !left.is_empty() {
        release(host, &left).await;
    }
    match committed {
        Ok(_) => Ok(()),
        Err(HostError::Lost(e)) => Err(HostError::Lost(e)),
        Err(e) => {
            tracing::warn!(error = %e, "snapshot capture failed");
            let mut tx = host.lease.begin_fenced(&host.worker.pool).await?;
            let error = format!("the capture failed: {e}");
            let ended = operations::Ended::Failed { error: &error };
            operations::finish(&mut tx, id, host.lease.epoch, ended).await?;
            tx.commit().await?;
            Ok(())
        }
    }
}

/// Stages the fork capture `snapshot`'s tree on this worker's disk (a copy-on-write
/// snapshot of the frozen tree), for its forks placed here to start from without a
/// restore; whether it did. A failure only costs them the restore.
async fn stage(host: &Owner<'_>, tree: &SandboxTree, snapshot: Uuid) -> bool {
    let disk = host.worker.custody.disk.clone();
    let root = tree.live.workspace.root.clone();
    match tokio::task::spawn_blocking(move || disk.stage(&root, snapshot)).await {
        Ok(Ok(staged)) => staged,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "staging the fork's tree failed; its forks restore it");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "staging the fork's tree failed; its forks restore it");
            false
        }
    }
}

/// The forks of `snapshot` meant for this worker, with their tenants.
async fn forks_here(host: &Owner<'_>, snapshot: Uuid) -> Vec<(Uuid, String)> {
    let forks = sqlx::query_as(
        "SELECT id, tenant_id FROM sandboxes
          WHERE source_snapshot_id = $1 AND placement_directory = $2 AND state = 'creating'",
    )
    .bind(snapshot)
    .bind(host.worker.custody.directory.id)
    .fetch_all(&host.worker.pool)
    .await;
    forks.unwrap_or_default()
}

/// Hands at most `takes` of `forks` to this worker's sandbox consumer at once; the
/// others.
fn hand_over(
    host: &Owner<'_>,
    mut forks: Vec<(Uuid, String)>,
    takes: usize,
) -> Vec<(Uuid, String)> {
    let Some(placements) = &host.worker.placements else {
        return forks;
    };
    let mut left = forks.split_off(takes.min(forks.len()));
    for fork in forks {
        if let Err(refused) = placements.try_send(fork) {
            left.push(refused.into_inner());
        }
    }
    left
}

/// The forks kept for this worker that it does not take (their tree was not staged,
/// or it has no slot for them): announced to every worker now, to be restored.
async fn release(host: &Owner<'_>, forks: &[(Uuid, String)]) {
    let ids: Vec<Uuid> = forks.iter().map(|f| f.0).collect();
    let released = async {
        let mut tx = host.worker.pool.begin().await?;
        cairn_common::sandbox::record::place_anywhere(&mut tx, Some(&ids)).await?;
        tx.commit().await
    };
    if let Err(e) = released.await {
        tracing::warn!(error = %e, "forks not handed to every worker; the sweeper does it");
    }
}

/// Stops the running operation when the sandbox is asked to stop or be destroyed, or
/// the worker's drain time is up.
async fn watch(pool: sqlx::PgPool, id: Uuid, stop: CancellationToken, drain: CancellationToken) {
    loop {
        tokio::select! {
            _ = drain.cancelled() => { stop.cancel(); return; }
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        let desired: Result<String, _> =
            sqlx::query_scalar("SELECT desired FROM sandboxes WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await;
        if matches!(desired.as_deref(), Ok("stopped" | "destroyed")) {
            stop.cancel();
            return;
        }
    }
}

async fn run(
    host: &Owner<'_>,
    workspace: &Workspace,
    id: Uuid,
    operation: &Operation,
    stop: &CancellationToken,
) -> Value {
    match operation {
        Operation::Exec(spec) => exec(host, workspace, id, spec, stop).await,
        Operation::Read(file) => {
            let argv = ["cat", "--", &file.path];
            match file_command(host, workspace, id, &argv, stop).await {
                Ok((outcome, stdout)) if outcome.succeeded() => {
                    if stdout.len() > MAX_FILE_BYTES {
                        json!({"error": format!("the file is larger than {MAX_FILE_BYTES} bytes")})
                    } else {
                        json!({"size": stdout.len(), "content": base64::engine::general_purpose::STANDARD.encode(&stdout)})
                    }
                }
                Ok((outcome, _)) => json!({"error": failure(&outcome)}),
                Err(e) => json!({"error": e}),
            }
        }
        Operation::Write { path, content } => {
            let bytes = match base64::engine::general_purpose::STANDARD.decode(content) {
                Ok(bytes) => bytes,
                Err(e) => return json!({"error": format!("content is not base64: {e}")}),
            };
            let staged = match Staged::write(&workspace.home, &bytes).await {
                Ok(staged) => staged,
                Err(e) => return json!({"error": format!("staging the content: {e}")}),
            };
            let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && cat -- \"$HOME/$2\" > \"$1\"";
            let argv = ["sh", "-c", script, "sh", path, staged.name()];
            let written = file_command(host, workspace, id, &argv, stop).await;
            staged.remove().await;
            match written {
                Ok((outcome, _)) if outcome.succeeded() => {
                    json!({"path": path, "size": bytes.len()})
                }
                Ok((outcome, _)) => json!({"error": failure(&outcome)}),
                Err(e) => json!({"error": e}),
            }
        }
        Operation::Snapshot(_) | Operation::Fork(_) => json!({"error": "not a command"}),
        Operation::Service { name, service } => {
            start_service(host, workspace, id, name, service.as_ref(), stop).await
        }
        Operation::List(file) => {
            let argv = [
                "find",
                &file.path,
                "-mindepth",
                "1",
                "-maxdepth",
                "1",
                "-printf",
                "%y %s %P\\0",
            ];
            match file_command(host, workspace, id, &argv, stop).await {
                Ok((outcome, stdout)) if outcome.succeeded() => {
                    json!({"path": file.path, "entries": entries(&stdout)})
                }
                Ok((outcome, _)) => json!({"error": failure(&outcome)}),
                Err(e) => json!({"error": e}),
            }
        }
    }
}

/// Why a file command failed, from its stderr.
fn failure(outcome: &StepOutcome) -> String {
    let said = outcome.stderr_tail.trim();
    if said.is_empty() {
        outcome.describe()
    } else {
        said.to_string()
    }
}

/// `find -printf '%y %s %P\0'` output, as entries sorted by name.
fn entries(listing: &[u8]) -> Vec<Value> {
    let mut entries: Vec<Value> = listing
        .split(|b| *b == 0)
        .filter(|line| !line.is_empty())
        .filter_map(|line| {
            let mut parts = line.splitn(3, |b| *b == b' ');
            let kind = match parts.next()? {
                b"f" => "file",
                b"d" => "dir",
                b"l" => "link",
                _ => "other",
            };
            let size: u64 = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
            let name = String::from_utf8_lossy(parts.next()?).into_owned();
            Some(json!({"name": name, "type": kind, "size": size}))
        })
        .collect();
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    entries
}

/// The command of an operation, in the sandbox's step sandbox.
fn command(
    host: &Owner<'_>,
    workspace: &Workspace,
    key: &str,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    spec: Option<&ExecSpec>,
    live: Option<LiveOutput>,
) -> StepCommand {
    let worker = &host.worker;
    let runner = &worker.isolation;
    let home = runner.home_path(&workspace.home);
    let mut all = BTreeMap::from([
        ("HOME".to_string(), home.to_string_lossy().into_owned()),
        (
            "CAIRN_SANDBOX_ID".to_string(),
            host.row.id.simple().to_string(),
        ),
    ]);
    all.extend(env);
    StepCommand {
        argv,
        env: all,
        place: isolation::Spec {
            workspace: workspace.root.clone(),
            cwd: spec.and_then(|s| s.cwd.clone()),
            home: workspace.home.clone(),
            // Whether the command asks for the network; the sandbox's layers are those of
            // its held namespace, which the command enters.
            network: cairn_common::egress::Effective {
                enabled: spec
                    .and_then(|s| s.network)
                    .unwrap_or(runner.network_default())
                    && spec.is_some(),
                ..host.row.effective_network(runner.network_default())
            },
            limits: runner.limits(None),
            identity: None,
            volumes: Vec::new(),
        },
        timeout: spec.map_or(FILE_TIMEOUT, |s| {
            Duration::from_secs(u64::from(s.timeout_sec))
        }),
        output_base: crate::step_output::output_base(
            &worker.settings.artifacts_dir,
            host.row.id,
            key,
            host.lease.epoch,
        ),
        live,
        max_output: if spec.is_some() {
            worker.settings.output_max_bytes
        } else {
            u64::try_from(MAX_FILE_BYTES).unwrap_or(u64::MAX) + 1
        },
        tail_bytes: worker.settings.output_tail_bytes,
        // A file's content is the caller's: it is returned as it is, never stored.
        redact: spec.is_some() && worker.settings.redact_output,
        kill_grace: worker.settings.kill_grace,
        input: None,
    }
}

async fn exec(
    host: &Owner<'_>,
    workspace: &Workspace,
    id: Uuid,
    spec: &ExecSpec,
    stop: &CancellationToken,
) -> Value {
    // The output goes live to the store as it is printed, under the operation's id.
    let live = LiveOutput {
        store: host.worker.custody.settings.store.store().clone(),
        request_id: id,
        epoch: host.lease.epoch,
        step_index: 0,
    };
    let input = match open_input(spec) {
        Ok(input) => input.map(std::sync::Arc::new),
        Err(e) => {
            let error = format!("the exec's input could not be made: {e}");
            return json!({"exit_code": null, "error": error});
        }
    };
    let argv = match (&input, terminal_leader()) {
        (Some(i), Some(setsid)) if i.is_terminal() => {
            let mut argv = vec![setsid, "--ctty".into(), "--".into()];
            argv.extend(spec.argv.iter().cloned());
            argv
        }
        (Some(i), None) if i.is_terminal() => {
            let error = "a terminal needs util-linux's `setsid` on the worker's PATH";
            return json!({"exit_code": null, "error": error});
        }
        _ => spec.argv.clone(),
    };
    let mut command = command(
        host,
        workspace,
        &format!("exec-{}", id.simple()),
        argv,
        spec.env.clone(),
        Some(spec),
        Some(live),
    );
    command.input = input.clone();
    // `POST …/kill` ends it as a stop does; it is reachable while it runs.
    let kill = stop.child_token();
    let _control = host.worker.controls.enter(id, input, kill.clone());
    match host.run_command(&command, &kill).await {
        Ok(outcome) => json!({
            "killed": kill.is_cancelled() && !stop.is_cancelled(),
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "timed_out": outcome.interrupted == Some(step::Interruption::TimedOut),
            "stopped": outcome.interrupted == Some(step::Interruption::Stopped),
            "limit": outcome.limit.map(|l| l.as_str()),
            "wall_ms": outcome.wall_ms,
            "cpu_ms": outcome.cpu_ms,
            "stdout": outcome.stdout_tail,
            "stderr": outcome.stderr_tail,
            "truncated": outcome.truncated,
            "output_digest": outcome.output_digest,
            "sandbox": outcome.sandbox,
        }),
        Err(e) => json!({"exit_code": null, "error": e.to_string()}),
    }
}

/// What leads a terminal's session: util-linux's `setsid --ctty`, run in the sandbox's
/// own namespaces, so that the command's session, process groups and controlling
/// terminal are all of its pid namespace (a shell's job control works, and `^C` reaches
/// its foreground job, never the worker's `nsenter`). Found once on the worker's PATH,
/// as `nsenter` is; the sandbox's view holds the same `/usr`.
fn terminal_leader() -> Option<String> {
    static FOUND: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let path = std::env::var_os("PATH").unwrap_or_else(|| isolation::DEFAULT_PATH.into());
            isolation::program::find("setsid".as_ref(), &path)
                .map(|p| p.to_string_lossy().into_owned())
        })
        .clone()
}

/// The input an exec asked for: a terminal, its standard input kept open, or none.
fn open_input(spec: &ExecSpec) -> std::io::Result<Option<crate::interactive::Input>> {
    use crate::interactive::Input;
    match (spec.pty, spec.stdin) {
        (Some(size), _) => Input::terminal(size.rows, size.cols).map(Some),
        (None, Some(true)) => Input::pipe().map(Some),
        _ => Ok(None),
    }
}

/// (Re)starts a service in the background, or ends it (`None`), with the launcher
/// script: the receipt says whether it started.
async fn start_service(
    host: &Owner<'_>,
    workspace: &Workspace,
    id: Uuid,
    name: &str,
    service: Option<&ServiceSpec>,
    stop: &CancellationToken,
) -> Value {
    let mut argv = ["sh", "-c", LAUNCHER, "cairn-service", name]
        .map(String::from)
        .to_vec();
    argv.extend(service.iter().flat_map(|s| s.argv.iter().cloned()));
    // Where the launcher keeps the service's pid and log: after the service's own
    // variables, so that one setting `HOME` still finds its earlier instance.
    let home = host.worker.isolation.home_path(&workspace.home);
    let dir = format!("{}/.cairn-services", home.display());
    let mut env = service.map(|s| s.env.clone()).unwrap_or_default();
    env.insert("CAIRN_SERVICE_DIR".into(), dir.clone());
    let spec = ExecSpec {
        argv: argv.clone(),
        env,
        cwd: service.and_then(|s| s.cwd.clone()),
        timeout_sec: 60,
        network: service.and_then(|s| s.network),
        stdin: None,
        pty: None,
    };
    let key = format!("service-{}", id.simple());
    let command = command(
        host,
        workspace,
        &key,
        argv,
        spec.env.clone(),
        Some(&spec),
        None,
    );
    match host.run_command(&command, stop).await {
        Ok(outcome) => json!({
            "name": name,
            "started": service.is_some() && outcome.succeeded(),
            "exit_code": outcome.exit_code,
            "stderr": outcome.stderr_tail,
            "log": format!("{dir}/{name}.log"),
        }),
        Err(e) => json!({"name": name, "started": false, "error": e.to_string()}),
    }
}

/// Runs a file command; its whole stdout, then its output files are removed (a file's
/// content is not kept as output).
async fn file_command(
    host: &Owner<'_>,
    workspace: &Workspace,
    id: Uuid,
    argv: &[&str],
    stop: &CancellationToken,
) -> Result<(StepOutcome, Vec<u8>), String> {
    let argv = argv.iter().map(|a| a.to_string()).collect();
    let command = command(
        host,
        workspace,
        &format!("file-{}", id.simple()),
        argv,
        BTreeMap::new(),
        None,
        None,
    );
    let outcome = host
        .run_command(&command, stop)
        .await
        .map_err(|e| e.to_string())?;
    let stdout = tokio::fs::read(&outcome.stdout_path)
        .await
        .unwrap_or_default();
    let _ = tokio::fs::remove_file(&outcome.stdout_path).await;
    let _ = tokio::fs::remove_file(outcome.stdout_path.with_extension("stderr")).await;
    Ok((outcome, stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_parsed_whatever_the_names() {
        let listing = b"f 12 a b.txt\0d 4096 dir\0l 3 link\0f 0 new\nline\0";
        let parsed = entries(listing);
        let names: Vec<&str> = parsed.iter().filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(names, ["a b.txt", "dir", "link", "new\nline"]);
        assert_eq!(parsed[0]["size"], 12);
        assert_eq!(parsed[1]["type"], "dir");
    }
}
