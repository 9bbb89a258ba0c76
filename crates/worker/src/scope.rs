//! The scope a verification check runs in, as digests: the workspace source, the
//! dependency inputs (lock files), the effective environment and the runner. A passed
//! check may be reused only when every one of them is unchanged.
//!
//! The source digest binds, for every entry the tree's `.gitignore` files do not ignore,
//! the raw bytes of its name, its kind and all its permission bits, and: a file's
//! content; a directory (empty ones too); a link's text and what it resolves to inside
//! the tree (the content of a file it leads to, even an ignored one); a special file's
//! kind only. A special file is never opened (a FIFO would block the walk) and nothing
//! is ever followed out of the tree: a link that leaves it is named in
//! [`SourceScope::escaping_link`], and checks on such a tree are never reused. Lock files
//! are bound even when ignored.

use cairn_common::digest;
use cairn_snapshot::regular::open_regular;
use cairn_snapshot::CaptureRules;
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Lock files: the declared dependency inputs of a tree, wherever they sit in it, and
/// whether or not they are ignored. `requirements*.txt` and `constraints*.txt` too.
pub const LOCK_FILES: [&str; 29] = [
    "Cargo.lock",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "bun.lock",
    "deno.lock",
    "poetry.lock",
    "Pipfile.lock",
    "pdm.lock",
    "uv.lock",
    "pylock.toml",
    "go.sum",
    "go.work.sum",
    "Gemfile.lock",
    "composer.lock",
    "flake.lock",
    "mix.lock",
    "pubspec.lock",
    "Package.resolved",
    "Podfile.lock",
    "packages.lock.json",
    "gradle.lockfile",
    "conda-lock.yml",
    "renv.lock",
    "stack.yaml.lock",
    "cabal.project.freeze",
    "Manifest.toml",
];

/// Whether a file name is a lock file's.
pub fn is_lock_file(name: &[u8]) -> bool {
    let pinned = |prefix: &[u8]| name.starts_with(prefix) && name.ends_with(b".txt");
    LOCK_FILES.iter().any(|l| l.as_bytes() == name)
        || pinned(b"requirements")
        || pinned(b"constraints")
}

/// Digests of a workspace's source and of its dependency inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceScope {
    pub source_digest: String,
    pub dependency_digest: String,
    pub files: usize,
    /// The first link (by path) that resolves outside the tree, if any.
    pub escaping_link: Option<String>,
}

/// Everything a check's reuse is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scope {
    pub source_digest: String,
    pub dependency_digest: String,
    pub environment_digest: String,
    pub runner_digest: String,
}

impl Scope {
    pub fn digest(&self) -> String {
        digest::of(self)
    }

    /// The first digest that differs from `prior`, named as a reason to run fresh.
    pub fn changed_from(&self, prior: &Scope) -> Option<&'static str> {
        // Lock files are part of the source too: name the narrower change first.
        if self.dependency_digest != prior.dependency_digest {
            Some("dependencies_changed")
        } else if self.source_digest != prior.source_digest {
            Some("source_changed")
        } else if self.environment_digest != prior.environment_digest {
            Some("environment_changed")
        } else if self.runner_digest != prior.runner_digest {
            Some("runner_changed")
        } else {
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("cannot list the source: {0}")]
    Listing(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
}

/// Measures the source of `root`. Nothing here runs git or reads `.git`: a check may
/// have written to it, and the worker must not act on what a check wrote there.
/// `.git`, nested repositories, credential files and excluded names never count, just
/// as they are never captured.
pub async fn measure(root: &Path, rules: &CaptureRules) -> Result<SourceScope, ScopeError> {
    let (root, rules) = (root.to_path_buf(), rules.clone());
    tokio::task::spawn_blocking(move || measure_blocking(&root, &rules))
        .await
        .map_err(|e| ScopeError::Listing(e.to_string()))?
}

fn measure_blocking(root: &Path, rules: &CaptureRules) -> Result<SourceScope, ScopeError> {
    let canonical_root = std::fs::canonicalize(root).map_err(|source| ScopeError::Read {
        path: root.display().to_string(),
        source,
    })?;
    let listed = list(root, rules)?;
    let mut paths: BTreeSet<PathBuf> = listed.iter().map(|(p, _)| p.clone()).collect();
    // Lock files count even when ignored (a library often ignores its `Cargo.lock`):
    // every lock file in a directory that is itself source.
    let directories = std::iter::once(PathBuf::new())
        .chain(listed.into_iter().filter(|(_, dir)| *dir).map(|(p, _)| p));
    for directory in directories {
        let Ok(children) = std::fs::read_dir(root.join(&directory)) else {
            continue;
        };
        for child in children.flatten() {
            let name = child.file_name();
            if is_lock_file(name.as_bytes()) && !rules.excludes(&name.to_string_lossy()) {
                paths.insert(directory.join(name));
            }
        }
    }
    let mut source = blake3::Hasher::new();
    let mut dependencies = blake3::Hasher::new();
    let mut files = 0;
    let mut escaping_link = None;
    for path in &paths {
        let full = root.join(path);
        let entry = describe(&canonical_root, &full).map_err(|source| ScopeError::Read {
            path: path.display().to_string(),
            source,
        })?;
        if entry.escapes && escaping_link.is_none() {
            escaping_link = Some(path.to_string_lossy().into_owned());
        }
        let name = path.as_os_str().as_bytes();
        record(&mut source, name, &entry.bytes);
        if path.file_name().is_some_and(|n| is_lock_file(n.as_bytes())) {
            record(&mut dependencies, name, &entry.bytes);
        }
        files += usize::from(!entry.directory);
    }
    Ok(SourceScope {
        source_digest: source.finalize().to_hex().to_string(),
        dependency_digest: dependencies.finalize().to_hex().to_string(),
        files,
        escaping_link,
    })
}

/// Adds one entry, length-prefixed so no two trees hash alike by shifting bytes between
/// a name and its description.
fn record(hasher: &mut blake3::Hasher, name: &[u8], description: &[u8]) {
    hasher.update(&(name.len() as u64).to_le_bytes());
    hasher.update(name);
    hasher.update(&(description.len() as u64).to_le_bytes());
    hasher.update(description);
}

/// The entries under `root` that the tree's own `.gitignore` files do not ignore (not
/// `.git/info/exclude`, not any global git configuration), as relative paths, each
/// with whether it is a directory.
fn list(root: &Path, rules: &CaptureRules) -> Result<Vec<(PathBuf, bool)>, ScopeError> {
    let filter_rules = rules.clone();
    let walker = ignore::WalkBuilder::new(root)
        .hidden(false)
        .parents(false)
        .ignore(false)
        .git_ignore(true)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |entry| {
            let name = entry.file_name().to_string_lossy();
            let nested_repository = entry.depth() > 0
                && entry.file_type().is_some_and(|t| t.is_dir())
                && entry.path().join(".git").exists();
            name != ".git" && !filter_rules.excludes(&name) && !nested_repository
        })
        .build();
    let mut paths = Vec::new();
    for entry in walker {
        let entry = entry.map_err(|e| ScopeError::Listing(e.to_string()))?;
        if entry.depth() == 0 {
            continue;
        }
        let directory = entry.file_type().is_some_and(|t| t.is_dir());
        if let Ok(relative) = entry.path().strip_prefix(root) {
            paths.push((relative.to_path_buf(), directory));
        }
    }
    Ok(paths)
}

/// What the digest binds of one entry.
struct Described {
    bytes: Vec<u8>,
    directory: bool,
    /// A link that resolves outside the tree.
    escapes: bool,
}

/// Describes one entry without following it out of the tree or opening anything but a
/// regular file.
fn describe(root: &Path, path: &Path) -> std::io::Result<Described> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(described(b"deleted".to_vec()))
        }
        Err(e) => return Err(e),
    };
    let mode = meta.permissions().mode() & 0o7777;
    let kind = meta.file_type();
    if kind.is_symlink() {
        let text = std::fs::read_link(path)?;
        let (resolved, escapes) = resolve_link(root, path, &text)?;
        let mut bytes = b"link:".to_vec();
        bytes.extend_from_slice(text.as_os_str().as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&resolved);
        return Ok(Described {
            bytes,
            directory: false,
            escapes,
        });
    }
    let mut bytes = format!("{}:{mode:o}:", kind_name(&kind)).into_bytes();
    if kind.is_dir() {
        return Ok(Described {
            bytes,
            directory: true,
            escapes: false,
        });
    }
    if kind.is_file() {
        bytes.extend_from_slice(content(path)?.as_bytes());
    }
    Ok(described(bytes))
}

fn described(bytes: Vec<u8>) -> Described {
    Described {
        bytes,
        directory: false,
        escapes: false,
    }
}

fn kind_name(kind: &std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "dir"
    } else if kind.is_file() {
        "file"
    } else if kind.is_fifo() {
        "fifo"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() {
        "char-device"
    } else if kind.is_block_device() {
        "block-device"
    } else {
        "other"
    }
}

/// A regular file's content hash; a file replaced by anything else meanwhile is named
/// so, never opened.
fn content(path: &Path) -> std::io::Result<String> {
    let Some(file) = open_regular(path)? else {
        return Ok("replaced".into());
    };
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(file)?;
    Ok(hasher.finalize().to_hex().to_string())
}

/// What a link at `path` with `text` resolves to inside `root` (the kind, mode and
/// content of its final target, `dangling` if there is none), and whether it leaves the
/// tree instead (then nothing past the tree's edge is read).
fn resolve_link(root: &Path, path: &Path, text: &Path) -> std::io::Result<(Vec<u8>, bool)> {
    if text.is_absolute() {
        return Ok((b"outside".to_vec(), true));
    }
    match std::fs::canonicalize(path) {
        Ok(target) if target.starts_with(root) => {
            let meta = std::fs::metadata(&target)?;
            let mode = meta.permissions().mode() & 0o7777;
            let mut bytes = format!("{}:{mode:o}:", kind_name(&meta.file_type())).into_bytes();
            if meta.is_file() {
                bytes.extend_from_slice(content(&target)?.as_bytes());
            }
            Ok((bytes, false))
        }
        Ok(_) => Ok((b"outside".to_vec(), true)),
        // Dangling (or a loop): where it points, lexically, from its real directory.
        Err(_) => {
            let parent = path.parent().map(std::fs::canonicalize).transpose()?;
            let inside = parent.is_some_and(|p| lexically_inside(root, &p.join(text)));
            Ok((b"dangling".to_vec(), !inside))
        }
    }
}

/// Whether `path`, with `.` and `..` applied lexically, stays under `root`.
fn lexically_inside(root: &Path, path: &Path) -> bool {
    let mut resolved = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                resolved.pop();
            }
            Component::CurDir => {}
            other => resolved.push(other),
        }
    }
    resolved.starts_with(root)
}

/// The effective environment of a check, with the per-run scratch paths replaced by a
/// placeholder so the same environment gives the same digest on every run.
pub fn environment_digest(env: &BTreeMap<String, String>, scratch: &Path) -> String {
    let scratch = scratch.to_string_lossy();
    let normalized: BTreeMap<&str, String> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.replace(scratch.as_ref(), "<scratch>")))
        .collect();
    digest::of(&normalized)
}

/// The runner: how checks are confined and on what they run.
pub fn runner_digest(confined: bool, backend: &str, base_image: Option<&str>) -> String {
    digest::of_json(&json!({
        "runner": "cairn-worker",
        "version": env!("CARGO_PKG_VERSION"),
        "confinement": if confined { "sandbox" } else { "none" },
        "backend": backend,
        "base_image": base_image,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn source_and_dependency_digests_follow_the_files() {
        let dir = std::env::temp_dir().join(format!("cairn-scope-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("src")).expect("dir");
        std::fs::write(dir.join("src/main.rs"), "fn main() {}").expect("write");
        std::fs::write(dir.join("Cargo.lock"), "v1").expect("write");
        std::fs::write(dir.join(".netrc"), "secret").expect("write");
        let rules = CaptureRules::default();
        let first = measure(&dir, &rules).await.expect("measure");
        assert_eq!(first.files, 2, "the credential file is not source");

        std::fs::write(dir.join(".netrc"), "other secret").expect("write");
        assert_eq!(measure(&dir, &rules).await.expect("measure"), first);

        std::fs::write(dir.join("src/main.rs"), "fn main() { }").expect("write");
        let edited = measure(&dir, &rules).await.expect("measure");
        assert_ne!(edited.source_digest, first.source_digest);
        assert_eq!(edited.dependency_digest, first.dependency_digest);

        std::fs::write(dir.join("Cargo.lock"), "v2").expect("write");
        let locked = measure(&dir, &rules).await.expect("measure");
        assert_ne!(locked.dependency_digest, edited.dependency_digest);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn ignored_output_git_internals_and_nested_repositories_are_not_source() {
        let dir = std::env::temp_dir().join(format!("cairn-scope-git-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .args(args)
                .current_dir(&dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.com")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.com")
                .status()
                .expect("git")
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "--quiet", "-b", "main"]);
        std::fs::write(dir.join(".gitignore"), "target/\n").expect("write");
        std::fs::write(dir.join("lib.rs"), "pub fn f() {}").expect("write");
        git(&["add", "."]);
        git(&["commit", "--quiet", "-m", "init"]);
        let rules = CaptureRules::default();
        let first = measure(&dir, &rules).await.expect("measure");
        assert_eq!(first.files, 2);

        std::fs::create_dir_all(dir.join("target")).expect("dir");
        std::fs::write(dir.join("target/out.o"), "object").expect("write");
        assert_eq!(
            measure(&dir, &rules).await.expect("measure"),
            first,
            "ignored output"
        );

        // What a check writes into .git cannot hide a file from the source.
        std::fs::write(dir.join(".git/info/exclude"), "hidden.rs\n").expect("write");
        std::fs::write(dir.join("hidden.rs"), "// hidden").expect("write");
        let hidden = measure(&dir, &rules).await.expect("measure");
        assert_ne!(
            hidden.source_digest, first.source_digest,
            ".git/info/exclude is not read"
        );
        std::fs::remove_file(dir.join("hidden.rs")).expect("remove");

        // A nested repository is not this source (it is never captured either).
        std::fs::create_dir_all(dir.join("vendored/.git")).expect("dir");
        std::fs::write(dir.join("vendored/lib.rs"), "x").expect("write");
        assert_eq!(
            measure(&dir, &rules).await.expect("measure"),
            first,
            "nested repository"
        );
        std::fs::remove_dir_all(dir.join("vendored")).expect("remove");

        std::fs::write(dir.join("new.rs"), "// new").expect("write");
        let untracked = measure(&dir, &rules).await.expect("measure");
        assert_ne!(
            untracked.source_digest, first.source_digest,
            "untracked source counts"
        );
        std::fs::remove_file(dir.join("new.rs")).expect("remove");

        std::fs::remove_file(dir.join("lib.rs")).expect("remove");
        let deleted = measure(&dir, &rules).await.expect("measure");
        assert_ne!(
            deleted.source_digest, first.source_digest,
            "a deleted file counts"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn scratch_paths_do_not_change_the_environment_digest() {
        let env = |scratch: &str| {
            BTreeMap::from([
                ("HOME".to_string(), scratch.to_string()),
                ("MODE".to_string(), "a".to_string()),
            ])
        };
        let a = environment_digest(&env("/tmp/one"), Path::new("/tmp/one"));
        let b = environment_digest(&env("/tmp/two"), Path::new("/tmp/two"));
        assert_eq!(a, b);
        let mut other = env("/tmp/two");
        other.insert("MODE".into(), "b".into());
        assert_ne!(a, environment_digest(&other, Path::new("/tmp/two")));
    }
}
