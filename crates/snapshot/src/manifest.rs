//! Manifests: what a snapshot holds, path by path, and where each chunk is stored.
//!
//! Encoded compactly (postcard, then zstd): a manifest is written on every checkpoint,
//! so its size is part of the cost of capturing a small change in a large tree.

use super::pack::ChunkId;
use super::{io, SnapshotError};
use crate::store::ArtifactStore;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Component, Path, PathBuf};

/// The format written today; see [`decode`]. Version 2 had no change time.
pub const VERSION: u32 = 3;
const VERSION_WITHOUT_CTIME: u32 = 2;
const MAGIC: &[u8] = b"cairn-manifest\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
}

/// One chunk of a file: its id and its place in one of the manifest's packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub id: ChunkId,
    /// Index into [`Manifest::packs`].
    pub pack: u32,
    pub offset: u32,
    /// Compressed length.
    pub length: u32,
}

/// One path of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the root, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    /// Only for the stat index of the next capture: the inode change time, which no
    /// write can set back (unlike the mtime), and [`UNKNOWN_CTIME`] in older manifests.
    pub ctime_ns: i64,
    /// Only for the stat index of the next capture.
    pub inode: u64,
    pub chunks: Vec<ChunkRef>,
    pub target: Option<String>,
}

/// The change time of entries read from a manifest that did not record it: it never
/// matches a file's, so such a file is read again by the next capture.
pub const UNKNOWN_CTIME: i64 = i64::MIN;

impl Entry {
    /// Whether `now` (as the walk saw it) is this entry unchanged: same kind, size, mode,
    /// mtime, change time and inode. Any write to a file's content moves its change time,
    /// whatever the writer does to its mtime (`cp -p`, `touch -r`, `rsync -t`).
    pub fn same_stat(&self, now: &Entry) -> bool {
        self.kind == now.kind
            && self.size == now.size
            && self.mode == now.mode
            && self.mtime_ns == now.mtime_ns
            && self.ctime_ns == now.ctime_ns
            && self.inode == now.inode
            && self.target == now.target
    }
}

/// An entry of a version-2 manifest (no change time).
#[derive(Serialize, Deserialize)]
struct EntryWithoutCtime {
    path: String,
    kind: EntryKind,
    mode: u32,
    size: u64,
    mtime_ns: i64,
    inode: u64,
    chunks: Vec<ChunkRef>,
    target: Option<String>,
}

/// A version-2 manifest after its version.
#[derive(Serialize, Deserialize)]
struct ManifestWithoutCtime {
    packs: Vec<uuid::Uuid>,
    entries: Vec<EntryWithoutCtime>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// The packs holding this snapshot's chunks.
    pub packs: Vec<uuid::Uuid>,
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// The manifest of an empty tree.
    pub fn empty() -> Manifest {
        Manifest {
            version: VERSION,
            packs: Vec::new(),
            entries: Vec::new(),
        }
    }

    /// Whether it is an empty tree's: no entry, no pack.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.packs.is_empty()
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Every chunk id the manifest references.
    pub fn chunk_ids(&self) -> HashSet<ChunkId> {
        self.entries
            .iter()
            .flat_map(|e| e.chunks.iter().map(|c| c.id))
            .collect()
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.path.as_str())
    }

    /// The digest of the tree's content (hex BLAKE3): each path with its kind, mode,
    /// size, chunks and link target, in path order. Where the chunks are stored, times
    /// and inodes are left out, so two captures of one tree have one digest.
    pub fn tree_digest(&self) -> String {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let mut hasher = blake3::Hasher::new();
        for e in entries {
            let kind: u8 = match e.kind {
                EntryKind::Dir => 0,
                EntryKind::File => 1,
                EntryKind::Symlink => 2,
            };
            // Lengths before variable fields, so no two trees encode alike.
            hasher.update(&(e.path.len() as u64).to_le_bytes());
            hasher.update(e.path.as_bytes());
            hasher.update(&[kind]);
            hasher.update(&(e.mode & 0o7777).to_le_bytes());
            hasher.update(&e.size.to_le_bytes());
            hasher.update(&(e.chunks.len() as u64).to_le_bytes());
            for chunk in &e.chunks {
                hasher.update(&chunk.id.0);
            }
            let target = e.target.as_deref().unwrap_or("");
            hasher.update(&[u8::from(e.target.is_some())]);
            hasher.update(&(target.len() as u64).to_le_bytes());
            hasher.update(target.as_bytes());
        }
        hasher.finalize().to_hex().to_string()
    }
}

/// The key a snapshot of an empty tree records instead of a manifest's: an empty
/// tree's manifest is never stored (nothing is written or synced for it), and a reader
/// makes it ([`load_recorded`]).
pub const EMPTY_MANIFEST_KEY: &str = "manifests/empty";

/// The key a snapshot's record names for `manifest`: [`EMPTY_MANIFEST_KEY`] for an
/// empty tree, else where the capture stored it.
pub fn recorded_key(snapshot_id: uuid::Uuid, manifest: &Manifest) -> String {
    match manifest.is_empty() {
        true => EMPTY_MANIFEST_KEY.to_string(),
        false => manifest_key(snapshot_id),
    }
}

pub fn manifest_key(snapshot_id: uuid::Uuid) -> String {
    format!("manifests/{}.zst", snapshot_id.simple())
}

/// Where the first format kept a manifest; only deleted now (by the reaper).
pub fn legacy_manifest_key(snapshot_id: uuid::Uuid) -> String {
    format!("manifests/{}.json.zst", snapshot_id.simple())
}

/// Where the first format kept each chunk (one object per chunk); only deleted now.
pub fn legacy_chunk_key(id: &str) -> String {
    format!("chunks/{}/{id}", &id[..2.min(id.len())])
}

pub fn encode(manifest: &Manifest) -> Result<Vec<u8>, SnapshotError> {
    let mut plain = MAGIC.to_vec();
    let body =
        postcard::to_stdvec(manifest).map_err(|e| SnapshotError::Integrity(e.to_string()))?;
    plain.extend_from_slice(&body);
    zstd::bulk::compress(&plain, 1).map_err(|e| io(Path::new("manifest"), e))
}

pub fn decode(bytes: &[u8]) -> Result<Manifest, SnapshotError> {
    let bad = |what: String| SnapshotError::Integrity(format!("manifest: {what}"));
    let plain = zstd::decode_all(bytes).map_err(|e| bad(e.to_string()))?;
    let body = plain
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("not a Cairn manifest of a supported format".into()))?;
    let (version, _) = postcard::take_from_bytes::<u32>(body).map_err(|e| bad(e.to_string()))?;
    let manifest: Manifest = match version {
        VERSION => postcard::from_bytes(body).map_err(|e| bad(e.to_string()))?,
        VERSION_WITHOUT_CTIME => {
            let (_, rest) =
                postcard::take_from_bytes::<u32>(body).map_err(|e| bad(e.to_string()))?;
            let old: ManifestWithoutCtime =
                postcard::from_bytes(rest).map_err(|e| bad(e.to_string()))?;
            Manifest {
                version: VERSION,
                packs: old.packs,
                entries: old
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        path: e.path,
                        kind: e.kind,
                        mode: e.mode,
                        size: e.size,
                        mtime_ns: e.mtime_ns,
                        ctime_ns: UNKNOWN_CTIME,
                        inode: e.inode,
                        chunks: e.chunks,
                        target: e.target,
                    })
                    .collect(),
            }
        }
        other => return Err(bad(format!("unsupported version {other}"))),
    };
    let packs = manifest.packs.len();
    if let Some(entry) = manifest
        .entries
        .iter()
        .find(|e| e.chunks.iter().any(|c| c.pack as usize >= packs))
    {
        return Err(bad(format!("{} names a pack it does not list", entry.path)));
    }
    Ok(manifest)
}

/// Reads the manifest of a snapshot whose record names `recorded` (its
/// `manifest_key`): an empty tree's is made, not read; any other is read from where the
/// capture stored it.
pub async fn load_recorded(
    store: &impl AsRef<ArtifactStore>,
    snapshot_id: uuid::Uuid,
    recorded: Option<&str>,
) -> Result<Manifest, SnapshotError> {
    match recorded {
        Some(EMPTY_MANIFEST_KEY) => Ok(Manifest::empty()),
        _ => load_manifest(store, snapshot_id).await,
    }
}

/// Reads a snapshot's stored manifest.
pub async fn load_manifest(
    store: &impl AsRef<ArtifactStore>,
    snapshot_id: uuid::Uuid,
) -> Result<Manifest, SnapshotError> {
    decode(&store.as_ref().get(&manifest_key(snapshot_id)).await?)
}

/// Checks that an entry stays inside the root: relative, no `..`, no empty or `.`
/// components, and (for symlinks) a target that, resolved against the tree being
/// restored (through the snapshot's own links), never leaves it; and that its chunks
/// name packs of the manifest. `symlinks` maps each link's path to its target.
pub(super) fn check_entry(
    entry: &Entry,
    symlinks: &HashMap<&str, &str>,
    packs: usize,
) -> Result<PathBuf, SnapshotError> {
    let refuse = || SnapshotError::UnsafeEntry(entry.path.clone());
    if entry.path.is_empty() || entry.path.contains('\0') || entry.path.starts_with('/') {
        return Err(refuse());
    }
    let path = PathBuf::from(&entry.path);
    if !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(refuse());
    }
    if let Some(bad) = entry
        .chunks
        .iter()
        .find(|c| c.pack as usize >= packs || c.length > super::pack::MAX_STORED_CHUNK)
    {
        return Err(SnapshotError::Integrity(format!(
            "chunk {} of {} names no pack of the manifest or is oversized",
            bad.id, entry.path
        )));
    }
    // No entry may pass through a symlink of the snapshot (symlink traversal).
    let mut prefix = PathBuf::new();
    let components: Vec<_> = path.components().collect();
    for component in &components[..components.len().saturating_sub(1)] {
        prefix.push(component);
        if symlinks.contains_key(prefix.to_string_lossy().as_ref()) {
            return Err(refuse());
        }
    }
    if let Some(target) = &entry.target {
        if !resolves_inside(&path, Path::new(target), symlinks) {
            return Err(refuse());
        }
    }
    Ok(path)
}

/// Links followed while resolving one target before it counts as a loop (as the kernel's
/// limit of 40).
const MAX_LINKS_FOLLOWED: usize = 40;

/// Whether the link at `link` with `target` resolves inside the tree: each component
/// is walked from the link's directory, `..` never climbs above the root, and a
/// component that is itself a link of the snapshot is replaced by its target, as the
/// kernel would once the tree is written. An absolute target, or a loop, leaves it.
pub fn resolves_inside<'a>(
    link: &Path,
    target: &'a Path,
    links: &HashMap<&'a str, &'a str>,
) -> bool {
    let mut at: Vec<String> = link
        .parent()
        .map(|p| {
            p.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut pending: VecDeque<Component<'_>> = VecDeque::new();
    let mut followed = 0;
    pending.extend(target.components());
    loop {
        let Some(component) = pending.pop_front() else {
            return true;
        };
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if at.pop().is_none() {
                    return false;
                }
            }
            Component::Normal(name) => {
                at.push(name.to_string_lossy().into_owned());
                let Some(next) = links.get(at.join("/").as_str()) else {
                    continue;
                };
                followed += 1;
                let next = Path::new(*next);
                if followed > MAX_LINKS_FOLLOWED || next.is_absolute() {
                    return false;
                }
                at.pop();
                let rest: Vec<Component<'_>> = pending.drain(..).collect();
                // The link's own components come first, then what was left of this one.
                let mut expanded: VecDeque<Component<'_>> = VecDeque::new();
                for c in next.components() {
                    expanded.push_back(c);
                }
                expanded.extend(rest);
                pending = expanded;
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_chain_resolves_through_the_tree_being_built() {
        let links: HashMap<&str, &str> =
            HashMap::from([("a/r", ".."), ("a/p1", "r/.."), ("b", "a/r/a/r")]);
        let inside =
            |link: &str, target: &str| resolves_inside(Path::new(link), Path::new(target), &links);
        assert!(inside("a/r", ".."), "a/r is the root");
        assert!(inside("b", "a/r/a/r"), "a chain that stays in the tree");
        assert!(
            !inside("a/p1", "r/.."),
            "r is the root, so r/.. leaves the tree"
        );
        assert!(!inside("c", "b/.."), "b is the root: b/.. leaves it");
        assert!(!inside("d", "/etc"));
        assert!(
            inside("e/f", "../e/g"),
            "a dangling link inside is not refused"
        );
    }

    fn file(path: &str, content: &[u8], mode: u32) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File,
            mode,
            size: content.len() as u64,
            mtime_ns: 1,
            ctime_ns: 2,
            inode: 3,
            chunks: vec![ChunkRef {
                id: ChunkId::of(content),
                pack: 0,
                offset: 0,
                length: 1,
            }],
            target: None,
        }
    }

    #[test]
    fn the_tree_digest_is_the_content_and_never_where_or_when_it_was_stored() {
        let tree = |entries: Vec<Entry>| Manifest {
            version: VERSION,
            packs: vec![uuid::Uuid::new_v4()],
            entries,
        };
        let first = tree(vec![file("a", b"x", 0o644), file("b/c", b"y", 0o755)]);
        // Another capture of the same tree: other packs, times, inodes and order.
        let mut again = tree(vec![file("b/c", b"y", 0o755), file("a", b"x", 0o644)]);
        for e in &mut again.entries {
            (e.mtime_ns, e.ctime_ns, e.inode, e.chunks[0].pack) = (9, 9, 9, 4);
        }
        assert_eq!(first.tree_digest(), again.tree_digest());
        assert_eq!(first.tree_digest().len(), 64);
        let edited = tree(vec![file("a", b"z", 0o644), file("b/c", b"y", 0o755)]);
        let chmodded = tree(vec![file("a", b"x", 0o600), file("b/c", b"y", 0o755)]);
        let renamed = tree(vec![file("a2", b"x", 0o644), file("b/c", b"y", 0o755)]);
        let removed = tree(vec![file("b/c", b"y", 0o755)]);
        let mut linked = tree(vec![file("a", b"x", 0o644), file("b/c", b"y", 0o755)]);
        linked.entries[0].target = Some("b/c".into());
        for other in [edited, chmodded, renamed, removed, linked] {
            assert_ne!(first.tree_digest(), other.tree_digest());
        }
    }

    #[test]
    fn a_manifest_round_trips_and_garbage_is_an_integrity_error() {
        let manifest = Manifest {
            version: VERSION,
            packs: vec![uuid::Uuid::new_v4()],
            entries: vec![Entry {
                path: "a/b".into(),
                kind: EntryKind::File,
                mode: 0o644,
                size: 3,
                mtime_ns: -5,
                ctime_ns: 11,
                inode: 9,
                chunks: vec![ChunkRef {
                    id: ChunkId::of(b"abc"),
                    pack: 0,
                    offset: 7,
                    length: 12,
                }],
                target: None,
            }],
        };
        let encoded = encode(&manifest).expect("encode");
        assert_eq!(decode(&encoded).expect("decode"), manifest);
        for garbage in [
            &b"garbage"[..],
            &zstd::encode_all(&b"{\"version\":1}"[..], 1).expect("zstd")[..],
            &encoded[..encoded.len() / 2],
        ] {
            assert!(matches!(decode(garbage), Err(SnapshotError::Integrity(_))));
        }
    }

    #[test]
    fn a_version_2_manifest_reads_with_an_unknown_change_time() {
        let old = ManifestWithoutCtime {
            packs: vec![],
            entries: vec![EntryWithoutCtime {
                path: "f".into(),
                kind: EntryKind::File,
                mode: 0o600,
                size: 0,
                mtime_ns: 4,
                inode: 2,
                chunks: vec![],
                target: None,
            }],
        };
        let mut plain = MAGIC.to_vec();
        plain.extend(postcard::to_stdvec(&(VERSION_WITHOUT_CTIME, old)).expect("encode"));
        let decoded = decode(&zstd::bulk::compress(&plain, 1).expect("zstd")).expect("decode");
        assert_eq!(decoded.version, VERSION);
        assert_eq!(decoded.entries[0].path, "f");
        assert_eq!(decoded.entries[0].mtime_ns, 4);
        assert_eq!(decoded.entries[0].ctime_ns, UNKNOWN_CTIME);
    }
}
