//! What a REST catalog commit sends: the difference between the metadata cdcd built on (`base`)
//! and the metadata it wants (`next`), as the spec's requirements and updates (Iceberg REST
//! spec, `CommitTableRequest`). Pure.
//!
//! cdcd's commit steps (`commit/`, `maintenance/`) build a whole next `TableMetadata`, as they do
//! for the filesystem and SQL catalogs; a REST server instead applies updates to its own current
//! metadata and writes the file itself. Diffing keeps one commit path for all catalogs. What cdcd
//! changes, and so what is diffed: snapshots (added, removed), refs, schemas (added, current),
//! properties, the format version, partition specs and sort orders (added, default: the
//! configured layout, `layout.rs`). Specs and orders are never removed and the location never
//! changes under cdcd; a difference there is refused rather than sent half.
//!
//! Requirements: the table's UUID (a table dropped and recreated under the name is another
//! table) and `main`'s snapshot id (optimistic concurrency: any other writer's commit to `main`
//! in between fails this one with 409, and cdcd re-plans on the new state); with a schema
//! change also the current schema id and the last assigned field id, as Iceberg-Java's
//! `UpdateSchema` requires; with a spec change the default spec id and the last assigned
//! partition id (`UpdatePartitionSpec`), with an order change the default order id.

use std::collections::{BTreeMap, HashMap, HashSet};

use iceberg::spec::{SnapshotReference, TableMetadata};
use iceberg::{TableRequirement, TableUpdate};

/// The branch cdcd commits to.
pub(crate) const MAIN: &str = "main";

/// One table's requirements and updates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Changes {
    pub requirements: Vec<TableRequirement>,
    pub updates: Vec<TableUpdate>,
}

/// The changes that turn `base` into `next`; `Err` names what cdcd cannot send.
pub(crate) fn between(base: &TableMetadata, next: &TableMetadata) -> Result<Changes, String> {
    refuse_unsendable(base, next)?;
    let mut requirements = vec![
        TableRequirement::UuidMatch { uuid: base.uuid() },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN.to_owned(),
            snapshot_id: base.snapshot_for_ref(MAIN).map(|s| s.snapshot_id()),
        },
    ];
    let mut updates = Vec::new();
    if next.format_version() != base.format_version() {
        updates.push(TableUpdate::UpgradeFormatVersion {
            format_version: next.format_version(),
        });
    }
    schema_updates(base, next, &mut requirements, &mut updates);
    layout_updates(base, next, &mut requirements, &mut updates);
    snapshot_updates(base, next, &mut updates)?;
    property_updates(base, next, &mut updates);
    Ok(Changes {
        requirements,
        updates,
    })
}

fn refuse_unsendable(base: &TableMetadata, next: &TableMetadata) -> Result<(), String> {
    if base.uuid() != next.uuid() {
        return Err("the table's UUID changed".into());
    }
    if base.location() != next.location() {
        return Err("the table's location changed".into());
    }
    let specs: HashSet<i32> = next.partition_specs_iter().map(|s| s.spec_id()).collect();
    if base
        .partition_specs_iter()
        .any(|s| !specs.contains(&s.spec_id()))
    {
        return Err("a partition spec was removed".into());
    }
    let orders: HashSet<i64> = next.sort_orders_iter().map(|o| o.order_id).collect();
    if base
        .sort_orders_iter()
        .any(|o| !orders.contains(&o.order_id))
    {
        return Err("a sort order was removed".into());
    }
    Ok(())
}

/// Added partition specs and sort orders, and a new default of either (`layout.rs`).
fn layout_updates(
    base: &TableMetadata,
    next: &TableMetadata,
    requirements: &mut Vec<TableRequirement>,
    updates: &mut Vec<TableUpdate>,
) {
    let known: HashSet<i32> = base.partition_specs_iter().map(|s| s.spec_id()).collect();
    let mut added: Vec<_> = next
        .partition_specs_iter()
        .filter(|s| !known.contains(&s.spec_id()))
        .collect();
    added.sort_by_key(|s| s.spec_id());
    let default = next.default_partition_spec_id();
    if !added.is_empty() || default != base.default_partition_spec_id() {
        requirements.push(TableRequirement::LastAssignedPartitionIdMatch {
            last_assigned_partition_id: base.last_partition_id(),
        });
        requirements.push(TableRequirement::DefaultSpecIdMatch {
            default_spec_id: base.default_partition_spec_id(),
        });
        let default_is_added = added.last().is_some_and(|s| s.spec_id() == default);
        for spec in added {
            updates.push(TableUpdate::AddSpec {
                spec: spec.as_ref().clone().into_unbound(),
            });
        }
        if default != base.default_partition_spec_id() {
            // -1: "the spec added last", since a server may number an added spec itself.
            let spec_id = if default_is_added { -1 } else { default };
            updates.push(TableUpdate::SetDefaultSpec { spec_id });
        }
    }
    let known: HashSet<i64> = base.sort_orders_iter().map(|o| o.order_id).collect();
    let mut added: Vec<_> = next
        .sort_orders_iter()
        .filter(|o| !known.contains(&o.order_id))
        .collect();
    added.sort_by_key(|o| o.order_id);
    let default = next.default_sort_order_id();
    if !added.is_empty() || default != base.default_sort_order_id() {
        requirements.push(TableRequirement::DefaultSortOrderIdMatch {
            default_sort_order_id: base.default_sort_order_id(),
        });
        let default_is_added = added.last().is_some_and(|o| o.order_id == default);
        for order in added {
            updates.push(TableUpdate::AddSortOrder {
                sort_order: order.as_ref().clone(),
            });
        }
        if default != base.default_sort_order_id() {
            let sort_order_id = if default_is_added { -1 } else { default };
            updates.push(TableUpdate::SetDefaultSortOrder { sort_order_id });
        }
    }
}

fn schema_updates(
    base: &TableMetadata,
    next: &TableMetadata,
    requirements: &mut Vec<TableRequirement>,
    updates: &mut Vec<TableUpdate>,
) {
    let known: HashSet<i32> = base.schemas_iter().map(|s| s.schema_id()).collect();
    let mut added: Vec<_> = next
        .schemas_iter()
        .filter(|s| !known.contains(&s.schema_id()))
        .collect();
    added.sort_by_key(|s| s.schema_id());
    let current_changed = next.current_schema_id() != base.current_schema_id();
    if added.is_empty() && !current_changed {
        return;
    }
    requirements.push(TableRequirement::CurrentSchemaIdMatch {
        current_schema_id: base.current_schema_id(),
    });
    requirements.push(TableRequirement::LastAssignedFieldIdMatch {
        last_assigned_field_id: base.last_column_id(),
    });
    let current_is_added = added
        .last()
        .is_some_and(|s| s.schema_id() == next.current_schema_id());
    for schema in added {
        updates.push(TableUpdate::AddSchema {
            schema: schema.as_ref().clone(),
        });
    }
    if current_changed {
        // -1: "the schema added last" (the spec's convention), since a server may number an
        // added schema itself.
        let schema_id = if current_is_added {
            -1
        } else {
            next.current_schema_id()
        };
        updates.push(TableUpdate::SetCurrentSchema { schema_id });
    }
}

fn snapshot_updates(
    base: &TableMetadata,
    next: &TableMetadata,
    updates: &mut Vec<TableUpdate>,
) -> Result<(), String> {
    let before: HashSet<i64> = base.snapshots().map(|s| s.snapshot_id()).collect();
    let after: HashSet<i64> = next.snapshots().map(|s| s.snapshot_id()).collect();
    let mut added: Vec<_> = next
        .snapshots()
        .filter(|s| !before.contains(&s.snapshot_id()))
        .collect();
    added.sort_by_key(|s| (s.sequence_number(), s.timestamp_ms()));
    for snapshot in added {
        updates.push(TableUpdate::AddSnapshot {
            snapshot: snapshot.as_ref().clone(),
        });
    }
    let (base_refs, next_refs) = (refs(base)?, refs(next)?);
    for (name, reference) in &next_refs {
        if base_refs.get(name) != Some(reference) {
            updates.push(TableUpdate::SetSnapshotRef {
                ref_name: name.clone(),
                reference: reference.clone(),
            });
        }
    }
    for name in base_refs.keys() {
        if !next_refs.contains_key(name) {
            updates.push(TableUpdate::RemoveSnapshotRef {
                ref_name: name.clone(),
            });
        }
    }
    let mut removed: Vec<i64> = before.difference(&after).copied().collect();
    if !removed.is_empty() {
        removed.sort_unstable();
        updates.push(TableUpdate::RemoveSnapshots {
            snapshot_ids: removed,
        });
    }
    Ok(())
}

/// The metadata's refs. `TableMetadata` has no accessor for them, so they are read from its
/// serialized form (the spec's `refs` field).
fn refs(meta: &TableMetadata) -> Result<BTreeMap<String, SnapshotReference>, String> {
    let json = serde_json::to_value(meta).map_err(|e| format!("serializing the metadata: {e}"))?;
    match json.get("refs") {
        None | Some(serde_json::Value::Null) => Ok(BTreeMap::new()),
        Some(refs) => serde_json::from_value(refs.clone())
            .map_err(|e| format!("reading the metadata's refs: {e}")),
    }
}

fn property_updates(base: &TableMetadata, next: &TableMetadata, updates: &mut Vec<TableUpdate>) {
    let (old, new) = (base.properties(), next.properties());
    let set: HashMap<String, String> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut removals: Vec<String> = old
        .keys()
        .filter(|k| !new.contains_key(*k))
        .cloned()
        .collect();
    if !set.is_empty() {
        updates.push(TableUpdate::SetProperties { updates: set });
    }
    if !removals.is_empty() {
        removals.sort();
        updates.push(TableUpdate::RemoveProperties { removals });
    }
}

/// Whether `now` (the table as loaded after a commit whose answer was lost) shows that commit:
/// `next`'s head of `main` is in it (a later writer may have committed on top), and the
/// snapshots `next` removed from `base` are gone. A commit that adds no snapshot (an expiry)
/// shows by its removals and properties alone.
pub(crate) fn landed(base: &TableMetadata, next: &TableMetadata, now: &TableMetadata) -> bool {
    let head = next.snapshot_for_ref(MAIN).map(|s| s.snapshot_id());
    let base_head = base.snapshot_for_ref(MAIN).map(|s| s.snapshot_id());
    if head != base_head {
        return head.is_some_and(|id| now.snapshot_by_id(id).is_some());
    }
    let after: HashSet<i64> = next.snapshots().map(|s| s.snapshot_id()).collect();
    let removed: Vec<i64> = base
        .snapshots()
        .map(|s| s.snapshot_id())
        .filter(|id| !after.contains(id))
        .collect();
    let props_applied = next
        .properties()
        .iter()
        .all(|(k, v)| now.properties().get(k) == Some(v));
    // A layout change shows by its defaults (a server may number them otherwise: compared by
    // fields).
    let layout_applied = next.default_partition_spec().fields().len()
        == now.default_partition_spec().fields().len()
        && next
            .default_partition_spec()
            .fields()
            .iter()
            .zip(now.default_partition_spec().fields())
            .all(|(a, b)| a.source_id == b.source_id && a.transform == b.transform)
        && next.default_sort_order().fields == now.default_sort_order().fields;
    removed.iter().all(|id| now.snapshot_by_id(*id).is_none()) && props_applied && layout_applied
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use iceberg::spec::{
        FormatVersion, NestedField, Operation, PrimitiveType, Schema, Snapshot, Summary,
        TableMetadataBuilder, Type,
    };

    use super::*;
    use crate::changelog::TableId;
    use crate::sinks::iceberg::commit::publish;

    fn schema(fields: &[(i32, &str)]) -> Schema {
        Schema::builder()
            .with_fields(
                fields
                    .iter()
                    .map(|(id, name)| {
                        Arc::new(NestedField::optional(
                            *id,
                            *name,
                            Type::Primitive(PrimitiveType::Long),
                        ))
                    })
                    .collect::<Vec<_>>(),
            )
            .build()
            .unwrap()
    }

    fn table() -> TableMetadata {
        let props = HashMap::from([("a".to_owned(), "1".to_owned())]);
        publish::new_table(
            &TableId::new("shop", "t"),
            "file:///w/shop/t",
            schema(&[(1, "id")]),
            FormatVersion::V3,
            props,
        )
        .unwrap()
    }

    fn snapshot(id: i64, parent: Option<i64>, sequence: i64) -> Snapshot {
        Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(parent)
            .with_sequence_number(sequence)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis() + sequence)
            .with_manifest_list(format!("file:///w/shop/t/metadata/snap-{id}.avro"))
            .with_summary(Summary {
                operation: Operation::Append,
                additional_properties: HashMap::new(),
            })
            .with_row_range(0, 0)
            .build()
    }

    fn with_snapshot(meta: &TableMetadata, s: Snapshot) -> TableMetadata {
        TableMetadataBuilder::new_from_metadata(meta.clone(), None)
            .set_branch_snapshot(s, MAIN)
            .unwrap()
            .build()
            .unwrap()
            .metadata
    }

    #[test]
    fn a_commit_adds_its_snapshot_and_moves_main_under_two_requirements() {
        let base = table();
        let next = with_snapshot(&base, snapshot(11, None, 1));
        let c = between(&base, &next).unwrap();
        assert_eq!(
            c.requirements,
            vec![
                TableRequirement::UuidMatch { uuid: base.uuid() },
                TableRequirement::RefSnapshotIdMatch {
                    r#ref: "main".into(),
                    snapshot_id: None
                },
            ]
        );
        assert_eq!(c.updates.len(), 2, "{:?}", c.updates);
        assert!(
            matches!(&c.updates[0], TableUpdate::AddSnapshot { snapshot } if snapshot.snapshot_id() == 11)
        );
        assert!(matches!(
            &c.updates[1],
            TableUpdate::SetSnapshotRef { ref_name, reference } if ref_name == "main" && reference.snapshot_id == 11
        ));
        // The next commit asserts main is still at 11.
        let after = with_snapshot(&next, snapshot(12, Some(11), 2));
        let c = between(&next, &after).unwrap();
        assert!(c
            .requirements
            .contains(&TableRequirement::RefSnapshotIdMatch {
                r#ref: "main".into(),
                snapshot_id: Some(11)
            }));
        // The wire form is the spec's.
        let json = serde_json::to_value(&c.updates).unwrap();
        assert_eq!(json[0]["action"], "add-snapshot");
        assert_eq!(json[0]["snapshot"]["parent-snapshot-id"], 11);
        assert_eq!(json[1]["action"], "set-snapshot-ref");
        assert_eq!(json[1]["type"], "branch");
    }

    #[test]
    fn a_schema_change_asserts_the_schema_and_field_ids_and_sets_the_added_one() {
        let base = with_snapshot(&table(), snapshot(11, None, 1));
        let evolved = TableMetadataBuilder::new_from_metadata(base.clone(), None)
            .add_current_schema(schema(&[(1, "id"), (2, "added")]))
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        let next = with_snapshot(&evolved, snapshot(12, Some(11), 2));
        let c = between(&base, &next).unwrap();
        assert!(c
            .requirements
            .contains(&TableRequirement::CurrentSchemaIdMatch {
                current_schema_id: base.current_schema_id()
            }));
        assert!(c
            .requirements
            .contains(&TableRequirement::LastAssignedFieldIdMatch {
                last_assigned_field_id: 1
            }));
        let json = serde_json::to_value(&c.updates).unwrap();
        let actions: Vec<&str> = json
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["action"].as_str().unwrap())
            .collect();
        assert_eq!(
            actions,
            [
                "add-schema",
                "set-current-schema",
                "add-snapshot",
                "set-snapshot-ref"
            ]
        );
        assert_eq!(json[1]["schema-id"], -1);
    }

    /// Issue 36: a changed `partition_by`/`sort_by` is sent as Iceberg-Java's
    /// `UpdatePartitionSpec`/`ReplaceSortOrder` send it, and a server applying the updates ends
    /// with the same default spec and order.
    #[test]
    fn a_layout_change_adds_and_sets_the_spec_and_order_under_their_requirements() {
        let base = with_snapshot(&table(), snapshot(11, None, 1));
        let spec = iceberg::spec::UnboundPartitionSpec::builder()
            .add_partition_field(1, "id_bucket_4", iceberg::spec::Transform::Bucket(4))
            .unwrap()
            .build();
        let order = iceberg::spec::SortOrder::builder()
            .with_sort_field(iceberg::spec::SortField {
                source_id: 1,
                transform: iceberg::spec::Transform::Identity,
                direction: iceberg::spec::SortDirection::Descending,
                null_order: iceberg::spec::NullOrder::Last,
            })
            .build(base.current_schema())
            .unwrap();
        let layout = crate::sinks::iceberg::layout::Layout {
            spec: Some(spec),
            order: Some(order),
        };
        let next = crate::sinks::iceberg::layout::evolve(&base, "file:///m/v2.json", &layout)
            .unwrap()
            .unwrap()
            .metadata;
        let c = between(&base, &next).unwrap();
        for r in [
            TableRequirement::LastAssignedPartitionIdMatch {
                last_assigned_partition_id: 999,
            },
            TableRequirement::DefaultSpecIdMatch { default_spec_id: 0 },
            TableRequirement::DefaultSortOrderIdMatch {
                default_sort_order_id: 0,
            },
        ] {
            assert!(c.requirements.contains(&r), "{r:?}: {:?}", c.requirements);
        }
        let json = serde_json::to_value(&c.updates).unwrap();
        let actions: Vec<&str> = json
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["action"].as_str().unwrap())
            .collect();
        assert_eq!(
            actions,
            [
                "add-spec",
                "set-default-spec",
                "add-sort-order",
                "set-default-sort-order"
            ]
        );
        assert_eq!(json[1]["spec-id"], -1);
        assert_eq!(json[3]["sort-order-id"], -1);
        let mut applied = TableMetadataBuilder::new_from_metadata(base.clone(), None);
        for u in c.updates {
            applied = u.apply(applied).unwrap();
        }
        let applied = applied.build().unwrap().metadata;
        assert_eq!(
            applied.default_partition_spec(),
            next.default_partition_spec()
        );
        assert_eq!(applied.default_sort_order(), next.default_sort_order());
        assert!(landed(&base, &next, &applied));
        assert!(!landed(&base, &next, &base));
    }

    #[test]
    fn an_expiry_removes_snapshots_and_properties_changes_are_sent_alone() {
        let one = with_snapshot(&table(), snapshot(11, None, 1));
        let two = with_snapshot(&one, snapshot(12, Some(11), 2));
        // The builder refuses an update dated before the snapshots it follows.
        std::thread::sleep(std::time::Duration::from_millis(10));
        let expired = TableMetadataBuilder::new_from_metadata(two.clone(), None)
            .remove_snapshots(&[11])
            .remove_properties(&["a".to_owned()])
            .unwrap()
            .set_properties(HashMap::from([("b".to_owned(), "2".to_owned())]))
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        let c = between(&two, &expired).unwrap();
        assert_eq!(
            c.updates,
            vec![
                TableUpdate::RemoveSnapshots {
                    snapshot_ids: vec![11]
                },
                TableUpdate::SetProperties {
                    updates: HashMap::from([("b".to_owned(), "2".to_owned())])
                },
                TableUpdate::RemoveProperties {
                    removals: vec!["a".to_owned()]
                },
            ]
        );
        assert!(landed(&two, &expired, &expired));
        assert!(!landed(&two, &expired, &two));
    }

    #[test]
    fn landed_finds_the_head_also_under_a_later_commit() {
        let base = with_snapshot(&table(), snapshot(11, None, 1));
        let ours = with_snapshot(&base, snapshot(12, Some(11), 2));
        let later = with_snapshot(&ours, snapshot(13, Some(12), 3));
        let theirs = with_snapshot(&base, snapshot(14, Some(11), 2));
        assert!(landed(&base, &ours, &ours));
        assert!(landed(&base, &ours, &later));
        assert!(!landed(&base, &ours, &base));
        assert!(!landed(&base, &ours, &theirs));
    }

    #[test]
    fn what_cdcd_never_changes_is_refused_not_sent() {
        let base = table();
        let moved = TableMetadataBuilder::new_from_metadata(base.clone(), None)
            .set_location("file:///elsewhere".into())
            .build()
            .unwrap()
            .metadata;
        let e = between(&base, &moved).unwrap_err();
        assert!(e.contains("location"), "{e}");
    }
}
