//! [`Layer`] and [`Layered`]: the one `ObjectStore` implementation of cdcd's store wrappers
//! ([`LargePuts`](super::LargePuts), [`CountedRequests`](super::CountedRequests),
//! [`FencedStore`](super::FencedStore), [`CertHint`](super::s3::CertHint)).
//!
//! Why: `ObjectStore` has eleven required methods, and each wrapper changes only how a kind of
//! request is sent (counted, fenced, its error explained, a large put split). A wrapper is a
//! [`Layer`] that says what it changes in a few hooks, each defaulting to "as it is"; [`Layered`]
//! routes every call of the trait through them, so the forwarding is written once.

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// A call on the store below, not polled yet.
pub type Sent<'a, T> = BoxFuture<'a, Result<T>>;

/// The stream a call on the store below answers with.
pub type Answers<T> = BoxStream<'static, Result<T>>;

/// A call on the store, as the layers tell calls apart.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// `put_opts`.
    Put(&'a Path),
    /// `put_multipart_opts` (its parts and completion go through the upload the layer returns).
    StartUpload(&'a Path),
    /// `get_opts`; `head` when only the metadata is asked.
    Get { location: &'a Path, head: bool },
    /// `get_ranges`, of `ranges` ranges.
    GetRanges { location: &'a Path, ranges: usize },
    /// `list`, `list_with_offset` or `list_with_delimiter` under `prefix`.
    List(Option<&'a Path>),
    /// `copy_opts` to `to`.
    Copy { to: &'a Path },
    /// `rename_opts` to `to`.
    Rename { to: &'a Path },
    /// `delete_stream` (its locations go through [`Layer::deleting`] first).
    Delete,
}

impl Request<'_> {
    /// Whether the call changes what the store holds.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Request::Put(_)
                | Request::StartUpload(_)
                | Request::Copy { .. }
                | Request::Rename { .. }
                | Request::Delete
        )
    }
}

/// What a store wrapper changes about the calls it passes to the store below ([`Layer::inner`]).
/// Every hook defaults to passing the call on as it is.
#[async_trait]
pub trait Layer: fmt::Display + fmt::Debug + Send + Sync + 'static {
    /// The store below.
    fn inner(&self) -> &dyn ObjectStore;

    /// Sends `request`, whose call on the store below is `sent`.
    async fn send<T: Send>(&self, _request: Request<'_>, sent: Sent<'_, T>) -> Result<T> {
        sent.await
    }

    /// The answers of a streaming `request` (a listing, or the locations a delete removed).
    fn stream<T: Send + 'static>(&self, _request: Request<'_>, answers: Answers<T>) -> Answers<T> {
        answers
    }

    /// The locations a batch delete is given, before the store below pulls them.
    fn deleting(&self, locations: Answers<Path>) -> Answers<Path> {
        locations
    }

    /// A multipart upload the store below started.
    fn upload(&self, upload: Box<dyn MultipartUpload>) -> Box<dyn MultipartUpload> {
        upload
    }

    /// The objects under `prefix` whose location sorts after `offset`: by default the store
    /// below's `list_with_offset`; the answers then go through [`stream`](Self::stream).
    fn list_after(&self, prefix: Option<&Path>, offset: &Path) -> Answers<ObjectMeta> {
        self.inner().list_with_offset(prefix, offset)
    }

    /// A plain put: by default the store below's, sent through [`send`](Self::send).
    async fn put(&self, path: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        let sent = self.inner().put_opts(path, payload, opts);
        self.send(Request::Put(path), sent).await
    }
}

/// A [`Layer`] as an `ObjectStore`.
pub struct Layered<L>(pub(crate) L);

impl<L: Layer> fmt::Debug for Layered<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<L: Layer> fmt::Display for Layered<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[async_trait]
impl<L: Layer> ObjectStore for Layered<L> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.0.put(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let sent = self.0.inner().put_multipart_opts(location, opts);
        let upload = self.0.send(Request::StartUpload(location), sent).await?;
        Ok(self.0.upload(upload))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let head = options.head;
        let sent = self.0.inner().get_opts(location, options);
        self.0.send(Request::Get { location, head }, sent).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let request = Request::GetRanges {
            location,
            ranges: ranges.len(),
        };
        let sent = self.0.inner().get_ranges(location, ranges);
        self.0.send(request, sent).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let answers = self.0.inner().delete_stream(self.0.deleting(locations));
        self.0.stream(Request::Delete, answers)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let answers = self.0.inner().list(prefix);
        self.0.stream(Request::List(prefix), answers)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let answers = self.0.list_after(prefix, offset);
        self.0.stream(Request::List(prefix), answers)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let sent = self.0.inner().list_with_delimiter(prefix);
        self.0.send(Request::List(prefix), sent).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let sent = self.0.inner().copy_opts(from, to, options);
        self.0.send(Request::Copy { to }, sent).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        let sent = self.0.inner().rename_opts(from, to, options);
        self.0.send(Request::Rename { to }, sent).await
    }
}
