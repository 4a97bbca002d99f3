//! The filesystem catalog's commit against another writer that deletes old metadata files
//! (Iceberg-Java's `HadoopTableOperations` with `write.metadata.delete-after-commit.enabled`),
//! on an in-memory warehouse: the versions it leaves, the hint, and what a load finds.

use std::collections::HashMap;

use bytes::Bytes;
use iceberg::spec::{FormatVersion, TableMetadata, TableMetadataBuilder};
use object_store::{ObjectStoreExt, PutPayload};

use super::*;
use crate::sinks::iceberg::files::metadata::hint_location;
use crate::test_fixtures::iceberg_id_schema;

const LOCATION: &str = "memory://w/shop/t";

fn table() -> TableId {
    TableId::new("shop", "t")
}

fn warehouse() -> Warehouse {
    Warehouse::from_url("memory://w").unwrap()
}

fn v1() -> TableMetadata {
    let schema = iceberg_id_schema();
    publish::new_table(
        &table(),
        LOCATION,
        schema,
        FormatVersion::V2,
        HashMap::new(),
    )
    .unwrap()
}

/// The metadata after `prev` (version `prev_version`) with property `key` set: what an
/// `ALTER TABLE … SET TBLPROPERTIES` commits (the previous file enters the metadata log).
fn on_top(prev: &TableMetadata, prev_version: u64, key: &str) -> TableMetadata {
    TableMetadataBuilder::new_from_metadata(
        prev.clone(),
        Some(metadata_location(LOCATION, prev_version)),
    )
    .set_properties(HashMap::from([(key.to_owned(), "x".to_owned())]))
    .unwrap()
    .build()
    .unwrap()
    .metadata
}

async fn put(w: &Warehouse, location: &str, bytes: Vec<u8>) {
    w.store()
        .put(
            &w.path(location).unwrap(),
            PutPayload::from(Bytes::from(bytes)),
        )
        .await
        .unwrap();
}

async fn put_version(w: &Warehouse, version: u64, meta: &TableMetadata) {
    put(
        w,
        &metadata_location(LOCATION, version),
        serde_json::to_vec(meta).unwrap(),
    )
    .await;
}

async fn delete_version(w: &Warehouse, version: u64) {
    let path = w.path(&metadata_location(LOCATION, version)).unwrap();
    w.store().delete(&path).await.unwrap();
}

async fn versions(w: &Warehouse) -> Vec<u64> {
    let mut out = Vec::new();
    for v in 1..=20 {
        let path = w.path(&metadata_location(LOCATION, v)).unwrap();
        if w.store().head(&path).await.is_ok() {
            out.push(v);
        }
    }
    out
}

async fn hint(w: &Warehouse) -> u64 {
    let path = w.path(&hint_location(LOCATION)).unwrap();
    let bytes = w.store().get(&path).await.unwrap().bytes().await.unwrap();
    std::str::from_utf8(&bytes).unwrap().trim().parse().unwrap()
}

/// cdcd's v1…v3 (through the catalog), returning v3's metadata.
async fn cdcd_at_v3(w: &Warehouse) -> TableMetadata {
    let mut meta = commit_version(w, &table(), 1, v1()).await.unwrap().metadata;
    for v in 2..=3 {
        let next = on_top(&meta, v - 1, &format!("cdcd{v}"));
        meta = commit_version(w, &table(), v, next).await.unwrap().metadata;
    }
    meta
}

/// Another writer commits v4…v7 on top of v3 and deletes v1…v4 (previous-versions-max = 2),
/// writing its hint; returns its v7.
async fn other_writer_to_v7(w: &Warehouse, v3: &TableMetadata) -> TableMetadata {
    let mut meta = v3.clone();
    for v in 4..=7 {
        meta = on_top(&meta, v - 1, &format!("other{v}"));
        put_version(w, v, &meta).await;
    }
    for v in 1..=4 {
        delete_version(w, v).await;
    }
    put(w, &hint_location(LOCATION), b"7".to_vec()).await;
    meta
}

/// Issue 34 part 3: with v4 deleted by the other writer, cdcd's commit on its stale v3 would
/// create v4 in the gap, move the hint back to 4 and count as committed. It is a conflict, and
/// nothing is written.
#[tokio::test]
async fn a_commit_never_lands_in_a_gap_left_by_deleted_versions() {
    let w = warehouse();
    let v3 = cdcd_at_v3(&w).await;
    other_writer_to_v7(&w, &v3).await;
    let next = on_top(&v3, 3, "cdcd4");
    let e = commit_version(&w, &table(), 4, next).await.unwrap_err();
    assert!(matches!(e, SinkError::CommitConflict { .. }), "{e:?}");
    assert_eq!(versions(&w).await, vec![5, 6, 7]);
    assert_eq!(hint(&w).await, 7);
    // The reload the conflict leads to finds the other writer's newest version.
    let loaded = load(&w, LOCATION).await.unwrap().unwrap();
    assert_eq!(loaded.version, 7);
    assert!(loaded.metadata.properties().contains_key("other7"));
    // And the commit planned again on it lands as v8.
    let again = on_top(&loaded.metadata, 7, "cdcd8");
    let landed = commit_version(&w, &table(), 8, again).await.unwrap();
    assert_eq!(landed.version, 8);
    assert_eq!(hint(&w).await, 8);
}

/// The race after the listing: the other writer went past the base (v4…v7, v4 deleted) between
/// cdcd's listing and its create, so the create of v4 succeeded. The file is deleted, the hint
/// untouched, and the commit is a conflict.
#[tokio::test]
async fn a_create_that_landed_beside_a_newer_version_is_undone() {
    let w = warehouse();
    let v3 = cdcd_at_v3(&w).await;
    other_writer_to_v7(&w, &v3).await;
    let ours = on_top(&v3, 3, "cdcd4");
    let file = metadata_location(LOCATION, 4);
    assert!(publish::create_metadata_file(&w, &table(), &file, &ours)
        .await
        .unwrap());
    let ours = Loaded {
        version: 4,
        metadata: ours,
        file,
    };
    let e = settle_beside(&w, &table(), ours, 7).await.unwrap_err();
    assert!(matches!(e, SinkError::CommitConflict { .. }), "{e:?}");
    assert_eq!(versions(&w).await, vec![5, 6, 7]);
    assert_eq!(hint(&w).await, 7);
}

/// The other side of the same race, rarer: a writer loaded cdcd's v4 the moment it landed and
/// committed v5 on top. It cannot be told apart from the case above, so it is a conflict too;
/// the other writer's version is untouched.
#[tokio::test]
async fn a_newer_version_built_on_the_commit_is_a_conflict_too() {
    let w = warehouse();
    let v3 = cdcd_at_v3(&w).await;
    let ours = on_top(&v3, 3, "cdcd4");
    let file = metadata_location(LOCATION, 4);
    assert!(publish::create_metadata_file(&w, &table(), &file, &ours)
        .await
        .unwrap());
    put_version(&w, 5, &on_top(&ours, 4, "other5")).await;
    let ours = Loaded {
        version: 4,
        metadata: ours,
        file,
    };
    let e = settle_beside(&w, &table(), ours, 5).await.unwrap_err();
    assert!(matches!(e, SinkError::CommitConflict { .. }), "{e:?}");
    let loaded = load(&w, LOCATION).await.unwrap().unwrap();
    assert_eq!(loaded.version, 5);
    assert!(loaded.metadata.properties().contains_key("cdcd4"));
}

/// A hint written below a version that appeared meanwhile is written again with the newest.
#[tokio::test]
async fn the_hint_is_never_left_below_a_listed_version() {
    let w = warehouse();
    let v3 = cdcd_at_v3(&w).await;
    assert_eq!(hint(&w).await, 3);
    put_version(&w, 4, &on_top(&v3, 3, "other4")).await;
    write_hint(&w, &table(), LOCATION, 3).await;
    assert_eq!(hint(&w).await, 4);
}

/// A stale hint above a gap (another writer trimmed the versions after it but did not rewrite
/// the hint) does not stop the load at the hinted version.
#[tokio::test]
async fn a_load_is_not_stopped_by_a_gap_above_the_hint() {
    let w = warehouse();
    let v3 = cdcd_at_v3(&w).await;
    other_writer_to_v7(&w, &v3).await;
    // v3 back in place (a file nobody deleted) and the hint naming it.
    put_version(&w, 3, &v3).await;
    put(&w, &hint_location(LOCATION), b"3".to_vec()).await;
    let loaded = load(&w, LOCATION).await.unwrap().unwrap();
    assert_eq!(loaded.version, 7);
}
