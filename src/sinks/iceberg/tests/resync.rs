//! Resync's swap at the sink (`resync/rebase.rs`): the lineage's state replaces the live table as
//! one snapshot on top of the live head, so sequence numbers and row ids go on rising (a REST
//! catalog refuses anything else), the checkpoint is the lineage's, and later commits' deletes
//! reach the rows the lineage wrote.

use super::*;
use crate::sinks::{ResyncMode, ResyncState};

async fn the_swap_is_one_snapshot_on_the_live_head(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    s.commit(&t, &[first_rows(3)], &cp(100)).await.unwrap();
    s.commit(&t, &[changes(&[upd(1, Some("a2"), 11), del(2)])], &cp(200))
        .await
        .unwrap();
    let before = s.tables.load(&t.id).await.unwrap().unwrap();
    let before = &before.metadata;

    let state = s
        .resync(&t.id, "r1", ResyncMode::SwapAtCopyEnd)
        .await
        .unwrap();
    assert!(matches!(state, ResyncState::UnderWay { .. }), "{state:?}");
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), None, "the lineage's");
    // The copy: two commits of the lineage, the first one mid-copy.
    let mut copying = Checkpoint::new("shop", Position::Postgres(Lsn(0)));
    copying.snapshot = Some("chunk 1".into());
    let first = s
        .commit(
            &t,
            &[changes(&[ins(10, "x"), ins(11, "y"), ins(12, "z")])],
            &copying,
        )
        .await
        .unwrap();
    assert!(!first.resync_swapped);
    if let Some(rows) = duck(&table_dir(dir.path()), "id") {
        assert_eq!(rows, "[(1,), (3,)]", "readers see the live table");
    }
    let swapped = s
        .commit(&t, &[changes(&[upd(10, Some("x2"), 7), del(11)])], &cp(300))
        .await
        .unwrap();
    assert!(swapped.resync_swapped);

    let after = s.tables.load(&t.id).await.unwrap().unwrap();
    let after = &after.metadata;
    let head = after.current_snapshot().unwrap();
    assert_eq!(after.uuid(), before.uuid());
    assert_eq!(head.sequence_number(), before.last_sequence_number() + 1);
    assert_eq!(after.snapshots().count(), 1, "the replaced snapshots left");
    assert_eq!(
        after
            .properties()
            .get(crate::sinks::iceberg::resync::RESYNC_ID_PROPERTY)
            .map(String::as_str),
        Some("r1")
    );
    if mode == DeleteMode::DeletionVectors {
        let (first_row_id, added) = head.row_range().unwrap();
        assert_eq!(first_row_id, before.next_row_id(), "row ids go on rising");
        assert!(added >= 2, "{added}");
    }
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(300)));
    let td = table_dir(dir.path());
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(rows, "[(10, 'x2', 7), (12, 'z', 120)]");
    }

    // Later commits delete and update rows the lineage wrote (v2: their equality deletes come
    // after every lineage file; v3: the lineage's index serves the table).
    s.commit(
        &t,
        &[changes(&[del(10), upd(12, Some("z2"), 5), ins(13, "w")])],
        &cp(400),
    )
    .await
    .unwrap();
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(rows, "[(12, 'z2', 5), (13, 'w', 130)]");
    }
    s.settle().await;
    let fresh = sink(dir.path(), mode);
    assert_eq!(fresh.checkpoint(&t.id).await.unwrap(), Some(cp(400)));
    fresh
        .commit(&t, &[changes(&[del(12)])], &cp(500))
        .await
        .unwrap();
    if let Some(rows) = duck(&td, "id") {
        assert_eq!(rows, "[(13,)]");
    }
}

both_modes!(the_swap_is_one_snapshot_on_the_live_head);
