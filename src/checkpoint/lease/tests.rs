use super::*;

fn settings(standby: bool, ttl_ms: u64) -> LeaseSettings {
    LeaseSettings {
        pipeline: "shop".into(),
        ttl: Duration::from_millis(ttl_ms),
        standby,
    }
}

async fn both_stores_behave(w: Warehouse) {
    let never = CancellationToken::new();
    let first = Lease::acquire(&w, settings(false, 1000), &never)
        .await
        .unwrap()
        .unwrap();
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
            let l = Lease::acquire(&w, settings(true, 1000), &CancellationToken::new())
                .await
                .unwrap()
                .unwrap();
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
    let mut stale = Lease {
        warehouse: w.clone(),
        path: second.path.clone(),
        location: second.location.clone(),
        settings: settings(true, 1000),
        record: second.record.clone(),
        version: UpdateVersion {
            e_tag: Some("\"stale\"".into()),
            version: None,
        },
    };
    let err = stale.keep(&CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, LeaseError::Lost { .. }), "{err}");
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
    let dead = Lease::acquire(&w, settings(true, 1000), &never)
        .await
        .unwrap()
        .unwrap();
    let t = Instant::now();
    let next = Lease::acquire(&w, settings(true, 1000), &never)
        .await
        .unwrap()
        .unwrap();
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
    let _held = Lease::acquire(&w, settings(true, 60_000), &never)
        .await
        .unwrap()
        .unwrap();
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
    };
    w.store()
        .put(&path, serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
    let t = Instant::now();
    let got = Lease::acquire(&w, settings(false, 600_000), &CancellationToken::new())
        .await
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_ne!(got.holder(), "here:4194304:x");
}
