//! Round trips on a temp warehouse, read back by independent readers (DuckDB's iceberg
//! extension, pyiceberg) from the testbed venv; without the venv those checks fail under CI or
//! `scripts/test.sh` and skip with a note elsewhere (`crate::test_ground`).

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_schema::DataType;

use super::*;
use crate::changelog::{Lsn, Op, Position, TableChangesBuilder};
use crate::config::DeleteMode;
use crate::test_fixtures::{
    changes, col, cp, del, first_rows, ins, run_reader, schema, table, test_bed, upd, without_key,
    C,
};

fn sink(dir: &Path, mode: DeleteMode) -> IcebergSink {
    let config = IcebergConfig {
        warehouse: format!("file://{}", dir.display()),
        namespace: None,
        delete_mode: mode,
        table_properties: Default::default(),
        maintenance_interval_ms: 0,
        catalog: Default::default(),
        tables: Default::default(),
    };
    IcebergSink::new(&config, "shop").unwrap()
}

/// Runs `code` in the testbed venv with `con` (DuckDB) ready; `None` when the venv is missing and
/// the check may skip ([`crate::test_ground`]: under CI or `scripts/test.sh` it fails instead).
fn python(code: &str) -> Option<String> {
    let bed = test_bed();
    let script = format!(
        "import sys, json\nsys.path.insert(0, '{bed}')\nfrom duck_load import connect\n{code}\n"
    );
    let out = run_reader("the independent-reader check (DuckDB, pyiceberg)", &script)?;
    Some(out.trim().to_owned())
}

/// DuckDB's rows of `iceberg_scan(table)`, ordered by the first column, as text. The progress
/// bar is off: on a loaded machine a scan passes its 2 s threshold and the bar lands in stdout.
fn duck(table: &str, columns: &str) -> Option<String> {
    python(&format!(
        "con = connect()\ncon.sql('SET enable_progress_bar = false')\nrows = con.sql(\"select {columns} from iceberg_scan('{table}') order by 1\").fetchall()\nprint(repr(rows))"
    ))
}

fn table_dir(dir: &Path) -> String {
    dir.join("public/t").display().to_string()
}

async fn inserts_updates_deletes_read_back_in_duckdb(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    // Two rows per data file, so a change to an already-written row needs a position delete.
    let s = sink(dir.path(), mode).with_file_limits(FileLimits {
        max_rows: 2,
        max_bytes: usize::MAX,
    });
    let t = schema();
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), None);

    let st = s.commit(&t, &[first_rows(3)], &cp(100)).await.unwrap();
    assert_eq!((st.data_rows, st.deleted_rows, st.files_written), (3, 0, 2));
    let td = table_dir(dir.path());
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(rows, "[(1, 'a', 10), (2, 'b', 20), (3, 'c', 30)]");
    }

    // Later commit: update of an earlier row (equality delete), insert + update of a new key in
    // one commit (row 4 lands in a closed file: position delete), delete, re-insert of a deleted
    // key, key change.
    let st = s
        .commit(
            &t,
            &[changes(&[
                upd(1, Some("a2"), 11),
                ins(4, "d"),
                ins(5, "e"),
                upd(4, Some("d2"), 41),
                del(2),
                ins(2, "b-again"),
                (Op::Update, 30, Some(3), Some("c-moved"), Some(300)),
            ])],
            &cp(200),
        )
        .await
        .unwrap();
    assert_eq!(
        st.deleted_rows, 4,
        "eq deletes 1, 2, 3 and one position delete"
    );
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(
            rows,
            "[(1, 'a2', 11), (2, 'b-again', 20), (4, 'd2', 41), (5, 'e', 50), (30, 'c-moved', 300)]"
        );
    }
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(200)));

    // A fresh sink (no cache) finds the newest metadata and continues (after the first one's
    // background index update: one index writer at a time, as the lease keeps it in the daemon).
    s.settle().await;
    let s2 = sink(dir.path(), mode);
    s2.commit(&t, &[changes(&[del(5)])], &cp(300))
        .await
        .unwrap();
    if let Some(rows) = duck(&td, "id") {
        assert_eq!(rows, "[(1,), (2,), (4,), (30,)]");
    }
    let status = s2.status(&t.id).await.unwrap().unwrap();
    assert_eq!(status.checkpoint, Some(cp(300)));
    assert!(status.location.ends_with("/public/t"));
    assert!(dir
        .path()
        .join("public/t/metadata/v4.metadata.json")
        .exists());
    let hint = std::fs::read_to_string(dir.path().join("public/t/metadata/version-hint.text"));
    assert_eq!(hint.unwrap(), "4");
}

async fn truncate_drops_earlier_rows(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    s.commit(&t, &[changes(&[ins(1, "a"), ins(2, "b")])], &cp(1))
        .await
        .unwrap();
    s.commit(&t, &[changes(&[upd(1, Some("x"), 1)])], &cp(2))
        .await
        .unwrap();
    let trunc = (Op::Truncate, 0, None, None, None);
    s.commit(&t, &[changes(&[ins(3, "c"), trunc, ins(4, "d")])], &cp(3))
        .await
        .unwrap();
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a") {
        assert_eq!(rows, "[(4, 'd')]");
    }
    let st = s.status(&t.id).await.unwrap().unwrap();
    assert_eq!(st.rows, Some(1));
}

async fn partial_updates_are_completed_from_the_table(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    s.commit(&t, &[first_rows(3)], &cp(1)).await.unwrap();
    // Row 2's current value comes from a later snapshot than its insert.
    s.commit(&t, &[changes(&[upd(2, Some("b2"), 22)])], &cp(2))
        .await
        .unwrap();
    // `a` absent: taken from the table (1, 2) or from this commit's earlier row (3).
    s.commit(
        &t,
        &[
            changes(&[upd(1, None, 100), upd(2, None, 200), upd(3, Some("c3"), 3)]),
            changes(&[upd(3, None, 300), upd(1, None, 101)]),
        ],
        &cp(3),
    )
    .await
    .unwrap();
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(1, 'a', 101), (2, 'b2', 200), (3, 'c3', 300)]");
    }
    // A key that is not in the table cannot be completed, and nothing is published.
    let err = s
        .commit(&t, &[changes(&[upd(9, None, 1)])], &cp(4))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("row not in table") && msg.contains('9'),
        "{msg}"
    );
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(3)));
}

async fn lookup_skips_rows_removed_by_position_deletes(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode).with_file_limits(FileLimits {
        max_rows: 1,
        max_bytes: usize::MAX,
    });
    let t = schema();
    // Both versions of row 1 carry the same sequence number; only the position delete tells
    // which one is current.
    let st = s
        .commit(
            &t,
            &[changes(&[ins(1, "old"), upd(1, Some("new"), 2)])],
            &cp(1),
        )
        .await
        .unwrap();
    assert_eq!(st.deleted_rows, 1);
    s.commit(&t, &[changes(&[upd(1, None, 3)])], &cp(2))
        .await
        .unwrap();
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, "[(1, 'new', 3)]");
    }
}

async fn empty_commit_publishes_the_checkpoint(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    let st = s.commit(&t, &[], &cp(42)).await.unwrap();
    assert_eq!(st.files_written, 0);
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(42)));
    let other = IcebergSink::new(
        &IcebergConfig {
            warehouse: format!("file://{}", dir.path().display()),
            namespace: None,
            delete_mode: mode,
            table_properties: Default::default(),
            maintenance_interval_ms: 0,
            catalog: Default::default(),
            tables: Default::default(),
        },
        "other",
    )
    .unwrap();
    assert_eq!(other.checkpoint(&t.id).await.unwrap(), None);
    if let Some(rows) = duck(&table_dir(dir.path()), "count(*)") {
        assert_eq!(rows, "[(0,)]");
    }
}

async fn schema_change_and_missing_key_are_refused(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    s.commit(&t, &[changes(&[ins(1, "a")])], &cp(1))
        .await
        .unwrap();
    let mut changed = (*t).clone();
    changed.columns[1].data_type = DataType::Int64;
    changed.columns.push(col("extra", DataType::Utf8));
    match s.commit(&Arc::new(changed), &[], &cp(2)).await {
        Err(SinkError::SchemaChanged { detail, .. }) => {
            assert!(
                detail.contains("column a") && detail.contains("extra"),
                "{detail}"
            )
        }
        other => panic!("{other:?}"),
    }
    // A keyed table that loses its key is a schema change, not a silent switch to appends.
    let mut keyless = (*t).clone();
    keyless.primary_key.clear();
    assert!(matches!(
        s.commit(&Arc::new(keyless), &[], &cp(2)).await,
        Err(SinkError::SchemaChanged { .. })
    ));
}

async fn stale_or_missing_hint_still_finds_the_newest_version(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let s = sink(dir.path(), mode);
    for lsn in 1..=3 {
        s.commit(&t, &[changes(&[ins(lsn as i64, "x")])], &cp(lsn))
            .await
            .unwrap();
    }
    let hint = dir.path().join("public/t/metadata/version-hint.text");
    std::fs::write(&hint, "2").unwrap();
    assert_eq!(
        sink(dir.path(), mode).checkpoint(&t.id).await.unwrap(),
        Some(cp(3))
    );
    std::fs::remove_file(&hint).unwrap();
    assert_eq!(
        sink(dir.path(), mode).checkpoint(&t.id).await.unwrap(),
        Some(cp(3))
    );
    // A second writer that loaded an older version conflicts instead of overwriting.
    std::fs::write(&hint, "4").unwrap();
    let stale = sink(dir.path(), mode);
    stale.checkpoint(&t.id).await.unwrap();
    s.commit(&t, &[changes(&[ins(10, "y")])], &cp(4))
        .await
        .unwrap();
    s.settle().await;
    assert!(matches!(
        stale.commit(&t, &[changes(&[ins(11, "z")])], &cp(5)).await,
        Err(SinkError::CommitConflict { version: 5, .. })
    ));
}

async fn pyiceberg_reads_position_deletes(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode).with_file_limits(FileLimits {
        max_rows: 1,
        max_bytes: usize::MAX,
    });
    let t = schema();
    s.commit(
        &t,
        &[changes(&[ins(1, "a"), ins(2, "b"), upd(1, Some("a2"), 5)])],
        &cp(1),
    )
    .await
    .unwrap();
    let meta = dir.path().join("public/t/metadata/v2.metadata.json");
    let code = format!(
        "from pyiceberg.table import StaticTable\nt = StaticTable.from_metadata('{}')\nprint(sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r['id']))",
        meta.display()
    );
    if let Some(out) = python(&code) {
        assert_eq!(
            out,
            "[{'id': 1, 'a': 'a2', 'b': 5}, {'id': 2, 'a': 'b', 'b': 20}]"
        );
    }
}

async fn memory_warehouse_round_trips(mode: DeleteMode) {
    let config = IcebergConfig {
        warehouse: "memory://".into(),
        namespace: Some("lake".into()),
        delete_mode: mode,
        table_properties: Default::default(),
        maintenance_interval_ms: 0,
        catalog: Default::default(),
        tables: Default::default(),
    };
    let s = IcebergSink::new(&config, "shop").unwrap();
    let t = schema();
    s.commit(&t, &[changes(&[ins(1, "a")])], &cp(1))
        .await
        .unwrap();
    s.commit(&t, &[changes(&[upd(1, None, 2)])], &cp(2))
        .await
        .unwrap();
    let st = s.status(&t.id).await.unwrap().unwrap();
    assert_eq!(st.checkpoint, Some(cp(2)));
    assert!(st.location.ends_with("/lake/t"), "{}", st.location);
}

/// `public.t` without a key, and whole-row changes of it: (op, id, a); b = id * 10.
fn keyless_changes(cs: &[(Op, i64, &'static str)]) -> (Arc<TableSchema>, TableChanges) {
    let t = without_key(&schema());
    let mut b = TableChangesBuilder::new(t.clone(), cs.len());
    for &(op, id, a) in cs {
        b.begin(op);
        for (col, v) in [(0, id), (2, id * 10)] {
            crate::test_fixtures::cell::<Int64Builder>(&mut b, col).append_value(v);
            if col == 0 {
                crate::test_fixtures::cell::<StringBuilder>(&mut b, 1).append_value(a);
            }
        }
        b.no_old_key().unwrap();
    }
    (t, b.finish().unwrap())
}

/// Issue 23: a keyless table's delete removes exactly one row equal to its whole image, from a
/// closed file of an earlier snapshot (a deletion vector on v3, a position delete on v2, never an
/// equality delete); more deletes than live copies fail the commit, which publishes nothing; a
/// fresh sink (no cache) continues exactly.
async fn multiset_deletes_remove_one_copy_each(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode).with_file_limits(FileLimits {
        max_rows: 2,
        max_bytes: usize::MAX,
    });
    let (ins, del) = (Op::Insert, Op::Delete);
    let (t, c) = keyless_changes(&[(ins, 1, "a"), (ins, 1, "a"), (ins, 1, "a"), (ins, 2, "b")]);
    s.commit(&t, &[c], &cp(1)).await.unwrap();
    // An update of one copy: delete (1, a) + insert (1, c).
    let (_, c) = keyless_changes(&[(del, 1, "a"), (ins, 1, "c")]);
    let st = s.commit(&t, &[c], &cp(2)).await.unwrap();
    assert_eq!(st.deleted_rows, 1);
    let td = table_dir(dir.path());
    let all = python(&format!(
        "con = connect()\ncon.sql('SET enable_progress_bar = false')\nrows = con.sql(\"select id, a, b from iceberg_scan('{td}') order by all\").fetchall()\nprint(repr(rows))"
    ));
    if let Some(rows) = all {
        assert_eq!(
            rows,
            "[(1, 'a', 10), (1, 'a', 10), (1, 'c', 10), (2, 'b', 20)]"
        );
    }
    // Three deletes of the two remaining copies: refused, nothing published.
    let (_, c) = keyless_changes(&[(del, 1, "a"), (del, 1, "a"), (del, 1, "a")]);
    match s.commit(&t, &[c], &cp(3)).await {
        Err(SinkError::Data { detail, .. }) => {
            assert!(detail.contains("does not hold"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(2)));
    let s2 = sink(dir.path(), mode);
    let (_, c) = keyless_changes(&[(del, 1, "a"), (del, 2, "b"), (ins, 2, "b"), (del, 1, "a")]);
    s2.commit(&t, &[c], &cp(4)).await.unwrap();
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(rows, "[(1, 'c', 10), (2, 'b', 20)]");
    }
    let eq = std::fs::read_dir(dir.path().join("public/t/data"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("eq-deletes"))
        .count();
    assert_eq!(eq, 0, "an equality delete would remove every copy");
}

/// `cdcd status` showed 0 bytes for every Iceberg table: snapshots carried no
/// `total-files-size`. The total is the live files' bytes, and a snapshot without it (written
/// before cdcd kept it) is counted from its manifests.
async fn status_counts_the_bytes_of_the_live_files(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    s.commit(&t, &[changes(&[ins(1, "a"), ins(2, "b")])], &cp(1))
        .await
        .unwrap();
    s.commit(&t, &[changes(&[ins(3, "c")])], &cp(2))
        .await
        .unwrap();
    let data_dir = dir.path().join("public/t/data");
    let on_disk: u64 = std::fs::read_dir(&data_dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk > 0);
    let bytes = |st: TableStatus| st.files.unwrap().live_bytes;
    assert_eq!(bytes(s.status(&t.id).await.unwrap().unwrap()), on_disk);

    // Deletes and an update add delete files and a data file.
    s.commit(&t, &[changes(&[del(1), upd(3, Some("c2"), 33)])], &cp(3))
        .await
        .unwrap();
    let after = bytes(s.status(&t.id).await.unwrap().unwrap());
    assert!(after > on_disk, "{after} <= {on_disk}");

    // The same table as an older cdcd left it: no total in the snapshot summary.
    s.settle().await;
    let metadata_dir = dir.path().join("public/t/metadata");
    let newest = (1..)
        .map(|v| metadata_dir.join(format!("v{v}.metadata.json")))
        .take_while(|p| p.exists())
        .last()
        .unwrap();
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&newest).unwrap()).unwrap();
    let current = meta["current-snapshot-id"].clone();
    for snapshot in meta["snapshots"].as_array_mut().unwrap() {
        if snapshot["snapshot-id"] == current {
            let summary = snapshot["summary"].as_object_mut().unwrap();
            assert!(summary.remove("total-files-size").is_some());
        }
    }
    std::fs::write(&newest, serde_json::to_vec(&meta).unwrap()).unwrap();
    let fresh = sink(dir.path(), mode);
    assert_eq!(bytes(fresh.status(&t.id).await.unwrap().unwrap()), after);
    // Its next commit counts the total from the live files again.
    fresh
        .commit(&t, &[changes(&[ins(4, "d")])], &cp(4))
        .await
        .unwrap();
    let last = bytes(fresh.status(&t.id).await.unwrap().unwrap());
    assert!(last > after, "{last} <= {after}");
}

/// Runs each round trip in both delete modes: `equality::x` (v2) and `dv::x` (v3).
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {
        mod equality {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::DeleteMode::Equality).await
            })*
        }
        mod dv {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::DeleteMode::DeletionVectors).await
            })*
        }
    };
}

both_modes!(
    inserts_updates_deletes_read_back_in_duckdb,
    truncate_drops_earlier_rows,
    partial_updates_are_completed_from_the_table,
    lookup_skips_rows_removed_by_position_deletes,
    empty_commit_publishes_the_checkpoint,
    schema_change_and_missing_key_are_refused,
    stale_or_missing_hint_still_finds_the_newest_version,
    pyiceberg_reads_position_deletes,
    memory_warehouse_round_trips,
    multiset_deletes_remove_one_copy_each,
    status_counts_the_bytes_of_the_live_files
);

mod format_v3;

mod types;

mod index;

mod compaction;
mod conflict;
mod maintenance;
mod merge;
mod requests;
mod resync;

/// Issue 17.3: a commit that loses its race to a newer lease holder (a higher
/// `cdcd.lease-epoch` in the winning snapshot) breaks this daemon's fence for every table; one
/// that loses to an older holder's late commit is a plain conflict.
#[tokio::test]
async fn losing_to_a_newer_lease_epoch_breaks_the_fence() {
    let dir = tempfile::tempdir().unwrap();
    let t = schema();
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(3600);
    let fenced = |epoch| {
        let fence = crate::storage::Fence::new("shop", epoch, far);
        let wh = Warehouse::from_url(&format!("file://{}", dir.path().display()))
            .unwrap()
            .fenced(fence.clone());
        (
            sink(dir.path(), DeleteMode::DeletionVectors).with_warehouse(wh),
            fence,
        )
    };
    let (old, old_fence) = fenced(1);
    old.commit(&t, &[changes(&[ins(1, "x")])], &cp(1))
        .await
        .unwrap();
    old.settle().await;
    let (new, new_fence) = fenced(2);
    new.checkpoint(&t.id).await.unwrap();
    new.commit(&t, &[changes(&[ins(2, "y")])], &cp(2))
        .await
        .unwrap();
    new.settle().await;
    let loaded = new.tables.load(&t.id).await.unwrap().unwrap();
    let summary = &loaded.metadata.current_snapshot().unwrap().summary();
    assert_eq!(
        summary
            .additional_properties
            .get(crate::checkpoint::LEASE_EPOCH_KEY)
            .map(String::as_str),
        Some("2")
    );

    let err = old
        .commit(&t, &[changes(&[ins(3, "z")])], &cp(3))
        .await
        .unwrap_err();
    assert!(matches!(err, SinkError::Fenced(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("lost the lease") && text.contains("epoch 2"),
        "{text}"
    );
    assert!(old_fence.check().is_err());

    // An epoch-1 commit landing late (the fence's remaining window) is a conflict for the
    // newer holder, not a reason to stop.
    let (late, _) = fenced(1);
    late.checkpoint(&t.id).await.unwrap();
    late.commit(&t, &[changes(&[ins(4, "w")])], &cp(4))
        .await
        .unwrap();
    late.settle().await;
    assert!(matches!(
        new.commit(&t, &[changes(&[ins(5, "v")])], &cp(5)).await,
        Err(SinkError::CommitConflict { .. })
    ));
    new_fence.check().unwrap();
}
