//! Opening a file a step may have replaced since it was listed: never through a link,
//! never blocking on a FIFO, and only ever reading a regular file. A FIFO opened
//! without `O_NONBLOCK` waits for a writer forever; a link swapped in would read
//! whatever it points at.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` for reading if it is a regular file now; `None` if it is anything else
/// (a link, a FIFO, a socket, a device or a directory) or gone.
pub fn open_regular(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        // A link (ELOOP), a socket (ENXIO), or gone meanwhile.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::ELOOP | nix::libc::ENXIO | nix::libc::ENOENT)
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if file.metadata()?.is_file() {
        Ok(Some(file))
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
