use std::time::Duration;

use object_store::memory::InMemory;
use object_store::{ObjectStoreExt, PutMode};

use super::*;

fn fence_for(ms: u64) -> Fence {
    Fence::new("shop", 7, Instant::now() + Duration::from_millis(ms))
}

#[tokio::test(start_paused = true)]
async fn the_deadline_refuses_writes_whatever_the_renewal_task_did() {
    let fence = fence_for(750);
    assert_eq!(fence.epoch(), 7);
    fence.check().unwrap();
    // A SIGSTOP: no task runs, the monotonic clock moves on.
    tokio::time::advance(Duration::from_millis(749)).await;
    fence.check().unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    let err = fence.check().unwrap_err();
    assert!(
        err.to_string().contains("lost the lease of pipeline shop"),
        "{err}"
    );
    assert!(err.reason.contains("not renewed in time"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_renewal_moves_the_deadline_forward_only_and_a_break_is_final() {
    let fence = fence_for(750);
    let first = fence.deadline();
    fence.renewed(first + Duration::from_millis(500));
    fence.renewed(first);
    assert_eq!(fence.deadline(), first + Duration::from_millis(500));
    tokio::time::advance(Duration::from_millis(1000)).await;
    fence.check().unwrap();
    fence.break_with("cdcd-2 took it over".into());
    fence.renewed(first + Duration::from_secs(60));
    let err = fence.check().unwrap_err();
    assert_eq!(err.reason, "cdcd-2 took it over");
}

#[tokio::test(start_paused = true)]
async fn a_write_in_flight_at_the_deadline_is_dropped() {
    let fence = fence_for(750);
    let started = Instant::now();
    // A request object_store keeps retrying for minutes.
    let slow = tokio::time::sleep(Duration::from_secs(300));
    let err = fence.guard(slow).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(750));
    assert!(err.reason.contains("not renewed in time"), "{err}");

    // The same write, with renewals landing meanwhile, runs to its end.
    let fence = fence_for(750);
    let renewer = {
        let fence = fence.clone();
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(250)).await;
                fence.renewed(Instant::now() + Duration::from_millis(750));
            }
        })
    };
    let started = Instant::now();
    fence
        .guard(tokio::time::sleep(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(1500));
    renewer.await.unwrap();
}

/// A create of `path`, as a commit writes its metadata.
async fn create(store: &dyn ObjectStore, path: &Path, body: &'static [u8]) -> Result<PutResult> {
    store
        .put_opts(path, PutPayload::from_static(body), PutMode::Create.into())
        .await
}

#[tokio::test(start_paused = true)]
async fn a_fenced_store_writes_nothing_after_the_deadline() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let fence = fence_for(750);
    let store = FencedStore::new(Arc::clone(&inner), fence.clone());
    let before = Path::from("t/metadata/v1.metadata.json");
    let after = Path::from("t/metadata/v2.metadata.json");
    create(&store, &before, b"v1").await.unwrap();
    tokio::time::advance(Duration::from_millis(800)).await;
    let err = create(&store, &after, b"v2").await.unwrap_err();
    assert!(err.to_string().contains("lost the lease"), "{err}");
    assert!(store.delete(&before).await.is_err());
    assert!(store.put_multipart(&after).await.is_err());
    // Reads still work; nothing was written or deleted after the deadline.
    assert!(store.get(&before).await.is_ok());
    assert!(matches!(
        inner.head(&after).await,
        Err(object_store::Error::NotFound { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_multipart_upload_cannot_complete_after_the_deadline() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let store = FencedStore::new(Arc::clone(&inner), fence_for(750));
    let path = Path::from("t/data/big.parquet");
    let mut upload = store.put_multipart(&path).await.unwrap();
    upload
        .put_part(PutPayload::from_static(b"part one"))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(800)).await;
    assert!(upload
        .put_part(PutPayload::from_static(b"part two"))
        .await
        .is_err());
    assert!(upload.complete().await.is_err());
    assert!(inner.head(&path).await.is_err());
}
