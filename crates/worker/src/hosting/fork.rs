//! Forks: the new sandboxes one capture provisions, and the identity a tree restored
//! from another sandbox's snapshot must not keep.
//!
//! Credential files never reach a snapshot (every capture leaves them out, see
//! `cairn_snapshot::CaptureRules`). Identity files (a machine id, SSH host keys) are
//! captured with the tree they belong to, and removed from every tree provisioned from
//! another sandbox's snapshot (a fork, a restore, `source: "snapshot:<id>"`), so each
//! new sandbox makes its own.

use cairn_common::digest;
use cairn_common::sandbox::record::{self, NewSandbox};
use cairn_common::sandbox::ForkSpec;
use sqlx::PgConnection;
use std::path::Path;
use uuid::Uuid;

/// Names of identity files: removed from a tree provisioned from another's snapshot.
const IDENTITY_FILES: [&str; 3] = ["machine-id", "random-seed", "dbus-machine-id"];

fn is_identity(name: &str) -> bool {
    IDENTITY_FILES.contains(&name)
        || (name.starts_with("ssh_host_") && (name.ends_with("_key") || name.ends_with("_key.pub")))
}

/// What a walk of a tree does with one entry that is not a directory it goes into.
enum Visit {
    Keep,
    Descend,
    Remove,
}

/// Walks the tree `root` without following a link, each directory opened beneath it,
/// asking `visit` of each entry (its path relative to `root`, whether it is a
/// directory); removes the entries it says to (a directory with all it holds); how
/// many.
fn walk(root: &Path, visit: impl Fn(&Path, bool) -> Visit) -> std::io::Result<u64> {
    use nix::dir::{Dir, Type};
    use nix::fcntl::OFlag;
    use nix::unistd::{unlinkat, UnlinkatFlags};
    use std::os::unix::ffi::OsStrExt;
    let mut removed = 0;
    let mut pending = vec![std::path::PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY;
        let fd = cairn_snapshot::regular::open_beneath(root, &relative, flags)?;
        let mut dir = Dir::from_fd(fd)?;
        let mut children = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
            if name != "." && name != ".." {
                children.push((name, entry.file_type()));
            }
        }
        for (name, kind) in children {
            let is_dir = match kind {
                Some(kind) => kind == Type::Directory,
                None => {
                    let at = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
                    let stat = nix::sys::stat::fstatat(&dir, name.as_os_str(), at)?;
                    stat.st_mode & libc::S_IFMT == libc::S_IFDIR
                }
            };
            let path = relative.join(&name);
            match (visit(&path, is_dir), is_dir) {
                (Visit::Keep, _) => {}
                (Visit::Descend, true) => pending.push(path),
                (Visit::Descend, false) => {}
                // Every directory on the way is a real one (never a link), walked here.
                (Visit::Remove, true) => {
                    std::fs::remove_dir_all(root.join(&path))?;
                    removed += 1;
                }
                (Visit::Remove, false) => {
                    unlinkat(&dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir)?;
                    removed += 1;
                }
            }
        }
    }
    Ok(removed)
}

/// Removes the identity files under `root` (never following a link); how many.
pub fn scrub(root: &Path) -> std::io::Result<u64> {
    walk(root, |path, is_dir| {
        let name = path.file_name().and_then(|n| n.to_str());
        match (is_dir, name.is_some_and(is_identity)) {
            (true, _) => Visit::Descend,
            (false, true) => Visit::Remove,
            (false, false) => Visit::Keep,
        }
    })
}

/// Removes from `root` (a staged copy of a capture's tree) every path the capture's
/// `manifest` does not hold, never following a link: what the capture left out (its
/// rules' exclusions, sockets) is not in the copy either, as a restore would have it.
/// The identity files go too (in the same walk: this is the copy's scrub). How many
/// paths went.
pub fn prune_to(root: &Path, manifest: &cairn_snapshot::Manifest) -> std::io::Result<u64> {
    let kept: std::collections::HashSet<&str> =
        manifest.entries.iter().map(|e| e.path.as_str()).collect();
    walk(root, |path, is_dir| {
        let name = path.file_name().and_then(|n| n.to_str());
        let held = path.to_str().is_some_and(|p| kept.contains(p));
        match (held, is_dir) {
            (true, true) => Visit::Descend,
            (true, false) if name.is_some_and(is_identity) => Visit::Remove,
            (true, false) => Visit::Keep,
            (false, _) => Visit::Remove,
        }
    })
}

/// Records `spec.count` new sandboxes from the fork's capture, each announced for
/// placement, in the caller's fenced transaction: the source's tenant, agent,
/// persistence and timeouts unless the fork sets them. With `staged_at`, none is
/// announced: the worker of that directory (this one) stages the capture's tree, takes
/// the ones it has slots for and announces the rest itself.
pub async fn provision(
    conn: &mut PgConnection,
    source: Uuid,
    snapshot_id: Uuid,
    spec: &ForkSpec,
    staged_at: Option<Uuid>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    type Source = (
        String,
        bool,
        i32,
        i32,
        i32,
        String,
        Option<serde_json::Value>,
        serde_json::Value,
        Vec<i32>,
        serde_json::Value,
    );
    let (
        agent,
        persistent,
        timeout_sec,
        idle_timeout_sec,
        disk_mb,
        tenant,
        network,
        metadata,
        ports,
        services,
    ): Source = sqlx::query_as(
        "SELECT agent, persistent, timeout_sec, idle_timeout_sec, disk_mb, tenant_id, network,
                    metadata, ports, services
               FROM sandboxes WHERE id = $1",
    )
    .bind(source)
    .fetch_one(&mut *conn)
    .await?;
    let timeout_sec = spec
        .timeout_sec
        .map_or(timeout_sec, |t| i32::try_from(t).unwrap_or(i32::MAX));
    let disk_mb = spec.disk_mb.map_or(disk_mb, |d| {
        i32::try_from(d).unwrap_or(i32::MAX).max(disk_mb)
    });
    let digest = digest::of(&serde_json::json!({"fork_of": source, "snapshot": snapshot_id}));
    let mut forks = Vec::new();
    for _ in 0..spec.count() {
        let fork = record::create(
            &mut *conn,
            &NewSandbox {
                agent: &agent,
                persistent,
                always_on: false,
                timeout_sec,
                idle_timeout_sec,
                disk_mb,
                repository: None,
                git_ref: None,
                source_snapshot_id: Some(snapshot_id),
                forked_from: Some(source),
                idempotency_key: None,
                request_digest: &digest,
                tenant: &tenant,
                network: network.clone(),
                metadata: metadata.clone(),
                template_id: None,
                ports: ports.clone(),
                services: services.clone(),
                placement_directory: staged_at,
            },
        )
        .await?;
        forks.push(fork);
    }
    Ok(forks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_files_go_and_the_rest_stays() {
        let root = std::env::temp_dir().join(format!("cairn-scrub-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(root.join("etc/ssh")).expect("dirs");
        for path in [
            "etc/machine-id",
            "etc/ssh/ssh_host_ed25519_key",
            "etc/ssh/ssh_host_ed25519_key.pub",
            "etc/ssh/sshd_config",
            "notes.txt",
        ] {
            std::fs::write(root.join(path), b"x").expect("write");
        }
        // A link to a host directory holding an identity file: never followed.
        let host = root.with_extension("host");
        std::fs::create_dir_all(&host).expect("host");
        std::fs::write(host.join("machine-id"), b"host's").expect("host id");
        std::os::unix::fs::symlink(&host, root.join("etc/linked")).expect("link");
        assert_eq!(scrub(&root).expect("scrub"), 3);
        assert!(host.join("machine-id").exists(), "the host's file stays");
        std::fs::remove_dir_all(&host).expect("cleanup");
        assert!(root.join("etc/ssh/sshd_config").exists());
        assert!(root.join("notes.txt").exists());
        assert!(!root.join("etc/machine-id").exists());
        std::fs::remove_dir_all(&root).expect("cleanup");
    }
}
