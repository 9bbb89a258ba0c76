//! The snapshot engine: content-defined chunks (FastCDC), BLAKE3 ids, zstd, packs.
//!
//! A chunk is stored once per store, in a pack ([`pack`]), and shared by every snapshot
//! holding it. A manifest ([`manifest`]) lists paths, modes, symlinks, sizes and where
//! each chunk is. A capture ([`capture()`]) skips files whose stat (size, mtime, inode)
//! matches the previous capture of the same lineage, and hashes and compresses on every
//! core. A restore ([`restore()`]) writes files in parallel and verifies every chunk
//! against its id; any mismatch is an [`SnapshotError::Integrity`] error.
//!
//! The capture root never holds credential files or nested unrelated repositories, and
//! a restore refuses any entry that would land outside its root.

mod capture;
pub mod manifest;
pub mod pack;
mod restore;
mod walk;

pub use capture::capture;
pub use manifest::{
    legacy_chunk_key, legacy_manifest_key, load_manifest, manifest_key, ChunkRef, Entry, EntryKind,
    Manifest,
};
pub use pack::{index_key, pack_key, ChunkId};
pub use restore::restore;

use crate::store::StoreError;
use std::path::Path;

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
    pub packs_new: u64,
}

/// Figures of one restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub files: u64,
    pub bytes: u64,
}
