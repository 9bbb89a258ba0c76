//! The snapshot engine: content-defined chunks (FastCDC), BLAKE3 ids, zstd, packs, and
//! the artifact store they live in. No database: the worker and the reaper keep the
//! snapshots' records (`cairn_common::lineage`).
//!
//! Modules, bottom up: [`store`] (objects behind `object_store`), [`pack`] (packs of
//! compressed chunks and their indexes), [`catalog`] (the chunks a store holds, as read
//! from its indexes), [`repository`] (a store and its catalog), [`manifest`], `walk`,
//! `capture` and `restore`.
//!
//! A chunk is stored once per store, in a pack ([`pack`]), and shared by every snapshot
//! holding it. A manifest ([`manifest`]) lists paths, modes, symlinks, sizes and where
//! each chunk is. A capture ([`capture()`]) skips files whose stat matches the previous
//! capture of the same lineage, and hashes and compresses on every core. A restore
//! ([`restore()`]) writes files in parallel and verifies every chunk against its id; any
//! mismatch is an [`SnapshotError::Integrity`] error.
//!
//! **What the stat index trusts**: a file is read again unless its size, mode, mtime,
//! change time (ctime) and inode all equal the previous capture's. The change time is
//! set by the kernel on every write and cannot be set back by a process (only by
//! changing the system clock), so an in-place rewrite that keeps size, mtime and inode
//! (`cp -p`, `touch -r`, `rsync --inplace -t`) is still seen, as git and restic see it.
//!
//! The capture root never holds credential files, excluded names, nested unrelated
//! repositories, special files or names that are not UTF-8; each capture reports what
//! it left out ([`Skipped`]). A restore refuses any entry that would land outside its
//! root.

mod capture;
pub mod catalog;
pub mod manifest;
pub mod pack;
pub mod regular;
pub mod repository;
mod restore;
pub mod secrets;
pub mod store;
mod walk;

pub use capture::{capture, capture_scanned, record_known, scan, Scan};
pub use manifest::{
    legacy_chunk_key, legacy_manifest_key, load_manifest, load_recorded, manifest_key,
    recorded_key, ChunkRef, Entry, EntryKind, Manifest, EMPTY_MANIFEST_KEY,
};
pub use pack::{index_key, pack_key, ChunkId};
pub use repository::Repository;
pub use restore::{restore, restore_indexed};
pub use store::{ArtifactStore, StoreError};

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

/// Names (one path component) of credential files and directories: SSH and Git, cloud
/// CLIs, container registries, Kubernetes, databases, package managers and secret
/// stores. A directory of these names is left out whole.
const CREDENTIAL_NAMES: [&str; 36] = [
    // SSH, Git, HTTP
    ".ssh",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    ".git-credentials",
    ".netrc",
    "_netrc",
    ".htpasswd",
    // Cloud CLIs
    ".aws",
    ".azure",
    "gcloud",
    ".boto",
    ".s3cfg",
    ".oci",
    ".doctl",
    "application_default_credentials.json",
    // Containers and Kubernetes
    ".docker",
    ".dockercfg",
    ".kube",
    "kubeconfig",
    // Databases
    ".pgpass",
    ".my.cnf",
    ".mylogin.cnf",
    // Package managers and registries
    ".npmrc",
    ".yarnrc",
    ".pypirc",
    ".gem",
    ".cargo-credentials",
    "credentials.toml",
    ".gradle-credentials",
    // Secret stores and infrastructure tools
    ".vault-token",
    ".gnupg",
    ".password-store",
    ".terraformrc",
    "credentials.tfrc.json",
];
const CREDENTIAL_SUFFIXES: [&str; 6] = [".pem", ".key", ".p12", ".pfx", ".jks", ".keystore"];

impl CaptureRules {
    /// Whether a name (one path component) is excluded as a credential or by pattern.
    pub fn excludes(&self, name: &str) -> bool {
        self.exclusion(name).is_some()
    }

    /// Why a name (one path component) is excluded, if it is.
    pub fn exclusion(&self, name: &str) -> Option<Exclusion> {
        if CREDENTIAL_NAMES.contains(&name)
            || name.starts_with(".env")
            || CREDENTIAL_SUFFIXES.iter().any(|s| name.ends_with(s))
        {
            return Some(Exclusion::Credential);
        }
        self.extra_patterns
            .iter()
            .any(|p| match p.strip_prefix('*') {
                Some(suffix) => name.ends_with(suffix),
                None => p == name,
            })
            .then_some(Exclusion::Pattern)
    }
}

/// Why an entry is outside the captured scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    Credential,
    /// A name of `CAIRN_CAPTURE_EXCLUDE`.
    Pattern,
    NestedRepository,
    /// A socket, fifo or device.
    SpecialFile,
    /// A name (or a symlink target) that is not UTF-8.
    NameNotUtf8,
    /// A file whose content holds a secret ([`secrets`]).
    SecretContent,
    /// A symlink whose target leads out of the tree (an absolute target, or `..` above
    /// the root): a restore refuses such a link, so the capture leaves it out.
    LinkOutside,
}

/// At most this many skipped paths are listed; the counts cover all of them.
pub const SKIPPED_PATHS_LISTED: usize = 50;

/// What a capture left out: counts per reason and the first paths (never content).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    pub credentials: u64,
    pub excluded: u64,
    pub nested_repositories: u64,
    pub special_files: u64,
    pub names_not_utf8: u64,
    #[serde(default)]
    pub secret_contents: u64,
    #[serde(default)]
    pub links_outside: u64,
    /// Relative paths (lossy UTF-8), at most [`SKIPPED_PATHS_LISTED`].
    pub paths: Vec<String>,
}

impl Skipped {
    pub fn add(&mut self, why: Exclusion, path: String) {
        *match why {
            Exclusion::Credential => &mut self.credentials,
            Exclusion::Pattern => &mut self.excluded,
            Exclusion::NestedRepository => &mut self.nested_repositories,
            Exclusion::SpecialFile => &mut self.special_files,
            Exclusion::NameNotUtf8 => &mut self.names_not_utf8,
            Exclusion::SecretContent => &mut self.secret_contents,
            Exclusion::LinkOutside => &mut self.links_outside,
        } += 1;
        if self.paths.len() < SKIPPED_PATHS_LISTED {
            self.paths.push(path);
        }
    }

    pub fn merge(&mut self, other: Skipped) {
        self.credentials += other.credentials;
        self.excluded += other.excluded;
        self.nested_repositories += other.nested_repositories;
        self.special_files += other.special_files;
        self.names_not_utf8 += other.names_not_utf8;
        self.secret_contents += other.secret_contents;
        self.links_outside += other.links_outside;
        let room = SKIPPED_PATHS_LISTED.saturating_sub(self.paths.len());
        self.paths.extend(other.paths.into_iter().take(room));
    }

    pub fn total(&self) -> u64 {
        self.credentials
            + self.excluded
            + self.nested_repositories
            + self.special_files
            + self.names_not_utf8
            + self.secret_contents
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
    /// Files left out because their content holds a secret (paths, never content).
    pub secrets: Vec<String>,
}

/// Figures of one restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub files: u64,
    pub bytes: u64,
}
