//! The verification scope as a property: on random trees, every single change that can
//! alter a check's outcome changes the source digest, and one that cannot does not.

use cairn_snapshot::CaptureRules;
use cairn_worker::scope::{self, SourceScope};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const TREES: usize = 40;
const CHANGES_PER_TREE: usize = 6;

/// `CAIRN_SCOPE_SEED` replays a failure.
fn seed() -> u64 {
    std::env::var("CAIRN_SCOPE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

fn scratch(seed: u64, tree: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cairn-scope-prop-{seed}-{tree}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

fn bytes(rng: &mut StdRng) -> Vec<u8> {
    (0..rng.random_range(0..64)).map(|_| rng.random()).collect()
}

/// A random tree: files (some executable), nested and empty directories, links that
/// stay inside, a non-UTF-8 name, a lock file the tree ignores and ignored output.
fn build(root: &Path, rng: &mut StdRng) {
    std::fs::write(root.join(".gitignore"), "target/\nCargo.lock\n").expect("ignore");
    std::fs::write(root.join("Cargo.lock"), bytes(rng)).expect("lock");
    std::fs::create_dir_all(root.join("target")).expect("target");
    std::fs::write(root.join("target/out.o"), bytes(rng)).expect("output");
    for d in 0..rng.random_range(1..4) {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).expect("dir");
        for f in 0..rng.random_range(0..4) {
            let file = dir.join(format!("f{f}.txt"));
            std::fs::write(&file, bytes(rng)).expect("file");
            if rng.random_bool(0.3) {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755))
                    .expect("mode");
            }
        }
    }
    std::fs::create_dir_all(root.join("empty")).expect("empty dir");
    std::fs::write(root.join("d0/data.txt"), bytes(rng)).expect("data");
    std::os::unix::fs::symlink("d0/data.txt", root.join("link")).expect("link");
    std::os::unix::fs::symlink("../target/out.o", root.join("d0/to-ignored")).expect("link");
    let name = OsStr::from_bytes(b"caf\xe9.txt");
    std::fs::write(root.join(name), bytes(rng)).expect("latin-1 name");
}

/// One change, and whether it can alter a check's outcome.
fn change(root: &Path, kind: usize, rng: &mut StdRng) -> (&'static str, bool) {
    let latin = root.join(OsStr::from_bytes(b"caf\xe9.txt"));
    match kind {
        0 => {
            let mut content = std::fs::read(root.join("d0/data.txt")).expect("read");
            content.push(rng.random());
            std::fs::write(root.join("d0/data.txt"), content).expect("write");
            ("content", true)
        }
        1 => {
            let path = root.join("d0/data.txt");
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o7777;
            let next = [0o000, 0o600, 0o640, 0o755, 0o444]
                .into_iter()
                .find(|m| *m != mode)
                .unwrap_or(0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(next)).expect("mode");
            ("mode", true)
        }
        2 => {
            let text = std::fs::read_link(root.join("link")).expect("link");
            let next = if text == Path::new("d0/data.txt") {
                "d0/../d0/data.txt"
            } else {
                "d0/data.txt"
            };
            std::fs::remove_file(root.join("link")).expect("unlink");
            std::os::unix::fs::symlink(next, root.join("link")).expect("link");
            ("link text", true)
        }
        3 => {
            let mut content = std::fs::read(root.join("target/out.o")).expect("read");
            content.push(1);
            std::fs::write(root.join("target/out.o"), content).expect("write");
            ("the content behind a link into an ignored directory", true)
        }
        4 => {
            let renamed = root.join(OsStr::from_bytes(b"caf\xe8.txt"));
            std::fs::rename(&latin, renamed).expect("rename");
            ("name bytes", true)
        }
        5 => {
            let mut content = std::fs::read(&latin).expect("read");
            content.push(2);
            std::fs::write(&latin, content).expect("write");
            ("content of a file with a non-UTF-8 name", true)
        }
        6 => {
            std::fs::remove_dir(root.join("empty")).expect("rmdir");
            ("an empty directory removed", true)
        }
        7 => {
            let name = format!("d0/new-empty-{}", rng.random::<u32>());
            std::fs::create_dir(root.join(name)).expect("mkdir");
            ("an empty directory added", true)
        }
        8 => {
            let mut content = std::fs::read(root.join("Cargo.lock")).expect("read");
            content.push(3);
            std::fs::write(root.join("Cargo.lock"), content).expect("write");
            ("an ignored lock file", true)
        }
        9 => {
            let path = root.join("d0");
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o7777;
            let next = if mode == 0o700 { 0o755 } else { 0o700 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(next)).expect("mode");
            ("a directory's mode", true)
        }
        10 => {
            nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
            ("a FIFO added", true)
        }
        // Changes no check can see: ignored build output nothing links to, and a file
        // written again with the same content.
        11 => {
            std::fs::write(root.join("target/other.o"), bytes(rng)).expect("write");
            ("ignored output", false)
        }
        _ => {
            let content = std::fs::read(root.join("d0/data.txt")).expect("read");
            std::fs::write(root.join("d0/data.txt"), content).expect("write");
            ("the same content written again", false)
        }
    }
}

const KINDS: usize = 13;

fn measure(root: &Path) -> SourceScope {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(scope::measure(root, &CaptureRules::default()))
        .expect("measure")
}

#[test]
fn every_change_a_check_could_see_changes_the_source_digest() {
    let seed = seed();
    println!("CAIRN_SCOPE_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for tree in 0..TREES {
        let root = scratch(seed, tree);
        build(&root, &mut rng);
        for _ in 0..CHANGES_PER_TREE {
            let before = measure(&root);
            let kind = rng.random_range(0..KINDS);
            // A change whose precondition a previous change removed is skipped.
            let (what, visible) =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut inner = StdRng::seed_from_u64(rng.random());
                    change(&root, kind, &mut inner)
                })) {
                    Ok(done) => done,
                    Err(_) => continue,
                };
            let after = measure(&root);
            assert_eq!(
                after.source_digest != before.source_digest,
                visible,
                "seed {seed}, tree {tree}: {what}"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}

#[test]
fn a_link_out_of_the_tree_is_named_and_never_followed() {
    let root = scratch(0, 0);
    std::fs::write(root.join("a.txt"), "a").expect("write");
    assert_eq!(measure(&root).escaping_link, None);
    std::fs::create_dir_all(root.join("a")).expect("dir");
    std::os::unix::fs::symlink("..", root.join("a/r")).expect("link");
    std::os::unix::fs::symlink("r/../../etc/passwd", root.join("a/p")).expect("link");
    assert_eq!(measure(&root).escaping_link.as_deref(), Some("a/p"));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_fifo_in_the_tree_never_blocks_the_walk() {
    let root = scratch(0, 1);
    nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
    std::os::unix::fs::symlink("pipe", root.join("to-pipe")).expect("link");
    let (done, finished) = std::sync::mpsc::channel();
    let path = root.clone();
    std::thread::spawn(move || {
        let _ = done.send(measure(&path));
    });
    let measured = finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the walk finished without opening the FIFO");
    assert_eq!(measured.files, 2);
    let _ = std::fs::remove_dir_all(&root);
}
