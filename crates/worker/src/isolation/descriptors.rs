//! Descriptors the worker makes for a child: where they are placed in it, and pipes and
//! memory files kept above that range so that placing never overwrites one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Where a program finds the file it is given with [`super::spawn::Launch::file`]
/// (bubblewrap's `--args`).
pub const FILE_FD: RawFd = 3;

/// The highest descriptor [`super::spawn::Launch::extra_files`] may be placed at: what
/// the child's sources are kept above.
pub(super) const PLACED_MAX: RawFd = FILE_FD + 4;

/// `fd`, moved above the descriptors the child places if it is at or below them (only
/// when the worker was started with few descriptors open).
pub(super) fn above_targets(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > PLACED_MAX {
        return Ok(fd);
    }
    // SAFETY: fcntl(2) duplicates a descriptor we own; the copy is owned at once.
    #[allow(unsafe_code)]
    unsafe {
        let moved = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, PLACED_MAX + 1);
        if moved < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(moved))
    }
}

/// An anonymous memory file holding `data`, read from its start, closed on exec unless
/// placed for the child (a step's variables, a filter's rules).
pub(super) fn memory_file(data: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create(2) with a NUL-terminated name; the descriptor is owned at once.
    #[allow(unsafe_code)]
    let fd = unsafe {
        let fd = libc::memfd_create(c"cairn-step-env".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(fd)
    };
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, data)?;
    std::io::Seek::rewind(&mut file)?;
    Ok(OwnedFd::from(file))
}

/// A pipe: the read end, then the write end, both above [`FILE_FD`] and closed on exec
/// (the child's copies on 1 and 2 are not).
pub(super) fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills the two integers; both are owned at once.
    #[allow(unsafe_code)]
    let (read, write) = unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    Ok((above_targets(read)?, above_targets(write)?))
}
