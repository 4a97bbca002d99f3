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

use async_trait::async_trait;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, PutPayload, PutResult, Result, UploadPart};

use super::layer::{Answers, Layer, Layered, Request, Sent};

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
    #[allow(clippy::new_ret_no_self)] // the wrapper is only ever used as a store
    pub fn new(inner: S) -> Layered<CountedRequests<S>> {
        Layered(CountedRequests { inner, log: None })
    }

    /// Also notes every request in `log` (tests).
    pub fn logged(inner: S, log: RequestLog) -> Layered<CountedRequests<S>> {
        Layered(CountedRequests {
            inner,
            log: Some(log),
        })
    }

    fn note_request(&self, request: Request<'_>) {
        let (op, n, path) = match request {
            Request::Put(location) | Request::StartUpload(location) => (OP_PUT, 1, Some(location)),
            Request::Get { location, head } => {
                (if head { OP_HEAD } else { OP_GET }, 1, Some(location))
            }
            Request::GetRanges { location, ranges } => (OP_GET, ranges as u64, Some(location)),
            Request::List(prefix) => (OP_LIST, 1, prefix),
            Request::Copy { to } | Request::Rename { to } => (OP_COPY, 1, Some(to)),
            // Counted one per location, as the store below pulls them (`deleting`).
            Request::Delete => return,
        };
        self.note(op, n, path);
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
impl<S: ObjectStore> Layer for CountedRequests<S> {
    async fn send<T: Send>(&self, request: Request<'_>, sent: Sent<'_, T>) -> Result<T> {
        self.note_request(request);
        sent.await
    }

    fn stream<T: Send + 'static>(&self, request: Request<'_>, answers: Answers<T>) -> Answers<T> {
        self.note_request(request);
        answers
    }

    fn deleting(&self, locations: Answers<Path>) -> Answers<Path> {
        let log = self.log.clone();
        locations
            .map(move |l| {
                count(OP_DELETE, 1);
                if let (Some(log), Ok(p)) = (&log, &l) {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    log.push((OP_DELETE, p.to_string()));
                }
                l
            })
            .boxed()
    }

    fn upload(&self, upload: Box<dyn MultipartUpload>) -> Box<dyn MultipartUpload> {
        Box::new(CountedUpload { inner: upload })
    }

    fn inner(&self) -> &dyn ObjectStore {
        &self.inner
    }
}
