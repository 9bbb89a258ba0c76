//! `cairn-bench snapshot`: the snapshot engine beside tar + zstd and restic.

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn run_shell(script: &str, env: &[(&str, &str)]) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("`{script}` failed: {status}");
    }
    Ok(started.elapsed())
}

/// A generated tree: mostly source-like text, some incompressible binaries.
pub fn generate_tree(root: &std::path::Path, files: usize, size_mib: u64) -> anyhow::Result<()> {
    let total = size_mib * 1024 * 1024;
    let per_file = (total / files.max(1) as u64).max(1);
    let words: Vec<&str> = "fn let match impl struct pub use crate self async await return if else for while loop \
        value error result option some none string vector map config request worker lease epoch journal"
        .split_whitespace()
        .collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..files {
        let dir = root.join(format!("d{:03}/s{:02}", i % 250, (i / 250) % 20));
        std::fs::create_dir_all(&dir)?;
        let size = (per_file / 2 + next() % per_file.max(1)) as usize;
        let binary = i % 10 < 3;
        let mut data = Vec::with_capacity(size);
        if binary {
            while data.len() < size {
                data.extend_from_slice(&next().to_le_bytes());
            }
        } else {
            while data.len() < size {
                data.extend_from_slice(words[(next() % words.len() as u64) as usize].as_bytes());
                data.push(if next() % 12 == 0 { b'\n' } else { b' ' });
            }
        }
        data.truncate(size);
        std::fs::write(
            dir.join(format!("f{i}.{}", if binary { "bin" } else { "rs" })),
            &data,
        )?;
    }
    Ok(())
}

pub fn change_one_percent(root: &std::path::Path) -> anyhow::Result<usize> {
    let mut changed = 0;
    for (i, entry) in walkdir_files(root)?.into_iter().enumerate() {
        if i % 100 == 0 {
            let mut bytes = std::fs::read(&entry)?;
            bytes.extend_from_slice(b"\n// changed\n");
            std::fs::write(&entry, bytes)?;
            changed += 1;
        }
    }
    Ok(changed)
}

pub fn walkdir_files(root: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.path());
        for entry in entries {
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    Ok(out)
}

fn line(label: &str, took: Duration, bytes: u64) {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    println!(
        "{label:>42}: {:>7.2} s  ({:.0} MiB/s)",
        took.as_secs_f64(),
        mib / took.as_secs_f64().max(1e-9)
    );
}

/// CPU seconds, user and system, of this process (every thread) and of the children
/// it reaped, from `/proc/self/stat`: what a phase cost beside its wall time.
struct CpuClock {
    seconds_per_tick: f64,
}

impl CpuClock {
    fn new() -> anyhow::Result<CpuClock> {
        Ok(CpuClock {
            seconds_per_tick: 1.0 / crate::meter::clock_ticks()?,
        })
    }

    /// This process's own CPU seconds so far, and its reaped children's.
    fn read(&self) -> anyhow::Result<(f64, f64)> {
        let (own, reaped) = crate::meter::process_ticks(std::process::id())?;
        Ok((
            own as f64 * self.seconds_per_tick,
            reaped as f64 * self.seconds_per_tick,
        ))
    }

    /// The CPU seconds used since `before`: this process's (`children` false) or the
    /// processes it started and reaped.
    fn used(&self, before: (f64, f64), children: bool) -> anyhow::Result<f64> {
        let now = self.read()?;
        Ok(if children {
            now.1 - before.1
        } else {
            now.0 - before.0
        })
    }
}

/// The CPU line under a figure; `doing` names the part it covers, if not all of it.
fn cpu_line(seconds: f64, doing: &str) {
    println!("{:>42}  {seconds:.2} s of CPU{doing}, user + system", "");
}

/// `tar | zstd -1` of the tree, made durable: the baseline of a full capture.
fn tar_zstd(
    src: &std::path::Path,
    work: &std::path::Path,
    bytes: u64,
    clock: &CpuClock,
) -> anyhow::Result<Duration> {
    let (s, w) = (src.display(), work.display());
    run_shell("sync", &[])?;
    let before = clock.read()?;
    let tar = run_shell(
        &format!("tar -C '{s}' -cf - . | zstd -q -1 -T0 -o '{w}/tree.tar.zst' && sync"),
        &[],
    )?;
    line("tar | zstd -1 -T0 (+ sync)", tar, bytes);
    cpu_line(clock.used(before, true)?, "");
    Ok(tar)
}

/// How many times faster Cairn was than its baseline, under Cairn's figure.
fn ratio(baseline_name: &str, baseline: Duration, cairn: Duration) {
    println!(
        "{:>42}  cairn is {:.2}x {baseline_name}",
        "",
        baseline.as_secs_f64() / cairn.as_secs_f64().max(1e-9)
    );
}

/// Whether restic is there to compare with.
fn restic_installed() -> bool {
    Command::new("restic")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The tree to measure (a copy of `tree`, else a generated one) in a scratch
/// directory, and its size in bytes.
fn prepare(
    tree: Option<PathBuf>,
    files: usize,
    size_mib: u64,
) -> anyhow::Result<(PathBuf, PathBuf, u64)> {
    let work = std::env::temp_dir().join(format!(
        "cairn-bench-snap-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&work)?;
    let src = work.join("tree");
    match &tree {
        Some(dir) => {
            // The directory itself, never a link to it: `cp -a` copies a link as a link,
            // and the 1 % change would then be made to the caller's own tree.
            let dir = dir
                .canonicalize()
                .with_context(|| format!("the tree {}", dir.display()))?;
            run_shell(
                &format!("cp -a '{}' '{}'", dir.display(), src.display()),
                &[],
            )?;
        }
        None => generate_tree(&src, files, size_mib)?,
    }
    let files_in_tree = walkdir_files(&src)?;
    let bytes: u64 = files_in_tree
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let count = files_in_tree.len();
    println!(
        "snapshot: {count} files, {:.0} MiB, {} cores; page cache warm for every tool",
        bytes as f64 / 1048576.0,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    Ok((work, src, bytes))
}

/// Restores of the full capture beside `zstd -d | tar -x` and, when installed, restic's.
async fn restores(
    store: &cairn_snapshot::Repository,
    full: &cairn_snapshot::Manifest,
    work: &std::path::Path,
    bytes: u64,
    restic_env: Option<&[(&str, &str); 2]>,
    clock: &CpuClock,
) -> anyhow::Result<()> {
    let w = work.display();
    // Restores are shown with and without the final sync: the sync (the disk writing a
    // 1 GiB tree back) varies several-fold from run to run on a shared disk.
    run_shell("sync", &[])?;
    let before = clock.read()?;
    let started = Instant::now();
    cairn_snapshot::restore(store, full, &work.join("restored")).await?;
    let restored = started.elapsed();
    let cpu_restoring = clock.used(before, false)?;
    let synced = run_shell("sync", &[])?;
    let (cairn_restoring, cairn_synced) = (restored, synced);
    line("cairn restore (verified, + sync)", restored + synced, bytes);
    println!(
        "{:>42}  {:.2} s restoring, {:.2} s sync",
        "",
        restored.as_secs_f64(),
        synced.as_secs_f64()
    );
    cpu_line(cpu_restoring, " restoring");
    std::fs::create_dir_all(work.join("untarred"))?;
    run_shell("sync", &[])?;
    let before = clock.read()?;
    let untarred = run_shell(
        &format!("zstd -q -d -c '{w}/tree.tar.zst' | tar -C '{w}/untarred' -xf -"),
        &[],
    )?;
    let cpu_untarring = clock.used(before, true)?;
    let synced = run_shell("sync", &[])?;
    line("zstd -d | tar -x (+ sync)", untarred + synced, bytes);
    println!(
        "{:>42}  {:.2} s extracting, {:.2} s sync",
        "",
        untarred.as_secs_f64(),
        synced.as_secs_f64()
    );
    cpu_line(cpu_untarring, " extracting");
    ratio(
        "zstd -d | tar -x, each with its sync",
        untarred + synced,
        cairn_restoring + cairn_synced,
    );
    ratio(
        "zstd -d | tar -x, without the syncs",
        untarred,
        cairn_restoring,
    );
    if let Some(restic_env) = restic_env {
        line(
            "restic restore (+ sync)",
            run_shell(
                &format!("restic restore -q latest --target '{w}/restic-out' && sync"),
                restic_env,
            )?,
            bytes,
        );
    } else {
        println!(
            "{:>42}  restic is not installed; its figures are skipped",
            ""
        );
    }
    Ok(())
}

/// A capture after 1 % of the files changed, against the full capture's manifest,
/// beside restic's incremental backup when restic is installed.
async fn incremental(
    store: &cairn_snapshot::Repository,
    src: &std::path::Path,
    full: &std::sync::Arc<cairn_snapshot::Manifest>,
    bytes: u64,
    restic_env: Option<&[(&str, &str); 2]>,
    clock: &CpuClock,
) -> anyhow::Result<()> {
    let changed = change_one_percent(src)?;
    run_shell("sync", &[])?;
    println!("{:>42}  changed {changed} files (1%)", "");
    let rules = cairn_snapshot::CaptureRules::default();
    let before = clock.read()?;
    let started = Instant::now();
    let (_, inc) =
        cairn_snapshot::capture(store, src, &rules, Some(full.clone()), uuid::Uuid::new_v4())
            .await?;
    let incremental = started.elapsed();
    line("cairn capture after 1% changed", incremental, bytes);
    cpu_line(clock.used(before, false)?, "");
    println!(
        "{:>42}  {} files re-read, {} new chunks",
        "",
        inc.files - inc.files_unchanged,
        inc.chunks_new
    );
    if let Some(restic_env) = restic_env {
        run_shell("sync", &[])?;
        let s = src.display();
        let took = run_shell(&format!("restic backup -q '{s}' && sync"), restic_env)?;
        line("restic incremental backup (+ sync)", took, bytes);
        println!(
            "{:>42}  cairn is {:.1}x faster",
            "",
            took.as_secs_f64() / incremental.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}

pub async fn run(tree: Option<PathBuf>, files: usize, size_mib: u64) -> anyhow::Result<()> {
    use cairn_snapshot::Repository;
    use cairn_snapshot::{self as snapshot, CaptureRules};
    let (work, src, bytes) = prepare(tree, files, size_mib)?;
    let s = src.display();
    let w = work.display();

    // Every figure includes making its output durable (sync), as a snapshot must be.
    let clock = CpuClock::new()?;
    let tar = tar_zstd(&src, &work, bytes, &clock)?;
    let store = Repository::open(&work.join("store").to_string_lossy())?;
    let rules = CaptureRules::default();
    run_shell("sync", &[])?;
    let before = clock.read()?;
    let started = Instant::now();
    let (full, stats) = snapshot::capture(&store, &src, &rules, None, uuid::Uuid::new_v4()).await?;
    // Shared with the next capture, as a worker shares its last manifest.
    let full = std::sync::Arc::new(full);
    let captured = started.elapsed();
    line("cairn full capture (durable: fsync)", captured, bytes);
    cpu_line(clock.used(before, false)?, "");
    ratio("tar | zstd -1 -T0", tar, captured);
    let stored = stats.bytes_uploaded as f64 / 1048576.0;
    let (chunks, packs) = (stats.chunks_new, stats.packs_new);
    println!(
        "{:>42}  {chunks} chunks in {packs} packs, {stored:.0} MiB stored",
        ""
    );

    let restic = restic_installed();
    let repo = format!("{w}/restic");
    let restic_env = [
        ("RESTIC_PASSWORD", "bench"),
        ("RESTIC_REPOSITORY", repo.as_str()),
    ];
    if restic {
        run_shell("restic init -q", &restic_env)?;
        line(
            "restic backup (+ sync)",
            run_shell(&format!("restic backup -q '{s}' && sync"), &restic_env)?,
            bytes,
        );
    }

    incremental(
        &store,
        &src,
        &full,
        bytes,
        restic.then_some(&restic_env),
        &clock,
    )
    .await?;
    restores(
        &store,
        &full,
        &work,
        bytes,
        restic.then_some(&restic_env),
        &clock,
    )
    .await?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
