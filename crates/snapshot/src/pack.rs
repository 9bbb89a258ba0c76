//! Packs: many compressed chunks in one object, so capturing many small files writes a
//! few large objects instead of one object per chunk.
//!
//! A pack (`packs/<aa>/<id>`) is a run of zstd-compressed chunks. Its index
//! (`index/<id>`) lists each chunk's id, offset and length and is written after the
//! pack, so an index never names a pack that is not stored. A store's catalog is the
//! union of its indexes: a capture consults it, so a chunk is stored once per store
//! whichever lineage stored it first.

use super::SnapshotError;
use crate::store::ArtifactStore;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use tokio::runtime::Handle;
use uuid::Uuid;

/// A pack is sealed once it holds this many bytes.
pub const PACK_TARGET: usize = 8 * 1024 * 1024;
/// The largest compressed chunk a manifest or an index may name (a chunk is at most
/// 256 KiB and zstd adds little even to incompressible data).
pub const MAX_STORED_CHUNK: u32 = 512 * 1024;
const INDEX_MAGIC: &[u8] = b"cairn-pack-index\n";

/// A chunk's BLAKE3 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    pub fn of(data: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(data).as_bytes())
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({})", self.to_hex())
    }
}

pub fn pack_key(id: Uuid) -> String {
    let name = id.simple().to_string();
    format!("packs/{}/{name}", &name[..2])
}

pub fn index_key(id: Uuid) -> String {
    format!("{INDEX_PREFIX}{}", id.simple())
}

pub(crate) const INDEX_PREFIX: &str = "index/";

/// Where a chunk is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub pack: Uuid,
    pub offset: u32,
    pub length: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedChunk {
    pub id: ChunkId,
    pub offset: u32,
    pub length: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PackIndex {
    pack: Uuid,
    chunks: Vec<PackedChunk>,
}

fn encode_index(pack: Uuid, chunks: &[PackedChunk]) -> Result<Vec<u8>, SnapshotError> {
    let mut bytes = INDEX_MAGIC.to_vec();
    let index = PackIndex {
        pack,
        chunks: chunks.to_vec(),
    };
    let body = postcard::to_stdvec(&index).map_err(|e| SnapshotError::Integrity(e.to_string()))?;
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

pub(crate) fn decode_index(pack: Uuid, bytes: &[u8]) -> Option<Vec<PackedChunk>> {
    let index: PackIndex = postcard::from_bytes(bytes.strip_prefix(INDEX_MAGIC)?).ok()?;
    let sane = index.pack == pack
        && index
            .chunks
            .iter()
            .all(|c| c.length <= MAX_STORED_CHUNK && c.offset.checked_add(c.length).is_some());
    sane.then_some(index.chunks)
}

/// A written pack and the chunks its index will list.
pub type Written = (Uuid, Vec<PackedChunk>);

/// A full pack, ready to be written.
pub struct Sealed {
    pub id: Uuid,
    pub bytes: Vec<u8>,
    pub chunks: Vec<PackedChunk>,
}

impl Sealed {
    /// Writes the pack (not its index: see [`write_index`]); returns what its index will
    /// say, and the emptied buffer for the next pack.
    pub fn write(
        self,
        handle: &Handle,
        store: &ArtifactStore,
    ) -> Result<(Written, Vec<u8>), SnapshotError> {
        store.put_blocking(handle, &pack_key(self.id), &self.bytes)?;
        let mut buffer = self.bytes;
        buffer.clear();
        Ok(((self.id, self.chunks), buffer))
    }
}

/// Writes a pack's index. Only once the pack is durable: an index is what lets other
/// captures reuse the pack's chunks, so it must never outlive a pack lost in a crash.
pub async fn write_index(
    store: &ArtifactStore,
    pack: Uuid,
    chunks: &[PackedChunk],
) -> Result<(), SnapshotError> {
    store
        .put(&index_key(pack), Bytes::from(encode_index(pack, chunks)?))
        .await?;
    Ok(())
}

/// The packs one capture fills, and every chunk it has put in them.
pub struct PackBuilder {
    open: Sealed,
    added: HashMap<ChunkId, Location>,
    /// Buffers of written packs, reused: a fresh 8 MiB buffer costs a page fault per
    /// page as it fills.
    spare: Vec<Vec<u8>>,
}

impl Default for PackBuilder {
    fn default() -> Self {
        PackBuilder {
            open: empty_pack(None),
            added: HashMap::new(),
            spare: Vec::new(),
        }
    }
}

fn empty_pack(buffer: Option<Vec<u8>>) -> Sealed {
    Sealed {
        id: Uuid::new_v4(),
        bytes: buffer
            .unwrap_or_else(|| Vec::with_capacity(PACK_TARGET + MAX_STORED_CHUNK as usize)),
        chunks: Vec::new(),
    }
}

impl PackBuilder {
    /// Where this capture already put a chunk.
    pub fn find(&self, id: &ChunkId) -> Option<Location> {
        self.added.get(id).copied()
    }

    /// Adds a compressed chunk (unless this capture added it already) and returns where
    /// it is, with the pack it filled, which the caller writes outside the lock.
    pub fn add(&mut self, id: ChunkId, compressed: &[u8]) -> (Location, Option<Sealed>) {
        if let Some(location) = self.find(&id) {
            return (location, None);
        }
        // A pack never reaches 4 GiB (it is sealed at PACK_TARGET).
        let offset = u32::try_from(self.open.bytes.len()).unwrap_or(u32::MAX);
        let length = u32::try_from(compressed.len()).unwrap_or(u32::MAX);
        self.open.bytes.extend_from_slice(compressed);
        self.open.chunks.push(PackedChunk { id, offset, length });
        let location = Location {
            pack: self.open.id,
            offset,
            length,
        };
        self.added.insert(id, location);
        let full = self.open.bytes.len() >= PACK_TARGET;
        let sealed = full.then(|| {
            let next = empty_pack(self.spare.pop());
            std::mem::replace(&mut self.open, next)
        });
        (location, sealed)
    }

    /// Takes back a written pack's buffer for a later pack.
    pub fn recycle(&mut self, buffer: Vec<u8>) {
        self.spare.push(buffer);
    }

    /// The last, partly filled pack, if it holds anything.
    pub fn finish(&mut self) -> Option<Sealed> {
        let last = std::mem::replace(&mut self.open, empty_pack(None));
        (!last.chunks.is_empty()).then_some(last)
    }
}

thread_local! {
    /// Each worker's compression and decompression contexts, reused from chunk to chunk
    /// (creating one per chunk costs more than compressing a small chunk).
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> = const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
    /// Each worker's output buffers, reused (a fresh one per chunk is an mmap and a page
    /// fault per page).
    static COMPRESSED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static DECOMPRESSED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Compresses a chunk into this thread's buffer and hands the result to `then`.
pub fn with_compressed<T>(data: &[u8], then: impl FnOnce(&[u8]) -> T) -> std::io::Result<T> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Compressor::new(super::ZSTD_LEVEL)?);
        }
        let compressor = cell
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no compressor"))?;
        COMPRESSED.with(|out| {
            let mut out = out.borrow_mut();
            out.clear();
            out.reserve(zstd::zstd_safe::compress_bound(data.len()));
            compressor.compress_to_buffer(data, &mut *out)?;
            Ok(then(&out))
        })
    })
}

/// Decompresses a chunk (never larger than [`super::MAX_CHUNK`]) into this thread's
/// buffer and hands the result to `then`.
pub fn with_decompressed<T>(data: &[u8], then: impl FnOnce(&[u8]) -> T) -> std::io::Result<T> {
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Decompressor::new()?);
        }
        let decompressor = cell
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no decompressor"))?;
        DECOMPRESSED.with(|out| {
            let mut out = out.borrow_mut();
            out.clear();
            out.reserve(super::MAX_CHUNK as usize);
            decompressor.decompress_to_buffer(data, &mut *out)?;
            Ok(then(&out))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builder_seals_full_packs_and_adds_a_chunk_once() {
        let mut builder = PackBuilder::default();
        let chunk = vec![7u8; 300 * 1024];
        let (first, sealed) = builder.add(ChunkId::of(&chunk), &chunk);
        assert!(sealed.is_none());
        let (again, _) = builder.add(ChunkId::of(&chunk), &chunk);
        assert_eq!(first, again, "the same chunk is added once");
        let mut sealed_packs = Vec::new();
        for i in 0..40u32 {
            let mut data = chunk.clone();
            data[..4].copy_from_slice(&i.to_le_bytes());
            if let (_, Some(sealed)) = builder.add(ChunkId::of(&data), &data) {
                sealed_packs.push(sealed);
            }
        }
        assert_eq!(sealed_packs.len(), 1, "12 MB of chunks seal one 8 MiB pack");
        assert!(sealed_packs[0].bytes.len() >= PACK_TARGET);
        let last = builder.finish().expect("a partly filled pack");
        assert_ne!(last.id, sealed_packs[0].id);
        assert!(builder.finish().is_none());
        let index = encode_index(last.id, &last.chunks).expect("encode");
        assert_eq!(decode_index(last.id, &index), Some(last.chunks.clone()));
        assert_eq!(
            decode_index(Uuid::new_v4(), &index),
            None,
            "another pack's index"
        );
    }
}
