//! A step's output as the worker keeps it: each stream's bounded file (made at its
//! first byte), its digest and its tail for the receipt, and the same bytes live to the
//! artifact store.

use crate::live_output::{self, Uploader};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// What one output stream keeps.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Bytes of the artifact file, at most.
    pub max: u64,
    /// Bytes of the tail kept with the receipt.
    pub tail: usize,
    /// Redact secrets from the file and the tail.
    pub redact: bool,
}

/// Streams one output pipe to its artifact file (up to `max` bytes, secrets redacted)
/// and, for a run's step, the same bytes live to the artifact store; keeps a digest of
/// the file and the last `tail` bytes stored, as text ([`cairn_common::output::escape`]).
pub async fn capture<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    path: PathBuf,
    bounds: Bounds,
    live: Option<Uploader>,
    drained: CancellationToken,
) -> Result<(Vec<u8>, String, bool), std::io::Error> {
    let Some(mut pipe) = pipe else {
        if let Some(live) = live {
            live.finish().await;
        }
        return Ok((Sha256::new().finalize().to_vec(), String::new(), false));
    };
    let mut sink = Sink {
        path,
        file: None,
        bounds,
        digest: Sha256::new(),
        written: 0,
        truncated: false,
        last: Vec::new(),
        live,
    };
    let mut redactor = bounds
        .redact
        .then(cairn_snapshot::secrets::Redactor::default);
    let mut buf = vec![0u8; 64 * 1024];
    let mut tick = tokio::time::interval(live_output::FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let n = tokio::select! {
            n = pipe.read(&mut buf) => n?,
            _ = drained.cancelled() => 0,
            _ = tick.tick() => {
                if let Some(live) = sink.live.as_mut() {
                    live.flush();
                }
                continue;
            }
        };
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        match redactor.as_mut() {
            Some(redactor) => sink.write(&redactor.push(chunk)).await?,
            None => sink.write(chunk).await?,
        }
    }
    if let Some(redactor) = redactor {
        sink.write(&redactor.finish()).await?;
    }
    match sink.file.as_mut() {
        Some(file) => file.flush().await?,
        // Nothing printed: no file, not even one an earlier command left at this path.
        None => match tokio::fs::remove_file(&sink.path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        },
    }
    if let Some(live) = sink.live.take() {
        live.finish().await;
    }
    let mut last = sink.last;
    if last.len() > bounds.tail {
        last.drain(..last.len() - bounds.tail);
    }
    Ok((
        sink.digest.finalize().to_vec(),
        cairn_common::output::escape(&last),
        sink.truncated,
    ))
}

/// Where stored output goes: the bounded artifact file and the tail.
struct Sink {
    path: PathBuf,
    /// Made at the first byte kept: a stream that printed nothing leaves no file (and
    /// costs the filesystem no inode).
    file: Option<tokio::fs::File>,
    bounds: Bounds,
    digest: Sha256,
    written: u64,
    truncated: bool,
    last: Vec<u8>,
    live: Option<Uploader>,
}

impl Sink {
    async fn write(&mut self, bytes: &[u8]) -> Result<(), std::io::Error> {
        let room =
            usize::try_from(self.bounds.max.saturating_sub(self.written)).unwrap_or(usize::MAX);
        let kept = &bytes[..bytes.len().min(room)];
        if kept.len() < bytes.len() {
            self.truncated = true;
        }
        if !kept.is_empty() {
            if let Some(live) = self.live.as_mut() {
                live.push(kept);
            }
            let file = match &mut self.file {
                Some(file) => file,
                None => {
                    if let Some(parent) = self.path.parent() {
                        tokio::fs::create_dir_all(parent).await?;
                    }
                    self.file.insert(tokio::fs::File::create(&self.path).await?)
                }
            };
            file.write_all(kept).await?;
            self.digest.update(kept);
            self.written += kept.len() as u64;
        }
        // The tail follows the whole stream, even past the artifact bound.
        self.last.extend_from_slice(bytes);
        if self.last.len() > self.bounds.tail * 2 {
            self.last.drain(..self.last.len() - self.bounds.tail);
        }
        Ok(())
    }
}

/// The file of one stream under an output base: the stream's name is appended, so the
/// base's `.epoch-N` stays in it (each epoch's output is its own file).
pub fn stream_path(base: &Path, stream: &str) -> PathBuf {
    let mut path = base.as_os_str().to_owned();
    path.push(".");
    path.push(stream);
    PathBuf::from(path)
}

/// Where a step's full output lives.
pub fn output_base(
    artifacts: &Path,
    request_id: uuid::Uuid,
    step_key: &str,
    epoch: i64,
) -> PathBuf {
    artifacts
        .join("outputs")
        .join(request_id.simple().to_string())
        .join(format!("{step_key}.epoch-{epoch}"))
}

/// The step's two streams, read into their files (and to live followers) as it prints.
pub struct Output {
    pub stdout_path: PathBuf,
    out: tokio::task::JoinHandle<Result<Captured, std::io::Error>>,
    err: tokio::task::JoinHandle<Result<Captured, std::io::Error>>,
    /// Cancelled when leftovers keep a pipe open past the grace: what was read is kept.
    drained: CancellationToken,
}

/// A stream's digest, tail and whether it was cut at the bound.
type Captured = (Vec<u8>, String, bool);

pub type Pipe = Option<tokio::net::unix::pipe::Receiver>;

impl Output {
    /// Starts reading both pipes into the files at `output_base`, within `bounds`, and
    /// to `live` followers.
    pub fn start(
        output_base: &Path,
        bounds: Bounds,
        live: Option<&live_output::LiveOutput>,
        stdout: Pipe,
        stderr: Pipe,
    ) -> Output {
        let stdout_path = stream_path(output_base, "stdout");
        let stderr_path = stream_path(output_base, "stderr");
        let drained = CancellationToken::new();
        let uploader = |stream| live.map(|l| Uploader::start(l, stream));
        let out = tokio::spawn(capture(
            stdout,
            stdout_path.clone(),
            bounds,
            uploader("stdout"),
            drained.clone(),
        ));
        let err = tokio::spawn(capture(
            stderr,
            stderr_path,
            bounds,
            uploader("stderr"),
            drained.clone(),
        ));
        Output {
            stdout_path,
            out,
            err,
            drained,
        }
    }

    /// Waits for both streams: they close when the last process holding them ends, so
    /// what is left is read for at most `grace`. Returns the digest of both, their
    /// tails and whether either was cut.
    pub async fn finish(
        &mut self,
        grace: std::time::Duration,
        pid: i32,
    ) -> Result<(String, (String, String), bool), std::io::Error> {
        let joined = |r: Result<_, tokio::task::JoinError>| r.map_err(std::io::Error::other);
        let drain_deadline = tokio::time::sleep(grace);
        tokio::pin!(drain_deadline);
        let both = async { ((&mut self.out).await, (&mut self.err).await) };
        tokio::pin!(both);
        let (out, err) = tokio::select! {
            joined = &mut both => joined,
            _ = &mut drain_deadline => {
                tracing::warn!(pid, "a process the step left holds its output open: output read so far is kept");
                self.drained.cancel();
                both.await
            }
        };
        let (out_digest, stdout_tail, out_truncated) = joined(out)??;
        let (err_digest, stderr_tail, err_truncated) = joined(err)??;
        let mut digest = Sha256::new();
        digest.update(out_digest);
        digest.update(err_digest);
        let digest = hex::encode(digest.finalize());
        Ok((
            digest,
            (stdout_tail, stderr_tail),
            out_truncated || err_truncated,
        ))
    }
}
