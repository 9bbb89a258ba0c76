//! The capture's walk: every capturable entry under a root, in manifest order.

use super::manifest::{Entry, EntryKind};
use super::{io, CaptureRules, Exclusion, Skipped, SnapshotError};
use rayon::prelude::*;
use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
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
    skipped.paths.sort();
    Ok((entries, skipped))
}

/// The capturable children of `dir` in file-name order, each with whether to descend.
fn read_children(
    root: &Path,
    dir: &Path,
    rules: &CaptureRules,
    skipped: &mut Skipped,
) -> Result<Vec<(Entry, bool)>, SnapshotError> {
    let mut children = std::fs::read_dir(dir)
        .and_then(|read| read.collect::<Result<Vec<_>, _>>())
        .map_err(|e| io(dir, e))?;
    children.sort_by_key(|child| child.file_name());
    let mut entries = Vec::with_capacity(children.len());
    for child in children {
        let path = child.path();
        let name = child.file_name();
        let file_type = child.file_type().map_err(|e| io(&path, e))?;
        let is_dir = file_type.is_dir();
        let shown = || relative_lossy(root, &path);
        if let Some(exclusion) = rules.exclusion(&name.to_string_lossy()) {
            skipped.add(exclusion, shown());
            continue;
        }
        // A nested repository is someone else's tree; the root's own .git is kept.
        if is_dir && path.join(".git").exists() {
            skipped.add(Exclusion::NestedRepository, shown());
            continue;
        }
        let kind = if file_type.is_symlink() {
            EntryKind::Symlink
        } else if is_dir {
            EntryKind::Dir
        } else if file_type.is_file() {
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
        // Not through a symlink: the entry itself.
        let meta = child.metadata().map_err(|e| io(&path, e))?;
        let target = if kind == EntryKind::Symlink {
            let target = std::fs::read_link(&path).map_err(|e| io(&path, e))?;
            match target.into_os_string().into_string() {
                Ok(target) => Some(target),
                Err(_) => {
                    skipped.add(Exclusion::NameNotUtf8, shown());
                    continue;
                }
            }
        } else {
            None
        };
        entries.push((
            Entry {
                path: relative,
                kind,
                mode: meta.permissions().mode() & 0o7777,
                size: if kind == EntryKind::File {
                    meta.size()
                } else {
                    0
                },
                mtime_ns: meta
                    .mtime()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(meta.mtime_nsec()),
                ctime_ns: meta
                    .ctime()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(meta.ctime_nsec()),
                inode: meta.ino(),
                chunks: Vec::new(),
                target,
            },
            is_dir,
        ));
    }
    Ok(entries)
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
