//! The lease fence: a deadline after which this daemon writes nothing to the warehouse, and the
//! store wrapper ([`FencedStore`]) that enforces it on every write.
//!
//! Where it sits: `checkpoint/lease/mod.rs` owns the lease and moves the deadline forward after each
//! successful renewal; `daemon::run` wraps the sinks' warehouse in [`Warehouse::fenced`], so
//! every write of a table writer (data files, manifests, the metadata or snapshot commit, the
//! primary-key index) passes through [`Fence::guard`]. Reads are not fenced.
//!
//! Why a deadline and not a flag set by the renewal task: a flag is only as fresh as the last
//! time that task ran. A process stopped by SIGSTOP or a frozen VM wakes up with every task
//! where it was; the first thing it may do is the commit it was about to make. The deadline is
//! an instant of the monotonic clock (tokio's `Instant`, `CLOCK_MONOTONIC` on Linux, which keeps
//! running while a process is stopped), so a write checked after such a pause sees that the
//! deadline has passed, whatever the renewal task has or has not done meanwhile.
//!
//! The argument (all times on monotonic clocks; only durations are compared across hosts, so
//! clock offsets do not matter, and rate differences are far below the 1/4 ttl margin):
//! - the holder's deadline is `s + 3/4 ttl`, where `s` is when it *sent* its last successful
//!   renewal (or acquisition): that write landed at some instant `w >= s`;
//! - a standby declares the lease dead only after it has seen the same content for a full
//!   `ttl`; it can first see that content at `w`, so it takes over no earlier than
//!   `w + ttl >= s + ttl`;
//! - [`Fence::guard`] checks `now < deadline` before a write is sent and drops the request (and
//!   with it object_store's retries) when the deadline passes while it is in flight, so every
//!   request this daemon sends after the deadline is never sent.
//!
//! What remains (said plainly): a request sent just before the deadline can still be applied by
//! the store later, if it sits in a network buffer or a proxy for more than `ttl / 4`; and a
//! host whose monotonic clock stops while it is frozen (some hypervisors) wakes up before its
//! deadline. No client can close that window without the store's help; cdcd narrows what it
//! can do with the epoch ([`Fence::epoch`], one more per acquisition), as Kafka does with
//! producer epochs:
//! - every table snapshot carries it (`cdcd.lease-epoch`), and the table commit is a
//!   create-if-absent of the next version: a stale commit either lands before the new holder's
//!   first commit of that table (the new holder then conflicts and restarts from the table's
//!   checkpoint: nothing is lost or doubled) or fails; and a commit that loses to a snapshot of
//!   a *newer* epoch breaks this fence for every table at once (`sinks::fenced_by_winner`);
//! - primary-key index run ids are allocated per epoch, so an older holder's late run never
//!   overwrites the new holder's (`sinks/index/`, "Two writers").

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, PutPayload, PutResult, Result, UploadPart};
use tokio::time::Instant;

use super::layer::{Answers, Layer, Layered, Request, Sent};

/// A write was refused because the lease is lost or past its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "lost the lease of pipeline {pipeline}: {reason}; this cdcd publishes nothing more and stops"
)]
pub struct Fenced {
    pub pipeline: String,
    pub reason: String,
}

/// The deadline and epoch of a held lease, shared by the lease keeper and every fenced store.
#[derive(Debug, Clone)]
pub struct Fence(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    pipeline: String,
    epoch: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Writes are allowed strictly before this instant.
    deadline: Instant,
    /// Why the lease is gone for good (another daemon took it, or it expired).
    broken: Option<String>,
}

impl Fence {
    /// The fence of lease epoch `epoch` of `pipeline`, open until `deadline`.
    pub fn new(pipeline: &str, epoch: u64, deadline: Instant) -> Fence {
        Fence(Arc::new(Shared {
            pipeline: pipeline.to_owned(),
            epoch,
            state: Mutex::new(State {
                deadline,
                broken: None,
            }),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Two plain fields, each written whole: a panic elsewhere cannot leave them torn.
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lease epoch: one more than the previous holder's, the same for all renewals.
    /// The pipeline whose lease this is.
    pub fn pipeline(&self) -> &str {
        &self.0.pipeline
    }

    pub fn epoch(&self) -> u64 {
        self.0.epoch
    }

    pub fn deadline(&self) -> Instant {
        self.state().deadline
    }

    /// A renewal sent at `sent` succeeded: writes are allowed until `deadline`. Never moves the
    /// deadline back, and does nothing once the fence is broken.
    pub fn renewed(&self, deadline: Instant) {
        let mut s = self.state();
        if s.broken.is_none() && deadline > s.deadline {
            s.deadline = deadline;
        }
    }

    /// The lease is gone for good (`reason` says why): every later write is refused.
    pub fn break_with(&self, reason: String) {
        let mut s = self.state();
        if s.broken.is_none() {
            s.broken = Some(reason);
        }
    }

    /// `Ok` while writes are allowed.
    pub fn check(&self) -> Result<(), Fenced> {
        let s = self.state();
        let reason = match &s.broken {
            Some(reason) => reason.clone(),
            None => {
                let now = Instant::now();
                if now < s.deadline {
                    return Ok(());
                }
                format!(
                    "it was not renewed in time (its deadline passed {} ms ago: was this process \
                     paused, or cut off from the store?), so a standby may hold it now",
                    now.duration_since(s.deadline).as_millis()
                )
            }
        };
        Err(Fenced {
            pipeline: self.0.pipeline.clone(),
            reason,
        })
    }

    /// Runs the write `fut` if the fence is open, and drops it (with the retries object_store
    /// would still make) if the deadline passes before it completes. A write that completes is
    /// reported as done even when that happens after the deadline: it was sent before.
    pub async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, Fenced> {
        self.check()?;
        tokio::pin!(fut);
        loop {
            let deadline = self.deadline();
            tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                // A renewal may have moved the deadline meanwhile: check again, then wait on.
                _ = tokio::time::sleep_until(deadline) => self.check()?,
            }
        }
    }
}

fn refused(e: Fenced) -> object_store::Error {
    object_store::Error::Generic {
        store: "lease fence",
        source: Box::new(e),
    }
}

/// An `ObjectStore` whose writes (puts, multipart uploads, deletes, copies, renames) go through
/// a [`Fence`]; reads pass straight through.
#[derive(Debug)]
pub struct FencedStore {
    inner: Arc<dyn ObjectStore>,
    fence: Fence,
}

impl FencedStore {
    #[allow(clippy::new_ret_no_self)] // the wrapper is only ever used as a store
    pub fn new(inner: Arc<dyn ObjectStore>, fence: Fence) -> Layered<FencedStore> {
        Layered(FencedStore { inner, fence })
    }
}

impl fmt::Display for FencedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fenced({})", self.inner)
    }
}

/// A multipart upload whose parts and completion are fenced.
#[derive(Debug)]
struct FencedUpload {
    inner: Box<dyn MultipartUpload>,
    fence: Fence,
}

#[async_trait]
impl MultipartUpload for FencedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let part = self.inner.put_part(data);
        let fence = self.fence.clone();
        async move { fence.guard(part).await.map_err(refused)? }.boxed()
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let fence = self.fence.clone();
        fence.guard(self.inner.complete()).await.map_err(refused)?
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}

#[async_trait]
impl Layer for FencedStore {
    async fn send<T: Send>(&self, request: Request<'_>, sent: Sent<'_, T>) -> Result<T> {
        if request.writes() {
            self.fence.guard(sent).await.map_err(refused)?
        } else {
            sent.await
        }
    }

    fn deleting(&self, locations: Answers<Path>) -> Answers<Path> {
        // Each location is checked as the inner store pulls it, right before its delete.
        let fence = self.fence.clone();
        locations
            .map(move |l| l.and_then(|p| fence.check().map(|()| p).map_err(refused)))
            .boxed()
    }

    fn upload(&self, upload: Box<dyn MultipartUpload>) -> Box<dyn MultipartUpload> {
        Box::new(FencedUpload {
            inner: upload,
            fence: self.fence.clone(),
        })
    }

    fn inner(&self) -> &dyn ObjectStore {
        self.inner.as_ref()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
