//! Maintenance on a temp warehouse (both formats): expiry keeps exactly what the properties say
//! and deletes only files no retained snapshot reaches; the metadata log stays bounded and the
//! files that left it are deleted, leftovers swept; DuckDB reads the table after each step.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::*;
use crate::sinks::iceberg::cleanup::referenced_files;

pub(super) fn sink_with(dir: &Path, mode: DeleteMode, props: &[(&str, &str)]) -> IcebergSink {
    let config = IcebergConfig {
        warehouse: format!("file://{}", dir.display()),
        namespace: None,
        delete_mode: mode,
        table_properties: props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        maintenance_interval_ms: 0,
        catalog: Default::default(),
        tables: Default::default(),
    };
    IcebergSink::new(&config, "shop").unwrap()
}

/// Every file under the table directory, as store paths (like `referenced_files`).
pub(super) fn files_on_disk(dir: &Path) -> HashSet<String> {
    fn walk(d: &Path, out: &mut HashSet<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.insert(p.display().to_string().trim_start_matches('/').to_owned());
            }
        }
    }
    let mut out = HashSet::new();
    walk(&dir.join("public/t"), &mut out);
    out
}

pub(super) fn is_metadata_file(p: &str) -> bool {
    p.ends_with(".metadata.json") || p.ends_with("version-hint.text")
}

/// `n` commits, each inserting one row, updating two and deleting one (deletes, replaced
/// vectors and rewritten manifests in the history).
pub(super) async fn commits(s: &IcebergSink, from: i64, n: i64) {
    let t = schema();
    for i in from..from + n {
        let cs = [
            ins(100 + i, "new"),
            upd(i % 5, Some("u"), i),
            upd(i % 5 + 5, Some("u"), i),
            del(50 + i),
        ];
        s.commit(&t, &[changes(&cs)], &cp(1000 + i as u64))
            .await
            .unwrap();
    }
}

pub(super) async fn seed(s: &IcebergSink) {
    let rows: Vec<C> = (0..60).map(|i| ins(i, "seed")).collect();
    s.commit(&schema(), &[changes(&rows)], &cp(1))
        .await
        .unwrap();
}

/// The rows `seed` + `commits(from, n)` leave, as DuckDB prints them (`(id, 'a', b)`).
#[derive(Default)]
pub(super) struct Model(pub(super) BTreeMap<i64, (&'static str, i64)>);

impl Model {
    pub(super) fn seeded() -> Model {
        Model((0..60).map(|i| (i, ("seed", i * 10))).collect())
    }

    pub(super) fn commits(&mut self, from: i64, n: i64) {
        for i in from..from + n {
            self.0.insert(100 + i, ("new", (100 + i) * 10));
            self.0.insert(i % 5, ("u", i));
            self.0.insert(i % 5 + 5, ("u", i));
            self.0.remove(&(50 + i));
        }
    }

    pub(super) fn text(&self) -> String {
        let rows: Vec<String> = self
            .0
            .iter()
            .map(|(id, (a, b))| format!("({id}, '{a}', {b})"))
            .collect();
        format!("[{}]", rows.join(", "))
    }
}

async fn expiry_keeps_the_newest_and_deletes_only_what_they_do_not_reach(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink_with(
        dir.path(),
        mode,
        &[
            ("history.expire.min-snapshots-to-keep", "3"),
            ("history.expire.max-snapshot-age-ms", "1"),
            ("cdcd.expiry.delete-delay-ms", "0"),
            // Expiry alone (compaction would add a snapshot; tests/compaction.rs has both).
            ("cdcd.compaction.enabled", "false"),
        ],
    );
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 8).await;
    s.settle().await;
    let before = s.tables.load(&t.id).await.unwrap().unwrap();
    let mut chain: Vec<_> = before.metadata.snapshots().cloned().collect();
    chain.sort_by_key(|s| s.sequence_number());
    assert_eq!(chain.len(), 9);
    let rows_before = duck(&table_dir(dir.path()), "id, a, b");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;

    let reports = s.maintain(Some(std::slice::from_ref(&t.id))).await.unwrap();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(
        (r.snapshots_expired, r.snapshots, r.error.clone()),
        (6, 3, None)
    );
    assert!(r.files_deleted > 0, "{r:?}");

    let after = s.tables.load(&t.id).await.unwrap().unwrap();
    let kept: Vec<i64> = {
        let mut k: Vec<_> = after.metadata.snapshots().cloned().collect();
        k.sort_by_key(|s| s.sequence_number());
        k.iter().map(|s| s.snapshot_id()).collect()
    };
    let newest: Vec<i64> = chain[6..].iter().map(|s| s.snapshot_id()).collect();
    assert_eq!(kept, newest);
    assert_eq!(after.version, before.version + 1);
    // Every file a retained snapshot reaches exists; nothing else but metadata files is left.
    let wh = s.tables.warehouse.clone();
    let live = referenced_files(&wh, &s.table_location(&t.id))
        .await
        .unwrap();
    let disk = files_on_disk(dir.path());
    let missing: Vec<_> = live.difference(&disk).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    let orphans: Vec<_> = disk
        .difference(&live)
        .filter(|p| !is_metadata_file(p))
        .collect();
    assert!(orphans.is_empty(), "unreachable files left: {orphans:?}");
    // The table reads the same, and commits go on from the expired metadata.
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(Some(rows), rows_before);
    }
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(1007)));
    commits(&s, 20, 2).await;
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(1021)));
    // Nothing left to expire beyond the minimum: a second cycle expires the two older ones only.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let again = s.maintain(None).await.unwrap();
    assert_eq!(again[0].snapshots_expired, 2, "{again:?}");
    assert_eq!(again[0].snapshots, 3);
    // A fresh sink (cold caches) agrees and commits on.
    s.settle().await;
    let s2 = sink(dir.path(), mode);
    commits(&s2, 40, 1).await;
    assert_eq!(s2.checkpoint(&t.id).await.unwrap(), Some(cp(1040)));
}

async fn the_default_age_expires_nothing_young(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    // Expiry alone: on v2 a cycle's compaction would commit a snapshot of its own (converting
    // the equality deletes).
    let s = sink_with(dir.path(), mode, &[("cdcd.compaction.enabled", "false")]);
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 3).await;
    let meta = s.tables.load(&t.id).await.unwrap().unwrap();
    let props = meta.metadata.properties();
    assert_eq!(
        props
            .get("history.expire.max-snapshot-age-ms")
            .map(String::as_str),
        Some("60000")
    );
    assert_eq!(
        props.get("cdcd.expiry.delete-delay-ms").map(String::as_str),
        Some("240000")
    );
    assert_eq!(
        props
            .get("write.metadata.delete-after-commit.enabled")
            .map(String::as_str),
        Some("true")
    );
    let r = s.maintain(None).await.unwrap();
    assert_eq!((r[0].snapshots_expired, r[0].snapshots), (0, 4), "{r:?}");
    assert_eq!(
        s.tables.load(&t.id).await.unwrap().unwrap().version,
        meta.version
    );
}

/// The files only expired snapshots reached outlive the expiry by the delete delay (a reader's
/// scan planned on one still finds them), then go, also when the process that expired them is
/// gone (a new sink finds the record of pending deletions).
async fn expired_files_wait_for_the_delete_delay(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let props = [
        ("history.expire.min-snapshots-to-keep", "2"),
        ("history.expire.max-snapshot-age-ms", "1"),
        ("cdcd.expiry.delete-delay-ms", "1500"),
        ("cdcd.compaction.enabled", "false"),
    ];
    let s = sink_with(dir.path(), mode, &props);
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 6).await;
    s.settle().await;
    let wh = s.tables.warehouse.clone();
    let location = s.table_location(&t.id);
    let reached_before = referenced_files(&wh, &location).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;

    let r = s.maintain(None).await.unwrap();
    assert_eq!(
        (r[0].snapshots_expired, r[0].files_deleted),
        (5, 0),
        "{r:?}"
    );
    let disk = files_on_disk(dir.path());
    let gone: Vec<_> = reached_before.difference(&disk).collect();
    assert!(gone.is_empty(), "deleted before the delay: {gone:?}");
    let live = referenced_files(&wh, &location).await.unwrap();
    let waiting: HashSet<_> = disk
        .difference(&live)
        .filter(|p| !is_metadata_file(p))
        .cloned()
        .collect();
    assert!(!waiting.is_empty(), "the expiry doomed nothing");
    // Not due yet: a cycle deletes nothing.
    let r = s.maintain(None).await.unwrap();
    assert_eq!(r[0].files_deleted, 0, "{r:?}");

    // Another process (the first one gone) deletes them once due.
    drop(s);
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let s2 = sink_with(dir.path(), mode, &props);
    let r = s2
        .maintain(Some(std::slice::from_ref(&t.id)))
        .await
        .unwrap();
    assert_eq!(r[0].files_deleted, waiting.len() as u64, "{r:?}");
    let disk = files_on_disk(dir.path());
    let live = referenced_files(&wh, &location).await.unwrap();
    let missing: Vec<_> = live.difference(&disk).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    let left: Vec<_> = disk
        .difference(&live)
        .filter(|p| !is_metadata_file(p))
        .collect();
    assert!(left.is_empty(), "left after the delay: {left:?}");
    let records = dir.path().join("_cdcd/shop/maintenance/public/t/deletes");
    assert_eq!(std::fs::read_dir(records).unwrap().count(), 0);
    commits(&s2, 20, 1).await;
    assert_eq!(s2.checkpoint(&t.id).await.unwrap(), Some(cp(1020)));
}

async fn metadata_log_is_bounded_and_leftovers_swept(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink_with(
        dir.path(),
        mode,
        &[
            ("write.metadata.previous-versions-max", "2"),
            ("cdcd.compaction.enabled", "false"),
        ],
    );
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 6).await;
    // The deletions run in the background after each commit.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let meta = s.tables.load(&t.id).await.unwrap().unwrap();
    assert_eq!(meta.metadata.metadata_log().len(), 2);
    let versions = |d: &Path| {
        let mut v: Vec<u64> = std::fs::read_dir(d.join("public/t/metadata"))
            .unwrap()
            .filter_map(|e| {
                super::super::maintenance::metadata_log::version_of(
                    &e.unwrap().path().display().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let n = meta.version;
    assert_eq!(versions(dir.path()), vec![n - 2, n - 1, n]);
    // A crash between a commit and its deletion leaves an old version behind: the cycle sweeps it.
    let leftover = dir.path().join("public/t/metadata/v2.metadata.json");
    std::fs::write(&leftover, b"{}").unwrap();
    let r = s.maintain(None).await.unwrap();
    assert_eq!(r[0].metadata_files_deleted, 1, "{r:?}");
    assert!(!leftover.exists());
    assert_eq!(versions(dir.path()), vec![n - 2, n - 1, n]);
    if let Some(rows) = duck(&table_dir(dir.path()), "count(*)") {
        assert_eq!(rows, "[(60,)]");
    }
}

async fn a_bad_property_is_refused_at_the_table(mode: DeleteMode) {
    let dir = tempfile::tempdir().unwrap();
    let s = sink(dir.path(), mode);
    let t = schema();
    seed(&s).await;
    // Another engine sets a value cdcd cannot read: the cycle reports it, the data is untouched.
    let loaded = s.tables.load(&t.id).await.unwrap().unwrap();
    let mut props = HashMap::new();
    props.insert(
        "history.expire.min-snapshots-to-keep".to_owned(),
        "lots".to_owned(),
    );
    let next = iceberg::spec::TableMetadataBuilder::new_from_metadata(
        loaded.metadata.clone(),
        Some(loaded.location()),
    )
    .set_properties(props)
    .unwrap()
    .build()
    .unwrap()
    .metadata;
    crate::sinks::iceberg::catalog::filesystem::commit_version(
        &s.tables.warehouse,
        &t.id,
        loaded.version + 1,
        next,
    )
    .await
    .unwrap();
    let r = s.maintain(Some(std::slice::from_ref(&t.id))).await.unwrap();
    let e = r[0].error.clone().unwrap();
    assert!(
        e.contains("history.expire.min-snapshots-to-keep") && e.contains("lots"),
        "{e}"
    );
    commits(&s, 0, 1).await;
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(1000)));
}

both_modes!(
    expiry_keeps_the_newest_and_deletes_only_what_they_do_not_reach,
    the_default_age_expires_nothing_young,
    expired_files_wait_for_the_delete_delay,
    metadata_log_is_bounded_and_leftovers_swept,
    a_bad_property_is_refused_at_the_table,
);
