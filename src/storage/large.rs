//! [`LargePuts`]: an `ObjectStore` wrapper that sends a large plain put as a multipart upload.
//!
//! Sits between every writer and the real store ([`super::Warehouse`] wraps each store in it), so
//! table writers keep calling `put` with a whole file and need not know the backend's limits.
//! Why: a single S3 PUT is capped at 5 GiB and a failed one restarts from byte 0; a multipart
//! upload sends [`PART_SIZE`] parts (retried one by one by object_store's retry policy, two in
//! flight) and only becomes visible on completion, so a crash mid-upload leaves no object, only
//! an incomplete upload that the bucket's lifecycle rule (`AbortIncompleteMultipartUpload`)
//! reclaims. Conditional puts (`PutMode::Create`/`Update`) stay single requests: they are small
//! (metadata, lease) and S3 has no conditional multipart completion in object_store 0.13.
//!
//! Crash point [`failpoints::MULTIPART_AFTER_FIRST_PART`] fires here, after a multipart upload's
//! first part. Tests also set `CDCD_MULTIPART_THRESHOLD=<bytes>` to reach multipart with small
//! files.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    MultipartUpload, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    Result,
};

use super::layer::{Layer, Layered};
use crate::failpoints;

/// Plain puts larger than this go multipart.
pub const MULTIPART_THRESHOLD: usize = 16 * 1024 * 1024;
/// Part size of those uploads (S3: at least 5 MiB except the last part).
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

fn default_threshold() -> usize {
    std::env::var("CDCD_MULTIPART_THRESHOLD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MULTIPART_THRESHOLD)
}

/// Wraps a store; see the module doc.
#[derive(Debug)]
pub struct LargePuts<S> {
    inner: S,
    threshold: usize,
}

impl<S: ObjectStore> LargePuts<S> {
    #[allow(clippy::new_ret_no_self)] // the wrapper is only ever used as a store
    pub fn new(inner: S) -> Layered<LargePuts<S>> {
        Layered(LargePuts {
            inner,
            threshold: default_threshold(),
        })
    }

    async fn put_multipart_payload(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mut upload = self
            .inner
            .put_multipart_opts(
                location,
                PutMultipartOptions {
                    tags: opts.tags,
                    attributes: opts.attributes,
                    extensions: opts.extensions,
                },
            )
            .await?;
        // Writers hand over one Bytes; several are joined once (never per row).
        let body: Bytes = match payload.as_ref() {
            [one] => one.clone(),
            many => Bytes::from(many.concat()),
        };
        match send_parts(upload.as_mut(), &body).await {
            Ok(()) => upload.complete().await,
            Err(e) => {
                // Best effort: the upload is useless now; a lifecycle rule reclaims what stays.
                let _ = upload.abort().await;
                Err(e)
            }
        }
    }
}

impl<S: ObjectStore> Layered<LargePuts<S>> {
    /// Another threshold (tests exercise multipart with small payloads).
    pub fn with_threshold(mut self, threshold: usize) -> Layered<LargePuts<S>> {
        self.0.threshold = threshold;
        self
    }
}

/// Uploads `body` in [`PART_SIZE`] slices, [`PARTS_IN_FLIGHT`] at a time.
async fn send_parts(upload: &mut dyn MultipartUpload, body: &Bytes) -> Result<()> {
    let mut in_flight = FuturesOrdered::new();
    let mut done = 0usize;
    let mut offset = 0usize;
    while offset < body.len() {
        let end = (offset + PART_SIZE).min(body.len());
        in_flight.push_back(upload.put_part(PutPayload::from_bytes(body.slice(offset..end))));
        offset = end;
        while in_flight.len() >= PARTS_IN_FLIGHT || (offset >= body.len() && !in_flight.is_empty())
        {
            if let Some(r) = in_flight.next().await {
                r?;
                done += 1;
                if done == 1 {
                    failpoints::crash_point(failpoints::MULTIPART_AFTER_FIRST_PART);
                }
            }
        }
    }
    Ok(())
}

impl<S: ObjectStore> fmt::Display for LargePuts<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LargePuts({})", self.inner)
    }
}

#[async_trait]
impl<S: ObjectStore> Layer for LargePuts<S> {
    async fn put(&self, path: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        if matches!(opts.mode, PutMode::Overwrite) && payload.content_length() > self.threshold {
            return self.put_multipart_payload(path, payload, opts).await;
        }
        self.inner.put_opts(path, payload, opts).await
    }

    fn inner(&self) -> &dyn ObjectStore {
        &self.inner
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn large_put_goes_multipart_and_reads_back_whole() {
        let store = LargePuts::new(InMemory::new()).with_threshold(1024);
        let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let path = Path::from("a/big.parquet");
        store
            .put(&path, PutPayload::from(body.clone()))
            .await
            .unwrap();
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], &body[..]);
    }

    #[tokio::test]
    async fn conditional_puts_stay_single_and_conditional() {
        let store = LargePuts::new(InMemory::new()).with_threshold(4);
        let path = Path::from("t/metadata/v1.metadata.json");
        let create = || PutOptions::from(PutMode::Create);
        store
            .put_opts(&path, PutPayload::from_static(b"first body"), create())
            .await
            .unwrap();
        let again = store
            .put_opts(&path, PutPayload::from_static(b"second body"), create())
            .await;
        assert!(matches!(
            again,
            Err(object_store::Error::AlreadyExists { .. })
        ));
    }
}
