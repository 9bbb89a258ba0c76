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

/// What a walk of a tree does with one entry.
enum Visit {
    Keep,
    Descend,
    Remove,
    /// The tree is not what it should be: the walk stops with an error.
    Refuse(&'static str),
}

/// Walks the tree `root` without following a link, each directory opened beneath it,
/// asking `visit` of each entry (its path relative to `root`, its own stat); removes the
/// entries it says to (a directory with all it holds); how many.
fn walk(
    root: &Path,
    mut visit: impl FnMut(&Path, &nix::sys::stat::FileStat) -> Visit,
) -> std::io::Result<u64> {
    use nix::dir::Dir;
    use nix::fcntl::{AtFlags, OFlag};
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
                children.push(name);
            }
        }
        for name in children {
            let stat =
                nix::sys::stat::fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
            let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
            let path = relative.join(&name);
            match (visit(&path, &stat), is_dir) {
                (Visit::Keep, _) | (Visit::Descend, false) => {}
                (Visit::Descend, true) => pending.push(path),
                (Visit::Refuse(why), _) => {
                    return Err(std::io::Error::other(format!("{}: {why}", path.display())))
                }
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

fn is_dir(stat: &nix::sys::stat::FileStat) -> bool {
    stat.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Removes the identity files under `root` (never following a link); how many.
pub fn scrub(root: &Path) -> std::io::Result<u64> {
    walk(root, |path, stat| {
        let name = path.file_name().and_then(|n| n.to_str());
        match (is_dir(stat), name.is_some_and(is_identity)) {
            (true, _) => Visit::Descend,
            (false, true) => Visit::Remove,
            (false, false) => Visit::Keep,
        }
    })
}

/// Cuts `root` (a staged copy of a capture's tree) to the capture's `manifest`, never
/// following a link: every path the manifest does not hold goes (what the capture left
/// out: its rules' exclusions, a file holding a secret, sockets), as do the identity
/// files (this is the copy's scrub). Every other file and link must be the manifest's,
/// stat for stat (inode, size, mode, times), and every path of the manifest there.
/// Otherwise (the source changed it after its capture; a nested subvolume a snapshot
/// leaves empty) an error: restore instead. The manifest cut the same way (the identity
/// files out, each directory's stat taken again once the cut is done: removals change
/// their times, the copy's root is a new subvolume's) is then a true index of the copy,
/// as a capture of it would write it; and how many paths went.
pub fn prune_to(
    root: &Path,
    manifest: cairn_snapshot::Manifest,
) -> std::io::Result<(cairn_snapshot::Manifest, u64)> {
    let mut identity = std::collections::HashSet::new();
    let removed = {
        let entries: std::collections::HashMap<&str, &cairn_snapshot::Entry> = manifest
            .entries
            .iter()
            .filter(|e| !e.path.is_empty())
            .map(|e| (e.path.as_str(), e))
            .collect();
        let mut seen = 0;
        let removed = walk(root, |path, stat| {
            let Some(entry) = path.to_str().and_then(|p| entries.get(p)) else {
                return Visit::Remove;
            };
            seen += 1;
            let name = path.file_name().and_then(|n| n.to_str());
            if is_dir(stat) {
                // A subvolume's root (256), or the empty placeholder a snapshot leaves
                // of a nested one (2): its files are not in the copy.
                return match stat.st_ino {
                    2 | 256 => Visit::Refuse("a nested subvolume"),
                    _ => Visit::Descend,
                };
            }
            if name.is_some_and(is_identity) {
                identity.insert(entry.path.clone());
                return Visit::Remove;
            }
            if same_stat(entry, stat) {
                Visit::Keep
            } else {
                Visit::Refuse("changed since its capture")
            }
        })?;
        if seen != entries.len() {
            return Err(std::io::Error::other("paths of the capture are missing"));
        }
        removed
    };
    let mut manifest = manifest;
    manifest.entries.retain(|e| !identity.contains(&e.path));
    let dirs = manifest.entries.iter_mut();
    for entry in dirs.filter(|e| e.kind == cairn_snapshot::EntryKind::Dir) {
        // Each walked as a real directory, in a tree nothing runs in yet.
        let stat = nix::sys::stat::lstat(&root.join(&entry.path))?;
        if !is_dir(&stat) {
            return Err(std::io::Error::other(
                "a directory of the capture is not one",
            ));
        }
        entry.mode = stat.st_mode & 0o7777;
        entry.inode = stat.st_ino;
        entry.mtime_ns = nanos(stat.st_mtime, stat.st_mtime_nsec);
        entry.ctime_ns = nanos(stat.st_ctime, stat.st_ctime_nsec);
    }
    Ok((manifest, removed))
}

fn nanos(seconds: i64, nanoseconds: i64) -> i64 {
    seconds
        .saturating_mul(1_000_000_000)
        .saturating_add(nanoseconds)
}

/// Whether a file or link is, by its stat, the manifest's `entry`.
fn same_stat(entry: &cairn_snapshot::Entry, stat: &nix::sys::stat::FileStat) -> bool {
    use cairn_snapshot::EntryKind;
    let kind = match stat.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFLNK => EntryKind::Symlink,
        _ => return false,
    };
    let size_matches =
        kind != EntryKind::File || u64::try_from(stat.st_size).ok() == Some(entry.size);
    entry.kind == kind
        && size_matches
        && entry.mode == stat.st_mode & 0o7777
        && entry.inode == stat.st_ino
        && entry.mtime_ns == nanos(stat.st_mtime, stat.st_mtime_nsec)
        && entry.ctime_ns == nanos(stat.st_ctime, stat.st_ctime_nsec)
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

    /// A manifest of `paths` under `root` as they stand (what a capture would record).
    fn manifest_of(root: &Path, paths: &[&str]) -> cairn_snapshot::Manifest {
        use cairn_snapshot::{Entry, EntryKind};
        use std::os::unix::fs::MetadataExt;
        let entries = paths
            .iter()
            .map(|path| {
                let meta = std::fs::symlink_metadata(root.join(path)).expect("stat");
                let kind = if meta.is_dir() {
                    EntryKind::Dir
                } else {
                    EntryKind::File
                };
                Entry {
                    path: (*path).to_string(),
                    kind,
                    mode: meta.mode() & 0o7777,
                    size: if meta.is_dir() { 0 } else { meta.size() },
                    mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
                    ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
                    inode: meta.ino(),
                    chunks: Vec::new(),
                    target: None,
                }
            })
            .collect();
        cairn_snapshot::Manifest {
            version: cairn_snapshot::manifest::VERSION,
            packs: Vec::new(),
            entries,
        }
    }

    #[test]
    fn a_staged_copy_is_cut_to_its_capture_or_refused() {
        let root = std::env::temp_dir().join(format!("cairn-prune-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(root.join("d/left-out")).expect("dirs");
        for path in [
            "a.txt",
            "d/b.txt",
            "secret.txt",
            "d/left-out/x",
            "machine-id",
        ] {
            std::fs::write(root.join(path), path).expect("write");
        }
        let captured = ["", "a.txt", "d", "d/b.txt", "machine-id"];
        let mut manifest = manifest_of(&root, &captured);
        // As if captured before its directories last changed (a mode too).
        use std::os::unix::fs::PermissionsExt;
        let private = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(root.join("d"), private).expect("chmod");
        for entry in manifest
            .entries
            .iter_mut()
            .filter(|e| e.kind == cairn_snapshot::EntryKind::Dir)
        {
            (entry.mtime_ns, entry.ctime_ns) = (0, 0);
        }
        // What the capture left out goes, and the identity file: the rest stays.
        let (cut, removed) = prune_to(&root, manifest.clone()).expect("cut");
        assert_eq!(removed, 3);
        assert!(root.join("a.txt").exists() && root.join("d/b.txt").exists());
        assert!(!root.join("secret.txt").exists() && !root.join("d/left-out").exists());
        assert!(!root.join("machine-id").exists());
        // The cut manifest is the copy as it now stands, the directories' times too.
        assert_eq!(
            cut.entries,
            manifest_of(&root, &["", "a.txt", "d", "d/b.txt"]).entries
        );
        // A file changed since its capture: refused (its copy is not the capture's).
        std::fs::write(root.join("a.txt"), "changed").expect("write");
        assert!(prune_to(&root, cut.clone()).is_err());
        // A path of the capture missing: refused.
        let manifest = manifest_of(&root, &["a.txt", "d", "d/b.txt"]);
        std::fs::remove_file(root.join("d/b.txt")).expect("remove");
        assert!(prune_to(&root, manifest).is_err());
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

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
