//! [`CountedRequests`]: an `ObjectStore` wrapper that counts the requests cdcd sends to the
//! warehouse, by kind (`cdcd_object_store_requests_total{op}`: `put`, `get`, `head`, `list`,
//! `delete`, `copy`), so a run can print what it would cost on S3 (issue 37: requests must grow
//! with the data changed, not with tables × commits).
//!
//! Sits right above the real store (under [`LargePuts`](super::LargePuts)), so a multipart upload
//! counts as the requests it is: one to start it, one per part, one to complete it. What is
//! counted is what cdcd asks for: a ranged read of several ranges counts one GET per range (S3's
//! client may merge neighbouring ones), a listing counts one LIST however many pages it takes,
//! and a batch delete one DELETE per object.
//!
//! Tests wrap a warehouse's store in one with a [`RequestLog`] of their own, to assert which
//! objects a step read or wrote (the metric is process-wide, shared by tests running at once).

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result, UploadPart,
};

use crate::metrics::{LABEL_OP, OBJECT_STORE_REQUESTS_TOTAL};

pub const OP_PUT: &str = "put";
pub const OP_GET: &str = "get";
pub const OP_HEAD: &str = "head";
pub const OP_LIST: &str = "list";
pub const OP_DELETE: &str = "delete";
pub const OP_COPY: &str = "copy";

fn count(op: &'static str, n: u64) {
    metrics::counter!(OBJECT_STORE_REQUESTS_TOTAL, LABEL_OP => op).increment(n);
}

/// The requests one store was sent: `(op, path)`, in order (tests).
pub type RequestLog = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, String)>>>;

/// Wraps a store; see the module doc.
#[derive(Debug)]
pub struct CountedRequests<S> {
    inner: S,
    log: Option<RequestLog>,
}

impl<S: ObjectStore> CountedRequests<S> {
    pub fn new(inner: S) -> CountedRequests<S> {
        CountedRequests { inner, log: None }
    }

    /// Also notes every request in `log` (tests).
    pub fn logged(inner: S, log: RequestLog) -> CountedRequests<S> {
        CountedRequests {
            inner,
            log: Some(log),
        }
    }

    fn note(&self, op: &'static str, n: u64, path: Option<&Path>) {
        count(op, n);
        if let Some(log) = &self.log {
            let path = path.map(|p| p.to_string()).unwrap_or_default();
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            for _ in 0..n {
                log.push((op, path.clone()));
            }
        }
    }
}

impl<S: ObjectStore> fmt::Display for CountedRequests<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountedRequests({})", self.inner)
    }
}

/// A multipart upload whose parts and completion are counted.
#[derive(Debug)]
struct CountedUpload {
    inner: Box<dyn MultipartUpload>,
}

#[async_trait]
impl MultipartUpload for CountedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        count(OP_PUT, 1);
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        count(OP_PUT, 1);
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        count(OP_DELETE, 1);
        self.inner.abort().await
    }
}

#[async_trait]
impl<S: ObjectStore> ObjectStore for CountedRequests<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.note(OP_PUT, 1, Some(location));
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.note(OP_PUT, 1, Some(location));
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(CountedUpload { inner }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let op = if options.head { OP_HEAD } else { OP_GET };
        self.note(op, 1, Some(location));
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.note(OP_GET, ranges.len() as u64, Some(location));
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let log = self.log.clone();
        let counted = locations
            .map(move |l| {
                count(OP_DELETE, 1);
                if let (Some(log), Ok(p)) = (&log, &l) {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    log.push((OP_DELETE, p.to_string()));
                }
                l
            })
            .boxed();
        self.inner.delete_stream(counted)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.note(OP_LIST, 1, prefix);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.note(OP_LIST, 1, prefix);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.note(OP_LIST, 1, prefix);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.note(OP_COPY, 1, Some(to));
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.note(OP_COPY, 1, Some(to));
        self.inner.rename_opts(from, to, options).await
    }
}
