//! Opening a file a step may have replaced since it was listed: never through a link,
//! never blocking on a FIFO, and only ever reading a regular file. A FIFO opened
//! without `O_NONBLOCK` waits for a writer forever; a link swapped in would read
//! whatever it points at.

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` for reading if it is a regular file now; `None` if it is anything else
/// (a link, a FIFO, a socket, a device or a directory) or gone.
pub fn open_regular(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path);
    regular_or_none(opened)
}

/// Opens `relative` beneath `root` with `flags`, as the kernel resolves it: never through
/// a link, never above `root` (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
/// A step that swaps a directory of its tree for a link while the capture runs makes
/// this fail (`ELOOP`, `EXDEV`), never read what the link points at.
pub fn open_beneath(root: &Path, relative: &Path, flags: OFlag) -> io::Result<OwnedFd> {
    let base = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    Ok(openat2(&base, relative, how)?)
}

/// [`open_regular`] for `relative` beneath `root`, resolved with [`open_beneath`]: `None`
/// for anything but a regular file now, a link on the way to it included.
pub fn open_regular_beneath(root: &Path, relative: &Path) -> io::Result<Option<File>> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    regular_or_none(open_beneath(root, relative, flags).map(File::from))
}

/// The file if it opened and is a regular file now; `None` for a link (`ELOOP`), a
/// socket (`ENXIO`), a path that left the root (`EXDEV`), one gone meanwhile, or
/// anything but a regular file.
fn regular_or_none(opened: io::Result<File>) -> io::Result<Option<File>> {
    let file = match opened {
        Ok(file) => file,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::ELOOP | nix::libc::ENXIO | nix::libc::ENOENT | nix::libc::EXDEV)
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    Ok(file.metadata()?.is_file().then_some(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a step swapping a directory of its tree for a link leaves the capture: the
    /// link is never followed, in any component of the path.
    #[test]
    fn nothing_is_opened_through_a_link_in_any_component() {
        let base = std::env::temp_dir().join(format!("cairn-beneath-{}", uuid::Uuid::new_v4()));
        let (root, outside) = (base.join("tree"), base.join("host"));
        std::fs::create_dir_all(root.join("dir")).expect("dirs");
        std::fs::create_dir_all(&outside).expect("host");
        std::fs::write(outside.join("secret"), "host secret").expect("secret");
        std::fs::write(root.join("dir/own"), "own").expect("own");
        std::os::unix::fs::symlink(&outside, root.join("swapped")).expect("link");
        std::os::unix::fs::symlink("../host", root.join("relative")).expect("link");
        let own = open_regular_beneath(&root, Path::new("dir/own")).expect("open");
        assert!(own.is_some());
        for path in ["swapped/secret", "relative/secret", "../host/secret"] {
            let opened = open_regular_beneath(&root, Path::new(path)).expect("no error");
            assert!(opened.is_none(), "{path} was opened");
        }
        for path in ["swapped", "relative", ".."] {
            let listed = open_beneath(&root, Path::new(path), OFlag::O_DIRECTORY | OFlag::O_RDONLY);
            assert!(listed.is_err(), "{path} was opened as a directory");
        }
        let _ = std::fs::remove_dir_all(base);
    }

    #[test]
    fn only_a_regular_file_is_opened_and_a_fifo_never_blocks() {
        let dir = std::env::temp_dir().join(format!("cairn-regular-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("file"), "x").expect("file");
        std::os::unix::fs::symlink("file", dir.join("link")).expect("link");
        nix::unistd::mkfifo(&dir.join("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
        assert!(open_regular(&dir.join("file")).expect("open").is_some());
        assert!(open_regular(&dir.join("link")).expect("open").is_none());
        assert!(open_regular(&dir.join("pipe")).expect("open").is_none());
        assert!(open_regular(&dir.join("gone")).expect("open").is_none());
        assert!(open_regular(&dir).expect("open").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
