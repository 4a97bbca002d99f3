//! What commits and maintenance cycles ask of the object store (issue 37: requests must grow
//! with the data changed, not with tables × commits), counted through a logged store
//! (`storage/requests.rs`).

use super::maintenance::{commits, seed, sink_with, Model};
use super::*;
use crate::sinks::Sink;
use crate::storage::requests::{CountedRequests, RequestLog, OP_DELETE, OP_GET, OP_LIST, OP_PUT};

/// `s` writing through a store that logs every request into the returned log.
fn logged(s: IcebergSink) -> (IcebergSink, RequestLog) {
    let log = RequestLog::default();
    let wh = s.tables.warehouse.clone();
    let store = Arc::new(CountedRequests::logged(wh.store().clone(), log.clone()));
    (s.with_warehouse(wh.with_store(store)), log)
}

/// A deletion-vector sink on `dir` without compaction (whose snapshots would mix in).
fn dv_sink(dir: &std::path::Path) -> IcebergSink {
    sink_with(
        dir,
        DeleteMode::DeletionVectors,
        &[("cdcd.compaction.enabled", "false")],
    )
}

fn taken(log: &RequestLog) -> Vec<(&'static str, String)> {
    std::mem::take(&mut *log.lock().unwrap())
}

/// The paths of the `op` requests among `sent`.
fn paths_of<'a>(sent: &'a [(&'static str, String)], op: &str) -> Vec<&'a str> {
    sent.iter()
        .filter(|(o, _)| *o == op)
        .map(|(_, p)| p.as_str())
        .collect()
}

/// A table with nothing to maintain costs nothing: once a cycle found nothing to do, the next
/// ones send no request, until a commit moves the table or its next expiry is due; then a cycle
/// runs again and does it.
#[tokio::test]
async fn an_idle_table_costs_no_request_until_a_commit_or_its_next_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (s, log) = logged(sink_with(
        dir.path(),
        DeleteMode::DeletionVectors,
        &[
            ("history.expire.max-snapshot-age-ms", "1500"),
            ("cdcd.expiry.delete-delay-ms", "0"),
            ("cdcd.compaction.enabled", "false"),
        ],
    ));
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 2).await;
    s.settle().await;
    // Nothing is old enough yet: the cycle finds nothing to do (and reads to find that out).
    taken(&log);
    let first = s.maintain(None).await.unwrap();
    assert_eq!(
        (first.len(), first[0].snapshots_expired),
        (1, 0),
        "{first:?}"
    );
    assert!(!taken(&log).is_empty());
    // Idle: no request at all.
    for _ in 0..3 {
        assert!(s.maintain(None).await.unwrap().is_empty());
        assert_eq!(taken(&log), vec![]);
    }
    // A commit wakes it.
    commits(&s, 10, 1).await;
    s.settle().await;
    taken(&log);
    let woken = s.maintain(None).await.unwrap();
    assert_eq!(woken.len(), 1, "{woken:?}");
    assert!(!taken(&log).is_empty());
    assert!(s.maintain(None).await.unwrap().is_empty());
    assert_eq!(taken(&log), vec![]);
    // Its snapshots come of age: the cycle runs by itself and expires them.
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let due = s.maintain(None).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!((due[0].snapshots_expired, due[0].snapshots), (3, 1));
    assert_eq!(s.checkpoint(&t.id).await.unwrap(), Some(cp(1010)));
}

/// An expiry reads back no manifest or manifest list this process wrote: the commits recorded
/// what each lists (parsing their Avro back was 12 % of cdcd's CPU with 1,000 tables). A new
/// process, which knows none of them, reads them and expires the same way.
#[tokio::test]
async fn an_expiry_reads_back_nothing_this_process_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let props = [
        ("history.expire.max-snapshot-age-ms", "1"),
        ("history.expire.min-snapshots-to-keep", "2"),
        ("cdcd.expiry.delete-delay-ms", "0"),
        ("cdcd.compaction.enabled", "false"),
    ];
    let (s, log) = logged(sink_with(dir.path(), DeleteMode::DeletionVectors, &props));
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 6).await;
    s.settle().await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    taken(&log);
    let r = s.maintain(None).await.unwrap();
    assert_eq!(r[0].snapshots_expired, 5, "{r:?}");
    assert!(r[0].files_deleted > 0, "{r:?}");
    let sent = taken(&log);
    let read_back: Vec<_> = paths_of(&sent, OP_GET)
        .into_iter()
        .filter(|p| p.ends_with(".avro"))
        .collect();
    assert_eq!(read_back, Vec::<&str>::new());

    commits(&s, 10, 3).await;
    s.settle().await;
    drop(s);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let (cold, log) = logged(sink_with(dir.path(), DeleteMode::DeletionVectors, &props));
    let r = cold
        .maintain(Some(std::slice::from_ref(&t.id)))
        .await
        .unwrap();
    assert_eq!(r[0].snapshots_expired, 3, "{r:?}");
    assert!(r[0].files_deleted > 0, "{r:?}");
    let sent = taken(&log);
    assert!(
        paths_of(&sent, OP_GET).iter().any(|p| p.ends_with(".avro")),
        "a new process reads what it did not write"
    );
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, model(&[(0, 6), (10, 3)]));
    }
}

/// The rows `seed` and then `commits(from, n)` for each of `commits` leave, as DuckDB prints them.
fn model(commits: &[(i64, i64)]) -> String {
    let mut model = Model::seeded();
    for &(from, n) in commits {
        model.commits(from, n);
    }
    model.text()
}

/// The delete manifests of `s`'s table's current snapshot.
async fn delete_manifests(s: &IcebergSink) -> usize {
    let t = schema();
    let loaded = s.tables.load(&t.id).await.unwrap().unwrap();
    let meta = &loaded.metadata;
    let list = meta.current_snapshot().unwrap().manifest_list().to_owned();
    files::manifest::load_manifests(&s.tables.warehouse, &list, meta.format_version())
        .await
        .unwrap()
        .iter()
        .filter(|m| m.content == iceberg::spec::ManifestContentType::Deletes)
        .count()
}

/// The entries the cached live state knows of each delete manifest it names are those the
/// manifest holds, read back and resolved as a cold commit would.
async fn assert_known_entries_are_the_manifests(s: &IcebergSink) {
    let t = schema();
    let slot = s.tables.slot(&t.id);
    let guard = slot.lock().await;
    let live = guard
        .live
        .as_ref()
        .expect("a commit leaves its state cached");
    assert!(!live.delete_entries.is_empty());
    for (path, known) in &live.delete_entries {
        let old = live
            .manifests
            .iter()
            .find(|m| &m.manifest_path == path)
            .expect("a known manifest is listed");
        let bytes = files::manifest::read(&s.tables.warehouse, path)
            .await
            .unwrap();
        let parsed = iceberg::spec::Manifest::parse_avro(&bytes).unwrap();
        let read = files::manifest::resolve_entries(old, &parsed).unwrap();
        assert_eq!(&read[..], &known[..], "{path}");
    }
}

/// Issue 37: a commit that replaces deletion vectors listed by earlier delete manifests folds
/// those manifests into its own delete manifest instead of rewriting each: no rewritten
/// manifest is written, the table keeps one delete manifest, a commit reads no vector back
/// (the live ones are cached) and no manifest either (the entries of the one it folds are known
/// from writing it); DuckDB reads every row right, and a fresh sink (cold load of manifests and
/// vectors, so the manifest it folds is read) commits on from it.
#[tokio::test]
async fn replaced_vectors_fold_their_manifests_into_the_commits_own() {
    let dir = tempfile::tempdir().unwrap();
    let (s, log) = logged(dv_sink(dir.path()));
    seed(&s).await;
    commits(&s, 0, 2).await;
    // Each of these deletes a seed row (`del(50 + i)`), so each replaces the seed file's vector,
    // which the previous commit's delete manifest lists.
    for i in 2..10 {
        taken(&log);
        commits(&s, i, 1).await;
        let sent = taken(&log);
        let puts = paths_of(&sent, OP_PUT);
        assert!(
            !puts
                .iter()
                .any(|p| p.contains("-r") && p.ends_with(".avro")),
            "commit {i} rewrote a manifest: {puts:?}"
        );
        // A data manifest, a delete manifest, the manifest list.
        assert_eq!(
            puts.iter().filter(|p| p.ends_with(".avro")).count(),
            3,
            "commit {i}: {puts:?}"
        );
        let gets = paths_of(&sent, OP_GET);
        assert!(
            !gets.iter().any(|p| p.ends_with(".puffin")),
            "commit {i} read a vector back: {gets:?}"
        );
        // The manifest it folds was written by this sink: its entries are known, not read back.
        assert!(
            !gets.iter().any(|p| p.ends_with(".avro")),
            "commit {i} read a manifest: {gets:?}"
        );
        assert_eq!(delete_manifests(&s).await, 1, "after commit {i}");
        assert_known_entries_are_the_manifests(&s).await;
    }
    s.settle().await;
    let expected = model(&[(0, 10)]);
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, expected);
    }
    let s2 = dv_sink(dir.path());
    // Seed rows again: the seed file's vector, read cold, is replaced and its manifest folded.
    let t = schema();
    s2.commit(&t, &[changes(&[del(40), upd(41, Some("u"), 7)])], &cp(2000))
        .await
        .unwrap();
    s2.settle().await;
    assert_eq!(delete_manifests(&s2).await, 1);
    let expected = model(&[(0, 10)])
        .replace("(40, 'seed', 400), ", "")
        .replace("(41, 'seed', 410)", "(41, 'u', 7)");
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, expected);
    }
}

/// Issue 37: a streaming commit of one table sends no DELETE and writes nothing of the
/// primary-key index (it persisted a run and a manifest and deleted the previous manifest on
/// every commit, and merged the runs that piled up); its only LISTs are the filesystem
/// catalog's three on `metadata/` (`catalog/filesystem/mod.rs`, steps 1, 3 and 4). A clean stop
/// persists the index covering the last commit; a sink that starts without it (a crash) catches
/// up from the table, and DuckDB reads every row right.
#[tokio::test]
async fn a_streaming_commit_sends_no_delete_and_no_index_request() {
    let dir = tempfile::tempdir().unwrap();
    let (s, log) = logged(dv_sink(dir.path()));
    let t = schema();
    seed(&s).await;
    commits(&s, 0, 2).await;
    s.settle().await;
    // A commit's index update runs in the background: its requests land in the next commit's
    // log, so the log is checked over a run of commits.
    taken(&log);
    let n = 10;
    commits(&s, 2, n).await;
    let sent = taken(&log);
    let of = |op: &str| -> Vec<&str> {
        sent.iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, p)| p.as_str())
            .collect()
    };
    assert_eq!(of(OP_DELETE), Vec::<&str>::new());
    let lists = of(OP_LIST);
    assert_eq!(lists.len(), 3 * n as usize, "{lists:?}");
    assert!(
        lists.iter().all(|p| p.ends_with("public/t/metadata")),
        "{lists:?}"
    );
    // Reads of index blocks stay (a lookup's cache miss): they follow the keys a commit
    // changes.
    let index: Vec<_> = sent
        .iter()
        .filter(|(op, p)| *op != OP_GET && p.contains("/_cdcd/"))
        .collect();
    assert_eq!(index, Vec::<&(&str, String)>::new());
    // A clean stop persists the index covering the last commit.
    s.settle().await;
    let stopped = taken(&log);
    assert!(
        stopped
            .iter()
            .any(|(op, p)| *op == OP_PUT && p.contains("/_cdcd/") && p.contains("manifest-")),
        "{stopped:?}"
    );
    let covered = super::index::covered(&s).await;
    let head = s.tables.load(&t.id).await.unwrap().unwrap();
    assert_eq!(
        covered,
        head.metadata.current_snapshot().map(|c| c.snapshot_id())
    );
    // Commits the index has not persisted, then a start without a clean stop.
    commits(&s, 2 + n, 3).await;
    drop(s);
    let s2 = dv_sink(dir.path());
    commits(&s2, 2 + n + 3, 2).await;
    s2.settle().await;
    assert_eq!(
        s2.checkpoint(&t.id).await.unwrap(),
        Some(cp(1000 + 2 + n as u64 + 4))
    );
    let expected = model(&[(0, 2 + n + 5)]);
    if let Some(rows) = duck(&table_dir(dir.path()), "id, a, b") {
        assert_eq!(rows, expected);
    }
}
