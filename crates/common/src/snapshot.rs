//! The snapshot engine: content-defined chunks (FastCDC), BLAKE3 ids, zstd.
//!
//! A chunk is stored once (`chunks/<id>`) and shared by every snapshot holding it. A
//! manifest lists paths, modes, symlinks, sizes and chunk ids. A capture skips files
//! whose stat (size, mtime, inode) matches the previous capture of the same lineage, and
//! hashes and compresses on every core. A restore writes files in parallel and verifies
//! every chunk against its id; any mismatch is an [`SnapshotError::Integrity`] error.
//!
//! The capture root never holds credential files or nested unrelated repositories, and
//! a restore refuses any entry that would land outside its root.

use crate::store::{ArtifactStore, StoreError};
use bytes::Bytes;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;

const MIN_CHUNK: u32 = 16 * 1024;
const AVG_CHUNK: u32 = 64 * 1024;
const MAX_CHUNK: u32 = 256 * 1024;
const ZSTD_LEVEL: i32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A chunk's content does not match its id, or the manifest is unreadable.
    #[error("integrity failure: {0}")]
    Integrity(String),
    /// A manifest entry would land outside the restore root.
    #[error("unsafe entry refused: {0}")]
    UnsafeEntry(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("snapshot I/O error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the restore target {0} is not empty")]
    TargetNotEmpty(String),
}

fn io(path: &Path, source: std::io::Error) -> SnapshotError {
    SnapshotError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
}

/// One path of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the root, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
    pub mode: u32,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub mtime_ns: i64,
    /// Only for the stat index of the next capture.
    #[serde(default)]
    pub inode: u64,
    #[serde(default)]
    pub chunks: Vec<String>,
    #[serde(default)]
    pub target: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub entries: Vec<Entry>,
}

impl Manifest {
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Every chunk id the manifest references.
    pub fn chunk_ids(&self) -> HashSet<String> {
        self.entries
            .iter()
            .flat_map(|e| e.chunks.iter().cloned())
            .collect()
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.path.as_str())
    }
}

pub fn chunk_key(id: &str) -> String {
    format!("chunks/{}/{id}", &id[..2.min(id.len())])
}

pub fn manifest_key(snapshot_id: uuid::Uuid) -> String {
    format!("manifests/{}.json.zst", snapshot_id.simple())
}

/// What a capture leaves out.
#[derive(Debug, Clone, Default)]
pub struct CaptureRules {
    /// Extra file or directory names (exact) or `*.suffix` patterns to exclude.
    pub extra_patterns: Vec<String>,
}

const CREDENTIAL_NAMES: [&str; 10] = [
    ".git-credentials",
    ".netrc",
    "_netrc",
    ".ssh",
    ".npmrc",
    ".pypirc",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
];
const CREDENTIAL_SUFFIXES: [&str; 6] = [".pem", ".key", ".p12", ".pfx", ".jks", ".keystore"];

impl CaptureRules {
    /// Whether a name (one path component) is excluded as a credential or by pattern.
    pub fn excludes(&self, name: &str) -> bool {
        if CREDENTIAL_NAMES.contains(&name) || name == ".env" || name.starts_with(".env.") {
            return true;
        }
        if CREDENTIAL_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            return true;
        }
        self.extra_patterns
            .iter()
            .any(|p| match p.strip_prefix('*') {
                Some(suffix) => name.ends_with(suffix),
                None => p == name,
            })
    }
}

/// Figures of one capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureStats {
    pub files: u64,
    pub files_unchanged: u64,
    pub bytes: u64,
    pub chunks_new: u64,
    pub bytes_uploaded: u64,
}

/// Captures `root` into the store. Files whose stat matches `previous` reuse its chunk
/// ids unread. Chunks are uploaded before the manifest; neither is durable until
/// [`ArtifactStore::flush`] (which [`capture`] calls) returns.
pub async fn capture(
    store: &ArtifactStore,
    root: &Path,
    rules: &CaptureRules,
    previous: Option<Arc<Manifest>>,
    snapshot_id: uuid::Uuid,
) -> Result<(Manifest, CaptureStats), SnapshotError> {
    let handle = Handle::current();
    let store_owned = store.clone();
    let root = root.to_path_buf();
    let rules = rules.clone();
    let (manifest, stats) = tokio::task::spawn_blocking(move || {
        capture_blocking(&handle, &store_owned, &root, &rules, previous.as_deref())
    })
    .await
    .map_err(|e| SnapshotError::Io {
        path: "capture".into(),
        source: std::io::Error::other(e),
    })??;
    let encoded =
        serde_json::to_vec(&manifest).map_err(|e| SnapshotError::Integrity(e.to_string()))?;
    let compressed = zstd::encode_all(&encoded[..], 1).map_err(|e| io(Path::new("manifest"), e))?;
    store
        .put(&manifest_key(snapshot_id), Bytes::from(compressed))
        .await?;
    store.flush().await?;
    Ok((manifest, stats))
}

/// Every capturable entry under `root`, depth-first in file-name order (the manifest's
/// order). Directories are read level by level, each level on all cores, then put in
/// order with an explicit stack: no recursion, so no depth can exhaust a thread's stack.
fn walk(root: &Path, rules: &CaptureRules) -> Result<Vec<Entry>, SnapshotError> {
    let mut children: HashMap<PathBuf, Vec<(Entry, bool)>> = HashMap::new();
    let mut level = vec![root.to_path_buf()];
    while !level.is_empty() {
        let read = level
            .par_iter()
            .map(|dir| Ok((dir.clone(), read_children(root, dir, rules)?)))
            .collect::<Result<Vec<_>, SnapshotError>>()?;
        level = read
            .iter()
            .flat_map(|(_, kids)| kids.iter().filter(|(_, descend)| *descend))
            .map(|(entry, _)| root.join(&entry.path))
            .collect();
        children.extend(read);
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
    Ok(entries)
}

/// The capturable children of `dir` in file-name order, each with whether to descend.
fn read_children(
    root: &Path,
    dir: &Path,
    rules: &CaptureRules,
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
        // A nested repository is someone else's tree; the root's own .git is kept.
        let nested_repo = is_dir && path.join(".git").exists();
        if rules.excludes(&name.to_string_lossy()) || nested_repo {
            continue;
        }
        let kind = if file_type.is_symlink() {
            EntryKind::Symlink
        } else if is_dir {
            EntryKind::Dir
        } else if file_type.is_file() {
            EntryKind::File
        } else {
            continue; // sockets, fifos, devices are not workspace content
        };
        // Not through a symlink: the entry itself.
        let meta = child.metadata().map_err(|e| io(&path, e))?;
        let target = if kind == EntryKind::Symlink {
            Some(
                std::fs::read_link(&path)
                    .map_err(|e| io(&path, e))?
                    .to_string_lossy()
                    .into_owned(),
            )
        } else {
            None
        };
        entries.push((
            Entry {
                path: relative_path(root, &path)?,
                kind,
                mode: meta.permissions().mode() & 0o7777,
                size: if kind == EntryKind::File {
                    meta.size()
                } else {
                    0
                },
                mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
                inode: meta.ino(),
                chunks: Vec::new(),
                target,
            },
            is_dir,
        ));
    }
    Ok(entries)
}

fn capture_blocking(
    handle: &Handle,
    store: &ArtifactStore,
    root: &Path,
    rules: &CaptureRules,
    previous: Option<&Manifest>,
) -> Result<(Manifest, CaptureStats), SnapshotError> {
    let mut entries = walk(root, rules)?;
    // The stat index and the known chunks borrow the previous manifest: nothing copied.
    let previous: HashMap<&str, &Entry> = previous
        .map(|m| m.entries.iter().map(|e| (e.path.as_str(), e)).collect())
        .unwrap_or_default();
    let previous_chunks: HashSet<&str> = previous
        .values()
        .flat_map(|e| e.chunks.iter().map(String::as_str))
        .collect();
    // Chunks written by this capture (the previous manifest's are known already).
    let known: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
    let stats = Mutex::new(CaptureStats::default());
    entries
        .par_iter_mut()
        .try_for_each(|entry| -> Result<(), SnapshotError> {
            if entry.kind != EntryKind::File {
                return Ok(());
            }
            let unchanged = previous.get(entry.path.as_str()).is_some_and(|p| {
                p.kind == EntryKind::File
                    && p.size == entry.size
                    && p.mtime_ns == entry.mtime_ns
                    && p.inode == entry.inode
            });
            if let (true, Some(p)) = (unchanged, previous.get(entry.path.as_str())) {
                entry.chunks = p.chunks.clone();
                let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
                s.files += 1;
                s.files_unchanged += 1;
                s.bytes += entry.size;
                return Ok(());
            }
            let path = root.join(&entry.path);
            let (mut new_chunks, mut uploaded) = (0u64, 0u64);
            let mut store_chunk = |data: &[u8]| -> Result<String, SnapshotError> {
                let id = blake3::hash(data).to_hex().to_string();
                let fresh = !previous_chunks.contains(id.as_str())
                    && known
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.clone());
                if fresh && !store.exists_blocking(handle, &chunk_key(&id))? {
                    let compressed = compress(data).map_err(|e| io(&path, e))?;
                    uploaded += compressed.len() as u64;
                    new_chunks += 1;
                    store.put_blocking(handle, &chunk_key(&id), Bytes::from(compressed))?;
                }
                Ok(id)
            };
            let mut file = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
            if entry.size <= IN_MEMORY_LIMIT {
                // Most files are small: read each into this thread's buffer and chunk it
                // there, instead of a fresh stream buffer per file.
                let chunks = READ_BUFFER.with(|buffer| -> Result<Vec<String>, SnapshotError> {
                    let mut buffer = buffer.borrow_mut();
                    buffer.clear();
                    file.read_to_end(&mut buffer).map_err(|e| io(&path, e))?;
                    let mut ids = Vec::new();
                    if buffer.is_empty() {
                        return Ok(ids);
                    }
                    for chunk in
                        fastcdc::v2020::FastCDC::new(&buffer, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
                    {
                        ids.push(store_chunk(
                            &buffer[chunk.offset..chunk.offset + chunk.length],
                        )?);
                    }
                    Ok(ids)
                })?;
                entry.chunks = chunks;
            } else {
                let chunker = fastcdc::v2020::StreamCDC::new(file, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK);
                for chunk in chunker {
                    let chunk = chunk.map_err(|e| io(&path, std::io::Error::other(e)))?;
                    let id = store_chunk(&chunk.data)?;
                    entry.chunks.push(id);
                }
            }
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            s.files += 1;
            s.bytes += entry.size;
            s.chunks_new += new_chunks;
            s.bytes_uploaded += uploaded;
            Ok(())
        })?;
    let stats = stats.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok((
        Manifest {
            version: 1,
            entries,
        },
        stats,
    ))
}

/// Files up to this size are chunked in memory.
const IN_MEMORY_LIMIT: u64 = 8 * 1024 * 1024;

thread_local! {
    /// Each capture worker's file buffer, reused from file to file.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each worker's compression and decompression contexts, reused from chunk to chunk
    /// (creating one per chunk costs more than compressing a small chunk).
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> = const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

fn compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL)?);
        }
        match cell.as_mut() {
            Some(compressor) => compressor.compress(data),
            None => zstd::bulk::compress(data, ZSTD_LEVEL),
        }
    })
}

/// Decompresses a chunk, which is never larger than [`MAX_CHUNK`].
fn decompress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Decompressor::new()?);
        }
        match cell.as_mut() {
            Some(decompressor) => decompressor.decompress(data, MAX_CHUNK as usize),
            None => zstd::bulk::decompress(data, MAX_CHUNK as usize),
        }
    })
}

fn relative_path(root: &Path, path: &Path) -> Result<String, SnapshotError> {
    let relative = path
        .strip_prefix(root)
        .map_err(|_| SnapshotError::UnsafeEntry(path.display().to_string()))?;
    let text = relative.to_str().ok_or_else(|| {
        SnapshotError::UnsafeEntry(format!("{} is not UTF-8", relative.display()))
    })?;
    Ok(text.to_string())
}

/// Reads a snapshot's manifest.
pub async fn load_manifest(
    store: &ArtifactStore,
    snapshot_id: uuid::Uuid,
) -> Result<Manifest, SnapshotError> {
    let bytes = store.get(&manifest_key(snapshot_id)).await?;
    let decoded = zstd::decode_all(&bytes[..])
        .map_err(|e| SnapshotError::Integrity(format!("manifest: {e}")))?;
    serde_json::from_slice(&decoded).map_err(|e| SnapshotError::Integrity(format!("manifest: {e}")))
}

/// Checks that an entry stays inside the root: relative, no `..`, no empty or `.`
/// components, and (for symlinks) a target that does not climb out either.
fn check_entry(entry: &Entry, symlinks: &HashSet<&str>) -> Result<PathBuf, SnapshotError> {
    let refuse = || SnapshotError::UnsafeEntry(entry.path.clone());
    if entry.path.is_empty() || entry.path.contains('\0') || entry.path.starts_with('/') {
        return Err(refuse());
    }
    let path = PathBuf::from(&entry.path);
    if !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(refuse());
    }
    // A chunk id names an object in the store: 64 lowercase hex, nothing a path could
    // be made of.
    if let Some(bad) = entry.chunks.iter().find(|id| !crate::digest::is_digest(id)) {
        return Err(SnapshotError::Integrity(format!(
            "malformed chunk id {bad:?} in {}",
            entry.path
        )));
    }
    // No entry may pass through a symlink of the snapshot (symlink traversal).
    let mut prefix = PathBuf::new();
    let components: Vec<_> = path.components().collect();
    for component in &components[..components.len().saturating_sub(1)] {
        prefix.push(component);
        if symlinks.contains(prefix.to_string_lossy().as_ref()) {
            return Err(refuse());
        }
    }
    if let Some(target) = &entry.target {
        let target = Path::new(target);
        if target.is_absolute() {
            return Err(refuse());
        }
        let mut depth: i64 = i64::try_from(components.len()).unwrap_or(0) - 1;
        for component in target.components() {
            match component {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                _ => return Err(refuse()),
            }
            if depth < 0 {
                return Err(refuse());
            }
        }
    }
    Ok(path)
}

/// Figures of one restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub files: u64,
    pub bytes: u64,
}

/// Restores a manifest into `target`, which must be empty or absent. Every entry is
/// checked before anything is written; every chunk is verified against its id.
pub async fn restore(
    store: &ArtifactStore,
    manifest: &Manifest,
    target: &Path,
) -> Result<RestoreStats, SnapshotError> {
    let symlinks: HashSet<&str> = manifest
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::Symlink)
        .map(|e| e.path.as_str())
        .collect();
    let mut checked = Vec::with_capacity(manifest.entries.len());
    for entry in &manifest.entries {
        checked.push((check_entry(entry, &symlinks)?, entry.clone()));
    }
    if target.exists()
        && std::fs::read_dir(target)
            .map_err(|e| io(target, e))?
            .next()
            .is_some()
    {
        return Err(SnapshotError::TargetNotEmpty(target.display().to_string()));
    }
    std::fs::create_dir_all(target).map_err(|e| io(target, e))?;
    let handle = Handle::current();
    let store = store.clone();
    let target = target.to_path_buf();
    tokio::task::spawn_blocking(move || restore_blocking(&handle, &store, &checked, &target))
        .await
        .map_err(|e| SnapshotError::Io {
            path: "restore".into(),
            source: std::io::Error::other(e),
        })?
}

fn restore_blocking(
    handle: &Handle,
    store: &ArtifactStore,
    entries: &[(PathBuf, Entry)],
    target: &Path,
) -> Result<RestoreStats, SnapshotError> {
    for (path, _) in entries.iter().filter(|(_, e)| e.kind == EntryKind::Dir) {
        let full = target.join(path);
        std::fs::create_dir_all(&full).map_err(|e| io(&full, e))?;
    }
    let stats = Mutex::new(RestoreStats::default());
    entries
        .par_iter()
        .filter(|(_, e)| e.kind == EntryKind::File)
        .try_for_each(|(path, entry)| -> Result<(), SnapshotError> {
            let full = target.join(path);
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            let mut out = std::fs::File::create(&full).map_err(|e| io(&full, e))?;
            for id in &entry.chunks {
                let compressed = store.get_blocking(handle, &chunk_key(id))?;
                let data = decompress(&compressed)
                    .map_err(|e| SnapshotError::Integrity(format!("chunk {id}: {e}")))?;
                if blake3::hash(&data).to_hex().as_str() != id {
                    return Err(SnapshotError::Integrity(format!(
                        "chunk {id} does not match its id"
                    )));
                }
                std::io::Write::write_all(&mut out, &data).map_err(|e| io(&full, e))?;
            }
            drop(out);
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(entry.mode))
                .map_err(|e| io(&full, e))?;
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            s.files += 1;
            s.bytes += entry.size;
            Ok(())
        })?;
    for (path, entry) in entries.iter().filter(|(_, e)| e.kind == EntryKind::Symlink) {
        let full = target.join(path);
        if let (Some(parent), Some(link)) = (full.parent(), entry.target.as_ref()) {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            std::os::unix::fs::symlink(link, &full).map_err(|e| io(&full, e))?;
        }
    }
    for (path, entry) in entries.iter().filter(|(_, e)| e.kind == EntryKind::Dir) {
        let full = target.join(path);
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(entry.mode))
            .map_err(|e| io(&full, e))?;
    }
    Ok(stats.into_inner().unwrap_or_else(|e| e.into_inner()))
}
