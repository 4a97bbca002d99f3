//! Index tests: a HashMap model under seeded random operations, persistence and reopen on local
//! disk, crash leftovers, conflicts and the memory bound.

use std::collections::HashMap;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;

use super::*;

/// xorshift64*: deterministic, no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Keys of varying length sharing prefixes, like `arrow_row` encodings of composite keys.
fn key_of(i: u64) -> Vec<u8> {
    let mut k = vec![1u8];
    k.extend_from_slice(&(i / 7).to_be_bytes());
    k.extend(std::iter::repeat_n(b'x', (i % 7) as usize));
    k
}

fn loc(file: &Arc<str>, position: u64) -> RowLocation {
    RowLocation {
        file: Arc::clone(file),
        position,
    }
}

type Model = HashMap<Vec<u8>, RowLocation>;

async fn check(index: &PrimaryKeyIndex, model: &Model, keyspace: u64) {
    let keys: Vec<Vec<u8>> = (0..keyspace).map(key_of).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let got = index.get_many(&refs).await.unwrap();
    for (k, g) in keys.iter().zip(got) {
        assert_eq!(g.as_ref(), model.get(k), "key {k:?}");
    }
}

/// Merges run in the background (two worker threads, so they end at any point between the
/// operations), and lookups and applies go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matches_a_hashmap_model_under_random_operations() {
    for (seed, reads) in [(1u64, BlockReads::Spans), (42, BlockReads::Exact)] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let root = Path::from("wh/_cdcd/p/index/ns/t");
        // A tiny budget so flushes, evictions and compactions all happen.
        let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
            .await
            .unwrap();
        index.set_block_reads(reads);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let keyspace = 3_000;
        let mut files: Vec<Arc<str>> = Vec::new();
        let mut next_file = 0;
        let mut model = Model::new();
        let mut snapshot = 0;
        for step in 0..150 {
            if files.is_empty() || rng.below(4) == 0 {
                files.push(Arc::from(format!("s3://wh/ns/t/data/{next_file}.parquet")));
                next_file += 1;
            }
            let batch: Vec<(Vec<u8>, IndexOp)> = (0..rng.below(200))
                .map(|_| {
                    let k = key_of(rng.below(keyspace));
                    let op = if rng.below(5) == 0 {
                        IndexOp::Remove
                    } else {
                        let f = &files[rng.below(files.len() as u64) as usize];
                        IndexOp::Upsert(loc(f, rng.below(1 << 40)))
                    };
                    (k, op)
                })
                .collect();
            for (k, op) in &batch {
                match op {
                    IndexOp::Upsert(l) => model.insert(k.clone(), l.clone()),
                    IndexOp::Remove => model.remove(k),
                };
            }
            index
                .apply(batch.iter().map(|(k, op)| IndexChange {
                    key: k,
                    op: op.clone(),
                }))
                .unwrap();
            match rng.below(10) {
                0..=4 => {
                    snapshot += 1;
                    index.persist(snapshot).await.unwrap();
                }
                5 => index.flush().await.unwrap(),
                6 if files.len() > 2 => {
                    let gone = files.remove(rng.below(files.len() as u64) as usize);
                    index.remove_files([&*gone]);
                    model.retain(|_, l| l.file != gone);
                }
                7 => {
                    snapshot += 1;
                    index.persist(snapshot).await.unwrap();
                    index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
                        .await
                        .unwrap();
                    index.set_block_reads(reads);
                    assert_eq!(index.covered_snapshot(), Some(snapshot));
                }
                8 => {
                    index.finish_merge().await;
                }
                9 if files.len() > 2 => {
                    snapshot += 1;
                    let (kept, out) = (files.len() - 2, next_file);
                    next_file += 1;
                    let holding;
                    (index, holding) = rewrite_through_prepared_runs(
                        index,
                        (&store, &root, reads),
                        &mut model,
                        &mut rng,
                        files.split_off(kept),
                        format!("s3://wh/ns/t/data/{out}.parquet"),
                        snapshot,
                    )
                    .await;
                    files.extend(holding);
                }
                _ => {}
            }
            if step % 25 == 0 {
                check(&index, &model, keyspace).await;
            }
        }
        check(&index, &model, keyspace).await;
        index.compact().await.unwrap();
        check(&index, &model, keyspace).await;
        let (runs, _) = index.stats();
        assert!(runs <= 16, "compaction keeps runs logarithmic: {runs}");
    }
}

/// A data-file compaction as the sink runs it (`prepared.rs`): the live keys of `inputs` move
/// to `output`, their runs written beside the index while commits go on (some of them delete or
/// move rewritten keys: those get their current entry back on top), then installed, or (an
/// index reopened or cleared meanwhile) discarded and applied the old way, or (the compaction
/// went stale) discarded with nothing moved. Snapshot `snapshot`. Returns the index and the
/// files that hold the rewritten rows now (the output, or the inputs when nothing moved).
async fn rewrite_through_prepared_runs(
    mut index: PrimaryKeyIndex,
    (store, root, reads): (&Arc<dyn ObjectStore>, &Path, BlockReads),
    model: &mut Model,
    rng: &mut Rng,
    inputs: Vec<Arc<str>>,
    output: String,
    snapshot: i64,
) -> (PrimaryKeyIndex, Vec<Arc<str>>) {
    let output: Arc<str> = Arc::from(output);
    let mut moved: Vec<Vec<u8>> = model
        .iter()
        .filter(|(_, l)| inputs.contains(&l.file))
        .map(|(k, _)| k.clone())
        .collect();
    moved.sort();
    let first_prepared = index.next_run_id;
    let mut reservation = index
        .reserve_runs_of(&[&output], moved.len() as u64, 1 + rng.below(64) as usize)
        .await
        .unwrap();
    for (position, k) in moved.iter().enumerate() {
        reservation.add(0, k, position as u64).await.unwrap();
    }
    let prepared = reservation.finish().await.unwrap();
    let reserved = first_prepared..index.next_run_id;
    // Commits meanwhile: a third of the moved keys deleted or updated into a new file.
    let newer: Arc<str> = Arc::from(format!("{output}.newer"));
    let mut touched = Vec::new();
    for k in &moved {
        if rng.below(3) != 0 {
            continue;
        }
        let op = if rng.below(2) == 0 {
            model.remove(k);
            IndexOp::Remove
        } else {
            let l = loc(&newer, rng.below(1 << 20));
            model.insert(k.clone(), l.clone());
            IndexOp::Upsert(l)
        };
        index.apply([IndexChange { key: k, op }]).unwrap();
        touched.push(k.clone());
    }
    let reopened = rng.below(4) == 0;
    match if reopened { 0 } else { 1 + rng.below(3) } {
        0 => {
            index.persist(snapshot - 1).await.unwrap();
            index = PrimaryKeyIndex::open(Arc::clone(store), root.clone(), 0)
                .await
                .unwrap();
            index.set_block_reads(reads);
        }
        1 => index.flush().await.unwrap(),
        _ => {}
    }
    if rng.below(5) == 0 {
        // Stale: the runs are deleted and the output forgotten, as `forget_rewrite` does.
        prepared.discard().await;
        index.remove_files([&*output]);
        index.persist(snapshot).await.unwrap();
        assert_no_prepared_run_left(&index, store, root, reserved, reopened).await;
        return (index, inputs);
    }
    // The commit: the keys touched meanwhile keep their current entry, the rest move.
    let refs: Vec<&[u8]> = touched.iter().map(|k| k.as_slice()).collect();
    let current = index.get_many(&refs).await.unwrap();
    match index.install_prepared(prepared).await {
        Ok(()) => {}
        Err(InstallError::NotOurs(prepared)) => {
            prepared.discard().await;
            let rows: Vec<(&[u8], Option<u64>)> = moved
                .iter()
                .enumerate()
                .filter(|(_, k)| !touched.contains(k))
                .map(|(p, k)| (k.as_slice(), Some(p as u64)))
                .collect();
            index.apply_file(&output, rows).unwrap();
        }
        Err(InstallError::Index(e)) => panic!("{e}"),
    }
    index
        .apply(refs.iter().zip(current).map(|(k, now)| IndexChange {
            key: k,
            op: now.map_or(IndexOp::Remove, IndexOp::Upsert),
        }))
        .unwrap();
    index.remove_files(inputs.iter().map(|f| &**f));
    for (position, k) in moved.iter().enumerate() {
        if !touched.contains(k) {
            model.insert(k.clone(), loc(&output, position as u64));
        }
    }
    model.retain(|_, l| !inputs.contains(&l.file));
    index.persist(snapshot).await.unwrap();
    assert_no_prepared_run_left(&index, store, root, reserved, reopened).await;
    (index, vec![output])
}

/// Installed or discarded, no run of ids `reserved` is left that no manifest names.
async fn assert_no_prepared_run_left(
    index: &PrimaryKeyIndex,
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    reserved: std::ops::Range<u64>,
    reopened: bool,
) {
    let named: Vec<&Path> = index.runs.iter().map(|r| &r.path).collect();
    let on_store: Vec<Path> = store
        .list(Some(root))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .unwrap();
    for path in on_store {
        if let Some(Name::Run(id)) = path.filename().map(classify) {
            if reserved.contains(&id) {
                assert!(
                    named.contains(&&path),
                    "{path} is named by no manifest (reopened: {reopened})"
                );
            }
        }
    }
}

fn local(dir: &tempfile::TempDir) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap())
}

async fn names(store: &Arc<dyn ObjectStore>, root: &Path) -> Vec<String> {
    let mut out: Vec<String> = store
        .list(Some(root))
        .map_ok(|m| m.location.filename().unwrap().to_owned())
        .try_collect()
        .await
        .unwrap();
    out.sort();
    out
}

#[tokio::test]
async fn persists_and_reopens_on_local_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let root = Path::from("ns/t/metadata/cdcd-index");
    let file: Arc<str> = Arc::from("file:///wh/ns/t/data/a.parquet");
    let keys: Vec<Vec<u8>> = (0..10_000u64).map(key_of).collect();
    {
        let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(index.covered_snapshot(), None);
        index
            .apply(keys.iter().enumerate().map(|(i, k)| IndexChange {
                key: k,
                op: IndexOp::Upsert(loc(&file, i as u64)),
            }))
            .unwrap();
        index.persist(11).await.unwrap();
        // Applied after the last persist: not durable, must not survive the "crash".
        index
            .apply([IndexChange {
                key: &keys[0],
                op: IndexOp::Remove,
            }])
            .unwrap();
        index.flush().await.unwrap();
    }
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(index.covered_snapshot(), Some(11));
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let got = index.get_many(&refs).await.unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref(), Some(&loc(&file, i as u64)));
    }
    assert_eq!(index.get_many(&[b"nope"]).await.unwrap(), vec![None]);
    // The unnamed run of the "crash" is deleted once this index's first manifest is durable.
    assert_eq!(names(&store, &root).await.len(), 3);
    index.persist(12).await.unwrap();
    let on_disk = names(&store, &root).await;
    assert_eq!(on_disk.len(), 2, "one manifest and one run: {on_disk:?}");
}

#[tokio::test]
async fn open_removes_crash_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let root = Path::from("idx");
    let file: Arc<str> = Arc::from("f1");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    index
        .apply([IndexChange {
            key: b"k",
            op: IndexOp::Upsert(loc(&file, 3)),
        }])
        .unwrap();
    index.persist(1).await.unwrap();
    // A run written before a crash (no manifest names it) and a superseded manifest.
    let orphan = run_path(&root, 99);
    store
        .put(&orphan, PutPayload::from_static(b"partial"))
        .await
        .unwrap();
    let old = manifest_path(&root, 0);
    store
        .put(&old, PutPayload::from_static(b"{}"))
        .await
        .unwrap();
    store
        .put(
            &root.clone().join("README"),
            PutPayload::from_static(b"kept"),
        )
        .await
        .unwrap();
    let mut reopened = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    assert_eq!(
        reopened.get_many(&[b"k"]).await.unwrap(),
        vec![Some(loc(&file, 3))]
    );
    let left = names(&store, &root).await;
    assert!(!left.contains(&"manifest-00000000000000000000.json".to_owned()));
    // The unnamed run stays until a manifest of this index is durable (issue 17.3).
    assert!(left.iter().any(|n| n.contains("99")), "{left:?}");
    // New runs never reuse the orphan's id.
    assert!(reopened.next_run_id > 99);
    reopened.persist(2).await.unwrap();
    let left = names(&store, &root).await;
    assert!(!left.iter().any(|n| n.contains("99")), "{left:?}");
    assert!(
        left.contains(&"README".to_owned()),
        "foreign files are left alone"
    );
}

/// Issue 17.3: a holder that lost the lease flushed a run it has not named yet when its
/// successor opens the index; then its manifest naming that run lands. The successor must not
/// have deleted the run, and must not write a run file of the same name.
#[tokio::test]
async fn a_stale_writers_unnamed_run_survives_its_successors_open() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let file: Arc<str> = Arc::from("f1");
    let mut old =
        PrimaryKeyIndex::open_as(Arc::clone(&store), root.clone(), &IndexMemory::new(0), 1)
            .await
            .unwrap();
    old.apply([IndexChange {
        key: b"a",
        op: IndexOp::Upsert(loc(&file, 0)),
    }])
    .unwrap();
    old.persist(1).await.unwrap();
    old.apply([IndexChange {
        key: b"b",
        op: IndexOp::Upsert(loc(&file, 1)),
    }])
    .unwrap();
    old.flush().await.unwrap();
    // The merge a flush used to make (a flush now leaves runs for the persist): the stale
    // writer's manifest is then one ahead of what the successor opens.
    old.compact().await.unwrap();
    let stale_run = old.runs[0].path.clone();

    let new = PrimaryKeyIndex::open_as(Arc::clone(&store), root.clone(), &IndexMemory::new(0), 2)
        .await
        .unwrap();
    assert!(new.next_run_id >= 2 << 32, "{}", new.next_run_id);
    assert!(old.next_run_id < 2 << 32);
    store.head(&stale_run).await.unwrap();

    // The stale manifest lands before the successor's: the successor conflicts, reopens, and
    // finds every run the newest manifest names.
    old.persist(2).await.unwrap();
    let mut new = new;
    let err = new.persist(2).await.unwrap_err();
    assert!(matches!(err, IndexError::Conflict { .. }), "{err}");
    let mut new =
        PrimaryKeyIndex::open_as(Arc::clone(&store), root.clone(), &IndexMemory::new(0), 2)
            .await
            .unwrap();
    assert_eq!(new.covered_snapshot(), Some(2));
    assert_eq!(
        new.get_many(&[b"a", b"b"]).await.unwrap(),
        vec![Some(loc(&file, 0)), Some(loc(&file, 1))]
    );
    new.apply([IndexChange {
        key: b"c",
        op: IndexOp::Upsert(loc(&file, 2)),
    }])
    .unwrap();
    new.persist(3).await.unwrap();
    // From the successor's manifest on, the stale writer can name nothing.
    old.apply([IndexChange {
        key: b"z",
        op: IndexOp::Upsert(loc(&file, 9)),
    }])
    .unwrap();
    assert!(matches!(
        old.persist(3).await,
        Err(IndexError::Conflict { .. })
    ));
    let reopened = PrimaryKeyIndex::open(Arc::clone(&store), root, 0)
        .await
        .unwrap();
    assert_eq!(
        reopened.get_many(&[b"a", b"b", b"c", b"z"]).await.unwrap(),
        vec![
            Some(loc(&file, 0)),
            Some(loc(&file, 1)),
            Some(loc(&file, 2)),
            None
        ]
    );
}

/// Issue 17.3: a run the manifest names but storage lost is corruption (rebuilt from the
/// table), and the reset index supersedes the broken manifest.
#[tokio::test]
async fn a_missing_run_is_corruption_and_a_reset_supersedes_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let file: Arc<str> = Arc::from("f");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    index
        .apply([IndexChange {
            key: b"a",
            op: IndexOp::Upsert(loc(&file, 0)),
        }])
        .unwrap();
    index.persist(1).await.unwrap();
    let run = index.runs[0].path.clone();
    store.delete(&run).await.unwrap();
    let err = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, IndexError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("missing"), "{err}");

    let mut reset =
        PrimaryKeyIndex::reset_as(Arc::clone(&store), root.clone(), &IndexMemory::new(0), 3)
            .await
            .unwrap();
    assert_eq!(reset.covered_snapshot(), None);
    reset
        .apply([IndexChange {
            key: b"a",
            op: IndexOp::Upsert(loc(&file, 5)),
        }])
        .unwrap();
    reset.persist(1).await.unwrap();
    let reopened = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    assert_eq!(reopened.covered_snapshot(), Some(1));
    assert_eq!(
        reopened.get_many(&[b"a"]).await.unwrap(),
        vec![Some(loc(&file, 5))]
    );
    assert_eq!(names(&store, &root).await.len(), 2, "one manifest, one run");
}

#[tokio::test]
async fn a_second_writer_conflicts() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let mut a = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    let mut b = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    a.persist(1).await.unwrap();
    let err = b.persist(1).await.unwrap_err();
    assert!(matches!(err, IndexError::Conflict { .. }), "{err}");
    assert_eq!(err.kind(), "commit_conflict");
}

#[tokio::test]
async fn clear_forgets_everything_durably() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let file: Arc<str> = Arc::from("f");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    index
        .apply([IndexChange {
            key: b"a",
            op: IndexOp::Upsert(loc(&file, 0)),
        }])
        .unwrap();
    index.persist(1).await.unwrap();
    index.clear();
    index
        .apply([IndexChange {
            key: b"b",
            op: IndexOp::Upsert(loc(&file, 1)),
        }])
        .unwrap();
    index.persist(2).await.unwrap();
    let index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    assert_eq!(
        index.get_many(&[b"a", b"b"]).await.unwrap(),
        vec![None, Some(loc(&file, 1))]
    );
    assert_eq!(names(&store, &root).await.len(), 2);
}

#[tokio::test]
async fn a_corrupt_run_is_reported_not_trusted() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let file: Arc<str> = Arc::from("f");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 0)
        .await
        .unwrap();
    index
        .apply([IndexChange {
            key: b"a",
            op: IndexOp::Upsert(loc(&file, 0)),
        }])
        .unwrap();
    index.persist(1).await.unwrap();
    let run = index.runs[0].path.clone();
    store
        .put(&run, PutPayload::from_static(b"garbage garbage garbage"))
        .await
        .unwrap();
    let err = PrimaryKeyIndex::open(Arc::clone(&store), root, 0)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, IndexError::Corrupt { .. }), "{err}");
}

#[tokio::test]
async fn memory_stays_within_the_budget() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let budget = 2 * memory::MIN_CACHE;
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), Path::from("idx"), budget)
        .await
        .unwrap();
    let file: Arc<str> = Arc::from("f");
    let mut peak_memtable = 0;
    let mut key = Vec::new();
    for i in 0..200_000u64 {
        key.clear();
        key.extend_from_slice(&i.to_be_bytes());
        key.extend_from_slice(&(i * 31).to_be_bytes());
        index
            .apply([IndexChange {
                key: &key,
                op: IndexOp::Upsert(loc(&file, i)),
            }])
            .unwrap();
        peak_memtable = peak_memtable.max(index.memory_usage().memtable);
        if index.needs_flush() {
            index.flush().await.unwrap();
            assert!(
                !index.needs_flush(),
                "buffers kept for reuse do not count as used"
            );
        }
    }
    index.persist(1).await.unwrap();
    // A memtable grows by doubling its buffers: one step past the budget is the most it reaches.
    assert!(
        peak_memtable <= 3 * budget / 2 + 4096,
        "memtable peaked at {peak_memtable}"
    );
    let mut rng = Rng(5);
    for _ in 0..20 {
        let keys: Vec<Vec<u8>> = (0..2_000)
            .map(|_| {
                let i = rng.below(200_000);
                let mut k = i.to_be_bytes().to_vec();
                k.extend_from_slice(&(i * 31).to_be_bytes());
                k
            })
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let got = index.get_many(&refs).await.unwrap();
        assert!(got.iter().all(Option::is_some));
        assert!(index.memory_usage().block_cache <= budget / 2);
    }
    let usage = index.memory_usage();
    // Bloom filters: 1.25 bytes per key, plus a sparse index entry per block.
    assert!(usage.runs < 200_000 * 2, "{usage:?}");
}

/// An index manifest put that object_store retried after its first attempt landed is this
/// persist, not a conflict (storage::put_create); a second writer still conflicts.
#[tokio::test]
async fn a_retried_manifest_put_that_landed_persists() {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let lossy: Arc<dyn ObjectStore> = Arc::new(crate::storage::LostAnswer(Arc::clone(&memory)));
    let root = Path::from("idx");
    let file: Arc<str> = Arc::from("f");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&lossy), root.clone(), 0)
        .await
        .unwrap();
    index
        .apply([IndexChange {
            key: b"k",
            op: IndexOp::Upsert(loc(&file, 1)),
        }])
        .unwrap();
    index.persist(1).await.unwrap();
    let mut other = PrimaryKeyIndex::open(Arc::clone(&memory), root.clone(), 0)
        .await
        .unwrap();
    index.persist(2).await.unwrap();
    let reopened = PrimaryKeyIndex::open(Arc::clone(&memory), root.clone(), 0)
        .await
        .unwrap();
    assert_eq!(reopened.covered, Some(2));
    assert_eq!(
        reopened.get_many(&[b"k"]).await.unwrap(),
        vec![Some(loc(&file, 1))]
    );
    // The same manifest name with another writer's bytes is still a conflict.
    let err = other.persist(2).await.unwrap_err();
    assert!(matches!(err, IndexError::Conflict { .. }), "{err}");
}

/// Many tables' indexes share one [`IndexMemory`] (issue 37): a memtable flushes once the
/// memtables together are over their share, the one block cache stays within its capacity over
/// every index's lookups, and a dropped or cleared index gives its memory back.
#[tokio::test]
async fn indexes_of_many_tables_share_one_memory_budget() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let memory = IndexMemory::split(1 << 20, 1 << 20);
    let limit = memory.memtables_limit();
    let file: Arc<str> = Arc::from("f");
    let mut indexes = Vec::new();
    // As many as commit at once (a memtable is flushed at every persist, so only the commits in
    // flight hold one).
    for t in 0..12 {
        let root = Path::from(format!("idx/{t}"));
        indexes.push(
            PrimaryKeyIndex::open_as(Arc::clone(&store), root, &memory, 1)
                .await
                .unwrap(),
        );
    }
    // Each table applies well under the limit on its own (a per-table budget would never
    // flush), but together they are over it: every memtable that holds a sizeable part of the
    // limit flushes, so the total stays near the limit.
    let mut flushed = 0;
    let mut peak = 0;
    for round in 0..200u64 {
        for (t, index) in indexes.iter_mut().enumerate() {
            let changes: Vec<(Vec<u8>, u64)> = (0..50)
                .map(|i| {
                    let k = round * 50 + i;
                    (key_of(k * 64 + t as u64), k)
                })
                .collect();
            index
                .apply(changes.iter().map(|(k, p)| IndexChange {
                    key: k,
                    op: IndexOp::Upsert(loc(&file, *p)),
                }))
                .unwrap();
            peak = peak.max(memory.memtables());
            if index.needs_flush() {
                assert!(index.memory_usage().memtable < limit, "flushed early");
                index.flush().await.unwrap();
                flushed += 1;
            }
        }
    }
    assert!(
        flushed > 0,
        "no memtable flushed although together over the limit"
    );
    assert!(
        peak <= 2 * limit,
        "memtables peaked at {peak} over a limit of {limit}"
    );
    for index in &mut indexes {
        index.persist(1).await.unwrap();
    }
    assert!(memory.runs() > 0, "run metas are charged");
    // Lookups over every table fill one cache, within its capacity.
    let mut rng = Rng(9);
    for _ in 0..5 {
        for (t, index) in indexes.iter().enumerate() {
            let keys: Vec<Vec<u8>> = (0..200)
                .map(|_| key_of(rng.below(200 * 50) * 64 + t as u64))
                .collect();
            let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
            let got = index.get_many(&refs).await.unwrap();
            assert!(got.iter().all(Option::is_some));
            assert!(memory.cached() <= memory.cache_capacity());
        }
    }
    assert!(memory.cached() > 0);
    let charged = memory.runs();
    let mut first = indexes.remove(0);
    first.clear();
    assert!(
        memory.runs() < charged,
        "a cleared index gives its run metas back"
    );
    drop(first);
    drop(indexes);
    assert_eq!(memory.memtables(), 0);
    assert_eq!(memory.runs(), 0);
    assert_eq!(memory.cached(), 0, "dropped indexes' blocks are forgotten");
}

async fn in_memory_index() -> PrimaryKeyIndex {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    PrimaryKeyIndex::open(store, Path::from("idx"), 1 << 20)
        .await
        .unwrap()
}

/// An initial copy flushes a memtable's worth at a time between persists: the runs stay until
/// more than `FLUSHED_RUNS` are live, then merge by the policy; every key is found throughout.
#[tokio::test]
async fn flushes_leave_runs_for_the_persist_to_merge() {
    let mut index = in_memory_index().await;
    let file: Arc<str> = Arc::from("f");
    // Runs of one size (same key lengths, same positions), so the policy merges them all once
    // it runs.
    let runs = FLUSHED_RUNS.max(2) as u8 + 1;
    let keys: Vec<Vec<u8>> = (0..runs)
        .flat_map(|run| (0..100u8).map(move |i| vec![run, i]))
        .collect();
    for (flush, stretch) in keys.chunks(100).enumerate() {
        index
            .apply(stretch.iter().enumerate().map(|(i, k)| IndexChange {
                key: k,
                op: IndexOp::Upsert(loc(&file, i as u64)),
            }))
            .unwrap();
        index.flush().await.unwrap();
        index.finish_merge().await;
        if flush == 1 {
            assert_eq!(index.runs.len(), 2, "two flushes, two runs");
        }
        if flush < FLUSHED_RUNS {
            assert_eq!(index.runs.len(), flush + 1, "a flush merges nothing yet");
        } else {
            assert_eq!(index.runs.len(), 1, "past the limit, the equal runs merge");
        }
    }
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let got = index.get_many(&refs).await.unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref(), Some(&loc(&file, (i % 100) as u64)));
    }
    index.persist(1).await.unwrap();
    assert_eq!(index.runs.len(), 1);
}

/// Runs whose keys interleave (merged entry by entry, not block by block) and a key every run
/// rewrites: one merge of them all keeps every key once, the newest run's entry winning.
#[tokio::test]
async fn a_merge_of_many_interleaved_runs_keeps_the_newest_entry() {
    let mut index = in_memory_index().await;
    let file: Arc<str> = Arc::from("f");
    let runs = FLUSHED_RUNS as u64 + 1;
    let mut model = Model::new();
    for run in 0..runs {
        let mut keys: Vec<(Vec<u8>, u64)> = (0..50u64)
            .map(|i| ((i * runs + run).to_be_bytes().to_vec(), i))
            .collect();
        keys.push((b"every run".to_vec(), 1000 + run));
        index
            .apply(keys.iter().map(|(k, at)| IndexChange {
                key: k,
                op: IndexOp::Upsert(loc(&file, *at)),
            }))
            .unwrap();
        for (k, at) in keys {
            model.insert(k, loc(&file, at));
        }
        index.flush().await.unwrap();
    }
    index.finish_merge().await;
    assert_eq!(index.runs.len(), 1, "one merge of every run");
    assert!(index.merged.entries_merged > 0, "{:?}", index.merged);
    let keys: Vec<&Vec<u8>> = model.keys().collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let got = index.get_many(&refs).await.unwrap();
    for (k, g) in keys.iter().zip(got) {
        assert_eq!(g.as_ref(), model.get(*k), "{k:?}");
    }
    assert_eq!(
        index.get_many(&[b"every run"]).await.unwrap(),
        vec![Some(loc(&file, 1000 + runs - 1))]
    );
}

/// A truncate while a merge runs (or after it ended, not yet installed): the merge is dropped,
/// its run is deleted with the cleared runs at the next persist, and nothing but the new
/// manifest and its run is left on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_beside_a_merge_leaves_no_run_behind() {
    for wait_for_the_merge in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = local(&dir);
        let root = Path::from("idx");
        let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 20)
            .await
            .unwrap();
        let file: Arc<str> = Arc::from("f");
        for (snapshot, range) in [(1, 0..5_000u64), (2, 5_000..10_000)] {
            let keys: Vec<Vec<u8>> = range.map(key_of).collect();
            index
                .apply(keys.iter().map(|k| IndexChange {
                    key: k,
                    op: IndexOp::Upsert(loc(&file, 0)),
                }))
                .unwrap();
            index.persist(snapshot).await.unwrap();
        }
        // Two runs of one size: the second persist started their merge.
        let merge_run = index.merging.as_ref().map(|m| m.run.clone()).unwrap();
        if wait_for_the_merge {
            while !index.merging.as_ref().unwrap().task.is_finished() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(
                store.head(&merge_run).await.is_ok(),
                "the merge wrote its run"
            );
        }
        index.clear();
        index
            .apply([IndexChange {
                key: &key_of(1),
                op: IndexOp::Upsert(loc(&file, 7)),
            }])
            .unwrap();
        index.persist(3).await.unwrap();
        index.finish_merge().await;
        let left = names(&store, &root).await;
        assert_eq!(left.len(), 2, "one manifest and one run: {left:?}");
        assert!(store.head(&merge_run).await.is_err(), "{left:?}");
        assert_eq!(
            index.get_many(&[&key_of(1), &key_of(2)]).await.unwrap(),
            vec![Some(loc(&file, 7)), None]
        );
    }
}

/// Words of filter a run holds in memory.
fn filter_words(run: &RunMeta) -> usize {
    match &run.filter {
        meta::Filter::PerBlock { words, .. } => words.len(),
        meta::Filter::Run(bloom) => bloom.words().len(),
    }
}

/// The oldest run holds no bloom filters (`RunWriter::without_filters`): written so by the merge
/// that makes it, and loaded so at open whatever it was written with; newer runs keep theirs.
/// Every key is still found, and keys with no entry (never written, or removed) still answer
/// none.
#[tokio::test]
async fn the_oldest_run_holds_no_filters() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let open = || PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 24);
    let mut index = open().await.unwrap();
    let file: Arc<str> = Arc::from("f");
    let mut model = Model::new();
    let keyspace = 40_000;
    let mut upsert = |index: &mut PrimaryKeyIndex, keys: std::ops::Range<u64>, at: u64| {
        let keys: Vec<Vec<u8>> = keys.map(key_of).collect();
        for k in &keys {
            model.insert(k.clone(), loc(&file, at));
        }
        index
            .apply(keys.iter().map(|k| IndexChange {
                key: k,
                op: IndexOp::Upsert(loc(&file, at)),
            }))
            .unwrap();
    };
    // One run written by a flush, with filters; loaded without them once it is the oldest.
    upsert(&mut index, 0..10_000, 1);
    index.persist(1).await.unwrap();
    assert_eq!(index.runs.len(), 1);
    assert!(
        filter_words(&index.runs[0]) > 0,
        "a flushed run has filters"
    );
    let written = index.memory_usage().runs;
    upsert(&mut index, 5_000..6_000, 2);
    index.persist(2).await.unwrap();
    let mut index = open().await.unwrap();
    assert_eq!(index.runs.len(), 2);
    assert!(
        filter_words(&index.runs[0]) > 0,
        "the newer run keeps its filters"
    );
    assert_eq!(
        filter_words(&index.runs[1]),
        0,
        "the oldest is loaded without"
    );
    assert!(index.runs[1].blocks.iter().all(|b| b.filter_len == 0));
    assert!(index.runs[1].memory_bytes() < written / 4, "{written}");
    check(&index, &model, keyspace).await;

    // Merged into one run: the merge writes it without filters, removals included.
    let removed: Vec<Vec<u8>> = (0..10_000).step_by(3).map(key_of).collect();
    index
        .apply(removed.iter().map(|k| IndexChange {
            key: k,
            op: IndexOp::Remove,
        }))
        .unwrap();
    for k in &removed {
        model.remove(k);
    }
    index.persist(3).await.unwrap();
    index.merge_runs(0, index.runs.len()).await.unwrap();
    assert_eq!(index.runs.len(), 1);
    assert_eq!(filter_words(&index.runs[0]), 0, "the merged oldest run");
    assert!(index.runs[0].blocks.iter().all(|b| b.filter_len == 0));
    check(&index, &model, keyspace).await;
    let index = open().await.unwrap();
    check(&index, &model, keyspace).await;
}

/// Four runs of 100 keys each, flushed: equal sizes, which the policy merges at the next persist.
async fn flush_equal_runs(index: &mut PrimaryKeyIndex) {
    let file: Arc<str> = Arc::from("f");
    for run in 0..4u8 {
        let keys: Vec<Vec<u8>> = (0..100u8).map(|i| vec![run, i]).collect();
        index
            .apply(keys.iter().map(|k| IndexChange {
                key: k,
                op: IndexOp::Upsert(loc(&file, 1)),
            }))
            .unwrap();
        index.flush().await.unwrap();
    }
    assert!(index.merge_to_pick().is_some());
}

/// A persist whose manifest does not land (another writer took its sequence) starts no merge:
/// the merge's run id was reserved by no manifest, so a merge started before it could have
/// uploaded a run under an id the reopened index hands out again.
#[tokio::test]
async fn a_manifest_that_fails_starts_no_merge() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 20)
        .await
        .unwrap();
    flush_equal_runs(&mut index).await;
    let mut other = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 20)
        .await
        .unwrap();
    other.persist(1).await.unwrap();
    let err = index.persist(1).await.unwrap_err();
    assert!(matches!(err, IndexError::Conflict { .. }), "{err}");
    assert!(
        index.merging.is_none(),
        "a merge started under an unreserved id"
    );
}

/// The persist of a clean stop starts no merge (the exit would abort it), where a commit's would.
#[tokio::test]
async fn a_clean_stop_persist_starts_no_merge() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut index = PrimaryKeyIndex::open(store, Path::from("idx"), 1 << 20)
        .await
        .unwrap();
    flush_equal_runs(&mut index).await;
    assert!(!index
        .persist_when_due(1, Duration::from_secs(3600))
        .await
        .unwrap());
    index.persist_applied().await.unwrap();
    assert_eq!(index.covered_snapshot(), Some(1));
    assert!(index.merging.is_none(), "a merge started at a clean stop");
    index.persist(2).await.unwrap();
    assert!(
        index.merging.is_some(),
        "a commit's persist starts the merge"
    );
}

/// An index told to keep the oldest run's filters (a table with soft deletes) loads them and
/// merges the next oldest with them; every key still answers the same.
#[tokio::test]
async fn the_oldest_run_keeps_its_filters_when_asked() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let root = Path::from("idx");
    let open = || PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 1 << 24);
    let mut index = open().await.unwrap();
    let file: Arc<str> = Arc::from("f");
    let mut model = Model::new();
    for (at, keys) in [(1u64, 0..8_000u64), (2, 4_000..12_000)] {
        let keys: Vec<Vec<u8>> = keys.map(key_of).collect();
        index
            .apply(keys.iter().map(|k| IndexChange {
                key: k,
                op: IndexOp::Upsert(loc(&file, at)),
            }))
            .unwrap();
        for k in keys {
            model.insert(k, loc(&file, at));
        }
        index.persist(at as i64).await.unwrap();
    }
    let mut index = open().await.unwrap();
    assert_eq!(filter_words(&index.runs[1]), 0, "loaded without");
    index.keep_oldest_filters().await.unwrap();
    assert!(filter_words(&index.runs[1]) > 0, "loaded again with them");
    check(&index, &model, 14_000).await;
    index.merge_runs(0, 2).await.unwrap();
    assert_eq!(index.runs.len(), 1);
    assert!(filter_words(&index.runs[0]) > 0, "merged with them");
    check(&index, &model, 14_000).await;
}
