//! The workspaces directory: one live worker at a time.
//!
//! A worker takes an exclusive lock on its directory at start, so a second worker
//! pointed at the same directory is refused with a clear error instead of removing or
//! replacing trees the first one runs in. The directory keeps an identity (a UUID in
//! `.cairn-directory`) that every tree recorded in it carries: a restarted worker, under
//! whatever worker id, finds and looks after the trees its directory holds, and the same
//! path on another host is never mistaken for this one.

use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use uuid::Uuid;

const IDENTITY_FILE: &str = ".cairn-directory";

#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the workspaces directory {0} is in use by another worker process; give each worker its own CAIRN_WORKSPACES_DIR"
    )]
    InUse(String),
}

/// The workspaces directory this process owns while it runs.
#[derive(Debug)]
pub struct Directory {
    pub path: PathBuf,
    pub id: Uuid,
    /// Tree for the life of the process; the kernel releases it when the process dies.
    _lock: Flock<File>,
}

impl Directory {
    /// Creates the directory if needed, locks it and reads (or gives it) its identity.
    pub fn claim(path: &Path) -> Result<Directory, DirectoryError> {
        let io = |source: std::io::Error| DirectoryError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(path).map_err(io)?;
        let path = std::fs::canonicalize(path).map_err(io)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path.join(IDENTITY_FILE))
            .map_err(io)?;
        let mut lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| DirectoryError::InUse(path.display().to_string()))?;
        let mut text = String::new();
        lock.read_to_string(&mut text).map_err(io)?;
        let id = match text.trim().parse::<Uuid>() {
            Ok(id) => id,
            Err(_) => {
                let id = Uuid::new_v4();
                lock.set_len(0).map_err(io)?;
                lock.rewind().map_err(io)?;
                lock.write_all(format!("{id}\n").as_bytes()).map_err(io)?;
                lock.sync_all().map_err(io)?;
                id
            }
        };
        Ok(Directory {
            path,
            id,
            _lock: lock,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_and_the_identity_survives_a_restart() {
        let dir = std::env::temp_dir().join(format!("cairn-dir-{}", Uuid::new_v4().simple()));
        let first = Directory::claim(&dir).expect("first claim");
        let second = Directory::claim(&dir);
        assert!(
            matches!(second, Err(DirectoryError::InUse(_))),
            "{second:?}"
        );
        let id = first.id;
        drop(first);
        let again = Directory::claim(&dir).expect("claimed again once released");
        assert_eq!(again.id, id, "the directory keeps its identity");
        drop(again);
        let _ = std::fs::remove_dir_all(dir);
    }
}
