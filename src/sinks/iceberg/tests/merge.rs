//! Manifest merging at commit (issue 19) on a temp warehouse, both formats: the current
//! snapshot's manifest list stays bounded; merged manifests hold their inputs' live entries as
//! EXISTING with each entry's snapshot id, sequence numbers and (v3) first row id kept; the table
//! reads the same as one written without merging (DuckDB); expiry after merges deletes exactly
//! what no retained snapshot reaches; a cold sink commits on.

use iceberg::spec::{FormatVersion, Manifest, ManifestFile, ManifestStatus, TableMetadata};

use super::maintenance::{commits, files_on_disk, is_metadata_file, seed, sink_with};
use super::*;
use crate::sinks::iceberg::cleanup::referenced_files;
use crate::sinks::iceberg::files::manifest::{load_manifests, read};

async fn current_manifests(s: &IcebergSink, meta: &TableMetadata) -> Vec<ManifestFile> {
    let snap = meta.current_snapshot().unwrap();
    load_manifests(
        &s.tables.warehouse,
        snap.manifest_list(),
        meta.format_version(),
    )
    .await
    .unwrap()
}

/// Checks every entry of the current snapshot's manifests: the manifest list's counts match the
/// entries; an entry from an earlier snapshot is EXISTING with that snapshot's sequence number
/// (data and file); v3 data rows' id ranges are explicit in merged manifests and never overlap.
/// Returns how many entries sit in merged manifests.
async fn check_entries(s: &IcebergSink, meta: &TableMetadata) -> usize {
    let mut merged_entries = 0;
    let mut row_ranges = Vec::new();
    for m in current_manifests(s, meta).await {
        let bytes = read(&s.tables.warehouse, &m.manifest_path).await.unwrap();
        let parsed = Manifest::parse_avro(&bytes).unwrap();
        let count = |st: ManifestStatus| {
            let es = parsed.entries().iter().filter(|e| e.status() == st);
            (
                es.clone().count() as u32,
                es.map(|e| e.data_file().record_count()).sum::<u64>(),
            )
        };
        assert_eq!(
            (m.added_files_count, m.added_rows_count),
            (
                Some(count(ManifestStatus::Added).0),
                Some(count(ManifestStatus::Added).1)
            ),
            "{}",
            m.manifest_path
        );
        assert_eq!(
            (m.existing_files_count, m.existing_rows_count),
            (
                Some(count(ManifestStatus::Existing).0),
                Some(count(ManifestStatus::Existing).1)
            )
        );
        assert_eq!(
            m.deleted_files_count,
            Some(0),
            "no DELETED entry is carried"
        );
        let merged = m.manifest_path.contains("-g");
        for e in parsed.entries() {
            let id = e.snapshot_id().unwrap_or(m.added_snapshot_id);
            let seq = e.sequence_number().unwrap_or(m.sequence_number);
            let file_seq = e.file_sequence_number.unwrap_or(m.sequence_number);
            // (After expiry the snapshot that wrote an entry may be gone.)
            if let Some(written_by) = meta.snapshot_by_id(id) {
                let n = written_by.sequence_number();
                // A v2 compaction's outputs keep its starting data sequence number
                // (maintenance/compaction/equality.rs); their file sequence number is its own.
                let v2_rewrite = written_by.summary().operation
                    == iceberg::spec::Operation::Replace
                    && meta.format_version() < FormatVersion::V3;
                if v2_rewrite {
                    assert!(seq < n && file_seq == n, "{m:?}");
                } else {
                    assert_eq!((seq, file_seq), (n, n), "{m:?}");
                }
            }
            if merged {
                merged_entries += 1;
                assert_eq!(e.status(), ManifestStatus::Existing);
                assert_ne!(id, m.added_snapshot_id, "entries keep their snapshot");
            }
            let f = e.data_file();
            if meta.format_version() >= FormatVersion::V3
                && f.content_type() == iceberg::spec::DataContentType::Data
            {
                let first = match f.first_row_id() {
                    Some(r) => r as u64,
                    None => {
                        assert!(!merged, "merged entries name their row ids");
                        continue;
                    }
                };
                row_ranges.push((first, first + f.record_count()));
            }
        }
    }
    row_ranges.sort();
    for w in row_ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "row id ranges overlap: {w:?}");
    }
    merged_entries
}

async fn merging_bounds_the_list_and_keeps_entries(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let plain_dir = tempfile::tempdir().unwrap();
    let props = [
        ("commit.manifest.min-count-to-merge", "5"),
        ("history.expire.min-snapshots-to-keep", "3"),
        ("history.expire.max-snapshot-age-ms", "1"),
        ("cdcd.expiry.delete-delay-ms", "0"),
    ];
    let s = sink_with(dir.path(), mode, &props);
    let plain = sink_with(
        plain_dir.path(),
        mode,
        &[("commit.manifest-merge.enabled", "false")],
    );
    let t = schema();
    for sink in [&s, &plain] {
        seed(sink).await;
        commits(sink, 0, 30).await;
        sink.settle().await;
    }
    let meta = s
        .tables
        .load(&t.id)
        .await
        .unwrap()
        .unwrap()
        .metadata
        .clone();
    let plain_meta = plain
        .tables
        .load(&t.id)
        .await
        .unwrap()
        .unwrap()
        .metadata
        .clone();
    let merged_list = current_manifests(&s, &meta).await.len();
    let plain_list = current_manifests(&plain, &plain_meta).await.len();
    eprintln!("manifests in the current snapshot: {merged_list} merged, {plain_list} unmerged");
    // Per kind: this commit's own, fewer than 5 waiting, and the merged one.
    assert!(merged_list <= 2 * (1 + 4 + 1), "{merged_list}");
    assert!(plain_list > 30, "{plain_list}");
    let merges = meta
        .snapshots()
        .filter(|s| {
            s.summary()
                .additional_properties
                .contains_key("manifests-created")
        })
        .count();
    assert!(merges >= 4, "{merges} merging commits");
    assert!(check_entries(&s, &meta).await > 0);
    check_entries(&plain, &plain_meta).await;
    let rows = duck(&table_dir(dir.path()), "id, a, b");
    assert_eq!(rows, duck(&table_dir(plain_dir.path()), "id, a, b"));

    // Expiry after merges: manifests merged away are deleted once no retained snapshot lists
    // them, and every file a retained one reaches stays.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let r = s.maintain(None).await.unwrap();
    assert_eq!((r[0].snapshots, r[0].error.clone()), (3, None), "{r:?}");
    let live = referenced_files(&s.tables.warehouse, &s.table_location(&t.id))
        .await
        .unwrap();
    let disk = files_on_disk(dir.path());
    assert!(live.is_subset(&disk), "{:?}", live.difference(&disk));
    let orphans: Vec<_> = disk
        .difference(&live)
        .filter(|p| !is_metadata_file(p))
        .collect();
    assert!(orphans.is_empty(), "{orphans:?}");
    assert_eq!(duck(&table_dir(dir.path()), "id, a, b"), rows);

    // A cold sink (live state read from the merged manifests) and the warm one commit on alike.
    commits(&s, 40, 3).await;
    commits(&plain, 40, 3).await;
    s.settle().await;
    let cold = sink_with(dir.path(), mode, &props);
    commits(&cold, 50, 8).await;
    commits(&plain, 50, 8).await;
    cold.settle().await;
    plain.settle().await;
    let meta = cold
        .tables
        .load(&t.id)
        .await
        .unwrap()
        .unwrap()
        .metadata
        .clone();
    check_entries(&cold, &meta).await;
    assert_eq!(
        duck(&table_dir(dir.path()), "id, a, b"),
        duck(&table_dir(plain_dir.path()), "id, a, b")
    );
}

/// Manifests merged away by a commit are still named by the snapshots before it; expiry keeps
/// them while one of those is retained (the reachability is by path: `reachable.rs`).
async fn expiry_keeps_merged_away_manifests_an_older_snapshot_needs(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink_with(
        dir.path(),
        mode,
        &[
            ("commit.manifest.min-count-to-merge", "3"),
            ("history.expire.min-snapshots-to-keep", "2"),
            ("history.expire.max-snapshot-age-ms", "1"),
            ("cdcd.expiry.delete-delay-ms", "0"),
            // Expiry alone: on v2 a cycle's compaction would commit a snapshot of its own
            // (converting the equality deletes), and the parent would no longer be retained.
            ("cdcd.compaction.enabled", "false"),
        ],
    );
    let t = schema();
    seed(&s).await;
    // Commit until the newest commit merged: its parent's manifests were merged away.
    let mut merged_by = None;
    for i in 0..20 {
        commits(&s, i, 1).await;
        let meta = s
            .tables
            .load(&t.id)
            .await
            .unwrap()
            .unwrap()
            .metadata
            .clone();
        let snap = meta.current_snapshot().unwrap();
        if snap
            .summary()
            .additional_properties
            .contains_key("manifests-created")
        {
            merged_by = Some(meta);
            break;
        }
    }
    let meta = merged_by.expect("a commit merged");
    let parent = meta
        .snapshot_by_id(
            meta.current_snapshot()
                .unwrap()
                .parent_snapshot_id()
                .unwrap(),
        )
        .unwrap();
    let parent_manifests: Vec<String> = load_manifests(
        &s.tables.warehouse,
        parent.manifest_list(),
        meta.format_version(),
    )
    .await
    .unwrap()
    .into_iter()
    .map(|m| m.manifest_path)
    .collect();
    let current: Vec<String> = current_manifests(&s, &meta)
        .await
        .into_iter()
        .map(|m| m.manifest_path)
        .collect();
    let merged_away: Vec<&String> = parent_manifests
        .iter()
        .filter(|p| !current.contains(p))
        .collect();
    assert!(merged_away.len() >= 3, "{merged_away:?}");
    let exists = |p: &str| std::path::Path::new(p.trim_start_matches("file://")).exists();
    s.settle().await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    // The parent is retained (min 2): its merged-away manifests stay.
    s.maintain(None).await.unwrap();
    assert!(merged_away.iter().all(|p| exists(p)), "{merged_away:?}");
    // Two more commits: the parent expires, and so do the manifests only it named.
    commits(&s, 100, 2).await;
    s.settle().await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    s.maintain(None).await.unwrap();
    assert!(merged_away.iter().all(|p| !exists(p)), "{merged_away:?}");
}

/// A commit that loses its version to another writer after merging from its stale base: its
/// merged manifest is never named, the retry merges from the winner's list, and no row of the
/// winner's commit is lost (DuckDB equal to the same changes applied by one writer).
async fn a_conflict_never_publishes_a_merge_of_a_stale_list(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let plain_dir = tempfile::tempdir().unwrap();
    let props = [("commit.manifest.min-count-to-merge", "3")];
    let a = sink_with(dir.path(), mode, &props);
    let one = sink_with(plain_dir.path(), mode, &props);
    let t = schema();
    for s in [&a, &one] {
        seed(s).await;
        commits(s, 0, 2).await;
        s.settle().await;
    }
    // Another writer commits on top; `a` still holds the version before it.
    let b = sink_with(dir.path(), mode, &props);
    b.commit(&t, &[changes(&[ins(500, "b")])], &cp(1500))
        .await
        .unwrap();
    b.settle().await;
    let late = [changes(&[ins(501, "a"), upd(1, Some("a"), 7)])];
    let lost = a.commit(&t, &late, &cp(1501)).await;
    assert!(
        matches!(lost, Err(SinkError::CommitConflict { .. })),
        "{:?}",
        lost.err()
    );
    a.commit(&t, &late, &cp(1501)).await.unwrap();
    a.settle().await;
    for (changes, lsn) in [
        (vec![changes(&[ins(500, "b")])], 1500),
        (late.to_vec(), 1501),
    ] {
        one.commit(&t, &changes, &cp(lsn)).await.unwrap();
    }
    one.settle().await;
    let live = referenced_files(&a.tables.warehouse, &a.table_location(&t.id))
        .await
        .unwrap();
    let stale: Vec<String> = files_on_disk(dir.path())
        .into_iter()
        .filter(|p| p.contains("-g") && p.ends_with(".avro") && !live.contains(p))
        .collect();
    assert!(!stale.is_empty(), "the lost attempt merged (an orphan)");
    let disk = files_on_disk(dir.path());
    assert!(live.is_subset(&disk), "{:?}", live.difference(&disk));
    let meta = a
        .tables
        .load(&t.id)
        .await
        .unwrap()
        .unwrap()
        .metadata
        .clone();
    check_entries(&a, &meta).await;
    let rows = duck(&table_dir(dir.path()), "id, a, b");
    assert!(
        rows.as_ref().is_none_or(|r| r.contains("(500, 'b'")),
        "{rows:?}"
    );
    assert_eq!(rows, duck(&table_dir(plain_dir.path()), "id, a, b"));
}

both_modes!(
    a_conflict_never_publishes_a_merge_of_a_stale_list,
    merging_bounds_the_list_and_keeps_entries,
    expiry_keeps_merged_away_manifests_an_older_snapshot_needs,
);
