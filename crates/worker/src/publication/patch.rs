//! The delivery patch: what differs between a base tree and a run's final tree, in git's
//! unified format, so `git apply` takes it. A text file gets hunks with three lines of
//! context; a file that is not text (a NUL, or not UTF-8) is named as differing. `.git`
//! directories are never part of it; a link is compared by its target (mode 120000), and
//! never followed.

use similar::TextDiff;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The largest file whose lines the patch shows; a larger one is named as differing,
/// so a hostile tree of huge files costs its hash, never its size in memory.
const TEXT_MAX: u64 = 1 << 20;

/// How long one file's diff may search for the smallest one.
const DIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The largest patch written: beyond it, the publication fails rather than store it.
pub const PATCH_MAX: usize = 64 << 20;

/// One entry of a tree, as the patch compares it: a file by its content's hash (its
/// bytes are read again only if it changed and is small enough to show), a link by its
/// target. Equal entries are the same content, mode and kind.
#[derive(Debug, Clone)]
enum Entry {
    File {
        hash: blake3::Hash,
        executable: bool,
        len: u64,
        path: std::path::PathBuf,
    },
    Link(String),
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        match (self, other) {
            (
                Entry::File {
                    hash, executable, ..
                },
                Entry::File {
                    hash: other_hash,
                    executable: other_executable,
                    ..
                },
            ) => hash == other_hash && executable == other_executable,
            (Entry::Link(target), Entry::Link(other_target)) => target == other_target,
            _ => false,
        }
    }
}

impl Entry {
    fn mode(&self) -> &'static str {
        match self {
            Entry::File {
                executable: true, ..
            } => "100755",
            Entry::File { .. } => "100644",
            Entry::Link(_) => "120000",
        }
    }

    /// Its content as text, when it is text and small enough to show.
    fn text(&self) -> Option<String> {
        match self {
            Entry::File { len, path, .. } if *len <= TEXT_MAX => {
                let bytes = std::fs::read(path).ok()?;
                if bytes.contains(&0) {
                    return None;
                }
                String::from_utf8(bytes).ok()
            }
            Entry::File { .. } => None,
            Entry::Link(target) => Some(target.clone()),
        }
    }
}

/// A patch and how many files it changes.
#[derive(Debug)]
pub struct Patch {
    pub text: String,
    pub files_changed: usize,
}

/// The patch that turns the tree at `base` into the tree at `after` (restored from a
/// capture: it holds only what a capture keeps). A path only in the base counts when
/// `base_kept` says a capture would keep it, so a credential or a nested repository the
/// capture left out is not shown deleted. An error when the patch would be larger than
/// [`PATCH_MAX`] or a name cannot be written in one.
pub fn between(
    base: &Path,
    after: &Path,
    base_kept: impl Fn(&str) -> bool,
) -> std::io::Result<Patch> {
    let (old, new) = (entries(base)?, entries(after)?);
    let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
    paths.sort();
    paths.dedup();
    let mut text = String::new();
    let mut files_changed = 0;
    for path in paths
        .into_iter()
        .filter(|p| new.contains_key(*p) || base_kept(p))
    {
        if let Some(bad) = path
            .chars()
            .find(|c| c.is_control() || matches!(c, '"' | '\\'))
        {
            return Err(std::io::Error::other(format!(
                "the name {path:?} holds {bad:?}, which a patch cannot carry unquoted"
            )));
        }
        let (a, b) = (old.get(path), new.get(path));
        if a == b {
            continue;
        }
        files_changed += 1;
        file_diff(&mut text, path, a, b);
        if text.len() > PATCH_MAX {
            return Err(std::io::Error::other(format!(
                "the patch is larger than {} MiB",
                PATCH_MAX >> 20
            )));
        }
    }
    Ok(Patch {
        text,
        files_changed,
    })
}

/// One file's part of the patch: its `diff --git` header, then its hunks.
fn file_diff(out: &mut String, path: &str, a: Option<&Entry>, b: Option<&Entry>) {
    let _ = writeln!(out, "diff --git a/{path} b/{path}");
    match (a, b) {
        (None, Some(new)) => {
            let _ = writeln!(out, "new file mode {}", new.mode());
        }
        (Some(old), None) => {
            let _ = writeln!(out, "deleted file mode {}", old.mode());
        }
        (Some(old), Some(new)) if old.mode() != new.mode() => {
            let _ = writeln!(out, "old mode {}\nnew mode {}", old.mode(), new.mode());
        }
        _ => {}
    }
    let old_name = a.map_or("/dev/null".to_string(), |_| format!("a/{path}"));
    let new_name = b.map_or("/dev/null".to_string(), |_| format!("b/{path}"));
    let old_text = a.map_or(Some(String::new()), Entry::text);
    let new_text = b.map_or(Some(String::new()), Entry::text);
    match (old_text, new_text) {
        (Some(old), Some(new)) if old != new => {
            // A diff that takes too long degrades to a coarser one, never a stall.
            let diff = TextDiff::configure()
                .timeout(DIFF_TIMEOUT)
                .diff_lines(&old, &new);
            let unified = diff
                .unified_diff()
                .context_radius(3)
                .header(&old_name, &new_name)
                .to_string();
            out.push_str(&unified);
        }
        // The same text: only the mode changed.
        (Some(_), Some(_)) => {}
        _ => {
            let _ = writeln!(out, "Binary files {old_name} and {new_name} differ");
        }
    }
}

/// Every file and link under `root` that its own `.gitignore` files do not ignore, by
/// its path relative to it; `.git` left out, links never followed.
fn entries(root: &Path) -> std::io::Result<BTreeMap<String, Entry>> {
    let mut found = BTreeMap::new();
    let walk = ignore::WalkBuilder::new(root)
        .hidden(false)
        .parents(false)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    for item in walk {
        let item = item.map_err(std::io::Error::other)?;
        let path = item.path();
        let Some(kind) = item.file_type() else {
            continue;
        };
        let Some(relative) = path
            .strip_prefix(root)
            .ok()
            .and_then(|p| p.to_str())
            .filter(|p| !p.is_empty())
            .map(str::to_string)
        else {
            // The root itself, or a name that is not UTF-8 (never captured either).
            continue;
        };
        if kind.is_symlink() {
            let target = std::fs::read_link(path)?;
            found.insert(relative, Entry::Link(target.to_string_lossy().into_owned()));
        } else if kind.is_file() {
            let metadata = std::fs::symlink_metadata(path)?;
            let executable = metadata.permissions().mode() & 0o111 != 0;
            found.insert(relative, file_entry(path, metadata.len(), executable)?);
        }
    }
    Ok(found)
}

/// A file's entry: its content's hash, read in pieces.
fn file_entry(path: &Path, len: u64, executable: bool) -> std::io::Result<Entry> {
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(std::fs::File::open(path)?)?;
    Ok(Entry::File {
        hash: hasher.finalize(),
        executable,
        len,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own, removed when dropped.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree(files: &[(&str, &[u8])]) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("cairn-patch-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        for (name, bytes) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
            std::fs::write(path, bytes).expect("write");
        }
        Dir(dir)
    }

    #[test]
    fn added_changed_removed_and_binary_files_are_each_one_file_of_the_patch() {
        let base = tree(&[
            ("keep.txt", b"same\n"),
            ("edit.txt", b"one\ntwo\nthree\n"),
            ("gone.txt", b"bye\n"),
            (".git/HEAD", b"ref: refs/heads/main\n"),
        ]);
        let after = tree(&[
            ("keep.txt", b"same\n"),
            ("edit.txt", b"one\n2\nthree\n"),
            ("src/new.rs", b"fn main() {}\n"),
            ("blob.bin", b"\0\x01\x02"),
            (".git/HEAD", b"changed\n"),
        ]);
        let patch = between(base.path(), after.path(), |_| true).expect("patch");
        assert_eq!(patch.files_changed, 4, "{}", patch.text);
        let text = &patch.text;
        assert!(text.contains("diff --git a/edit.txt b/edit.txt\n--- a/edit.txt\n+++ b/edit.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"), "{text}");
        assert!(text.contains("diff --git a/src/new.rs b/src/new.rs\nnew file mode 100644\n--- /dev/null\n+++ b/src/new.rs\n@@ -0,0 +1 @@\n+fn main() {}\n"), "{text}");
        assert!(text.contains("diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n--- a/gone.txt\n+++ /dev/null\n"), "{text}");
        assert!(
            text.contains("Binary files /dev/null and b/blob.bin differ"),
            "{text}"
        );
        assert!(!text.contains(".git/"), "{text}");
        assert!(!text.contains("keep.txt"), "{text}");
    }

    #[test]
    fn a_link_is_its_target_and_is_never_followed() {
        let base = tree(&[]);
        let after = tree(&[]);
        std::os::unix::fs::symlink("/etc/shadow", after.path().join("leak")).expect("link");
        let patch = between(base.path(), after.path(), |_| true).expect("patch");
        assert_eq!(patch.files_changed, 1);
        assert!(
            patch.text.contains("new file mode 120000"),
            "{}",
            patch.text
        );
        assert!(patch.text.contains("+/etc/shadow"), "{}", patch.text);
    }

    #[test]
    fn a_file_too_large_to_show_is_named_as_differing() {
        let big = vec![b'a'; (TEXT_MAX + 1) as usize];
        let patch = between(tree(&[]).path(), tree(&[("big.txt", &big)]).path(), |_| {
            true
        })
        .expect("patch");
        assert_eq!(patch.files_changed, 1);
        assert!(
            patch
                .text
                .contains("Binary files /dev/null and b/big.txt differ"),
            "{}",
            patch.text
        );
        assert!(patch.text.len() < 200);
    }

    #[test]
    fn ignored_output_and_what_is_not_considered_stay_out_and_odd_names_are_refused() {
        let base = tree(&[(".env.example", b"KEY=\n"), ("keep.txt", b"k\n")]);
        let after = tree(&[
            ("keep.txt", b"k\n"),
            (".gitignore", b"target/\n"),
            ("target/debug/app", b"\0binary"),
        ]);
        let patch = between(base.path(), after.path(), |p| p != ".env.example").expect("patch");
        assert_eq!(patch.files_changed, 1, "{}", patch.text);
        assert!(patch.text.contains("b/.gitignore"), "{}", patch.text);
        assert!(!patch.text.contains("b/target/"), "{}", patch.text);
        assert!(!patch.text.contains(".env.example"), "{}", patch.text);
        let odd = tree(&[("a\nb.txt", b"x\n")]);
        assert!(between(base.path(), odd.path(), |_| true).is_err());
    }

    #[test]
    fn identical_trees_make_an_empty_patch() {
        let files: &[(&str, &[u8])] = &[("a.txt", b"a\n")];
        let patch = between(tree(files).path(), tree(files).path(), |_| true).expect("patch");
        assert_eq!((patch.files_changed, patch.text.as_str()), (0, ""));
    }
}
