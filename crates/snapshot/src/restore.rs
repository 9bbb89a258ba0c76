//! Restore: a manifest into an empty directory, every chunk verified against its id.

use super::manifest::{check_entry, ChunkRef, Entry, EntryKind, Manifest};
use super::pack::{self, ChunkId};
use super::{io, CaptureRules, RestoreStats, SnapshotError};
use crate::store::{ArtifactStore, StoreError};
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::runtime::Handle;
use uuid::Uuid;

/// Restores a manifest into `target`, which must be empty or absent. Every entry is
/// checked before anything is written; every chunk is verified against its id.
pub async fn restore(
    store: &impl AsRef<ArtifactStore>,
    manifest: &Manifest,
    target: &Path,
) -> Result<RestoreStats, SnapshotError> {
    let store = store.as_ref();
    let symlinks: HashMap<&str, &str> = manifest
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::Symlink)
        .filter_map(|e| Some((e.path.as_str(), e.target.as_deref()?)))
        .collect();
    let mut checked = Vec::with_capacity(manifest.entries.len());
    for entry in &manifest.entries {
        checked.push((
            check_entry(entry, &symlinks, manifest.packs.len())?,
            entry.clone(),
        ));
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
    let reader = PackReader::new(store.clone(), handle, manifest.packs.clone());
    let target = target.to_path_buf();
    tokio::task::spawn_blocking(move || restore_blocking(&reader, &checked, &target))
        .await
        .map_err(|e| SnapshotError::Io {
            path: "restore".into(),
            source: std::io::Error::other(e),
        })?
}

/// [`restore`], then the restored tree's own stats as the stat index of its next capture:
/// the manifest with each entry's chunks under the stats the restore gave the files
/// (new inodes and times), so that capture reads nothing the restore wrote.
pub async fn restore_indexed(
    store: &impl AsRef<ArtifactStore>,
    manifest: &Manifest,
    target: &Path,
    rules: &CaptureRules,
) -> Result<Manifest, SnapshotError> {
    restore(store, manifest, target).await?;
    let restored = super::scan(target, rules).await?;
    let by_path: std::collections::HashMap<&str, &Entry> = manifest
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e))
        .collect();
    // An entry the restore did not give exactly (none, barring a concurrent writer) is
    // left out of the index: the next capture reads it.
    let entries = restored
        .into_entries()
        .into_iter()
        .filter_map(|mut now| {
            let then = by_path.get(now.path.as_str())?;
            let same = then.kind == now.kind
                && then.size == now.size
                && then.mode == now.mode
                && then.target == now.target;
            same.then(|| {
                now.chunks = then.chunks.clone();
                now
            })
        })
        .collect();
    Ok(Manifest {
        version: manifest.version,
        packs: manifest.packs.clone(),
        entries,
    })
}

/// Reads chunks out of a manifest's packs. A local pack is opened once per restore and
/// read at offsets from every worker; a remote one is read by range.
struct PackReader {
    store: ArtifactStore,
    handle: Handle,
    packs: Vec<Uuid>,
    open: Vec<Mutex<Option<Arc<std::fs::File>>>>,
}

/// Beyond this many packs a restore opens a pack per read instead of keeping each open.
const OPEN_PACKS_LIMIT: usize = 128;

impl PackReader {
    fn new(store: ArtifactStore, handle: Handle, packs: Vec<Uuid>) -> PackReader {
        let open = if packs.len() <= OPEN_PACKS_LIMIT {
            packs.iter().map(|_| Mutex::new(None)).collect()
        } else {
            Vec::new()
        };
        PackReader {
            store,
            handle,
            packs,
            open,
        }
    }

    /// Hands the chunk's bytes, decompressed and checked against its id, to `then`.
    fn with_chunk<T>(
        &self,
        chunk: &ChunkRef,
        then: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, SnapshotError> {
        let pack = self
            .packs
            .get(chunk.pack as usize)
            .ok_or_else(|| SnapshotError::Integrity(format!("chunk {} names no pack", chunk.id)))?;
        let key = pack::pack_key(*pack);
        let verified = |compressed: &[u8]| -> Result<T, SnapshotError> {
            pack::with_decompressed(compressed, |data| {
                (ChunkId::of(data) == chunk.id).then(|| then(data))
            })
            .map_err(|e| SnapshotError::Integrity(format!("chunk {}: {e}", chunk.id)))?
            .ok_or_else(|| {
                SnapshotError::Integrity(format!("chunk {} does not match its id", chunk.id))
            })
        };
        match (
            self.store.local_path(&key),
            self.open.get(chunk.pack as usize),
        ) {
            (Some(path), Some(slot)) => {
                let file = {
                    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
                    match slot.as_ref() {
                        Some(file) => file.clone(),
                        None => {
                            let file = Arc::new(open_pack(&path, &key)?);
                            *slot = Some(file.clone());
                            file
                        }
                    }
                };
                with_read_at(&file, chunk, &key, verified)
            }
            (Some(path), None) => with_read_at(&open_pack(&path, &key)?, chunk, &key, verified),
            (None, _) => verified(&self.read_range(chunk, &key)?),
        }
    }
}

impl PackReader {
    /// A chunk of a remote pack. A pack shorter than the manifest says (cut or replaced)
    /// is an integrity failure, like a local one.
    fn read_range(&self, chunk: &ChunkRef, key: &str) -> Result<Vec<u8>, SnapshotError> {
        let start = u64::from(chunk.offset);
        let end = start + u64::from(chunk.length);
        let short =
            || SnapshotError::Integrity(format!("chunk {} lies beyond the end of {key}", chunk.id));
        match self.store.get_range_blocking(&self.handle, key, start..end) {
            Ok(bytes) if bytes.len() as u64 == end - start => Ok(bytes.to_vec()),
            Ok(_) => Err(short()),
            Err(StoreError::NotFound(_)) => Err(missing(key)),
            Err(e) => {
                let size = self.handle.block_on(self.store.size(key)).unwrap_or(None);
                match size {
                    Some(size) if size < end => Err(short()),
                    _ => Err(e.into()),
                }
            }
        }
    }
}

/// A pack the manifest names and the store does not hold: the snapshot lost bytes.
fn missing(key: &str) -> SnapshotError {
    SnapshotError::Integrity(format!("{key} is missing from the store"))
}

fn open_pack(path: &Path, key: &str) -> Result<std::fs::File, SnapshotError> {
    std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => missing(key),
        _ => io(path, e),
    })
}

thread_local! {
    /// Each restore worker's buffer for compressed chunks, reused.
    static PACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads a chunk's compressed bytes out of a local pack into this thread's buffer.
fn with_read_at<T>(
    file: &std::fs::File,
    chunk: &ChunkRef,
    key: &str,
    then: impl FnOnce(&[u8]) -> Result<T, SnapshotError>,
) -> Result<T, SnapshotError> {
    use std::os::unix::fs::FileExt;
    PACKED.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        let length = chunk.length as usize;
        if buffer.len() < length {
            buffer.resize(length, 0);
        }
        file.read_exact_at(&mut buffer[..length], u64::from(chunk.offset))
            .map_err(|e| match e.kind() {
                // A pack shorter than the manifest says was cut or replaced.
                std::io::ErrorKind::UnexpectedEof => SnapshotError::Integrity(format!(
                    "chunk {} lies beyond the end of {key}",
                    chunk.id
                )),
                _ => io(Path::new(key), e),
            })?;
        then(&buffer[..length])
    })
}

/// Creates a file to restore into. Its directory was made with the manifest's
/// directories; one the manifest does not list (a parent it leaves implicit) is made now.
fn create_file(full: &Path) -> Result<std::fs::File, SnapshotError> {
    match std::fs::File::create(full) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::File::create(full).map_err(|e| io(full, e))
        }
        created => created.map_err(|e| io(full, e)),
    }
}

fn restore_blocking(
    reader: &PackReader,
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
            let mut out = create_file(&full)?;
            for chunk in &entry.chunks {
                reader
                    .with_chunk(chunk, |data| out.write_all(data))?
                    .map_err(|e| io(&full, e))?;
            }
            // On the open file: no second lookup of its path.
            out.set_permissions(std::fs::Permissions::from_mode(entry.mode))
                .map_err(|e| io(&full, e))?;
            let mut s = stats.lock().unwrap_or_else(PoisonError::into_inner);
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
    Ok(stats.into_inner().unwrap_or_else(PoisonError::into_inner))
}
