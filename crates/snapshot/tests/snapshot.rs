//! The snapshot engine against a real local artifact store.

use cairn_snapshot::Repository;
use cairn_snapshot::{
    self as snapshot, CaptureRules, CaptureStats, Entry, EntryKind, Manifest, SnapshotError,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn scratch(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cairn-snap-{label}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("scratch");
    dir
}

fn write(root: &Path, path: &str, bytes: &[u8]) {
    let full = root.join(path);
    std::fs::create_dir_all(full.parent().expect("parent")).expect("dirs");
    std::fs::write(full, bytes).expect("write");
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state & 0xff) as u8
        })
        .collect()
}

fn tree(root: &Path) {
    write(root, "src/main.rs", b"fn main() { println!(\"hi\"); }\n");
    write(root, "data/blob.bin", &pseudo_random(700_000, 7));
    write(root, "README.md", &b"text ".repeat(50_000));
    std::os::unix::fs::symlink("src/main.rs", root.join("entry")).expect("symlink");
    std::fs::set_permissions(
        root.join("src/main.rs"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    // Never captured: credentials and an unrelated nested repository.
    write(root, ".git-credentials", b"https://user:token@example.com");
    write(root, ".env", b"SECRET=1");
    write(root, ".env.production", b"SECRET=2");
    write(root, ".netrc", b"machine example.com password x");
    write(root, ".ssh/id_ed25519", b"PRIVATE");
    write(root, "deploy/server.pem", b"-----BEGIN PRIVATE KEY-----");
    write(root, "vendor/other/.git/HEAD", b"ref: refs/heads/main");
    write(root, "vendor/other/lib.rs", b"pub fn other() {}");
    write(root, "custom.secret", b"configured pattern");
}

fn rules() -> CaptureRules {
    CaptureRules {
        extra_patterns: vec!["*.secret".into()],
    }
}

/// The local store in `dir`; opened again, by another process say, it is the same store.
fn open(dir: &Path) -> Repository {
    Repository::open(dir.to_str().expect("utf8")).expect("store")
}

/// Captures `src` as a new snapshot; with `previous` as the stat index, files unchanged
/// since it are not read again.
async fn capture(
    store: &Repository,
    src: &Path,
    previous: Option<&Manifest>,
) -> (Manifest, CaptureStats) {
    let previous = previous.map(|m| Arc::new(m.clone()));
    snapshot::capture(store, src, &rules(), previous, uuid::Uuid::new_v4())
        .await
        .expect("capture")
}

/// Restores `manifest` into a fresh directory; returns the restored tree.
async fn restored(store: &Repository, manifest: &Manifest) -> PathBuf {
    let tree = scratch("out").join("tree");
    snapshot::restore(store, manifest, &tree)
        .await
        .expect("restore");
    tree
}

/// Restores `manifest` into `out`, which must fail as an integrity error (`what` names
/// the fault); returns the error's message.
async fn integrity_failure(
    store: &Repository,
    manifest: &Manifest,
    out: &Path,
    what: &str,
) -> String {
    match snapshot::restore(store, manifest, out).await {
        Err(SnapshotError::Integrity(message)) => message,
        other => panic!("{what} must be an integrity failure, got {other:?}"),
    }
}

#[tokio::test]
async fn capture_and_restore_round_trip_without_credentials() {
    let (src, out, store_dir) = (scratch("src"), scratch("out"), scratch("store"));
    tree(&src);
    let store = open(&store_dir);
    let id = uuid::Uuid::new_v4();
    let (manifest, stats) = snapshot::capture(&store, &src, &rules(), None, id)
        .await
        .expect("capture");
    let paths: Vec<&str> = manifest.paths().collect();
    for secret in [
        ".git-credentials",
        ".env",
        ".env.production",
        ".netrc",
        ".ssh",
        ".ssh/id_ed25519",
        "deploy/server.pem",
        "vendor/other",
        "vendor/other/lib.rs",
        "custom.secret",
    ] {
        assert!(
            !paths.contains(&secret),
            "{secret} must never be captured: {paths:?}"
        );
    }
    assert!(
        paths.contains(&"vendor"),
        "the parent of a nested repository is still captured"
    );
    assert!(stats.chunks_new > 0);

    let loaded = snapshot::load_manifest(&store, id).await.expect("manifest");
    assert_eq!(loaded, manifest);
    let restored = snapshot::restore(&store, &loaded, &out.join("tree"))
        .await
        .expect("restore");
    assert_eq!(restored.files, 3);
    let tree_out = out.join("tree");
    assert_eq!(
        std::fs::read(tree_out.join("data/blob.bin")).expect("blob"),
        pseudo_random(700_000, 7)
    );
    assert_eq!(
        std::fs::read_link(tree_out.join("entry")).expect("link"),
        PathBuf::from("src/main.rs")
    );
    let mode = std::fs::metadata(tree_out.join("src/main.rs"))
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o755);
    assert!(!tree_out.join(".env").exists());
}

#[tokio::test]
async fn an_empty_trees_capture_writes_nothing_and_restores_empty() {
    let (src, out, store_dir) = (scratch("src"), scratch("out"), scratch("store"));
    std::fs::create_dir_all(&src).expect("empty tree");
    let store = open(&store_dir);
    fn objects(dir: &Path) -> usize {
        let entries = std::fs::read_dir(dir)
            .expect("store")
            .filter_map(Result::ok);
        let count = |e: std::fs::DirEntry| match e.file_type().expect("type").is_dir() {
            true => objects(&e.path()),
            false => 1,
        };
        entries.map(count).sum()
    }
    let before = objects(&store_dir);
    let id = uuid::Uuid::new_v4();
    let (manifest, _) = snapshot::capture(&store, &src, &rules(), None, id)
        .await
        .expect("capture");
    assert!(manifest.is_empty());
    assert_eq!(objects(&store_dir), before, "nothing was stored");
    let key = snapshot::recorded_key(id, &manifest);
    assert_eq!(key, snapshot::EMPTY_MANIFEST_KEY);
    let loaded = snapshot::load_recorded(&store, id, Some(&key)).await;
    assert_eq!(loaded.expect("made"), manifest);
    let restored = snapshot::restore(&store, &manifest, &out.join("tree"))
        .await
        .expect("restore");
    assert_eq!(restored.files, 0);
    assert_eq!(
        std::fs::read_dir(out.join("tree")).expect("tree").count(),
        0
    );

    // A tree of one empty directory is not empty: its manifest is stored.
    std::fs::create_dir(src.join("dir")).expect("dir");
    let id = uuid::Uuid::new_v4();
    let (manifest, _) = snapshot::capture(&store, &src, &rules(), None, id)
        .await
        .expect("capture");
    let key = snapshot::recorded_key(id, &manifest);
    assert_eq!(key, snapshot::manifest_key(id));
    let loaded = snapshot::load_recorded(&store, id, Some(&key)).await;
    assert_eq!(loaded.expect("stored"), manifest);
}

#[tokio::test]
async fn chunks_are_shared_and_unchanged_files_are_not_read_again() {
    let (src, store_dir) = (scratch("src"), scratch("store"));
    tree(&src);
    let store = open(&store_dir);
    let (first, _) = capture(&store, &src, None).await;
    // Change one file: only its chunks are new, every other file is skipped by stat.
    let changed = b"fn main() { println!(\"changed\"); }\n";
    write(&src, "src/main.rs", changed);
    let (second, stats) = capture(&store, &src, Some(&first)).await;
    assert_eq!(stats.files, 3);
    assert_eq!(stats.files_unchanged, 2);
    assert_eq!(stats.chunks_new, 1);
    let shared = first.chunk_ids().intersection(&second.chunk_ids()).count();
    assert!(shared >= 2, "unchanged files share their chunks");
    // A third capture of the same tree without a stat index, by another process (a
    // store opened afresh reads the pack indexes), still stores nothing new.
    let elsewhere = open(&store_dir);
    let (third, again) = capture(&elsewhere, &src, None).await;
    assert_eq!(
        (again.chunks_new, again.packs_new),
        (0, 0),
        "content-addressed chunks are stored once per store"
    );
    // Restored from packs another capture wrote.
    let tree = restored(&elsewhere, &third).await;
    assert_eq!(
        std::fs::read(tree.join("src/main.rs")).expect("read"),
        changed
    );
}

/// A changed or new file whose content an earlier capture stored is not stored again:
/// its chunk is found in the store's catalog, with a place in the new manifest's packs.
#[tokio::test]
async fn a_changed_file_with_content_already_stored_adds_no_chunk() {
    let (src, store_dir) = (scratch("src"), scratch("store"));
    tree(&src);
    let store = open(&store_dir);
    let (first, _) = capture(&store, &src, None).await;
    let readme = std::fs::read(src.join("README.md")).expect("read");
    write(&src, "src/main.rs", &readme);
    write(&src, "docs/copy.md", &readme);
    let (second, stats) = capture(&store, &src, Some(&first)).await;
    assert_eq!((stats.chunks_new, stats.packs_new), (0, 0));
    assert_eq!(stats.files - stats.files_unchanged, 2, "both were read");
    assert!(second.chunk_ids().is_subset(&first.chunk_ids()));
    let tree = restored(&store, &second).await;
    for path in ["src/main.rs", "docs/copy.md", "README.md"] {
        assert_eq!(std::fs::read(tree.join(path)).expect("read"), readme);
    }
}

/// Copies every file under `from` into `to`, at the same relative paths.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir_all(&target).expect("dir");
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A store may hold one chunk in two packs (two lineages stored it at once), and its
/// catalog knows either. A changed file with that content keeps to the pack the
/// previous manifest holds it in: the new manifest names no other pack. Six stores,
/// since the catalog's pick goes either way.
#[tokio::test]
async fn a_chunk_held_in_two_packs_keeps_the_previous_manifests_pack() {
    for _ in 0..6 {
        let (src, elsewhere, store_dir, other_dir) = (
            scratch("src"),
            scratch("other-src"),
            scratch("store"),
            scratch("other-store"),
        );
        write(&src, "a.txt", b"shared content");
        write(&src, "b.txt", b"its own content");
        let (first, _) = capture(&open(&store_dir), &src, None).await;
        // The same chunk, stored by a capture that did not see the first one's pack.
        write(&elsewhere, "c.txt", b"shared content");
        capture(&open(&other_dir), &elsewhere, None).await;
        copy_tree(&other_dir.join("packs"), &store_dir.join("packs"));
        copy_tree(&other_dir.join("index"), &store_dir.join("index"));
        write(&src, "b.txt", b"shared content");
        let (second, stats) = capture(&open(&store_dir), &src, Some(&first)).await;
        assert_eq!(stats.chunks_new, 0);
        assert_eq!(
            second.packs, first.packs,
            "no pack named beyond the first's"
        );
    }
}

/// A manifest need not list a file's directories: the restore makes them.
#[tokio::test]
async fn a_restore_makes_the_directories_a_manifest_leaves_implicit() {
    let (src, store_dir) = (scratch("src"), scratch("store"));
    write(&src, "deep/er/file.txt", b"content");
    let store = open(&store_dir);
    let (mut manifest, _) = capture(&store, &src, None).await;
    manifest.entries.retain(|e| e.kind != EntryKind::Dir);
    assert_eq!(manifest.entries.len(), 1);
    let tree = restored(&store, &manifest).await;
    assert_eq!(
        std::fs::read(tree.join("deep/er/file.txt")).expect("read"),
        b"content"
    );
}

/// An in-place rewrite that keeps the size, the mtime and the inode (`cp -p`, `touch -r`,
/// `rsync --inplace -t`) still moves the change time: the next capture reads the file.
#[tokio::test]
async fn an_in_place_rewrite_that_keeps_size_mtime_and_inode_is_captured() {
    use std::io::{Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let (src, store_dir) = (scratch("src"), scratch("store"));
    write(&src, "a.txt", b"before");
    write(&src, "b.txt", b"unchanged");
    let store = open(&store_dir);
    let (first, _) = capture(&store, &src, None).await;
    let path = src.join("a.txt");
    let before = std::fs::metadata(&path).expect("meta");
    // The change time has a clock tick's resolution: make sure one passes.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    file.rewind().expect("rewind");
    file.write_all(b"AFTER!").expect("rewrite");
    file.set_modified(before.modified().expect("mtime"))
        .expect("mtime back");
    drop(file);
    let after = std::fs::metadata(&path).expect("meta");
    assert_eq!(
        (after.len(), after.mtime(), after.mtime_nsec(), after.ino()),
        (
            before.len(),
            before.mtime(),
            before.mtime_nsec(),
            before.ino()
        ),
        "size, mtime and inode are those the stat index saw"
    );
    let (second, stats) = capture(&store, &src, Some(&first)).await;
    assert_eq!(
        (stats.files, stats.files_unchanged),
        (2, 1),
        "a.txt read again"
    );
    let tree = restored(&store, &second).await;
    assert_eq!(std::fs::read(tree.join("a.txt")).expect("read"), b"AFTER!");
}

/// What a capture leaves out is reported (counts and paths, never content), and a tree
/// restored with its own stat index is unchanged from its snapshot: its next capture
/// would read nothing.
#[tokio::test]
async fn skipped_entries_are_reported_and_a_restored_tree_is_unchanged_from_its_snapshot() {
    let (src, store_dir, out) = (scratch("src"), scratch("store"), scratch("out"));
    tree(&src);
    nix::unistd::mkfifo(&src.join("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
    let store = open(&store_dir);
    let scanned = snapshot::scan(&src, &rules()).await.expect("scan");
    let skipped = scanned.skipped.clone();
    assert_eq!(
        (
            skipped.credentials,
            skipped.excluded,
            skipped.nested_repositories,
            skipped.special_files
        ),
        (6, 1, 1, 1),
        "{skipped:?}"
    );
    for path in [".env", ".ssh", "custom.secret", "vendor/other", "pipe"] {
        assert!(skipped.paths.contains(&path.to_string()), "{skipped:?}");
    }
    let id = uuid::Uuid::new_v4();
    let (manifest, _) = snapshot::capture_scanned(&store, &src, scanned, None, id)
        .await
        .expect("capture");
    let index = snapshot::restore_indexed(&store, &manifest, &out.join("tree"), &rules())
        .await
        .expect("restore");
    let restored = snapshot::scan(&out.join("tree"), &rules())
        .await
        .expect("scan");
    assert!(
        restored.unchanged_from(&index),
        "nothing changed since the restore"
    );
    assert!(
        !restored.unchanged_from(&manifest),
        "the capture's own stats name other inodes"
    );
    write(&out.join("tree"), "src/new.rs", b"new");
    let changed = snapshot::scan(&out.join("tree"), &rules())
        .await
        .expect("scan");
    assert!(!changed.unchanged_from(&index), "a new file is a change");
    let (_, stats) = snapshot::capture_scanned(
        &store,
        &out.join("tree"),
        changed,
        Some(Arc::new(index)),
        uuid::Uuid::new_v4(),
    )
    .await
    .expect("capture");
    assert_eq!(
        stats.files - stats.files_unchanged,
        1,
        "only the new file is read after a restore"
    );
}

#[tokio::test]
async fn a_pack_whose_index_is_gone_is_never_referenced_again() {
    let (src, store_dir) = (scratch("src"), scratch("store"));
    tree(&src);
    let store = open(&store_dir);
    let (first, _) = capture(&store, &src, None).await;
    // The reaper reclaims a pack index first, then the pack.
    for pack in &first.packs {
        store
            .store()
            .delete(&snapshot::index_key(*pack))
            .await
            .expect("index");
        store
            .store()
            .delete(&snapshot::pack_key(*pack))
            .await
            .expect("pack");
    }
    // The reclaimed snapshot's bytes are gone: an integrity failure, not a retryable miss.
    let out = scratch("out").join("tree");
    let message = integrity_failure(&store, &first, &out, "a missing pack").await;
    assert!(message.contains("missing"), "{message}");
    // The same process captures again, even with the reclaimed manifest as its stat
    // index: its catalog forgets the reclaimed packs and unchanged files are read again,
    // so the chunks are stored anew and the snapshot restores.
    let (second, stats) = capture(&store, &src, Some(&first)).await;
    assert_eq!(
        stats.files_unchanged, 0,
        "nothing reused from reclaimed packs"
    );
    assert!(stats.chunks_new > 0);
    assert!(second.packs.iter().all(|p| !first.packs.contains(p)));
    restored(&store, &second).await;
}

#[tokio::test]
async fn a_corrupted_chunk_fails_the_restore_as_an_integrity_error() {
    let (src, out, store_dir) = (scratch("src"), scratch("out"), scratch("store"));
    tree(&src);
    let store = open(&store_dir);
    let (manifest, _) = capture(&store, &src, None).await;
    let victim = manifest
        .entries
        .iter()
        .find(|e| e.path == "data/blob.bin")
        .expect("blob")
        .chunks[0];
    // Overwrite the chunk's bytes inside its pack with a valid zstd frame of other bytes.
    let key = snapshot::pack_key(manifest.packs[victim.pack as usize]);
    let mut pack = store.store().get(&key).await.expect("pack").to_vec();
    let forged = zstd::encode_all(&b"not the original bytes"[..], 1).expect("zstd");
    let start = victim.offset as usize;
    pack[start..start + forged.len()].copy_from_slice(&forged);
    store
        .store()
        .put(&key, bytes::Bytes::from(pack))
        .await
        .expect("overwrite");
    let message = integrity_failure(&store, &manifest, &out.join("tree"), "a forged chunk").await;
    assert!(message.contains(&victim.id.to_hex()), "{message}");
}

#[tokio::test]
async fn entries_escaping_the_root_are_refused_before_anything_is_written() {
    let store = open(&scratch("store"));
    let entry = |path: &str, kind: EntryKind, target: Option<&str>| Entry {
        path: path.into(),
        kind,
        mode: 0o644,
        size: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        inode: 0,
        chunks: vec![],
        target: target.map(String::from),
    };
    let cases = vec![
        vec![entry("../escape", EntryKind::File, None)],
        vec![entry("/etc/passwd", EntryKind::File, None)],
        vec![entry("a/../../b", EntryKind::File, None)],
        vec![
            entry("link", EntryKind::Symlink, Some("/etc")),
            entry("link/passwd", EntryKind::File, None),
        ],
        vec![entry("link", EntryKind::Symlink, Some("../../outside"))],
        vec![entry("dir/link", EntryKind::Symlink, Some("../.."))],
        // Each link alone stays inside lexically; followed through the tree being
        // written, the chain climbs out of it.
        vec![
            entry("a", EntryKind::Dir, None),
            entry("a/r", EntryKind::Symlink, Some("..")),
            entry("a/p1", EntryKind::Symlink, Some("r/..")),
            entry("a/p2", EntryKind::Symlink, Some("p1/x")),
            entry("cfg", EntryKind::Symlink, Some("a/p2/ext/cfg")),
        ],
        // A loop never resolves.
        vec![
            entry("x", EntryKind::Symlink, Some("y")),
            entry("y", EntryKind::Symlink, Some("x/z")),
        ],
    ];
    for entries in cases {
        let out = scratch("out").join("tree");
        let manifest = Manifest {
            version: 2,
            packs: vec![],
            entries: entries.clone(),
        };
        match snapshot::restore(&store, &manifest, &out).await {
            Err(SnapshotError::UnsafeEntry(_)) => {}
            other => panic!("{entries:?} must be refused, got {other:?}"),
        }
        assert!(!out.exists(), "nothing written for a refused manifest");
    }
    // A chunk must lie in a pack the manifest lists: nothing is read from anywhere else.
    let out = scratch("out").join("tree");
    let mut sneaky = entry("file", EntryKind::File, None);
    sneaky.chunks = vec![snapshot::ChunkRef {
        id: snapshot::ChunkId::of(b"x"),
        pack: 3,
        offset: 0,
        length: 10,
    }];
    let manifest = Manifest {
        version: 2,
        packs: vec![uuid::Uuid::new_v4()],
        entries: vec![sneaky],
    };
    let message = integrity_failure(
        &store,
        &manifest,
        &out,
        "a chunk outside the manifest's packs",
    )
    .await;
    assert!(message.contains("names no pack"), "{message}");
    assert!(!out.exists(), "nothing written for a refused manifest");
    // Links that stay inside are fine.
    let out = scratch("out").join("tree");
    let ok = Manifest {
        version: 2,
        packs: vec![],
        entries: vec![
            entry("dir", EntryKind::Dir, None),
            entry("dir/up", EntryKind::Symlink, Some("../other")),
        ],
    };
    snapshot::restore(&store, &ok, &out)
        .await
        .expect("inside links restore");
}

#[tokio::test]
async fn small_files_chunked_in_memory_and_large_files_streamed_cut_the_same_chunks() {
    let root = scratch("sizes");
    let restored = scratch("sizes-restored");
    let store = open(&scratch("sizes-store"));
    // 9 MiB is streamed; its first 7 MiB, as a file of its own, is chunked in memory.
    let large = pseudo_random(9 * 1024 * 1024, 11);
    write(&root, "large.bin", &large);
    write(&root, "prefix.bin", &large[..7 * 1024 * 1024]);
    write(&root, "empty", b"");
    let (manifest, stats) = capture(&store, &root, None).await;
    // A pack filled mid-capture is synced by the pack syncer, the last by the flush.
    assert!(stats.packs_new >= 2, "{} packs", stats.packs_new);
    let chunks = |path: &str| -> Vec<snapshot::ChunkId> {
        manifest
            .entries
            .iter()
            .find(|e| e.path == path)
            .map(|e| e.chunks.iter().map(|c| c.id).collect())
            .expect("entry")
    };
    let (large_chunks, prefix_chunks) = (chunks("large.bin"), chunks("prefix.bin"));
    assert!(chunks("empty").is_empty());
    assert!(prefix_chunks.len() > 10);
    // Content-defined cuts: the shared prefix yields the same chunks, except the last
    // one of the shorter file, which ends where the file ends.
    let shared = prefix_chunks.len() - 1;
    assert_eq!(large_chunks[..shared], prefix_chunks[..shared]);
    std::fs::remove_dir_all(&restored).expect("clean target");
    snapshot::restore(&store, &manifest, &restored)
        .await
        .expect("restore");
    assert_eq!(
        std::fs::read(restored.join("large.bin")).expect("large"),
        large
    );
    assert_eq!(
        std::fs::read(restored.join("prefix.bin")).expect("prefix"),
        &large[..7 * 1024 * 1024]
    );
    assert_eq!(std::fs::read(restored.join("empty")).expect("empty"), b"");
}

/// The same engine over a store that is not a local directory (object_store's in-memory
/// backend): listing indexes, range reads of packs and puts all go through object_store.
#[tokio::test]
async fn a_remote_store_captures_deduplicates_and_restores_through_object_store() {
    let src = scratch("remote-src");
    tree(&src);
    let store = Repository::open("memory:///").expect("store");
    let (first, stats) = capture(&store, &src, None).await;
    assert!(stats.packs_new >= 1);
    let tree = restored(&store, &first).await;
    assert_eq!(
        std::fs::read(tree.join("data/blob.bin")).expect("blob"),
        pseudo_random(700_000, 7)
    );
    let (_, again) = capture(&store, &src, None).await;
    assert_eq!(again.chunks_new, 0, "stored once in a remote store too");
    // A pack cut short is an integrity failure, not a panic or a short file.
    let key = snapshot::pack_key(first.packs[0]);
    let pack = store.store().get(&key).await.expect("pack");
    store
        .store()
        .put(&key, pack.slice(..pack.len() / 2))
        .await
        .expect("truncate");
    let out = scratch("remote-out").join("tree");
    let message = integrity_failure(&store, &first, &out, "a truncated pack").await;
    assert!(message.contains("beyond the end"), "{message}");
}

/// Every byte the store holds, with every zstd frame in it decompressed: what a reader of
/// the store's packs, indexes and manifests could see.
fn store_plaintext(store_dir: &Path) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut pending = vec![store_dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("store dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).expect("store file");
            for start in 0..bytes.len().saturating_sub(4) {
                if bytes[start..start + 4] == [0x28, 0xb5, 0x2f, 0xfd] {
                    let mut decoder = match zstd::stream::read::Decoder::new(&bytes[start..]) {
                        Ok(decoder) => decoder.single_frame(),
                        Err(_) => continue,
                    };
                    let mut frame = Vec::new();
                    let _ = std::io::Read::read_to_end(&mut decoder, &mut frame);
                    seen.extend_from_slice(&frame);
                }
            }
            seen.extend_from_slice(&bytes);
        }
    }
    seen
}

/// A tree holding the credential files of cloud CLIs, registries, Kubernetes, databases
/// and `.env*` variants, a private key under an innocent name and a token in a note,
/// beside a control file: after a capture, every pack, index and manifest of the store is
/// decompressed and searched, and only the control file's marker is there. The snapshot
/// records what it left out.
#[tokio::test]
async fn no_planted_secret_reaches_the_store() {
    let (src, store_dir) = (scratch("secrets-src"), scratch("secrets-store"));
    let key = format!(
        "-----BEGIN OPENSSH {0}-----\nb3BlbnNzaC1rZXktdjE MARKER-deploy-key\n-----END OPENSSH {0}-----\n",
        "PRIVATE KEY"
    );
    let token = format!("token: {}_{} MARKER-note\n", "ghp", "x".repeat(36));
    let planted: [(&str, String); 9] = [
        (".aws/credentials", "aws_access_key_id = MARKER-aws".into()),
        (
            ".docker/config.json",
            "{\"auths\": \"MARKER-docker\"}".into(),
        ),
        (".kube/config", "token: MARKER-kube".into()),
        (".pgpass", "db:5432:*:u:MARKER-pgpass".into()),
        (".envrc", "export T=MARKER-envrc".into()),
        (".env-prod", "T=MARKER-env-prod".into()),
        ("keys/deploy_key", key),
        ("docs/notes.txt", token),
        (
            "big/dump.log",
            format!(
                "{}{}",
                "x".repeat(9 << 20),
                "\nAKIAZZZZZZZZZZZZZZZZ MARKER-big\n"
            ),
        ),
    ];
    for (path, content) in &planted {
        write(&src, path, content.as_bytes());
    }
    write(&src, "control.txt", b"MARKER-control");
    let store = open(&store_dir);
    let (manifest, stats) = capture(&store, &src, None).await;
    let plain = store_plaintext(&store_dir);
    let found = |marker: &str| plain.windows(marker.len()).any(|w| w == marker.as_bytes());
    assert!(found("MARKER-control"), "the control file was captured");
    for (path, content) in &planted {
        let marker = content
            .split_whitespace()
            .find_map(|w| w.find("MARKER-").map(|i| &w[i..]))
            .expect("a marker")
            .trim_end_matches(['"', '}']);
        assert!(!found(marker), "{path}: {marker} reached the store");
        assert!(
            !manifest.entries.iter().any(|e| e.path == *path),
            "{path} is in the manifest"
        );
    }
    let mut secrets = stats.secrets.clone();
    secrets.sort();
    assert_eq!(
        secrets,
        ["big/dump.log", "docs/notes.txt", "keys/deploy_key"]
    );
}

/// A checkpoint syncs only what it wrote: every file it names (a key it did not write
/// is an error, so nothing is skipped silently) and the directories a put created.
#[tokio::test]
async fn flushing_keys_syncs_each_named_object_and_refuses_one_not_written() {
    let dir = scratch("flush");
    let store = snapshot::store::ArtifactStore::open(dir.to_str().expect("utf8")).expect("store");
    let keys = vec!["packs/ab/new".to_string(), "index/new".to_string()];
    for key in &keys {
        store
            .put(key, bytes::Bytes::from_static(b"x"))
            .await
            .expect("put");
    }
    store
        .flush_keys(keys)
        .await
        .expect("flush what was written");
    store
        .flush_keys(Vec::new())
        .await
        .expect("nothing to flush");
    let missing = store
        .flush_keys(vec!["packs/cd/never-written".into()])
        .await;
    assert!(
        missing.is_err(),
        "a key that was never written must not pass as durable"
    );
    store
        .sync_object_blocking("packs/ab/new")
        .expect("sync one object");
    assert!(store
        .sync_object_blocking("packs/cd/never-written")
        .is_err());
    let _ = std::fs::remove_dir_all(dir);
}
