//! A write's content, staged in the sandbox's home for the sandboxed copy to read.
//!
//! The home is the agent's: anything in it may be a symbolic link to a host file placed
//! by an earlier exec, and may be swapped while the worker writes. So the worker never
//! resolves a path there: it opens the home itself without following a link, then
//! creates a file of a fresh, unguessable name beneath that handle with `O_EXCL |
//! O_NOFOLLOW` (an entry already there, link or not, is refused, never written
//! through), sets its mode through the descriptor and unlinks it by name beneath the
//! same handle (unlinking never follows a link).

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

/// A staged file: the home's handle and the name beneath it.
#[derive(Debug)]
pub struct Staged {
    home: OwnedFd,
    name: String,
}

impl Staged {
    /// Writes `bytes` to a new file in `home`, readable by the sandbox's user.
    pub async fn write(home: &Path, bytes: &[u8]) -> io::Result<Staged> {
        let home = home.to_path_buf();
        let bytes = bytes.to_vec();
        tokio::task::spawn_blocking(move || Staged::write_blocking(&home, &bytes))
            .await
            .map_err(io::Error::other)?
    }

    fn write_blocking(home: &Path, bytes: &[u8]) -> io::Result<Staged> {
        let home = nix::fcntl::open(
            home,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let name = format!(".cairn-upload-{}", uuid::Uuid::new_v4().simple());
        let file = openat(
            &home,
            name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let staged = Staged { home, name };
        // Through the descriptor: a mode set by name would follow a swapped-in link.
        fchmod(&file, Mode::from_bits_truncate(0o644))?;
        std::fs::File::from(file).write_all(bytes)?;
        Ok(staged)
    }

    /// The file's name in the home.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Unlinks the file (or whatever the agent put under its name since: only the
    /// entry, never what a link points to).
    pub async fn remove(self) {
        let _ = tokio::task::spawn_blocking(move || {
            unlinkat(&self.home, self.name.as_str(), UnlinkatFlags::NoRemoveDir)
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cairn-staged-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    /// A link the agent left in its home, under any name, leads nowhere: the staged
    /// file is new, and a file the link points to is neither written nor chmodded.
    #[tokio::test]
    async fn a_link_in_the_home_is_never_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch();
        let (home, target) = (dir.join("home"), dir.join("target"));
        std::fs::create_dir(&home).expect("home");
        std::fs::write(&target, "root's").expect("target");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).expect("mode");
        std::os::unix::fs::symlink(&target, home.join(".cairn-upload")).expect("link");

        let staged = Staged::write(&home, b"uploaded").await.expect("staged");
        let path = home.join(staged.name());
        assert_eq!(std::fs::read(&path).expect("read"), b"uploaded");
        let meta = std::fs::symlink_metadata(&path).expect("meta");
        assert!(meta.is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        // The agent swaps the staged file for a link before the worker removes it.
        std::fs::remove_file(&path).expect("rm");
        std::os::unix::fs::symlink(&target, &path).expect("swap");
        staged.remove().await;
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "the link is gone"
        );
        assert_eq!(std::fs::read(&target).expect("target"), b"root's");
        let mode = std::fs::metadata(&target)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A home that is itself a link is refused.
    #[tokio::test]
    async fn a_home_that_is_a_link_is_refused() {
        let dir = scratch();
        std::fs::create_dir(dir.join("elsewhere")).expect("dir");
        std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("home")).expect("link");
        assert!(Staged::write(&dir.join("home"), b"x").await.is_err());
        assert_eq!(
            std::fs::read_dir(dir.join("elsewhere"))
                .expect("ls")
                .count(),
            0
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
