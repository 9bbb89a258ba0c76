//! Finding a program: by its name on a `PATH`, as a shell would, or by its path.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A program name with no `/` is looked up in the process's own `PATH` (else
/// [`super::DEFAULT_PATH`]); a path is taken as it is.
pub fn resolve(program: &OsStr, env: &[(OsString, OsString)]) -> io::Result<PathBuf> {
    let path = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.clone())
        .unwrap_or_else(|| super::DEFAULT_PATH.into());
    find(program, &path).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is not in PATH", program.to_string_lossy()),
        )
    })
}

/// `program` itself if it holds a `/`, else the first executable file of that name in
/// the directories of `path`.
pub fn find(program: &OsStr, path: &OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
