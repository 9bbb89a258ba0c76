//! A snapshot repository: an artifact store and the catalog of the chunks this process
//! knows it holds. Captures go through one (they deduplicate against its catalog);
//! restores only read objects, so they take the store itself.

use crate::catalog::Catalog;
use crate::store::{ArtifactStore, StoreError};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
pub struct Repository {
    store: ArtifactStore,
    /// Which chunks the store holds, as far as this handle has read its pack indexes.
    catalog: Arc<Mutex<Catalog>>,
}

impl Repository {
    /// Opens the repository a URL names; a local directory is created if missing.
    pub fn open(url: &str) -> Result<Repository, StoreError> {
        ArtifactStore::open(url).map(Repository::from)
    }

    /// The URL recorded on every snapshot this repository holds.
    pub fn url(&self) -> &str {
        self.store.url()
    }

    /// The store's identity (see [`ArtifactStore::identity`]).
    pub async fn identity(&self) -> Result<uuid::Uuid, StoreError> {
        self.store.identity().await
    }

    /// Its objects.
    pub fn store(&self) -> &ArtifactStore {
        &self.store
    }

    /// The chunk catalog captures consult (see [`Catalog::refresh`]).
    pub fn catalog(&self) -> &Mutex<Catalog> {
        &self.catalog
    }
}

impl AsRef<ArtifactStore> for Repository {
    fn as_ref(&self) -> &ArtifactStore {
        &self.store
    }
}

impl From<ArtifactStore> for Repository {
    fn from(store: ArtifactStore) -> Self {
        Repository {
            store,
            catalog: Arc::default(),
        }
    }
}
