//! The rule that decides whether a commit another writer beat is planned again
//! (`only_others_committed`): pure, on metadata built by hand.

use std::collections::HashMap;

use iceberg::spec::{
    FormatVersion, Operation, Snapshot, Summary, TableMetadata, TableMetadataBuilder,
};

use super::*;
use crate::sinks::iceberg::commit::publish;
use crate::test_fixtures::iceberg_id_schema;

fn empty() -> TableMetadata {
    let schema = iceberg_id_schema();
    publish::new_table(
        &TableId::new("shop", "t"),
        "file:///w/shop/t",
        schema,
        FormatVersion::V2,
        HashMap::new(),
    )
    .unwrap()
}

/// `meta` with snapshot `id` on `main` (its parent the current head), carrying `cp` if given.
fn commit(meta: &TableMetadata, id: i64, cp: Option<Checkpoint>) -> TableMetadata {
    let parent = meta.current_snapshot().map(|s| s.snapshot_id());
    let sequence = meta.last_sequence_number() + 1;
    let snapshot = Snapshot::builder()
        .with_snapshot_id(id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(sequence)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis() + sequence)
        .with_manifest_list(format!("file:///w/shop/t/metadata/snap-{id}.avro"))
        .with_summary(Summary {
            operation: Operation::Append,
            additional_properties: cp
                .map(|c| c.to_properties().into_iter().collect())
                .unwrap_or_default(),
        })
        .build();
    TableMetadataBuilder::new_from_metadata(meta.clone(), None)
        .set_branch_snapshot(snapshot, "main")
        .unwrap()
        .build()
        .unwrap()
        .metadata
}

#[test]
fn other_engines_commits_on_top_are_planned_upon() {
    let ours = commit(&empty(), 1, Some(cp(100)));
    // A Spark rewrite, then an expiry by another engine on top: no checkpoint of ours.
    let theirs = commit(&commit(&ours, 2, None), 3, None);
    assert!(only_others_committed("shop", &ours, &theirs).unwrap());
    // Another pipeline's checkpoint does not count as ours.
    let other = commit(
        &ours,
        4,
        Some(Checkpoint::new("other", Position::Postgres(Lsn(1)))),
    );
    assert!(only_others_committed("shop", &ours, &other).unwrap());
    // A compaction of this pipeline carries the same checkpoint: not a commit of changes.
    let compacted = commit(&ours, 5, Some(cp(100)));
    assert!(only_others_committed("shop", &ours, &compacted).unwrap());
    // Nothing new at all (the conflict came from elsewhere): planned again.
    assert!(only_others_committed("shop", &ours, &ours).unwrap());
}

#[test]
fn an_expired_parent_still_names_cdcds_snapshot() {
    let ours = commit(&commit(&empty(), 1, Some(cp(100))), 2, Some(cp(200)));
    let rewritten = commit(&ours, 3, None);
    // Spark's expire_snapshots(retain_last => 1): snapshot 2 is gone, 3's parent id still says 2.
    let expired = TableMetadataBuilder::new_from_metadata(rewritten, None)
        .remove_snapshots(&[1, 2])
        .build()
        .unwrap()
        .metadata;
    assert!(only_others_committed("shop", &ours, &expired).unwrap());
}

#[test]
fn a_commit_of_this_pipeline_or_a_rollback_stops() {
    let base = commit(&empty(), 1, Some(cp(100)));
    let ours = commit(&base, 2, Some(cp(200)));
    // A second daemon of this pipeline committed: its changes may be ours.
    let twin = commit(&ours, 3, Some(cp(300)));
    assert!(!only_others_committed("shop", &ours, &twin).unwrap());
    // Rolled back to snapshot 1 (main no longer descends from 2).
    let rolled = TableMetadataBuilder::new_from_metadata(ours.clone(), None)
        .set_ref(
            "main",
            iceberg::spec::SnapshotReference::new(
                1,
                iceberg::spec::SnapshotRetention::branch(None, None, None),
            ),
        )
        .unwrap()
        .build()
        .unwrap()
        .metadata;
    assert!(!only_others_committed("shop", &ours, &rolled).unwrap());
    // A lineage that never reaches cdcd's snapshot (the table replaced under its name).
    let cut = commit(&commit(&empty(), 7, None), 8, None);
    assert!(!only_others_committed("shop", &ours, &cut).unwrap());
}
