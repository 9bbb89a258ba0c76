//! The workspaces' disk: every tree and home is a btrfs subvolume with a quota of its
//! own, so a step that writes past its run's or sandbox's size fails with "Disk quota
//! exceeded" and the host's disk never holds more than the volume's size.
//!
//! The volume is the workspaces directory itself when that is a btrfs filesystem (an
//! operator's volume). Otherwise the worker makes one: a sparse image file in the
//! directory (`.cairn-disk.img`), loop-mounted over the directory in the worker's own
//! mount namespace, so that it goes away with the process however it ends and is
//! mounted again, with its trees, by the next worker on the directory. Project quotas
//! on ext4 or XFS would need the kernel's quota support; a size-limited mount per tree
//! costs a mount and a filesystem per run; a subvolume and its quota are two ioctls
//! (docs/SECURITY.md, "Disk").

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether trees get a disk quota: the sandbox's modes, for the volume. `Auto`: quotas
/// where the worker can make its volume (root, loop devices, btrfs), else unbounded
/// trees and a warning; `Required`: no start without them; `Off`: plain directories.
pub use crate::isolation::Mode;

const IMAGE: &str = ".cairn-disk.img";
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
const MIB: u64 = 1024 * 1024;
const SUBVOLUME_ROOT_INODE: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0} failed: {1}")]
    Tool(&'static str, String),
    #[error("disk quotas need {0}")]
    Unavailable(String),
}

/// The volume trees are made on, or none (trees are unbounded).
#[derive(Debug, Clone)]
pub struct Disk {
    /// Where trees and homes are: the workspaces directory.
    root: PathBuf,
    enforced: bool,
    /// Why trees are unbounded, when they are.
    pub unbounded_because: Option<String>,
}

/// Call before any thread starts (the mount namespace is per process only then): gives
/// the process a mount namespace of its own, whose mounts never reach the host's, when
/// this process may make its volume.
pub fn private_mounts(mode: Mode) -> Result<(), DiskError> {
    if mode == Mode::Off || !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    use nix::mount::{mount, MsFlags};
    let done = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).and_then(|()| {
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        )
    });
    match (done, mode) {
        (Ok(()), _) | (Err(_), Mode::Auto) => Ok(()),
        (Err(e), _) => Err(DiskError::Unavailable(format!(
            "a mount namespace of the worker's own: {e}"
        ))),
    }
}

impl Disk {
    /// Opens (making it the first time) the volume of the claimed directory `dir`.
    pub fn open(dir: &Path, mode: Mode, size_mb: u64) -> Result<Disk, DiskError> {
        let unbounded = |why: String| Disk {
            root: dir.to_path_buf(),
            enforced: false,
            unbounded_because: Some(why),
        };
        if mode == Mode::Off {
            return Ok(unbounded("CAIRN_DISK_QUOTA=off".into()));
        }
        match mount_volume(dir, size_mb) {
            Ok(()) => Ok(Disk {
                root: dir.to_path_buf(),
                enforced: true,
                unbounded_because: None,
            }),
            Err(e) if mode == Mode::Auto => Ok(unbounded(e.to_string())),
            Err(e) => Err(e),
        }
    }

    /// A volume of nothing: trees are plain directories in `dir` (tests, tools).
    pub fn unbounded(dir: &Path) -> Disk {
        Disk {
            root: dir.to_path_buf(),
            enforced: false,
            unbounded_because: Some("not asked for".into()),
        }
    }

    /// The workspaces directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn enforced(&self) -> bool {
        self.enforced
    }

    /// Says at start whether trees are bounded, and gives `/readyz` its `disk` details.
    pub fn report(&self, run_disk_mb: u64) -> serde_json::Value {
        match &self.unbounded_because {
            None => tracing::info!(run_disk_mb, "trees have disk quotas"),
            Some(why) => {
                tracing::warn!(reason = %why, "trees have no disk quota: a step can fill the host's disk")
            }
        }
        serde_json::json!({
            "quota": self.enforced,
            "run_disk_mb": self.enforced.then_some(run_disk_mb),
            "unbounded_because": self.unbounded_because,
        })
    }

    /// Makes `path`, a tree or home in the workspaces directory, empty, with
    /// room for `quota_mb` MiB. What was there is removed first.
    pub fn make(&self, path: &Path, quota_mb: u64) -> std::io::Result<()> {
        // Made empty a moment ago (a reset, then a cold start): kept, with this room.
        if self.is_empty_tree(path) {
            return self.resize(path, quota_mb);
        }
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if !self.enforced {
            return std::fs::create_dir_all(path);
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(std::io::Error::other("a tree needs a parent and a name"));
        };
        if !parent.starts_with(&self.root) {
            return Err(std::io::Error::other(format!(
                "{} is not in the workspaces directory",
                path.display()
            )));
        }
        // Parents are the worker's own (a check's scratch root), never a step's.
        std::fs::create_dir_all(parent)?;
        let parent = open_directory(parent)?;
        create_subvolume(&parent, name.as_encoded_bytes())?;
        let made = open_beneath(&parent, name.as_encoded_bytes())?;
        limit(&made, quota_mb.saturating_mul(MIB))
    }
}

impl Disk {
    /// Whether `path` is an empty tree as [`Disk::make`] makes them (a subvolume where
    /// trees have quotas), not a link.
    fn is_empty_tree(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return false;
        };
        meta.is_dir()
            && (!self.enforced || meta.ino() == SUBVOLUME_ROOT_INODE)
            && std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
    }

    /// Sets the room of `path`, a tree [`Disk::make`] made; a plain directory (made
    /// before the volume had quotas) is left as it is.
    pub fn resize(&self, path: &Path, quota_mb: u64) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if !self.enforced || path.parent() != Some(self.root.as_path()) {
            return Ok(());
        }
        let Some(name) = path.file_name() else {
            return Ok(());
        };
        let parent = open_directory(&self.root)?;
        let tree = open_beneath(&parent, name.as_encoded_bytes())?;
        // A subvolume's root is inode 256; the limit of any other directory would be
        // its volume's.
        if File::from(tree.try_clone()?).metadata()?.ino() != SUBVOLUME_ROOT_INODE {
            return Ok(());
        }
        limit(&tree, quota_mb.saturating_mul(MIB))
    }
}

/// Where volumes are, in the workspaces directory: never a request's tree, so neither
/// the janitor nor a tree's reset ever touches them.
const VOLUMES: &str = ".volumes";

impl Disk {
    /// A volume's directory, made on its first use with room for `quota_mb` MiB and
    /// kept as it is after (its room set again: a size never changes, but a volume
    /// made before quotas is a plain directory and stays one).
    pub fn volume(&self, id: uuid::Uuid, quota_mb: u64) -> std::io::Result<PathBuf> {
        let parent = self.root.join(VOLUMES);
        std::fs::create_dir_all(&parent)?;
        let name = id.simple().to_string();
        let path = parent.join(&name);
        if !self.enforced {
            std::fs::create_dir_all(&path)?;
            return Ok(path);
        }
        let parent = open_directory(&parent)?;
        let volume = match open_beneath(&parent, name.as_bytes()) {
            Ok(volume) => volume,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_subvolume(&parent, name.as_bytes())?;
                open_beneath(&parent, name.as_bytes())?
            }
            Err(e) => return Err(e),
        };
        use std::os::unix::fs::MetadataExt;
        if File::from(volume.try_clone()?).metadata()?.ino() == SUBVOLUME_ROOT_INODE {
            limit(&volume, quota_mb.saturating_mul(MIB))?;
        }
        Ok(path)
    }

    /// Removes a volume's directory and everything in it (nothing there is followed).
    pub fn remove_volume(&self, id: uuid::Uuid) -> std::io::Result<()> {
        let path = self.root.join(VOLUMES).join(id.simple().to_string());
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Where a fork's capture is staged, as a snapshot of its source's tree (see
/// [`Disk::stage`]).
const STAGED: &str = ".forks";
/// A staged capture being removed.
const TRASH: &str = "removed-";

impl Disk {
    /// Stages the tree `tree` (a sandbox's, in this directory) as `.forks/<id>`: a
    /// copy-on-write snapshot of what it holds now, taken while its processes are
    /// frozen for the capture `id`, so that a fork of it placed on this worker starts
    /// from it without a restore. `false` where trees are not subvolumes.
    pub fn stage(&self, tree: &Path, id: uuid::Uuid) -> std::io::Result<bool> {
        if !self.enforced || tree.parent() != Some(self.root.as_path()) {
            return Ok(false);
        }
        let Some(name) = tree.file_name() else {
            return Ok(false);
        };
        let staged = self.root.join(STAGED);
        std::fs::create_dir_all(&staged)?;
        let staged = open_directory(&staged)?;
        let root = open_directory(&self.root)?;
        let source = open_beneath(&root, name.as_encoded_bytes())?;
        snapshot_subvolume(&staged, &source, id.simple().to_string().as_bytes())?;
        Ok(true)
    }

    /// Makes `tree` (a tree path of this directory, empty) a snapshot of the staged
    /// capture `id`, with room for `quota_mb` MiB; `false` when none is staged here.
    pub fn from_staged(&self, id: uuid::Uuid, tree: &Path, quota_mb: u64) -> std::io::Result<bool> {
        let (Some(name), true) = (tree.file_name(), tree.parent() == Some(self.root.as_path()))
        else {
            return Ok(false);
        };
        if !self.enforced {
            return Ok(false);
        }
        let staged = match open_directory(&self.root.join(STAGED)) {
            Ok(staged) => staged,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let source = match open_beneath(&staged, id.simple().to_string().as_bytes()) {
            Ok(source) => source,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        match std::fs::remove_dir_all(tree) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let root = open_directory(&self.root)?;
        snapshot_subvolume(&root, &source, name.as_encoded_bytes())?;
        let made = open_beneath(&root, name.as_encoded_bytes())?;
        limit(&made, quota_mb.saturating_mul(MIB))?;
        Ok(true)
    }

    /// The captures staged here.
    pub fn staged(&self) -> Vec<uuid::Uuid> {
        let Ok(entries) = std::fs::read_dir(self.root.join(STAGED)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// Removes a staged capture (no fork waits for it any more). It is first renamed
    /// aside, at once, so that a fork finds it whole or not at all; what an earlier
    /// removal left aside goes too.
    pub fn remove_staged(&self, id: uuid::Uuid) -> std::io::Result<()> {
        let staged = self.root.join(STAGED);
        let name = id.simple().to_string();
        let aside = staged.join(format!("{TRASH}{name}"));
        match std::fs::rename(staged.join(&name), &aside) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        for entry in std::fs::read_dir(&staged)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TRASH) {
                std::fs::remove_dir_all(entry.path())?;
            }
        }
        Ok(())
    }
}

/// Makes a tree with [`Disk::make`] off the runtime's threads.
pub async fn make(disk: &Disk, path: &Path, quota_mb: u64) -> std::io::Result<()> {
    let (disk, path) = (disk.clone(), path.to_path_buf());
    tokio::task::spawn_blocking(move || disk.make(&path, quota_mb))
        .await
        .map_err(std::io::Error::other)?
}

/// Whether `dir` (a tree or home) is at its quota: a file, or 1 MiB of one, there is refused
/// with "Disk quota exceeded". Asked after a step fails, to name the cause.
pub fn exhausted(dir: &Path) -> bool {
    use nix::fcntl::{fallocate, open, FallocateFlags, OFlag};
    use nix::sys::stat::Mode as Perm;
    let flags = OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let file = match open(dir, flags, Perm::from_bits_truncate(0o600)) {
        Ok(file) => file,
        // Even the file's inode does not fit.
        Err(e) => return e == nix::errno::Errno::EDQUOT,
    };
    matches!(
        fallocate(&file, FallocateFlags::empty(), 0, 1 << 20),
        Err(nix::errno::Errno::EDQUOT)
    )
}

fn is_btrfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 == BTRFS_SUPER_MAGIC)
}

fn mount_volume(dir: &Path, size_mb: u64) -> Result<(), DiskError> {
    let io = |what: &Path, e| DiskError::Io(what.display().to_string(), e);
    if !is_btrfs(dir) {
        if !nix::unistd::geteuid().is_root() {
            return Err(DiskError::Unavailable(
                "root, or CAIRN_WORKSPACES_DIR on a btrfs volume".into(),
            ));
        }
        let image = dir.join(IMAGE);
        let made_before = image.exists();
        if !made_before {
            make_image(dir, &image, size_mb)?;
        }
        let options = "loop,nosuid,nodev";
        // A worker killed a moment ago may still hold the volume: its namespace goes
        // with it. A volume just made has no such holder: its failure is final.
        let mut tries = 0;
        loop {
            match tool(
                "mount",
                Command::new("mount")
                    .args(["-t", "btrfs", "-o", options])
                    .arg(&image)
                    .arg(dir),
            ) {
                Ok(()) => break,
                Err(_) if made_before && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
                Err(e) => return Err(e),
            }
        }
    }
    let volume = File::open(dir).map_err(|e| io(dir, e))?;
    enable_quotas(&volume).map_err(|e| io(dir, e))
}

fn make_image(dir: &Path, image: &Path, size_mb: u64) -> Result<(), DiskError> {
    let size = if size_mb > 0 {
        size_mb.saturating_mul(MIB)
    } else {
        // Four fifths of what the host has free now: a full volume leaves the host room.
        let stats = nix::sys::statvfs::statvfs(dir)
            .map_err(|e| DiskError::Io(dir.display().to_string(), e.into()))?;
        (stats.blocks_available() as u64).saturating_mul(stats.fragment_size() as u64) / 5 * 4
    };
    // btrfs needs about 114 MiB of its own.
    let size = size.max(256 * MIB);
    let partial = image.with_extension("partial");
    let file =
        File::create(&partial).map_err(|e| DiskError::Io(partial.display().to_string(), e))?;
    file.set_len(size)
        .map_err(|e| DiskError::Io(partial.display().to_string(), e))?;
    drop(file);
    let made = tool(
        "mkfs.btrfs",
        Command::new("mkfs.btrfs")
            .args(["-q", "-K", "-f"])
            .arg(&partial),
    );
    if let Err(e) = made {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, image).map_err(|e| DiskError::Io(image.display().to_string(), e))
}

fn tool(name: &'static str, command: &mut Command) -> Result<(), DiskError> {
    let output = command
        .output()
        .map_err(|e| DiskError::Unavailable(format!("{name} ({e})")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(DiskError::Tool(
            name,
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ))
    }
}

// The kernel's btrfs ioctls (include/uapi/linux/btrfs.h).
const BTRFS_IOCTL_MAGIC: u8 = 0x94;
const BTRFS_PATH_NAME_MAX: usize = 4087;
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1 << 0;

#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
#[derive(Default)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
#[derive(Default)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

const fn ioc(direction: u64, number: u64, size: usize) -> u64 {
    (direction << 30) | ((size as u64) << 16) | ((BTRFS_IOCTL_MAGIC as u64) << 8) | number
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const SUBVOL_CREATE: u64 = ioc(IOC_WRITE, 14, std::mem::size_of::<VolArgs>());
const SNAP_CREATE: u64 = ioc(IOC_WRITE, 1, std::mem::size_of::<VolArgs>());
const QUOTA_CTL: u64 = ioc(
    IOC_READ | IOC_WRITE,
    40,
    std::mem::size_of::<QuotaCtlArgs>(),
);
const QGROUP_LIMIT: u64 = ioc(IOC_READ, 43, std::mem::size_of::<QgroupLimitArgs>());
const QUOTA_CTL_ENABLE: u64 = 1;

#[allow(unsafe_code)]
fn ioctl<T>(fd: &impl AsRawFd, request: u64, argument: &mut T) -> std::io::Result<()> {
    // SAFETY: `argument` is the `repr(C)` struct the kernel reads and writes for
    // `request`, alive and exclusively borrowed for the call.
    let result =
        unsafe { libc::ioctl(fd.as_raw_fd(), request as libc::c_ulong, argument as *mut T) };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn enable_quotas(volume: &File) -> std::io::Result<()> {
    let mut args = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    ioctl(volume, QUOTA_CTL, &mut args)
}

fn create_subvolume(parent: &OwnedFd, name: &[u8]) -> std::io::Result<()> {
    let mut args = vol_args(name, 0)?;
    ioctl(parent, SUBVOL_CREATE, &mut args)
}

/// Makes `name` in `parent` a writable snapshot of the subvolume `source`: it shares
/// every extent with it, at once, whatever its size.
fn snapshot_subvolume(parent: &OwnedFd, source: &OwnedFd, name: &[u8]) -> std::io::Result<()> {
    let mut args = vol_args(name, i64::from(source.as_raw_fd()))?;
    ioctl(parent, SNAP_CREATE, &mut args)
}

fn vol_args(name: &[u8], fd: i64) -> std::io::Result<VolArgs> {
    if name.len() > BTRFS_PATH_NAME_MAX || name.contains(&b'/') || name.contains(&0) {
        return Err(std::io::Error::other("not a subvolume name"));
    }
    let mut args = VolArgs {
        fd,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    };
    args.name[..name.len()].copy_from_slice(name);
    Ok(args)
}

/// Limits the subvolume `volume` is the root of (qgroup id 0: the fd's own).
fn limit(volume: &OwnedFd, bytes: u64) -> std::io::Result<()> {
    let mut args = QgroupLimitArgs {
        qgroupid: 0,
        lim: QgroupLimit {
            flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
            max_rfer: bytes,
            ..QgroupLimit::default()
        },
    };
    ioctl(volume, QGROUP_LIMIT, &mut args)
}

fn open_directory(path: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::{open, OFlag};
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    open(path, flags, nix::sys::stat::Mode::empty()).map_err(std::io::Error::from)
}

/// Opens `name` in `parent` without following a link (a step may have put one there).
fn open_beneath(parent: &OwnedFd, name: &[u8]) -> std::io::Result<OwnedFd> {
    use nix::fcntl::{openat, OFlag};
    let name = std::ffi::OsStr::from_bytes(name);
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    openat(parent, name, flags, nix::sys::stat::Mode::empty()).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // From include/uapi/linux/btrfs.h, as the kernel computes them on x86_64.
        assert_eq!(SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(QUOTA_CTL, 0xc010_9428);
        assert_eq!(QGROUP_LIMIT, 0x8030_942b);
    }
}
