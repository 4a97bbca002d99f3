//! A file uploaded as it is written: a `std::io::Write` over object_store's `BufWriter` (a single
//! put for a small file, a multipart upload past one part), for the Parquet writer of a
//! compaction's outputs (`encode::StreamingFile`).
//!
//! Why: a compaction output grows to the table's target size (128 MiB by default), and encoded
//! into memory whole before it was put, it was most of what compaction added to the process's
//! RSS: 100-180 MiB while a 100M-row table streamed (docs/performance.md, "A 100M-row table",
//! sixth pass). Uploaded as it is written, an output holds the row group being encoded and at
//! most [`PART_BYTES`] × ([`PARTS_IN_FLIGHT`] + 1) of upload buffers.
//!
//! The Parquet writer is synchronous and runs on the blocking pool (encoding is CPU work the
//! runtime's workers should not do), so each write hands its bytes to the upload with
//! `Handle::block_on`, which a blocking-pool thread may call (a runtime worker may not: every
//! write of an [`Upload`] happens inside `writer::encode_blocking`). An upload dropped before
//! [`Upload::complete`] (the compaction failed or was dropped) is aborted in the background, so no
//! part of it becomes an object.

use std::io::Write;
use std::sync::Arc;

use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::io::AsyncWriteExt;
use tokio::runtime::Handle;

/// Bytes buffered before a part is uploaded (S3 needs parts of at least 5 MiB).
pub(crate) const PART_BYTES: usize = 8 * 1024 * 1024;
/// Parts uploaded at once.
const PARTS_IN_FLIGHT: usize = 2;

/// An object being written at `path`.
pub(crate) struct Upload {
    /// `None` once completed.
    out: Option<BufWriter>,
    runtime: Handle,
    written: u64,
}

impl Upload {
    /// An upload to `path` of `store`; call from within the runtime (its writes then come from
    /// the blocking pool).
    pub(crate) fn new(store: &Arc<dyn ObjectStore>, path: Path) -> std::io::Result<Upload> {
        let runtime = Handle::try_current().map_err(std::io::Error::other)?;
        let out = BufWriter::with_capacity(Arc::clone(store), path, PART_BYTES)
            .with_max_concurrency(PARTS_IN_FLIGHT);
        Ok(Upload {
            out: Some(out),
            runtime,
            written: 0,
        })
    }

    /// Uploads what is buffered and completes the object; its size in bytes.
    pub(crate) fn complete(mut self) -> std::io::Result<u64> {
        let Some(mut out) = self.out.take() else {
            return Ok(self.written);
        };
        self.runtime.block_on(out.shutdown())?;
        Ok(self.written)
    }
}

impl Write for Upload {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(out) = self.out.as_mut() else {
            return Err(std::io::Error::other("write after the upload completed"));
        };
        self.runtime.block_on(out.write_all(buf))?;
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // A part is uploaded once full; `complete` uploads the rest.
        Ok(())
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some(mut out) = self.out.take() {
            self.runtime.spawn(async move {
                if let Err(e) = out.abort().await {
                    tracing::debug!(error = %e, "aborting an unfinished upload");
                }
            });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use object_store::local::LocalFileSystem;

    use super::*;

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A file of several parts uploads whole when completed; one dropped after its first part
    /// (a compaction that failed or was dropped) leaves nothing behind on local disk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn completed_uploads_land_whole_and_dropped_ones_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let chunk = vec![7u8; 1024 * 1024];
        let parts = PART_BYTES * 2 / chunk.len() + 3;
        let (s, c) = (Arc::clone(&store), chunk.clone());
        let size = tokio::task::spawn_blocking(move || {
            let mut up = Upload::new(&s, Path::from("whole.parquet")).unwrap();
            for _ in 0..parts {
                up.write_all(&c).unwrap();
            }
            up.complete().unwrap()
        })
        .await
        .unwrap();
        assert_eq!(size, (parts * chunk.len()) as u64);
        let meta = object_store::ObjectStoreExt::head(&store, &Path::from("whole.parquet"))
            .await
            .unwrap();
        assert_eq!(meta.size, size);

        let s = Arc::clone(&store);
        tokio::task::spawn_blocking(move || {
            let mut up = Upload::new(&s, Path::from("dropped.parquet")).unwrap();
            for _ in 0..parts {
                up.write_all(&chunk).unwrap();
            }
        })
        .await
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while names(dir.path()) != ["whole.parquet"] {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                names(dir.path())
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
