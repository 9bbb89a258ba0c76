//! The capture's walk: every capturable entry under a root, in manifest order.

use super::manifest::{Entry, EntryKind};
use super::{io, CaptureRules, Exclusion, Skipped, SnapshotError};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Every capturable entry under `root`, depth-first in file-name order (the manifest's
/// order), and what was left out. Directories are read level by level, each level on
/// all cores, then put in order with an explicit stack: no recursion, so no depth can
/// exhaust a thread's stack.
pub(super) fn walk(
    root: &Path,
    rules: &CaptureRules,
) -> Result<(Vec<Entry>, Skipped), SnapshotError> {
    let mut children: HashMap<PathBuf, Vec<(Entry, bool)>> = HashMap::new();
    let mut skipped = Skipped::default();
    let mut level = vec![root.to_path_buf()];
    while !level.is_empty() {
        let read = level
            .par_iter()
            .map(|dir| {
                let mut skipped = Skipped::default();
                let kids = read_children(root, dir, rules, &mut skipped)?;
                Ok((dir.clone(), kids, skipped))
            })
            .collect::<Result<Vec<_>, SnapshotError>>()?;
        level = read
            .iter()
            .flat_map(|(_, kids, _)| kids.iter().filter(|(_, descend)| *descend))
            .map(|(entry, _)| root.join(&entry.path))
            .collect();
        for (dir, kids, left_out) in read {
            skipped.merge(left_out);
            children.insert(dir, kids);
        }
    }
    let mut entries = Vec::new();
    let mut stack: Vec<(Entry, bool)> = children.remove(root).unwrap_or_default();
    stack.reverse();
    while let Some((entry, descend)) = stack.pop() {
        if descend {
            if let Some(kids) = children.remove(&root.join(&entry.path)) {
                stack.extend(kids.into_iter().rev());
            }
        }
        entries.push(entry);
    }
    let entries = without_links_outside(entries, &mut skipped);
    skipped.paths.sort();
    Ok((entries, skipped))
}

/// `entries` without the links a restore would refuse: those whose target, resolved
/// through the tree's own links, leaves it. Repeated until none is left, since a chain
/// resolves differently once one of its links is gone.
fn without_links_outside(mut entries: Vec<Entry>, skipped: &mut Skipped) -> Vec<Entry> {
    loop {
        let links: HashMap<&str, &str> = entries
            .iter()
            .filter_map(|e| Some((e.path.as_str(), e.target.as_deref()?)))
            .collect();
        let outside: std::collections::HashSet<String> = entries
            .iter()
            .filter(|e| e.kind == EntryKind::Symlink)
            .filter(|e| {
                let target = Path::new(e.target.as_deref().unwrap_or(""));
                !super::manifest::resolves_inside(Path::new(&e.path), target, &links)
            })
            .map(|e| e.path.clone())
            .collect();
        if outside.is_empty() {
            return entries;
        }
        for path in &outside {
            skipped.add(Exclusion::LinkOutside, path.clone());
        }
        entries.retain(|e| !outside.contains(&e.path));
    }
}

/// The capturable children of `dir` in file-name order, each with whether to descend.
/// `dir` is opened beneath `root` and its children are read through that handle, never
/// through a link: a step that swaps a directory for a link mid-capture makes the
/// capture fail, not list or read what the link points at.
fn read_children(
    root: &Path,
    dir: &Path,
    rules: &CaptureRules,
    skipped: &mut Skipped,
) -> Result<Vec<(Entry, bool)>, SnapshotError> {
    use nix::fcntl::{readlinkat, AtFlags, OFlag};
    use nix::sys::stat::{fstatat, SFlag};
    let inside = dir.strip_prefix(root).unwrap_or(Path::new(""));
    let fd = crate::regular::open_beneath(root, inside, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
        .map_err(|e| io(dir, e))?;
    let mut handle = nix::dir::Dir::from_fd(fd).map_err(|e| io(dir, e.into()))?;
    let names = sorted_names(&mut handle, dir)?;
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        let shown = || relative_lossy(root, &path);
        // The entry itself, not what a link names.
        let meta = fstatat(&handle, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| io(&path, e.into()))?;
        let format = SFlag::from_bits_truncate(meta.st_mode & SFlag::S_IFMT.bits());
        let is_dir = format == SFlag::S_IFDIR;
        if let Some(exclusion) = rules.exclusion(&name.to_string_lossy()) {
            skipped.add(exclusion, shown());
            continue;
        }
        // A nested repository is someone else's tree; the root's own .git is kept.
        if is_dir {
            let git = Path::new(&name).join(".git");
            if fstatat(&handle, git.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
                skipped.add(Exclusion::NestedRepository, shown());
                continue;
            }
        }
        let kind = if format == SFlag::S_IFLNK {
            EntryKind::Symlink
        } else if is_dir {
            EntryKind::Dir
        } else if format == SFlag::S_IFREG {
            EntryKind::File
        } else {
            // Sockets, fifos, devices are not workspace content.
            skipped.add(Exclusion::SpecialFile, shown());
            continue;
        };
        let Some(relative) = relative_path(root, &path)? else {
            skipped.add(Exclusion::NameNotUtf8, shown());
            continue;
        };
        let target = if kind == EntryKind::Symlink {
            let target = readlinkat(&handle, name.as_os_str()).map_err(|e| io(&path, e.into()))?;
            match target.into_string() {
                Ok(target) => Some(target),
                Err(_) => {
                    skipped.add(Exclusion::NameNotUtf8, shown());
                    continue;
                }
            }
        } else {
            None
        };
        entries.push((entry_of(relative, kind, &meta, target), is_dir));
    }
    Ok(entries)
}

/// The names in a directory but `.` and `..`, sorted.
fn sorted_names(
    handle: &mut nix::dir::Dir,
    dir: &Path,
) -> Result<Vec<std::ffi::OsString>, SnapshotError> {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let mut names = Vec::new();
    for child in handle.iter() {
        let child = child.map_err(|e| io(dir, e.into()))?;
        let name = OsStr::from_bytes(child.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_os_string());
        }
    }
    names.sort();
    Ok(names)
}

/// A manifest entry, with no chunks yet, from the entry's stat.
fn entry_of(
    path: String,
    kind: EntryKind,
    meta: &nix::sys::stat::FileStat,
    target: Option<String>,
) -> Entry {
    let nanos = |seconds: i64, nanoseconds: i64| {
        seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(nanoseconds)
    };
    Entry {
        path,
        kind,
        mode: meta.st_mode & 0o7777,
        size: if kind == EntryKind::File {
            u64::try_from(meta.st_size).unwrap_or(0)
        } else {
            0
        },
        mtime_ns: nanos(meta.st_mtime, meta.st_mtime_nsec),
        ctime_ns: nanos(meta.st_ctime, meta.st_ctime_nsec),
        inode: meta.st_ino,
        chunks: Vec::new(),
        target,
    }
}

/// The path relative to the root; `None` when it is not UTF-8 (manifests hold text
/// paths, so such an entry is left out and reported as skipped).
fn relative_path(root: &Path, path: &Path) -> Result<Option<String>, SnapshotError> {
    let relative = path
        .strip_prefix(root)
        .map_err(|_| SnapshotError::UnsafeEntry(path.display().to_string()))?;
    Ok(relative.to_str().map(String::from))
}

fn relative_lossy(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod swap_tests {
    use super::*;

    /// A directory the walk listed, swapped for a link to the host before the walk reads
    /// it: the walk fails rather than list the host's directory.
    #[test]
    fn a_directory_swapped_for_a_link_is_never_listed() {
        let base = std::env::temp_dir().join(format!("cairn-walk-{}", uuid::Uuid::new_v4()));
        let (root, outside) = (base.join("tree"), base.join("host"));
        std::fs::create_dir_all(&root).expect("tree");
        std::fs::create_dir_all(&outside).expect("host");
        std::fs::write(outside.join("host-secret"), "x").expect("secret");
        std::os::unix::fs::symlink(&outside, root.join("dir")).expect("link");
        let mut skipped = Skipped::default();
        let read = read_children(
            &root,
            &root.join("dir"),
            &CaptureRules::default(),
            &mut skipped,
        );
        assert!(read.is_err(), "{read:?}");
        let top =
            read_children(&root, &root, &CaptureRules::default(), &mut skipped).expect("root");
        assert_eq!(top.len(), 1);
        assert_eq!(
            top[0].0.kind,
            EntryKind::Symlink,
            "the link is kept as a link"
        );
        assert!(!top[0].1, "and never descended into");
        let _ = std::fs::remove_dir_all(base);
    }

    /// A link out of the tree is left out (a restore would refuse the whole snapshot
    /// for it), and named as skipped; links inside are kept.
    #[test]
    fn links_that_leave_the_tree_are_left_out() {
        let root = std::env::temp_dir().join(format!("cairn-links-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(root.join("sub")).expect("tree");
        for (link, target) in [
            ("abs", "/usr/bin/python3"),
            ("up", "../.."),
            ("ok", "sub"),
            ("chain", "ok/../up"),
        ] {
            std::os::unix::fs::symlink(target, root.join(link)).expect("link");
        }
        let (entries, skipped) = walk(&root, &CaptureRules::default()).expect("walk");
        let kept: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(kept, vec!["ok", "sub"], "{skipped:?}");
        assert_eq!(skipped.links_outside, 3, "{skipped:?}");
        let _ = std::fs::remove_dir_all(root);
    }
}
