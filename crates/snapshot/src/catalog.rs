//! The catalog of a store's chunks: the union of its pack indexes, as far as this
//! process has read them. A capture refreshes it (listing the store's indexes) before it
//! deduplicates against it.

use crate::pack::{decode_index, index_key, ChunkId, Location, PackedChunk, INDEX_PREFIX};
use crate::store::{ArtifactStore, StoreError};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use tokio::runtime::Handle;
use uuid::Uuid;

/// What a store holds: every chunk named by an index, by id.
#[derive(Default)]
pub struct Catalog {
    packs: HashSet<Uuid>,
    chunks: Arc<HashMap<ChunkId, Location>>,
}

/// What a capture may reuse: the packs whose index is listed, and their chunks.
pub struct Known {
    pub packs: HashSet<Uuid>,
    pub chunks: Arc<HashMap<ChunkId, Location>>,
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field("packs", &self.packs.len())
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl Catalog {
    /// Brings the catalog up to the store's indexes: packs whose index is gone (the
    /// reaper deletes the index first) are forgotten, new indexes are read. An index
    /// that cannot be read is skipped: its chunks are then merely stored again.
    pub fn refresh(&mut self, handle: &Handle, store: &ArtifactStore) -> Result<Known, StoreError> {
        let listed: HashSet<Uuid> = store
            .list_blocking(handle, INDEX_PREFIX)?
            .iter()
            .filter_map(|key| key.strip_prefix(INDEX_PREFIX))
            .filter_map(|name| Uuid::try_parse(name).ok())
            .collect();
        let gone: HashSet<Uuid> = self.packs.difference(&listed).copied().collect();
        if !gone.is_empty() {
            Arc::make_mut(&mut self.chunks).retain(|_, l| !gone.contains(&l.pack));
            self.packs.retain(|p| !gone.contains(p));
        }
        let new: Vec<Uuid> = listed.difference(&self.packs).copied().collect();
        let read: Vec<(Uuid, Option<Vec<PackedChunk>>)> = new
            .par_iter()
            .map(|pack| {
                let bytes = match store.get_blocking(handle, &index_key(*pack)) {
                    Ok(bytes) => bytes,
                    Err(StoreError::NotFound(_)) => return Ok((*pack, None)),
                    Err(e) => return Err(e),
                };
                let chunks = decode_index(*pack, &bytes);
                if chunks.is_none() {
                    tracing::warn!(%pack, "unreadable pack index skipped");
                }
                Ok((*pack, chunks))
            })
            .collect::<Result<_, StoreError>>()?;
        for (pack, chunks) in read {
            if let Some(chunks) = chunks {
                self.add(pack, &chunks);
            }
        }
        Ok(Known {
            packs: self.packs.clone(),
            chunks: self.chunks.clone(),
        })
    }

    /// Records a pack this process wrote.
    pub fn add(&mut self, pack: Uuid, chunks: &[PackedChunk]) {
        let map = Arc::make_mut(&mut self.chunks);
        for chunk in chunks {
            map.entry(chunk.id).or_insert(Location {
                pack,
                offset: chunk.offset,
                length: chunk.length,
            });
        }
        self.packs.insert(pack);
    }
}
