use super::*;

fn settings(standby: bool, ttl_ms: u64) -> LeaseSettings {
    LeaseSettings {
        pipeline: "shop".into(),
        ttl: Duration::from_millis(ttl_ms),
        standby,
    }
}

/// A lease acquired on `w` (a standby when `standby`) with `ttl_ms`, cancelled by `stop`.
async fn held_until(w: &Warehouse, standby: bool, ttl_ms: u64, stop: &CancellationToken) -> Lease {
    Lease::acquire(w, settings(standby, ttl_ms), stop)
        .await
        .unwrap()
        .unwrap()
}

/// [`held_until`] never cancelled.
async fn acquired(w: &Warehouse, standby: bool, ttl_ms: u64) -> Lease {
    held_until(w, standby, ttl_ms, &CancellationToken::new()).await
}

async fn both_stores_behave(w: Warehouse) {
    let never = CancellationToken::new();
    let first = held_until(&w, false, 1000, &never).await;
    // A second daemon that does not wait is refused with a message naming the holder.
    let err = Lease::acquire(&w, settings(false, 1000), &never)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(first.holder()) && text.contains("already running"),
        "{text}"
    );

    // A standby waits while the holder renews, and takes over right after a release.
    let stop = CancellationToken::new();
    let mut holder = first;
    let keeper = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let r = holder.keep(&stop).await;
            (holder, r)
        })
    };
    let standby = {
        let w = w.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let l = acquired(&w, true, 1000).await;
            (l, t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!standby.is_finished(), "the standby took a renewed lease");
    stop.cancel();
    let (holder, kept) = keeper.await.unwrap();
    kept.unwrap();
    holder.release().await;
    let (second, waited) = standby.await.unwrap();
    assert!(waited >= Duration::from_millis(2500), "{waited:?}");

    // The new holder fences the old one: a stale renewal fails with Lost.
    let mut stale = Lease::held(
        &w,
        second.path.clone(),
        second.location.clone(),
        settings(true, 1000),
        second.record.clone(),
        UpdateVersion {
            e_tag: Some("\"stale\"".into()),
            version: None,
        },
        Instant::now(),
    );
    let fence = stale.fence();
    let err = stale.keep(&CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, LeaseError::Lost { .. }), "{err}");
    // Lost breaks the fence at once, long before its deadline.
    let refused = fence.check().unwrap_err();
    assert!(refused.reason.contains("took it over"), "{refused}");
    assert_eq!(second.epoch(), 2);
}

#[tokio::test]
async fn memory_lease_fences_and_hands_over() {
    both_stores_behave(Warehouse::from_url("memory://").unwrap()).await;
}

#[tokio::test]
async fn local_lease_fences_and_hands_over() {
    let dir = tempfile::tempdir().unwrap();
    let w = Warehouse::from_url(&format!("file://{}", dir.path().display())).unwrap();
    both_stores_behave(w).await;
}

#[tokio::test]
async fn a_dead_holder_is_taken_over_after_the_ttl() {
    let w = Warehouse::from_url("memory://").unwrap();
    let never = CancellationToken::new();
    // Acquired and never renewed: the daemon died.
    let dead = held_until(&w, true, 1000, &never).await;
    let t = Instant::now();
    let next = held_until(&w, true, 1000, &never).await;
    assert!(
        t.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        t.elapsed()
    );
    assert_ne!(dead.holder(), next.holder());
}

#[tokio::test]
async fn shutdown_stops_a_standby() {
    let w = Warehouse::from_url("memory://").unwrap();
    let never = CancellationToken::new();
    let _held = held_until(&w, true, 60_000, &never).await;
    let stop = CancellationToken::new();
    stop.cancel();
    let got = Lease::acquire(&w, settings(true, 60_000), &stop)
        .await
        .unwrap();
    assert!(got.is_none());
}

#[tokio::test]
async fn a_dead_local_holder_is_taken_over_at_once() {
    use object_store::ObjectStoreExt;
    let w = Warehouse::from_url("memory://").unwrap();
    let path = w.path(&lease_location(&w, "shop")).unwrap();
    // A holder on this machine whose pid does not run (pid_max is at most 2^22).
    let record = LeaseRecord {
        holder: "here:4194304:x".into(),
        counter: 3,
        ttl_ms: 600_000,
        written_at: String::new(),
        released: false,
        machine: machine_id(),
        pid: 4_194_304,
        epoch: 41,
    };
    w.store()
        .put(&path, serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
    let t = Instant::now();
    let got = acquired(&w, false, 600_000).await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_ne!(got.holder(), "here:4194304:x");
    assert_eq!(got.epoch(), 42);
}

/// A store whose lease renewals (conditional updates) hang while `stalled` is set, like a
/// request object_store keeps retrying after lost responses.
#[derive(Debug)]
struct Stall {
    inner: std::sync::Arc<dyn object_store::ObjectStore>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stall({})", self.inner)
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Stall {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        if self.stalled.load(std::sync::atomic::Ordering::SeqCst)
            && matches!(opts.mode, PutMode::Update(_))
        {
            std::future::pending::<()>().await;
        }
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A holder whose renewals go through a [`Stall`], and a standby beside it on the same objects.
fn stalling_pair() -> (
    Warehouse,
    Warehouse,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let memory: std::sync::Arc<dyn object_store::ObjectStore> =
        std::sync::Arc::new(object_store::memory::InMemory::new());
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let base = Warehouse::from_url("memory://").unwrap();
    let holder = base.clone().with_store(std::sync::Arc::new(Stall {
        inner: memory.clone(),
        stalled: stalled.clone(),
    }));
    (holder, base.with_store(memory), stalled)
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_expires_at_the_deadline() {
    let (w, _, stalled) = stalling_pair();
    let t = Instant::now();
    let mut lease = acquired(&w, false, 4000).await;
    let fence = lease.fence();
    stalled.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = lease.keep(&CancellationToken::new()).await.unwrap_err();
    // 3/4 of the ttl after the acquisition was sent, not when the hanging request returns.
    assert_eq!(t.elapsed(), Duration::from_millis(3000));
    assert!(matches!(err, LeaseError::Expired { .. }), "{err}");
    assert!(err.to_string().contains("lost the lease"), "{err}");
    assert!(fence.check().is_err());
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_the_fence_open() {
    let w = Warehouse::from_url("memory://").unwrap();
    let mut lease = acquired(&w, false, 3000).await;
    let fence = lease.fence();
    let stop = CancellationToken::new();
    let keeper = {
        let stop = stop.clone();
        tokio::spawn(async move { lease.keep(&stop).await })
    };
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        fence.check().unwrap();
    }
    stop.cancel();
    keeper.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_holder_paused_past_its_deadline_wakes_up_fenced() {
    let w = Warehouse::from_url("memory://").unwrap();
    let mut lease = acquired(&w, false, 3000).await;
    let fence = lease.fence();
    let keeper = tokio::spawn(async move { lease.keep(&CancellationToken::new()).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fence.check().unwrap();
    // SIGSTOP for two ttls, then SIGCONT: the clock moved, no task ran meanwhile. The first
    // write after waking is refused whether or not the keeper has run yet.
    tokio::time::advance(Duration::from_millis(6000)).await;
    assert!(fence.check().is_err());
    let err = keeper.await.unwrap().unwrap_err();
    assert!(matches!(err, LeaseError::Expired { .. }), "{err}");
    assert!(fence.check().is_err(), "a late renewal reopened the fence");
}

#[tokio::test(start_paused = true)]
async fn the_holder_is_fenced_before_a_standby_can_take_over() {
    let (holder_wh, standby_wh, stalled) = stalling_pair();
    let mut held = acquired(&holder_wh, true, 4000).await;
    let fence = held.fence();
    let keeper = tokio::spawn(async move { held.keep(&CancellationToken::new()).await });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // Renewals from now on hang in the store; the standby sees no change.
    stalled.store(true, std::sync::atomic::Ordering::SeqCst);
    let fenced_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let watcher = {
        let (fence, fenced_at) = (fence.clone(), fenced_at.clone());
        tokio::spawn(async move {
            while fence.check().is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            *fenced_at.lock().unwrap() = Some(Instant::now());
        })
    };
    let next = acquired(&standby_wh, true, 4000).await;
    let took_over = Instant::now();
    watcher.await.unwrap();
    let fenced_at = fenced_at.lock().unwrap().unwrap();
    assert!(
        took_over.duration_since(fenced_at) >= Duration::from_millis(900),
        "fenced {fenced_at:?}, taken over {took_over:?}"
    );
    assert_eq!(next.epoch(), fence.epoch() + 1);
    assert!(matches!(
        keeper.await.unwrap(),
        Err(LeaseError::Expired { .. })
    ));
}
