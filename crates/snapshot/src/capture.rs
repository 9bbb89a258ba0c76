//! Capture: a tree into packs and a manifest.

use super::manifest::{self, ChunkRef, Entry, EntryKind, Manifest};
use super::pack::{self, ChunkId, Location, PackBuilder, Sealed, Written};
use super::walk::walk;
use super::{io, CaptureRules, CaptureStats, Skipped, SnapshotError, MAX_CHUNK, MIN_CHUNK};
use crate::repository::Repository;
use crate::{ArtifactStore, StoreError};
use bytes::Bytes;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::runtime::Handle;
use uuid::Uuid;

/// Files up to this size are chunked in memory.
const IN_MEMORY_LIMIT: u64 = 8 * 1024 * 1024;

thread_local! {
    /// Each capture worker's file buffer, reused from file to file.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A tree as the walk saw it: what a capture would hold (stats only, nothing read) and
/// what it leaves out.
#[derive(Debug, Clone)]
pub struct Scan {
    entries: Vec<Entry>,
    pub skipped: Skipped,
}

impl Scan {
    /// The paths the capture keeps (relative, `/`-separated).
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.path.as_str())
    }

    /// Whether the tree is exactly what `manifest` describes, by the stat index's rules
    /// (see the module's header): then a capture would store nothing new.
    pub fn unchanged_from(&self, manifest: &Manifest) -> bool {
        self.entries.len() == manifest.entries.len()
            && self
                .entries
                .iter()
                .zip(&manifest.entries)
                .all(|(now, then)| {
                    now.path == then.path
                        && match now.kind {
                            // A directory's own times move with its entries, compared here.
                            EntryKind::Dir => then.kind == EntryKind::Dir && then.mode == now.mode,
                            _ => then.same_stat(now),
                        }
                })
    }

    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn into_entries(self) -> Vec<Entry> {
        self.entries
    }
}

/// Walks `root` (on a blocking thread): the stats of every capturable entry.
pub async fn scan(root: &Path, rules: &CaptureRules) -> Result<Scan, SnapshotError> {
    let root = root.to_path_buf();
    let rules = rules.clone();
    tokio::task::spawn_blocking(move || walk(&root, &rules))
        .await
        .map_err(|e| SnapshotError::Io {
            path: "walk".into(),
            source: std::io::Error::other(e),
        })?
        .map(|(entries, skipped)| Scan { entries, skipped })
}

/// Captures `root` into the store. Files whose stat matches `previous` reuse its chunks
/// unread; a chunk the store already holds (in any lineage) is not stored again. Packs
/// are written and synced before the indexes and the manifest, which are synced before
/// this returns ([`crate::ArtifactStore::flush_keys`]: only what this capture wrote).
pub async fn capture(
    repository: &Repository,
    root: &Path,
    rules: &CaptureRules,
    previous: Option<Arc<Manifest>>,
    snapshot_id: Uuid,
) -> Result<(Manifest, CaptureStats), SnapshotError> {
    let scanned = scan(root, rules).await?;
    capture_scanned(repository, root, scanned, previous, snapshot_id).await
}

/// [`capture`] of a tree already walked (the tree must not have changed since).
pub async fn capture_scanned(
    repository: &Repository,
    root: &Path,
    scanned: Scan,
    previous: Option<Arc<Manifest>>,
    snapshot_id: Uuid,
) -> Result<(Manifest, CaptureStats), SnapshotError> {
    let handle = Handle::current();
    let store = repository.store();
    let repository_owned = repository.clone();
    let root = root.to_path_buf();
    let (manifest, stats, written) = tokio::task::spawn_blocking(move || {
        capture_blocking(
            &handle,
            &repository_owned,
            &root,
            scanned.entries,
            previous.as_deref(),
        )
    })
    .await
    .map_err(|e| SnapshotError::Io {
        path: "capture".into(),
        source: std::io::Error::other(e),
    })??;
    // Packs are durable before an index names them, and everything is durable before
    // the caller marks the snapshot ready. Only what this capture wrote is synced: the
    // full packs were synced as they were written, and this makes every pack and its
    // directories durable (the last pack's bytes too).
    store
        .flush_keys(
            written
                .iter()
                .map(|(pack, _)| pack::pack_key(*pack))
                .collect(),
        )
        .await?;
    let mut indexes = tokio::task::JoinSet::new();
    for (pack, chunks) in &written {
        let (store, pack, chunks) = (store.clone(), *pack, chunks.clone());
        indexes.spawn(async move { pack::write_index(&store, pack, &chunks).await });
    }
    while let Some(written) = indexes.join_next().await {
        written.map_err(|e| SnapshotError::Io {
            path: "index".into(),
            source: std::io::Error::other(e),
        })??;
    }
    let manifest_key = put_manifest(store, &manifest, snapshot_id).await?;
    let mut index_and_manifest: Vec<String> = written
        .iter()
        .map(|(pack, _)| pack::index_key(*pack))
        .collect();
    index_and_manifest.extend(manifest_key);
    store.flush_keys(index_and_manifest).await?;
    // The catalog lock may be held by another capture's refresh: wait off the runtime.
    let catalog_owner = repository.clone();
    tokio::task::spawn_blocking(move || {
        let mut catalog = lock(catalog_owner.catalog());
        for (pack, chunks) in &written {
            catalog.add(*pack, chunks);
        }
    })
    .await
    .map_err(|e| SnapshotError::Io {
        path: "catalog".into(),
        source: std::io::Error::other(e),
    })?;
    Ok((manifest, stats))
}

/// The packs a new manifest names. It starts as the previous manifest's list, so the
/// chunks of unchanged files keep their references as they are.
struct PackTable {
    ids: Vec<Uuid>,
    positions: HashMap<Uuid, u32>,
}

impl PackTable {
    fn starting_with(ids: &[Uuid]) -> PackTable {
        PackTable {
            ids: ids.to_vec(),
            positions: ids
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, u32::try_from(i).unwrap_or(u32::MAX)))
                .collect(),
        }
    }

    fn holds(&self, pack: Uuid) -> bool {
        self.positions.contains_key(&pack)
    }

    fn place(&mut self, id: ChunkId, location: Location) -> ChunkRef {
        let next = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
        let pack = *self.positions.entry(location.pack).or_insert_with(|| {
            self.ids.push(location.pack);
            next
        });
        ChunkRef {
            id,
            pack,
            offset: location.offset,
            length: location.length,
        }
    }

    /// Drops the packs no entry references any more, renumbering the references.
    fn compact(self, entries: &mut [Entry]) -> Vec<Uuid> {
        let mut used = vec![false; self.ids.len()];
        for chunk in entries.iter().flat_map(|e| e.chunks.iter()) {
            used[chunk.pack as usize] = true;
        }
        if used.iter().all(|u| *u) {
            return self.ids;
        }
        let mut renumbered = vec![0u32; self.ids.len()];
        let mut kept = Vec::new();
        for (i, id) in self.ids.iter().enumerate() {
            if used[i] {
                renumbered[i] = u32::try_from(kept.len()).unwrap_or(u32::MAX);
                kept.push(*id);
            }
        }
        for chunk in entries.iter_mut().flat_map(|e| e.chunks.iter_mut()) {
            chunk.pack = renumbered[chunk.pack as usize];
        }
        kept
    }
}

/// What the capture's workers share: the pack table, the packs being filled, and the
/// packs written so far.
struct Shared {
    table: PackTable,
    builder: PackBuilder,
    written: Vec<Written>,
}

/// What a mutex holds, once no thread uses it (a poisoned one too: its data is whole).
fn inner<T>(mutex: Mutex<T>) -> T {
    mutex.into_inner().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

type Captured = (Manifest, CaptureStats, Vec<Written>);

/// The previous manifest's stat index by path, where its chunks' packs are still in
/// this store (a reclaimed pack's index is gone; a manifest of another store names none
/// of them). It borrows the manifest: nothing copied.
fn reusable_from<'m>(
    previous: Option<&'m Manifest>,
    packs_in_store: &HashSet<Uuid>,
) -> HashMap<&'m str, &'m Entry> {
    let Some(previous) = previous else {
        return HashMap::new();
    };
    let reusable: Vec<bool> = (previous.packs.iter())
        .map(|p| packs_in_store.contains(p))
        .collect();
    let in_store = |chunks: &[ChunkRef]| chunks.iter().all(|c| reusable[c.pack as usize]);
    (previous.entries.iter())
        .filter(|e| e.kind == EntryKind::File && in_store(&e.chunks))
        .map(|e| (e.path.as_str(), e))
        .collect()
}

/// A file's chunks, each stored by `store_chunk` (which may keep a known one); `None`
/// when a chunk holds a secret: the file is then left out, and its chunks are checked
/// before any is stored.
fn chunks_of<S>(
    mut file: std::fs::File,
    size: u64,
    path: &Path,
    store_chunk: &mut S,
) -> Result<Option<Vec<ChunkRef>>, SnapshotError>
where
    S: FnMut(&[u8]) -> Result<ChunkRef, SnapshotError>,
{
    if size > IN_MEMORY_LIMIT {
        let chunker = fastcdc::v2020::StreamCDC::new(file, MIN_CHUNK, super::AVG_CHUNK, MAX_CHUNK);
        let mut chunks = Vec::new();
        for chunk in chunker {
            let chunk = chunk.map_err(|e| io(path, std::io::Error::other(e)))?;
            if crate::secrets::holds_secret(&chunk.data) {
                return Ok(None);
            }
            chunks.push(store_chunk(&chunk.data)?);
        }
        return Ok(Some(chunks));
    }
    // Most files are small: read each into this thread's buffer and chunk it there,
    // instead of a fresh stream buffer per file.
    READ_BUFFER.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        buffer.clear();
        // The walk saw the size: reserve it and read through `take`, which (unlike a
        // plain `File`) does not stat the file again for a hint.
        buffer.reserve(usize::try_from(size).unwrap_or(0) + 1);
        (&mut file)
            .take(u64::MAX)
            .read_to_end(&mut buffer)
            .map_err(|e| io(path, e))?;
        if buffer.is_empty() {
            return Ok(Some(Vec::new()));
        }
        if crate::secrets::holds_secret(&buffer) {
            return Ok(None);
        }
        // A file that fits in one chunk is one chunk (as restic keeps files below its
        // minimum whole): cut points only pay off in larger files, and scanning for
        // them costs as much as compressing.
        if buffer.len() <= MAX_CHUNK as usize {
            return Ok(Some(vec![store_chunk(&buffer)?]));
        }
        fastcdc::v2020::FastCDC::new(&buffer, MIN_CHUNK, super::AVG_CHUNK, MAX_CHUNK)
            .map(|c| store_chunk(&buffer[c.offset..c.offset + c.length]))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    })
}

fn capture_blocking(
    handle: &Handle,
    repository: &Repository,
    root: &Path,
    mut entries: Vec<Entry>,
    previous: Option<&Manifest>,
) -> Result<Captured, SnapshotError> {
    let store = repository.store();
    let known = lock(repository.catalog()).refresh(handle, store)?;
    let previous_entries = reusable_from(previous, &known.packs);
    let run = Run {
        handle,
        store,
        root,
        stored: known.chunks,
        previous_entries,
        shared: Mutex::new(Shared {
            table: PackTable::starting_with(previous.map_or(&[][..], |m| &m.packs)),
            builder: PackBuilder::default(),
            written: Vec::new(),
        }),
        stats: Mutex::new(CaptureStats::default()),
        secrets: Mutex::new(Vec::new()),
        syncer: PackSyncer::default(),
        previous_chunks: std::sync::OnceLock::new(),
    };
    entries
        .par_iter_mut()
        .try_for_each(|entry| run.entry(entry))?;
    let last = lock(&run.shared).builder.finish();
    if let Some(sealed) = last {
        // The closing flush syncs the last pack.
        run.write(sealed)?;
    }
    run.syncer.finish()?;
    let (shared, stats, secrets) = (inner(run.shared), inner(run.stats), inner(run.secrets));
    Ok(assemble(entries, shared, stats, secrets))
}

/// Syncs each full pack as soon as it is written, beside the reading, so that the
/// capture's closing flush waits for its last pack, not for every pack's bytes. Its
/// thread starts with the first full pack: a capture of one pack (most checkpoints)
/// starts none. On an error the capture drops the sender, and the thread ends.
#[derive(Default)]
struct PackSyncer(Mutex<Option<Syncing>>);

type Syncing = (
    std::sync::mpsc::Sender<Uuid>,
    std::thread::JoinHandle<Result<(), StoreError>>,
);

impl PackSyncer {
    fn sync(&self, store: &ArtifactStore, pack: Uuid) -> Result<(), SnapshotError> {
        // A remote store's object is durable once put.
        if store.local_path(&pack::pack_key(pack)).is_none() {
            return Ok(());
        }
        let mut syncing = lock(&self.0);
        if syncing.is_none() {
            let (to_sync, packs) = std::sync::mpsc::channel::<Uuid>();
            let store = store.clone();
            let thread = std::thread::Builder::new()
                .name("cairn-pack-sync".into())
                .spawn(move || {
                    let mut first_error = None;
                    for pack in packs {
                        if let Err(e) = store.sync_object_blocking(&pack::pack_key(pack)) {
                            first_error.get_or_insert(e);
                        }
                    }
                    first_error.map_or(Ok(()), Err)
                })
                .map_err(|e| io(Path::new("pack syncer"), e))?;
            *syncing = Some((to_sync, thread));
        }
        if let Some((to_sync, _)) = syncing.as_ref() {
            // Its thread ends only once the sender is dropped: this send is received.
            let _ = to_sync.send(pack);
        }
        Ok(())
    }

    /// Waits until every pack handed over is synced.
    fn finish(&self) -> Result<(), SnapshotError> {
        let Some((to_sync, thread)) = lock(&self.0).take() else {
            return Ok(());
        };
        drop(to_sync);
        let synced = thread.join().map_err(|_| {
            io(
                Path::new("pack syncer"),
                std::io::Error::other("the pack syncer panicked"),
            )
        })?;
        Ok(synced?)
    }
}

/// One capture's state, shared by the threads that read its files.
struct Run<'a> {
    handle: &'a Handle,
    store: &'a ArtifactStore,
    root: &'a Path,
    /// Every chunk the store holds, where.
    stored: Arc<HashMap<ChunkId, Location>>,
    previous_entries: HashMap<&'a str, &'a Entry>,
    shared: Mutex<Shared>,
    stats: Mutex<CaptureStats>,
    /// Files left out for holding a secret.
    secrets: Mutex<Vec<String>>,
    syncer: PackSyncer,
    /// The previous manifest's chunks by id, made the first time they are asked for.
    previous_chunks: std::sync::OnceLock<HashMap<ChunkId, ChunkRef>>,
}

impl Run<'_> {
    /// Gives a file entry its chunks: the previous manifest's when its stat is the
    /// same, else read and stored (none when it holds a secret).
    fn entry(&self, entry: &mut Entry) -> Result<(), SnapshotError> {
        if entry.kind != EntryKind::File {
            return Ok(());
        }
        if let Some(p) =
            (self.previous_entries.get(entry.path.as_str())).filter(|p| p.same_stat(entry))
        {
            entry.chunks = p.chunks.clone();
            let mut s = lock(&self.stats);
            s.files += 1;
            s.files_unchanged += 1;
            s.bytes += entry.size;
            return Ok(());
        }
        let path = self.root.join(&entry.path);
        let (mut new_chunks, mut uploaded) = (0u64, 0u64);
        let mut store_chunk = |data: &[u8]| {
            let (chunk, new) = self.store_chunk(data, &path)?;
            if let Some(bytes) = new {
                new_chunks += 1;
                uploaded += bytes;
            }
            Ok(chunk)
        };
        // Replaced since the walk (by a link or a FIFO, say): the tree moved under the
        // capture, which fails rather than block or follow it.
        let opened = crate::regular::open_regular_beneath(self.root, Path::new(&entry.path));
        let Some(file) = opened.map_err(|e| io(&path, e))? else {
            let moved = std::io::Error::other("no longer a regular file");
            return Err(io(&path, moved));
        };
        // A file holding a secret (a private key block, a known token) is left out: its
        // chunks are checked before any is stored.
        match chunks_of(file, entry.size, &path, &mut store_chunk)? {
            Some(chunks) => entry.chunks = chunks,
            None => {
                lock(&self.secrets).push(entry.path.clone());
                entry.chunks = Vec::new();
            }
        }
        let mut s = lock(&self.stats);
        s.files += 1;
        s.bytes += entry.size;
        s.chunks_new += new_chunks;
        s.bytes_uploaded += uploaded;
        Ok(())
    }

    /// Where a chunk of `path` is kept: the previous manifest's, the store's, or this
    /// capture's packs, added (compressed) when new; with its compressed size then.
    fn store_chunk(
        &self,
        data: &[u8],
        path: &Path,
    ) -> Result<(ChunkRef, Option<u64>), SnapshotError> {
        let id = ChunkId::of(data);
        if let Some(location) = self.stored.get(&id) {
            // A store may hold a chunk in two packs (two lineages stored it at once), and
            // the catalog knows one of them: where that one is new to this manifest,
            // the previous manifest's place of the chunk keeps its pack list as it was.
            if !lock(&self.shared).table.holds(location.pack) {
                if let Some(chunk) = self.previous_place(&id) {
                    return Ok((chunk, None));
                }
            }
            return Ok((lock(&self.shared).table.place(id, *location), None));
        }
        {
            let mut shared = lock(&self.shared);
            if let Some(location) = shared.builder.find(&id) {
                return Ok((shared.table.place(id, location), None));
            }
        }
        // Compressed outside the lock; a chunk two threads meet at once is compressed
        // twice but added once.
        let mut new = None;
        let (chunk, sealed) = pack::with_compressed(data, |compressed| {
            let mut shared = lock(&self.shared);
            let before = shared.builder.find(&id);
            let (location, sealed) = shared.builder.add(id, compressed);
            if before.is_none() {
                new = Some(compressed.len() as u64);
            }
            (shared.table.place(id, location), sealed)
        })
        .map_err(|e| io(path, e))?;
        if let Some(sealed) = sealed {
            let pack = sealed.id;
            self.write(sealed)?;
            self.syncer.sync(self.store, pack)?;
        }
        Ok((chunk, new))
    }

    /// Where the previous manifest keeps a chunk (its packs come first in this
    /// manifest's table, at the same positions), if it is still in the store.
    fn previous_place(&self, id: &ChunkId) -> Option<ChunkRef> {
        let chunks = self.previous_chunks.get_or_init(|| {
            (self.previous_entries.values())
                .flat_map(|e| e.chunks.iter().map(|c| (c.id, *c)))
                .collect()
        });
        chunks.get(id).copied()
    }

    /// Writes a sealed pack (then its index) and keeps its buffer for the next one.
    fn write(&self, sealed: Sealed) -> Result<(), SnapshotError> {
        let (written, buffer) = sealed.write(self.handle, self.store)?;
        let mut shared = lock(&self.shared);
        shared.written.push(written);
        shared.builder.recycle(buffer);
        Ok(())
    }
}

/// The manifest of the captured entries (those holding a secret left out, the packs
/// compacted to the ones used), and what the capture did.
fn assemble(
    mut entries: Vec<Entry>,
    shared: Shared,
    mut stats: CaptureStats,
    mut secrets: Vec<String>,
) -> Captured {
    let Shared { table, written, .. } = shared;
    secrets.sort();
    entries.retain(|e| secrets.binary_search(&e.path).is_err());
    let packs = table.compact(&mut entries);
    stats.secrets = secrets;
    stats.packs_new = written.len() as u64;
    let manifest = Manifest {
        version: manifest::VERSION,
        packs,
        entries,
    };
    (manifest, stats, written)
}

/// Records `manifest` as the capture `snapshot_id` of a tree its caller has verified is
/// exactly what the manifest describes, stat for stat (a copy-on-write copy of the tree
/// it was captured from, cut to it): no file is read and nothing is stored but the
/// manifest, with the packs no entry names any more dropped from it. A pack it names
/// that is no longer in the store (reclaimed meanwhile) is an error: capture instead.
pub async fn record_known(
    repository: &Repository,
    manifest: Manifest,
    snapshot_id: Uuid,
) -> Result<Manifest, SnapshotError> {
    let handle = Handle::current();
    let owner = repository.clone();
    let Manifest {
        version,
        packs,
        mut entries,
    } = manifest;
    let manifest = tokio::task::spawn_blocking(move || {
        let known = lock(owner.catalog()).refresh(&handle, owner.store())?;
        let packs = PackTable::starting_with(&packs).compact(&mut entries);
        if let Some(gone) = packs.iter().find(|p| !known.packs.contains(p)) {
            return Err(SnapshotError::Integrity(format!(
                "pack {gone} is no longer in the store"
            )));
        }
        Ok(Manifest {
            version,
            packs,
            entries,
        })
    })
    .await
    .map_err(|e| SnapshotError::Io {
        path: "manifest".into(),
        source: std::io::Error::other(e),
    })??;
    let store = repository.store();
    let key = put_manifest(store, &manifest, snapshot_id).await?;
    store.flush_keys(key.into_iter().collect()).await?;
    Ok(manifest)
}

/// Writes `manifest` as the snapshot `snapshot_id`'s (not yet synced); its key. An
/// empty tree's is not written ([`manifest::EMPTY_MANIFEST_KEY`]): `None`.
async fn put_manifest(
    store: &ArtifactStore,
    manifest: &Manifest,
    snapshot_id: Uuid,
) -> Result<Option<String>, SnapshotError> {
    if manifest.is_empty() {
        return Ok(None);
    }
    let key = manifest::manifest_key(snapshot_id);
    store
        .put(&key, Bytes::from(manifest::encode(manifest)?))
        .await?;
    Ok(Some(key))
}
