//! The primary-key index wired into the v3 commit: persisted beside the table after each
//! commit, caught up from the table when it is behind (a crash between the table commit and the
//! index persist), rebuilt when it is missing, and used to complete partial updates.

use super::*;
use crate::sinks::pk_index::PrimaryKeyIndex;

fn dv_sink(dir: &Path) -> IcebergSink {
    sink(dir, DeleteMode::DeletionVectors)
}

/// The snapshot the persisted index of `t` covers.
pub(super) async fn covered(s: &IcebergSink) -> Option<i64> {
    let t = schema();
    s.tables.settle_index(&t.id).await;
    let root = s.tables.warehouse.path(&s.index_location(&t.id)).unwrap();
    let index = PrimaryKeyIndex::open(Arc::clone(s.tables.warehouse.store()), root, 1 << 20)
        .await
        .unwrap();
    index.covered_snapshot()
}

fn index_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("_cdcd/shop/index/public/t")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test]
async fn index_is_persisted_beside_the_table_covering_each_commit() {
    let dir = tempfile::tempdir().unwrap();
    let s = dv_sink(dir.path());
    let t = schema();
    let a = s
        .commit(&t, &[changes(&[ins(1, "a"), ins(2, "b")])], &cp(1))
        .await
        .unwrap();
    assert_eq!(covered(&s).await, Some(a.snapshot_id));
    assert!(index_dir(dir.path()).is_dir());
    let b = s
        .commit(&t, &[changes(&[upd(1, Some("x"), 5), del(2)])], &cp(2))
        .await
        .unwrap();
    assert_eq!(b.deleted_rows, 2);
    assert_eq!(covered(&s).await, Some(b.snapshot_id));
    // Nothing of the index is under the table (orphan-file removal would delete it).
    let under_table = walk(&dir.path().join("public/t"));
    assert!(
        under_table.iter().all(|p| !p.contains("cdcd")),
        "{under_table:?}"
    );
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// A crash after the table commit but before the index persist leaves the index one snapshot
/// behind: a restarted sink replays the files added since, so the row written by the lost
/// snapshot is located (not its stale, already-deleted predecessor).
#[tokio::test]
async fn restart_with_the_index_behind_the_table_replays_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let s = dv_sink(dir.path());
    s.commit(&t, &[first_rows(4)], &cp(1)).await.unwrap();
    let first = covered(&s).await;
    let saved = dir.path().join("saved-index");
    copy_dir(&index_dir(dir.path()), &saved);
    s.commit(&t, &[changes(&[upd(2, Some("b2"), 22), del(3)])], &cp(2))
        .await
        .unwrap();
    s.tables.settle_index(&t.id).await;
    drop(s);
    // The index as it was before the second commit's persist.
    std::fs::remove_dir_all(index_dir(dir.path())).unwrap();
    copy_dir(&saved, &index_dir(dir.path()));

    let s = dv_sink(dir.path());
    assert_eq!(covered(&s).await, first);
    // 2 is now in the second commit's file; 1 gets completed from the table; 4 is deleted.
    let st = s
        .commit(
            &t,
            &[changes(&[upd(2, Some("b3"), 33), upd(1, None, 11), del(4)])],
            &cp(3),
        )
        .await
        .unwrap();
    assert_eq!(
        st.deleted_rows, 3,
        "rows of 1, 2 (second commit's file) and 4"
    );
    let current = s.status(&t.id).await.unwrap().unwrap().snapshot_id;
    assert_eq!(covered(&s).await, Some(current));
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(1, 'a', 11), (2, 'b3', 33)]");
    }
}

/// No index at all (deleted, or a table from before the index): rebuilt from every data file.
#[tokio::test]
async fn missing_index_is_rebuilt_from_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let s = dv_sink(dir.path()).with_file_limits(FileLimits {
        max_rows: 2,
        max_bytes: usize::MAX,
    });
    s.commit(&t, &[first_rows(3)], &cp(1)).await.unwrap();
    s.commit(&t, &[changes(&[upd(3, Some("c2"), 3), del(1)])], &cp(2))
        .await
        .unwrap();
    s.tables.settle_index(&t.id).await;
    drop(s);
    std::fs::remove_dir_all(dir.path().join("_cdcd")).unwrap();

    let s = dv_sink(dir.path());
    let st = s
        .commit(&t, &[changes(&[upd(3, None, 4), del(2), del(1)])], &cp(3))
        .await
        .unwrap();
    assert_eq!(st.deleted_rows, 2, "3 and 2; 1 was already deleted");
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(3, 'c2', 4)]");
    }
}

/// A truncate the index missed (behind the table) must not let it locate rows of dropped files.
#[tokio::test]
async fn index_behind_a_truncate_forgets_dropped_files() {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let s = dv_sink(dir.path());
    s.commit(&t, &[changes(&[ins(1, "a"), ins(2, "b")])], &cp(1))
        .await
        .unwrap();
    s.tables.settle_index(&t.id).await;
    let saved = dir.path().join("saved-index");
    copy_dir(&index_dir(dir.path()), &saved);
    let trunc = (Op::Truncate, 0, None, None, None);
    s.commit(&t, &[changes(&[trunc, ins(2, "b2")])], &cp(2))
        .await
        .unwrap();
    s.tables.settle_index(&t.id).await;
    drop(s);
    std::fs::remove_dir_all(index_dir(dir.path())).unwrap();
    copy_dir(&saved, &index_dir(dir.path()));

    let s = dv_sink(dir.path());
    let st = s
        .commit(&t, &[changes(&[del(1), upd(2, None, 7)])], &cp(3))
        .await
        .unwrap();
    assert_eq!(st.deleted_rows, 1, "only 2's row after the truncate");
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(2, 'b2', 7)]");
    }
}

/// Partial updates after a restart are completed from the row the reopened index points at,
/// including rows moved by key changes and rows in a file with a deletion vector.
#[tokio::test]
async fn partial_update_after_restart_is_completed_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let s = dv_sink(dir.path());
    s.commit(&t, &[first_rows(3)], &cp(1)).await.unwrap();
    s.commit(
        &t,
        &[changes(&[
            del(1),
            (Op::Update, 20, Some(2), Some("moved"), Some(200)),
        ])],
        &cp(2),
    )
    .await
    .unwrap();
    s.tables.settle_index(&t.id).await;
    drop(s);
    let s = dv_sink(dir.path());
    s.commit(
        &t,
        &[changes(&[upd(20, None, 201), upd(3, None, 301)])],
        &cp(3),
    )
    .await
    .unwrap();
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(3, 'c', 301), (20, 'moved', 201)]");
    }
    // The old key of the move is gone: completing it is refused.
    let err = s
        .commit(&t, &[changes(&[upd(2, None, 1)])], &cp(4))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("row not in table"), "{err}");
}

/// An open index that no longer covers the table's snapshot (another writer, or a publish whose
/// outcome was unknown) is reopened and caught up before it locates anything.
#[tokio::test]
async fn open_index_behind_another_writers_commit_is_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let a = dv_sink(dir.path());
    a.commit(&t, &[changes(&[ins(1, "a"), ins(2, "b")])], &cp(1))
        .await
        .unwrap();
    // One index writer at a time (in the daemon the lease sees to it).
    a.tables.settle_index(&t.id).await;
    let b = dv_sink(dir.path());
    b.commit(&t, &[changes(&[upd(1, Some("from-b"), 5)])], &cp(2))
        .await
        .unwrap();
    b.tables.settle_index(&t.id).await;
    // `a`'s cached metadata is stale: its publish conflicts, then the retry builds on `b`'s.
    let stale = a
        .commit(&t, &[changes(&[upd(1, None, 6)])], &cp(3))
        .await
        .unwrap_err();
    assert!(matches!(stale, SinkError::CommitConflict { .. }), "{stale}");
    let st = a
        .commit(&t, &[changes(&[upd(1, None, 6)])], &cp(3))
        .await
        .unwrap();
    assert_eq!(st.deleted_rows, 1, "b's row of 1");
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(1, 'from-b', 6), (2, 'b', 20)]");
    }
}

#[tokio::test]
async fn index_runs_are_written_with_per_block_filters() {
    // CPKIRUN3 (sinks/pk_index/meta.rs): what lets merges of an initial copy's runs copy blocks.
    let dir = tempfile::tempdir().unwrap();
    let s = dv_sink(dir.path());
    let t = schema();
    s.commit(&t, &[changes(&[ins(1, "a"), ins(2, "b")])], &cp(1))
        .await
        .unwrap();
    s.tables.settle_index(&t.id).await;
    let runs: Vec<_> = std::fs::read_dir(index_dir(dir.path()))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pki"))
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let bytes = std::fs::read(&runs[0]).unwrap();
    assert!(bytes.ends_with(b"CPKIRUN3"));
}
