//! One way to publish: [`put_create`], the create-if-absent put behind every commit point
//! (Iceberg `v<N>.metadata.json`, Paimon `snapshot-N` and `schema-0`, the primary-key index
//! manifest).
//!
//! A create-if-absent put (object_store `PutMode::Create`: atomic on local disk, `If-None-Match: *`
//! on S3) either lands or finds the object there. Finding it is a conflict (another writer
//! published that name first) except in one case: object_store retries a put that timed out or
//! got a 5xx, and if the first attempt did land, the retry fails on the object that attempt
//! wrote. Every published body names its commit (a fresh snapshot id, commit uuid, timestamp), so
//! an existing object with exactly our bytes is that first attempt: [`Created::AlreadyOurs`], a
//! success. Callers map the answer onto their own errors; none of them writes its own match on
//! `AlreadyExists` any more.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

/// What a create-if-absent put found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The object did not exist; it now holds our bytes.
    Created,
    /// The object exists with exactly our bytes: a retried create whose first attempt landed.
    AlreadyOurs,
    /// The object exists with other bytes (or cannot be read back): another writer's.
    Conflict,
}

impl Created {
    /// Whether our bytes are now at the path (`Created` or `AlreadyOurs`).
    pub fn is_ours(self) -> bool {
        matches!(self, Created::Created | Created::AlreadyOurs)
    }
}

/// Puts `bytes` at `path` unless an object is there; see the module doc for the answers. An `Err`
/// is any other store failure: the outcome is unknown (the put may still have landed).
pub async fn put_create(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: Bytes,
) -> object_store::Result<Created> {
    let put = store
        .put_opts(
            path,
            PutPayload::from_bytes(bytes.clone()),
            PutOptions::from(PutMode::Create),
        )
        .await;
    match put {
        Ok(_) => Ok(Created::Created),
        Err(object_store::Error::AlreadyExists { .. }) if holds(store, path, &bytes).await => {
            Ok(Created::AlreadyOurs)
        }
        Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Conflict),
        Err(e) => Err(e),
    }
}

/// Whether the object at `path` holds exactly `ours`. Unreadable counts as not ours: the caller
/// then reports a conflict and stops, which is safe either way.
async fn holds(store: &dyn ObjectStore, path: &Path, ours: &[u8]) -> bool {
    match store.get(path).await {
        Ok(got) => got.bytes().await.is_ok_and(|b| b.as_ref() == ours),
        Err(_) => false,
    }
}

#[cfg(test)]
pub(crate) use lost_answer::LostAnswer;

#[cfg(test)]
mod lost_answer {
    use std::sync::Arc;

    use futures::stream::BoxStream;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
        PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    /// A store whose creates land but whose answer is lost, so every create is sent twice, as
    /// object_store's retry does after a timeout: the second attempt finds the first's object.
    /// For tests of every publisher.
    #[derive(Debug)]
    pub(crate) struct LostAnswer(pub(crate) Arc<dyn ObjectStore>);

    impl std::fmt::Display for LostAnswer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "LostAnswer({})", self.0)
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for LostAnswer {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            let retry =
                matches!(opts.mode, PutMode::Create).then(|| (payload.clone(), opts.clone()));
            let first = self.0.put_opts(location, payload, opts).await;
            match retry {
                Some((payload, opts)) if first.is_ok() => {
                    self.0.put_opts(location, payload, opts).await
                }
                _ => first,
            }
        }
        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }
        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.0.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.0.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.0.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::storage::Warehouse;
    use object_store::memory::InMemory;

    /// The three answers on one store: a fresh create, the retry of a create that landed (the
    /// object holds our bytes), and another writer's object.
    async fn answers(w: &Warehouse) {
        let path = w
            .path(&w.location(&["ns", "t", "metadata", "v1.metadata.json"]))
            .unwrap();
        let ours = Bytes::from_static(b"{\"snapshot\": 1}");
        let store = w.store().as_ref();
        assert_eq!(
            put_create(store, &path, ours.clone()).await.unwrap(),
            Created::Created
        );
        // object_store's retry of a create whose first attempt landed sees the object it wrote.
        assert_eq!(
            put_create(store, &path, ours.clone()).await.unwrap(),
            Created::AlreadyOurs
        );
        let theirs = Bytes::from_static(b"{\"snapshot\": 2}");
        assert_eq!(
            put_create(store, &path, theirs).await.unwrap(),
            Created::Conflict
        );
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, ours, "a conflicting create never overwrites");
        // A longer body starting with ours is not ours.
        let longer = Bytes::from_static(b"{\"snapshot\": 1}\n");
        assert_eq!(
            put_create(store, &path, longer).await.unwrap(),
            Created::Conflict
        );
    }

    #[tokio::test]
    async fn in_memory_store_answers_created_already_ours_conflict() {
        answers(&Warehouse::from_url("memory://").unwrap()).await;
    }

    #[tokio::test]
    async fn local_dir_answers_created_already_ours_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let w = Warehouse::from_url(&format!("file://{}", dir.path().display())).unwrap();
        answers(&w).await;
        assert!(dir.path().join("ns/t/metadata/v1.metadata.json").exists());
    }

    #[tokio::test]
    async fn a_retried_create_that_landed_is_already_ours() {
        let store = LostAnswer(std::sync::Arc::new(InMemory::new()));
        let path = Path::from("wh/ns/t/snapshot/snapshot-1");
        let ours = Bytes::from_static(b"snapshot 1 of commit a");
        // The raw put reports the retry's failure although the object is ours...
        let raw = store
            .put_opts(
                &path,
                PutPayload::from_bytes(ours.clone()),
                PutOptions::from(PutMode::Create),
            )
            .await;
        assert!(matches!(
            raw,
            Err(object_store::Error::AlreadyExists { .. })
        ));
        // ...and put_create tells the two apart.
        let path = Path::from("wh/ns/t/snapshot/snapshot-2");
        assert_eq!(
            put_create(&store, &path, ours.clone()).await.unwrap(),
            Created::AlreadyOurs
        );
        let theirs = Bytes::from_static(b"snapshot 2 of commit b");
        assert_eq!(
            put_create(&store, &path, theirs).await.unwrap(),
            Created::Conflict
        );
    }

    #[test]
    fn ours_means_created_or_already_ours() {
        assert!(Created::Created.is_ours());
        assert!(Created::AlreadyOurs.is_ours());
        assert!(!Created::Conflict.is_ours());
    }
}
