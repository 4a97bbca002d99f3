//! Tests of the `CPKIRUN3` run format and the merges it enables: per-block filters, verbatim
//! block copies (disjoint runs), entry-by-entry merges (overlapping runs, tombstones, removed
//! files), and runs of the two older formats still read and merged.

use std::collections::BTreeMap;

use object_store::memory::InMemory;

use super::bloom::{key_hash, Bloom, Layout};
use super::meta::Filter;
use super::run::put_varint;
use super::*;

fn key(v: u64) -> Vec<u8> {
    let mut k = vec![1u8];
    k.extend_from_slice(&v.to_be_bytes());
    k
}

fn at(file: &str, position: u64) -> RowLocation {
    RowLocation {
        file: Arc::from(file),
        position,
    }
}

type Model = BTreeMap<Vec<u8>, Option<RowLocation>>;

async fn open(store: &Arc<dyn ObjectStore>, budget: usize) -> PrimaryKeyIndex {
    PrimaryKeyIndex::open(Arc::clone(store), Path::from("idx"), budget)
        .await
        .unwrap()
}

/// Applies `keys` as rows 0.. of `file` to the index and the model.
fn upsert(index: &mut PrimaryKeyIndex, model: &mut Model, file: &str, keys: &[u64]) {
    let encoded: Vec<Vec<u8>> = keys.iter().map(|v| key(*v)).collect();
    index
        .apply_file(
            file,
            encoded
                .iter()
                .enumerate()
                .map(|(p, k)| (k.as_slice(), Some(p as u64))),
        )
        .unwrap();
    for (p, k) in encoded.into_iter().enumerate() {
        model.insert(k, Some(at(file, p as u64)));
    }
}

/// Persists, then waits for the merges the persist starts (in the background in a running
/// cdcd), so each test sees the runs as the merge policy leaves them.
async fn persist_merged(index: &mut PrimaryKeyIndex, snapshot: i64) {
    index.persist(snapshot).await.unwrap();
    index.compact().await.unwrap();
}

async fn check(index: &PrimaryKeyIndex, model: &Model) {
    let keys: Vec<&[u8]> = model.keys().map(|k| k.as_slice()).collect();
    let got = index.get_many(&keys).await.unwrap();
    for ((k, want), got) in model.iter().zip(got) {
        assert_eq!(&got, want, "key {k:?}");
    }
}

#[tokio::test]
async fn per_block_filters_find_every_key_and_skip_most_absent_ones() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut index = open(&store, 1 << 24).await;
    let mut model = Model::new();
    let evens: Vec<u64> = (0..50_000u64).map(|i| i * 2).collect();
    upsert(&mut index, &mut model, "f", &evens);
    persist_merged(&mut index, 1).await;
    let run = Arc::clone(&index.runs[0]);
    assert!(run.has_block_stats());
    assert!(run.blocks.len() > 10, "{} blocks", run.blocks.len());
    for v in &evens {
        let k = key(*v);
        assert!(run.candidate(&k, key_hash(&k)).is_some(), "{v}");
    }
    // Odd keys fall inside the blocks' key ranges: only the block filters can reject them.
    let passed = (0..50_000u64)
        .map(|i| key(i * 2 + 1))
        .filter(|k| run.candidate(k, key_hash(k)).is_some())
        .count();
    assert!(passed < 1_500, "{passed} of 50000 absent keys passed");
    // Memory stays ~10 bits per key of filter.
    let Filter::PerBlock { words, .. } = &run.filter else {
        panic!("new runs have per-block filters")
    };
    assert!(
        words.len() * 64 < 50_000 * 12,
        "{} filter bits",
        words.len() * 64
    );
    for i in 0..2_000u64 {
        model.insert(key(i * 2 + 1), None);
    }
    check(&index, &model).await;
}

#[tokio::test]
async fn disjoint_runs_merge_by_copying_blocks() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut index = open(&store, 0).await;
    let mut model = Model::new();
    // An initial copy: 4 readers, each continuing its own key range at every commit.
    for commit in 0..6u64 {
        let keys: Vec<u64> = (0..4u64)
            .flat_map(|r| (0..12_000).map(move |i| r * 1_000_000 + commit * 12_000 + i))
            .collect();
        upsert(&mut index, &mut model, &format!("f{commit}"), &keys);
        persist_merged(&mut index, commit as i64 + 1).await;
    }
    let stats = index.merged;
    assert!(stats.blocks_copied > 0, "{stats:?}");
    // Only the blocks where one reader's range meets the next commit's are merged entry by entry.
    assert!(stats.entries_copied > 2 * stats.entries_merged, "{stats:?}");
    check(&index, &model).await;
    let reopened = open(&store, 0).await;
    check(&reopened, &model).await;
}

#[tokio::test]
async fn overlapping_runs_merge_entry_by_entry_and_the_newest_wins() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut index = open(&store, 0).await;
    let mut model = Model::new();
    let all: Vec<u64> = (0..10_000).collect();
    upsert(&mut index, &mut model, "a", &all);
    persist_merged(&mut index, 1).await;
    let thirds: Vec<u64> = (0..10_000).step_by(3).collect();
    upsert(&mut index, &mut model, "b", &thirds);
    let removed: Vec<Vec<u8>> = (0..10_000).step_by(7).map(key).collect();
    index
        .apply(removed.iter().map(|k| IndexChange {
            key: k,
            op: IndexOp::Remove,
        }))
        .unwrap();
    for k in removed {
        model.insert(k, None);
    }
    persist_merged(&mut index, 2).await;
    upsert(&mut index, &mut model, "c", &thirds);
    persist_merged(&mut index, 3).await;
    // Newest two first (tombstones kept: an older run remains), then everything.
    let runs = index.stats().0;
    index.merge_runs(0, 2).await.unwrap();
    assert_eq!(index.stats().0, runs - 1);
    check(&index, &model).await;
    index.merge_runs(0, runs).await.unwrap();
    assert_eq!(index.stats().0, 1);
    let live = model.values().filter(|v| v.is_some()).count() as u64;
    assert_eq!(
        index.runs[0].entries, live,
        "tombstones dropped in a full merge"
    );
    assert!(index.merged.entries_merged > 0, "{:?}", index.merged);
    check(&index, &model).await;
    check(&open(&store, 0).await, &model).await;
}

#[tokio::test]
async fn blocks_naming_removed_files_or_dropped_tombstones_are_rewritten() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut index = open(&store, 0).await;
    let mut model = Model::new();
    let range = |from: u64| (from..from + 5_000).collect::<Vec<u64>>();
    upsert(&mut index, &mut model, "a", &range(0));
    persist_merged(&mut index, 1).await;
    upsert(&mut index, &mut model, "b", &range(5_000));
    persist_merged(&mut index, 2).await;
    assert_eq!(index.stats().0, 1, "two equal runs merge");
    // A tombstone in a run of its own, above every key so far.
    index
        .apply([IndexChange {
            key: &key(20_000),
            op: IndexOp::Remove,
        }])
        .unwrap();
    model.insert(key(20_000), None);
    index.remove_files(["a"]);
    for (_, v) in model.iter_mut() {
        if v.as_ref().is_some_and(|l| &*l.file == "a") {
            *v = None;
        }
    }
    upsert(&mut index, &mut model, "c", &range(10_000));
    persist_merged(&mut index, 3).await;
    upsert(&mut index, &mut model, "d", &range(15_000));
    persist_merged(&mut index, 4).await;
    // Everything was merged into one run, so tombstones (the removal, and file a's entries) are
    // gone, and no block names file a; blocks of b, c and d were copied as they were.
    assert_eq!(index.stats().0, 1);
    let run = Arc::clone(&index.runs[0]);
    assert_eq!(run.entries, 15_000);
    let a_id = 0;
    assert!(run
        .blocks
        .iter()
        .all(|b| !b.tombstones && b.files.is_none_or(|(lo, _)| lo > a_id)));
    assert!(index.merged.blocks_copied > 0, "{:?}", index.merged);
    check(&index, &model).await;
    check(&open(&store, 0).await, &model).await;
}

/// Rewrites the single run of the index under `idx` in an older format (`CPKIRUN1` with a
/// spread filter, `CPKIRUN2` with one blocked filter), as an older cdcd wrote it, and points the
/// manifest at it. `keys` are the run's keys.
async fn downgrade(
    store: &Arc<dyn ObjectStore>,
    index: &PrimaryKeyIndex,
    keys: &[Vec<u8>],
    layout: Layout,
) {
    let run = &index.runs[0];
    let bytes = store.get(&run.path).await.unwrap().bytes().await.unwrap();
    let mut out = bytes[..run.meta_offset as usize].to_vec();
    put_varint(&mut out, run.blocks.len() as u64);
    for b in &run.blocks {
        let first = run.first_key(b);
        put_varint(&mut out, first.len() as u64);
        out.extend_from_slice(first);
        put_varint(&mut out, b.len);
    }
    put_varint(&mut out, run.last_key.len() as u64);
    out.extend_from_slice(&run.last_key);
    put_varint(&mut out, run.entries);
    let mut bloom = match layout {
        Layout::Blocked => Bloom::with_capacity(keys.len() as u64),
        Layout::Spread => Bloom::from_parts(vec![0; keys.len() * 10 / 64 + 1], 7, Layout::Spread),
    };
    assert_eq!(bloom.layout(), layout);
    for k in keys {
        bloom.insert(key_hash(k));
    }
    put_varint(&mut out, 7);
    put_varint(&mut out, bloom.words().len() as u64);
    for w in bloom.words() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&run.meta_offset.to_le_bytes());
    out.extend_from_slice(match layout {
        Layout::Spread => b"CPKIRUN1",
        Layout::Blocked => b"CPKIRUN2",
    });
    let size = out.len() as u64;
    store.put(&run.path, PutPayload::from(out)).await.unwrap();
    let mpath = manifest_path(&index.root, index.manifest_seq);
    let raw = store.get(&mpath).await.unwrap().bytes().await.unwrap();
    let mut m: Manifest = serde_json::from_slice(&raw).unwrap();
    m.runs[0].size = size;
    store
        .put(&mpath, PutPayload::from(serde_json::to_vec(&m).unwrap()))
        .await
        .unwrap();
}

#[tokio::test]
async fn runs_of_older_formats_are_still_read_and_merged() {
    for layout in [Layout::Spread, Layout::Blocked] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut index = open(&store, 1 << 24).await;
        let mut model = Model::new();
        let first: Vec<u64> = (0..6_000).map(|i| i * 2).collect();
        upsert(&mut index, &mut model, "a", &first);
        persist_merged(&mut index, 1).await;
        let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
        downgrade(&store, &index, &keys, layout).await;
        drop(index);

        let mut index = open(&store, 1 << 24).await;
        assert!(!index.runs[0].has_block_stats(), "{layout:?}");
        for i in 0..500 {
            model.insert(key(i * 2 + 1), None);
        }
        check(&index, &model).await;
        // A run of the same size merges with the old one, into the current format.
        let second: Vec<u64> = (0..6_000).map(|i| i * 2 + 6_000).collect();
        upsert(&mut index, &mut model, "b", &second);
        persist_merged(&mut index, 2).await;
        assert_eq!(index.stats().0, 1, "{layout:?}");
        assert!(index.runs[0].has_block_stats());
        assert!(index.merged.entries_merged > 0);
        check(&index, &model).await;
        check(&open(&store, 1 << 24).await, &model).await;
    }
}
