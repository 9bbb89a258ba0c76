//! A step's output, as it is printed, in the artifact store: each stream is a sequence of
//! chunk objects under `outputs/<request>/<epoch>/<step index>/<stream>/<sequence>`, each
//! at most [`CHUNK_BYTES`] and uploaded at most [`FLUSH_EVERY`] after its first byte. So
//! a reader (the API's `…/output`, `cairnctl runs logs --follow`) sees a line within a
//! second of its printing, and what was uploaded stays readable when the worker dies.
//! The bytes are those of the stored artifact: bounded and, when configured, redacted.

use bytes::{Bytes, BytesMut};
use cairn_common::output::{live_chunk_key, live_stream_prefix};
use cairn_snapshot::store::ArtifactStore;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub const CHUNK_BYTES: usize = 64 * 1024;
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// Chunks waiting for upload before the writer keeps bytes back instead.
const QUEUED_CHUNKS: usize = 16;
/// How long the end of a step waits for its last chunks, all told.
const FINISH_WITHIN: Duration = Duration::from_secs(10);
/// How long one upload of a chunk may take.
const PUT_WITHIN: Duration = Duration::from_secs(10);

/// Where one step's streams go: its attempt, in the store (key layout:
/// [`cairn_common::output::live_stream_prefix`]).
#[derive(Clone, Debug)]
pub struct LiveOutput {
    pub store: ArtifactStore,
    pub request_id: uuid::Uuid,
    pub epoch: i64,
    pub step_index: usize,
}

/// Uploads one stream's chunks, in order, on its own task.
pub struct Uploader {
    pending: BytesMut,
    queue: Option<mpsc::Sender<Bytes>>,
    task: JoinHandle<()>,
}

impl Uploader {
    pub fn start(live: &LiveOutput, stream: &'static str) -> Uploader {
        let (queue, mut chunks) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
        let store = live.store.clone();
        let index = i64::try_from(live.step_index).unwrap_or(i64::MAX);
        let prefix = live_stream_prefix(live.request_id, live.epoch, index, stream);
        let task = tokio::spawn(async move {
            let mut sequence = 0u64;
            while let Some(chunk) = chunks.recv().await {
                let key = live_chunk_key(&prefix, sequence);
                sequence += 1;
                let mut tries = 0;
                // A store that fails for a moment loses nothing; one that keeps failing
                // (or hangs) leaves a gap a reader can see, never a stalled step.
                loop {
                    let put = tokio::time::timeout(PUT_WITHIN, store.put(&key, chunk.clone()));
                    let error = match put.await {
                        Ok(Ok(())) => break,
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => format!("no answer within {PUT_WITHIN:?}"),
                    };
                    tries += 1;
                    if tries == 3 {
                        tracing::warn!(error, key, "a chunk of live output could not be stored");
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
            }
        });
        Uploader {
            pending: BytesMut::new(),
            queue: Some(queue),
            task,
        }
    }

    /// Takes bytes as they are stored; full chunks leave at once.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        self.send(CHUNK_BYTES);
    }

    /// Sends what is pending (at each tick of [`FLUSH_EVERY`]).
    pub fn flush(&mut self) {
        self.send(1);
    }

    /// Queues pieces of at most [`CHUNK_BYTES`], while at least `least` bytes wait and
    /// the queue has room; with the queue full they wait for the next call.
    fn send(&mut self, least: usize) {
        let Some(queue) = &self.queue else {
            return;
        };
        while self.pending.len() >= least {
            let Ok(permit) = queue.try_reserve() else {
                return;
            };
            let n = self.pending.len().min(CHUNK_BYTES);
            permit.send(self.pending.split_to(n).freeze());
        }
    }

    /// Uploads the rest and waits for every chunk, all within [`FINISH_WITHIN`].
    pub async fn finish(mut self) {
        let queue = self.queue.take();
        let mut rest = std::mem::take(&mut self.pending);
        let task = &mut self.task;
        let everything = async move {
            if let Some(queue) = queue {
                while !rest.is_empty() {
                    let n = rest.len().min(CHUNK_BYTES);
                    if queue.send(rest.split_to(n).freeze()).await.is_err() {
                        break;
                    }
                }
            }
            // The queue is closed: the task ends once it stored what it holds.
            let _ = task.await;
        };
        if tokio::time::timeout(FINISH_WITHIN, everything)
            .await
            .is_err()
        {
            tracing::warn!("the last chunks of live output were not stored in time");
            self.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_arrive_in_order_bounded_and_complete() {
        let dir =
            std::env::temp_dir().join(format!("cairn-live-{}", uuid::Uuid::new_v4().simple()));
        let store = ArtifactStore::open(dir.to_str().expect("utf-8")).expect("store");
        let request_id = uuid::Uuid::new_v4();
        let live = LiveOutput {
            store: store.clone(),
            request_id,
            epoch: 1,
            step_index: 0,
        };
        let mut uploader = Uploader::start(&live, "stdout");
        let mut written = Vec::new();
        for i in 0..200u32 {
            let line = format!("line {i} {}\n", "x".repeat(1000));
            uploader.push(line.as_bytes());
            written.extend_from_slice(line.as_bytes());
            if i % 50 == 0 {
                uploader.flush();
            }
        }
        uploader.push(b"\0\xff no newline");
        written.extend_from_slice(b"\0\xff no newline");
        uploader.finish().await;
        let prefix = live_stream_prefix(request_id, 1, 0, "stdout");
        let mut keys = store.list(&prefix).await.expect("list");
        keys.sort();
        let mut read = Vec::new();
        for key in &keys {
            let chunk = store.get(key).await.expect("chunk");
            assert!(chunk.len() <= CHUNK_BYTES);
            read.extend_from_slice(&chunk);
        }
        assert_eq!(read, written);
        assert_eq!(keys.first(), Some(&format!("{prefix}0000000000")));
        let _ = std::fs::remove_dir_all(dir);
    }
}
