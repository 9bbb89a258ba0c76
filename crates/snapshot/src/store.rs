//! The artifact store: immutable, content-addressed objects behind `object_store`.
//!
//! A local directory by default (a path or `file://`), S3, GCS or Azure by URL
//! (`s3://bucket/prefix`, `gs://…`, `az://…`, credentials from the usual environment
//! variables). Each snapshot row records the URL of the store that holds its bytes;
//! cleanup opens that store, never the current configuration.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutPayload};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::runtime::Handle;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid artifact store URL {0:?}: {1}")]
    InvalidUrl(String, String),
    #[error("object {0} not found")]
    NotFound(String),
    #[error("artifact store error: {0}")]
    Backend(#[from] object_store::Error),
    #[error("artifact store I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the store's identity object {IDENTITY_KEY} is not an id: {0:?}")]
    Identity(String),
}

/// The object that names a store: an id written once, inside the store, so every URL
/// or mount path that reaches the same bytes gives the same identity.
pub const IDENTITY_KEY: &str = "store-id";

#[derive(Clone, Debug)]
pub struct ArtifactStore {
    url: String,
    store: Arc<dyn ObjectStore>,
    /// For a local store: its directory, synced before a snapshot is called durable.
    local: Option<PathBuf>,
}

impl AsRef<ArtifactStore> for ArtifactStore {
    fn as_ref(&self) -> &ArtifactStore {
        self
    }
}

impl ArtifactStore {
    /// Opens the store a URL names; a local directory is created if missing.
    pub fn open(url: &str) -> Result<ArtifactStore, StoreError> {
        let local_path = match url.strip_prefix("file://") {
            Some(path) => Some(path.to_string()),
            None if !url.contains("://") => Some(url.to_string()),
            None => None,
        };
        if let Some(path) = local_path {
            std::fs::create_dir_all(&path)?;
            let root = std::fs::canonicalize(&path)?;
            let store = LocalFileSystem::new_with_prefix(&root)
                .map_err(|e| StoreError::InvalidUrl(url.to_string(), e.to_string()))?;
            return Ok(ArtifactStore {
                url: format!("file://{}", root.display()),
                store: Arc::new(store),
                local: Some(root),
            });
        }
        // One spelling per URL (the scheme and bucket in lower case, no trailing slash);
        // what keys the reaper's lock and reclaim scope is the store's identity.
        let parsed = url::Url::parse(url.trim_end_matches('/'))
            .map_err(|e| StoreError::InvalidUrl(url.to_string(), e.to_string()))?;
        let url = parsed.as_str().trim_end_matches('/').to_string();
        let options: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                k.starts_with("AWS_") || k.starts_with("GOOGLE_") || k.starts_with("AZURE_")
            })
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        let (store, prefix) = object_store::parse_url_opts(&parsed, options)
            .map_err(|e| StoreError::InvalidUrl(url.to_string(), e.to_string()))?;
        let store: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
            Arc::from(store)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
        };
        Ok(ArtifactStore {
            url,
            store,
            local: None,
        })
    }

    /// Opens a store that must already exist: a local directory that is missing (say an
    /// unmounted volume) is an error rather than a new empty store.
    pub fn open_existing(url: &str) -> Result<ArtifactStore, StoreError> {
        let local =
            url.strip_prefix("file://")
                .or(if url.contains("://") { None } else { Some(url) });
        if let Some(path) = local {
            if !std::path::Path::new(path).is_dir() {
                return Err(StoreError::InvalidUrl(
                    url.to_string(),
                    "the directory does not exist".into(),
                ));
            }
        }
        Self::open(url)
    }

    /// The URL recorded on every snapshot this store holds.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// For a local store, the file that holds an object.
    pub fn local_path(&self, key: &str) -> Option<PathBuf> {
        self.local.as_ref().map(|root| root.join(key))
    }

    /// Deletes every object under a prefix (which ends with `/`), at any depth.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<(), StoreError> {
        if let Some(root) = &self.local {
            return match tokio::fs::remove_dir_all(root.join(prefix)).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            };
        }
        let prefix_path = ObjectPath::from(prefix.trim_end_matches('/'));
        let keys: Vec<String> = self
            .store
            .list(Some(&prefix_path))
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await?;
        self.delete_many(&keys).await
    }

    /// The keys of every object under a prefix (which ends with `/`).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        if self.local.is_some() {
            let this = self.clone();
            let prefix = prefix.to_string();
            let handle = Handle::current();
            return tokio::task::spawn_blocking(move || this.list_blocking(&handle, &prefix))
                .await
                .map_err(|e| StoreError::Io(std::io::Error::other(e)))?;
        }
        let prefix_path = ObjectPath::from(prefix.trim_end_matches('/'));
        let listed: Vec<_> = self.store.list(Some(&prefix_path)).try_collect().await?;
        Ok(listed
            .into_iter()
            .map(|meta| meta.location.to_string())
            .collect())
    }

    /// The keys of every object under a prefix (which ends with `/`), for a caller on a
    /// blocking thread.
    pub fn list_blocking(&self, handle: &Handle, prefix: &str) -> Result<Vec<String>, StoreError> {
        if let Some(root) = &self.local {
            let names = match std::fs::read_dir(root.join(prefix)) {
                Ok(read) => read,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut keys = Vec::new();
            for name in names {
                let name = name?.file_name();
                // Temporary names of objects being written carry a '#'.
                if let Some(name) = name.to_str().filter(|n| !n.contains('#')) {
                    keys.push(format!("{prefix}{name}"));
                }
            }
            return Ok(keys);
        }
        let prefix_path = ObjectPath::from(prefix.trim_end_matches('/'));
        handle.block_on(async {
            let listed: Vec<_> = self.store.list(Some(&prefix_path)).try_collect().await?;
            Ok(listed
                .into_iter()
                .map(|meta| meta.location.to_string())
                .collect())
        })
    }

    /// A byte range of an object, for a caller on a blocking thread.
    pub fn get_range_blocking(
        &self,
        handle: &Handle,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StoreError> {
        handle.block_on(async {
            match self.store.get_range(&ObjectPath::from(key), range).await {
                Ok(bytes) => Ok(bytes),
                Err(object_store::Error::NotFound { .. }) => {
                    Err(StoreError::NotFound(key.to_string()))
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), StoreError> {
        self.store
            .put(&ObjectPath::from(key), PutPayload::from(bytes))
            .await?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        match self.store.get(&ObjectPath::from(key)).await {
            Ok(result) => Ok(result.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::NotFound(key.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self.store.head(&ObjectPath::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// [`Self::exists`] for a caller on a blocking thread (the capture's workers). A local
    /// store is asked directly, without a hop through the runtime per object.
    pub fn exists_blocking(&self, handle: &Handle, key: &str) -> Result<bool, StoreError> {
        match &self.local {
            Some(root) => match std::fs::metadata(root.join(key)) {
                Ok(meta) => Ok(meta.is_file()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e.into()),
            },
            None => handle.block_on(self.exists(key)),
        }
    }

    /// [`Self::put`] for a caller on a blocking thread. A local object is written to a
    /// temporary name and renamed into place, so a reader (or a later capture that
    /// deduplicates against it) never sees a partial object.
    pub fn put_blocking(&self, handle: &Handle, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let Some(root) = &self.local else {
            return handle.block_on(self.put(key, Bytes::copy_from_slice(bytes)));
        };
        let path = root.join(key);
        let temporary = path.with_file_name(format!(
            "{}#{}",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("object"),
            uuid::Uuid::new_v4().simple()
        ));
        let write = |temporary: &std::path::Path| std::fs::write(temporary, bytes);
        let written = match write(&temporary) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| write(&temporary)),
            other => other,
        };
        if let Err(e) = written {
            // A failed write (a full disk, say) leaves nothing behind.
            let _ = std::fs::remove_file(&temporary);
            return Err(e.into());
        }
        if let Err(e) = std::fs::rename(&temporary, &path) {
            let _ = std::fs::remove_file(&temporary);
            return Err(e.into());
        }
        Ok(())
    }

    /// [`Self::get`] for a caller on a blocking thread (the restore's workers).
    pub fn get_blocking(&self, handle: &Handle, key: &str) -> Result<Bytes, StoreError> {
        match &self.local {
            Some(root) => match std::fs::read(root.join(key)) {
                Ok(bytes) => Ok(Bytes::from(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(StoreError::NotFound(key.to_string()))
                }
                Err(e) => Err(e.into()),
            },
            None => handle.block_on(self.get(key)),
        }
    }

    /// The store's identity: the id in [`IDENTITY_KEY`], written by whoever opens the
    /// store first (a create-only put, so two first openers agree).
    pub async fn identity(&self) -> Result<uuid::Uuid, StoreError> {
        match self.existing_identity().await {
            Ok(id) => return Ok(id),
            Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let id = uuid::Uuid::new_v4();
        let put = self
            .store
            .put_opts(
                &ObjectPath::from(IDENTITY_KEY),
                PutPayload::from(id.to_string().into_bytes()),
                PutMode::Create.into(),
            )
            .await;
        match put {
            Ok(_) => {
                self.flush_keys(vec![IDENTITY_KEY.to_string()]).await?;
                Ok(id)
            }
            Err(object_store::Error::AlreadyExists { .. }) => self.existing_identity().await,
            Err(e) => Err(e.into()),
        }
    }

    /// The store's identity, only read: `NotFound` when it has none (a reader never
    /// names a store it only looked at).
    pub async fn existing_identity(&self) -> Result<uuid::Uuid, StoreError> {
        let bytes = self.get(IDENTITY_KEY).await?;
        let text = String::from_utf8_lossy(&bytes);
        uuid::Uuid::parse_str(text.trim()).map_err(|_| StoreError::Identity(text.into_owned()))
    }

    /// Deletes objects in bulk (the backend's batch delete where it has one); deleting
    /// what is already gone succeeds.
    pub async fn delete_many(&self, keys: &[String]) -> Result<(), StoreError> {
        let paths = futures::stream::iter(keys.iter().map(|k| Ok(ObjectPath::from(k.as_str()))));
        let mut deleted = self.store.delete_stream(Box::pin(paths));
        while let Some(result) = futures::StreamExt::next(&mut deleted).await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The size of an object, `None` when it does not exist.
    pub async fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self.store.head(&ObjectPath::from(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes an object; deleting what is already gone succeeds.
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.store.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Syncs one local object's bytes, from a blocking thread; its directory entry is
    /// made durable by [`Self::flush_keys`]. A remote store's object is durable once put.
    pub fn sync_object_blocking(&self, key: &str) -> Result<(), StoreError> {
        if let Some(root) = &self.local {
            std::fs::File::open(root.join(key))?.sync_all()?;
        }
        Ok(())
    }

    /// Makes the named objects durable: for a local store each file and every directory
    /// between it and the store's root is synced (one `syncfs` instead when there are
    /// many); a remote store's puts are durable once acknowledged. Unlike `syncfs`, this
    /// waits for nothing else written on the filesystem.
    pub async fn flush_keys(&self, keys: Vec<String>) -> Result<(), StoreError> {
        const PER_FILE_LIMIT: usize = 256;
        let Some(root) = self.local.clone() else {
            return Ok(());
        };
        if keys.is_empty() {
            return Ok(());
        }
        if keys.len() > PER_FILE_LIMIT {
            return self.flush().await;
        }
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut dirs = std::collections::BTreeSet::new();
            for key in keys {
                let path = root.join(&key);
                std::fs::File::open(&path)?.sync_all()?;
                // A directory the put created is durable only once its parent is synced.
                let mut dir = path.parent();
                while let Some(d) = dir.filter(|d| d.starts_with(&root)) {
                    dirs.insert(d.to_path_buf());
                    dir = d.parent();
                }
            }
            for dir in dirs {
                std::fs::File::open(&dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(())
    }

    /// Makes everything written so far durable. A remote store's puts are durable once
    /// acknowledged; a local store's files are flushed with one `syncfs(2)`.
    pub async fn flush(&self) -> Result<(), StoreError> {
        if let Some(root) = self.local.clone() {
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let dir = std::fs::File::open(&root)?;
                nix::unistd::syncfs(&dir).map_err(std::io::Error::from)
            })
            .await
            .map_err(std::io::Error::other)??;
        }
        Ok(())
    }
}
