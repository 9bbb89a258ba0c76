//! The scope a verification check runs in, as digests: the workspace source, the
//! declared dependency inputs (lock files), the effective environment and the runner.
//! A passed check may be reused only when every one of them is unchanged.

use cairn_common::digest;
use cairn_snapshot::CaptureRules;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lock files: the declared dependency inputs of a tree, wherever they sit in it.
pub const LOCK_FILES: [&str; 14] = [
    "Cargo.lock",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "poetry.lock",
    "Pipfile.lock",
    "uv.lock",
    "requirements.txt",
    "go.sum",
    "Gemfile.lock",
    "composer.lock",
    "flake.lock",
];

/// Digests of a workspace's source and of its dependency inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceScope {
    pub source_digest: String,
    pub dependency_digest: String,
    pub files: usize,
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

/// Measures the source of `root`: every file the tree's own `.gitignore` files do not
/// ignore (build output in ignored directories is not source). `.git`, nested
/// repositories, credential files and excluded names never count, just as they are never
/// captured. Nothing here runs git or reads `.git`: a check may have written to it, and
/// the worker must not act on what a check wrote there.
pub async fn measure(root: &Path, rules: &CaptureRules) -> Result<SourceScope, ScopeError> {
    let (root, rules) = (root.to_path_buf(), rules.clone());
    tokio::task::spawn_blocking(move || {
        let paths = list(&root, &rules)?;
        hash_tree(&root, &rules, paths)
    })
    .await
    .map_err(|e| ScopeError::Listing(e.to_string()))?
}

fn hash_tree(
    root: &Path,
    rules: &CaptureRules,
    paths: Vec<String>,
) -> Result<SourceScope, ScopeError> {
    let mut source: Vec<(String, String)> = Vec::with_capacity(paths.len());
    let mut dependencies: Vec<(String, String)> = Vec::new();
    for path in paths {
        if Path::new(&path)
            .components()
            .any(|c| c.as_os_str().to_str().is_some_and(|n| rules.excludes(n)))
        {
            continue;
        }
        let entry = hash_entry(&root.join(&path)).map_err(|source| ScopeError::Read {
            path: path.clone(),
            source,
        })?;
        let is_lock = Path::new(&path)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| LOCK_FILES.contains(&n));
        if is_lock {
            dependencies.push((path.clone(), entry.clone()));
        }
        source.push((path, entry));
    }
    Ok(SourceScope {
        source_digest: digest::of(&source),
        dependency_digest: digest::of(&dependencies),
        files: source.len(),
    })
}

/// The source files under `root`, as sorted relative paths. Only the tree's `.gitignore`
/// files apply: not `.git/info/exclude`, not any global git configuration.
fn list(root: &Path, rules: &CaptureRules) -> Result<Vec<String>, ScopeError> {
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
        if entry.depth() == 0 || entry.file_type().is_some_and(|t| t.is_dir()) {
            continue;
        }
        if let Ok(relative) = entry.path().strip_prefix(root) {
            paths.push(relative.to_string_lossy().into_owned());
        }
    }
    paths.sort();
    Ok(paths)
}

/// One entry: its kind, executable bit and content hash (a symlink by its target; a
/// tracked file that is gone as `deleted`).
fn hash_entry(path: &PathBuf) -> Result<String, std::io::Error> {
    use std::os::unix::fs::PermissionsExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok("deleted".into()),
        Err(e) => return Err(e),
    };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(path)?;
        return Ok(format!("link:{}", target.to_string_lossy()));
    }
    if meta.is_dir() {
        // A submodule or nested repository: not part of this source.
        return Ok("dir".into());
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(std::fs::File::open(path)?)?;
    let exec = meta.permissions().mode() & 0o111 != 0;
    Ok(format!(
        "file:{}:{}",
        if exec { "x" } else { "-" },
        hasher.finalize().to_hex()
    ))
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
        "confinement": if confined { "linux-netns" } else { "none" },
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
