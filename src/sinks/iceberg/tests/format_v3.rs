//! Format v3 specifics: deletion vectors merged across commits, one DV per data file, old DV
//! entries removed, row lineage, and the Puffin/manifest fields independent readers rely on.

use super::*;

fn dv_sink(dir: &Path) -> IcebergSink {
    sink(dir, DeleteMode::DeletionVectors)
}

fn metadata(dir: &Path, version: u64) -> serde_json::Value {
    let text =
        std::fs::read_to_string(dir.join(format!("public/t/metadata/v{version}.metadata.json")))
            .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Live delete files of the current snapshot of a freshly loaded table.
async fn live_deletes(s: &IcebergSink) -> Vec<iceberg::spec::DataFile> {
    let t = schema();
    let loaded = s.tables.load(&t.id).await.unwrap().unwrap();
    let snap = loaded.metadata.current_snapshot().unwrap();
    let ms = files::manifest::load_manifests(
        &s.tables.warehouse,
        snap.manifest_list(),
        loaded.metadata.format_version(),
    )
    .await
    .unwrap();
    let files = files::manifest::load_files(&s.tables.warehouse, &ms)
        .await
        .unwrap();
    assert!(
        files.equality_deletes.is_empty(),
        "v3 writes no equality deletes"
    );
    files.position_deletes.into_iter().map(|f| f.file).collect()
}

fn pyiceberg(meta: &Path) -> Option<String> {
    python(&format!(
        "from pyiceberg.table import StaticTable\nt = StaticTable.from_metadata('{}')\nprint(sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r['id']))",
        meta.display()
    ))
}

#[tokio::test]
async fn existing_dv_is_merged_and_its_entry_removed() {
    let dir = tempfile::tempdir().unwrap();
    let s = dv_sink(dir.path());
    let t = schema();
    let td = table_dir(dir.path());
    s.commit(&t, &[first_rows(4)], &cp(1)).await.unwrap();
    assert_eq!(metadata(dir.path(), 2)["format-version"], 3);
    // First DV on the file: row 1 updated, row 2 deleted.
    let st = s
        .commit(&t, &[changes(&[upd(1, Some("a2"), 11), del(2)])], &cp(2))
        .await
        .unwrap();
    assert_eq!(st.deleted_rows, 2);
    let dvs = live_deletes(&s).await;
    assert_eq!(dvs.len(), 1);
    assert_eq!(dvs[0].record_count(), 2);
    // Second DV on the same file: merged (3 positions), the old entry is gone.
    let st = s.commit(&t, &[changes(&[del(3)])], &cp(3)).await.unwrap();
    assert_eq!(st.deleted_rows, 1);
    let dvs = live_deletes(&s).await;
    assert_eq!(dvs.len(), 1, "one DV per data file: {dvs:?}");
    let dv = &dvs[0];
    assert_eq!(dv.record_count(), 3);
    assert_eq!(dv.file_format(), iceberg::spec::DataFileFormat::Puffin);
    assert!(dv
        .referenced_data_file()
        .unwrap()
        .ends_with("-00000.parquet"));
    // content_offset/size point at a valid blob (PFA1 magic before it, DV magic inside it).
    let bytes = std::fs::read(dv.file_path().strip_prefix("file://").unwrap()).unwrap();
    let off = dv.content_offset().unwrap() as usize;
    let len = dv.content_size_in_bytes().unwrap() as usize;
    assert_eq!(&bytes[..4], b"PFA1");
    assert_eq!(&bytes[off + 4..off + 8], &[0xD1, 0xD3, 0x39, 0x64]);
    assert_eq!(
        u32::from_be_bytes(bytes[off..off + 4].try_into().unwrap()) as usize + 8,
        len
    );
    let status = s.status(&t.id).await.unwrap().unwrap();
    assert_eq!(status.rows, Some(2));
    // Row lineage: 4 + 1 rows were assigned ids.
    let m = metadata(dir.path(), 4);
    assert_eq!(m["next-row-id"], 5);
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(rows, "[(1, 'a2', 11), (4, 'd', 40)]");
    }
    let meta = dir.path().join("public/t/metadata/v4.metadata.json");
    if let Some(out) = pyiceberg(&meta) {
        assert_eq!(
            out,
            "[{'id': 1, 'a': 'a2', 'b': 11}, {'id': 4, 'a': 'd', 'b': 40}]"
        );
    }
}

#[tokio::test]
async fn delete_reinsert_key_change_and_partial_update_over_a_dv() {
    let dir = tempfile::tempdir().unwrap();
    let s = dv_sink(dir.path()).with_file_limits(FileLimits {
        max_rows: 2,
        max_bytes: usize::MAX,
    });
    let t = schema();
    let td = table_dir(dir.path());
    s.commit(&t, &[first_rows(3)], &cp(1)).await.unwrap();
    // Delete + re-insert, key change 3 → 30, and an insert + update in one commit whose first
    // version sits in a closed file (DV on this commit's own file).
    s.commit(
        &t,
        &[changes(&[
            del(2),
            ins(2, "b-again"),
            (Op::Update, 30, Some(3), Some("c-moved"), Some(300)),
            ins(4, "d"),
            ins(5, "e"),
            upd(4, Some("d2"), 41),
        ])],
        &cp(2),
    )
    .await
    .unwrap();
    // Partial update completed from row 1, whose file has a DV (row 2's old version), and of
    // row 4 whose file has a DV on its first position.
    s.commit(
        &t,
        &[changes(&[upd(1, None, 100), upd(4, None, 400)])],
        &cp(3),
    )
    .await
    .unwrap();
    assert!(live_deletes(&s)
        .await
        .iter()
        .all(|f| f.referenced_data_file().is_some()));
    let want =
        "[(1, 'a', 100), (2, 'b-again', 20), (4, 'd2', 400), (5, 'e', 50), (30, 'c-moved', 300)]";
    if let Some(rows) = duck(&td, "id, a, b") {
        assert_eq!(rows, want);
    }
    let meta = dir.path().join("public/t/metadata/v4.metadata.json");
    if let Some(out) = pyiceberg(&meta) {
        assert_eq!(
            out,
            "[{'id': 1, 'a': 'a', 'b': 100}, {'id': 2, 'a': 'b-again', 'b': 20}, {'id': 4, 'a': 'd2', 'b': 400}, {'id': 5, 'a': 'e', 'b': 50}, {'id': 30, 'a': 'c-moved', 'b': 300}]"
        );
    }
    // Truncate drops rows and DVs alike.
    let trunc = (Op::Truncate, 0, None, None, None);
    s.commit(&t, &[changes(&[trunc, ins(7, "g")])], &cp(4))
        .await
        .unwrap();
    assert!(live_deletes(&s).await.is_empty());
    if let Some(rows) = duck(&td, "id, a") {
        assert_eq!(rows, "[(7, 'g')]");
    }
    assert_eq!(s.status(&t.id).await.unwrap().unwrap().rows, Some(1));
}

#[tokio::test]
async fn deleting_a_key_that_is_not_there_writes_no_dv() {
    let dir = tempfile::tempdir().unwrap();
    let s = dv_sink(dir.path());
    let t = schema();
    s.commit(&t, &[changes(&[ins(1, "a")])], &cp(1))
        .await
        .unwrap();
    let st = s.commit(&t, &[changes(&[del(9)])], &cp(2)).await.unwrap();
    assert_eq!((st.deleted_rows, st.files_written), (0, 0));
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(2)));
}
