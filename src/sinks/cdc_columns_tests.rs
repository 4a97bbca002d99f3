use arrow_array::{Array, BooleanArray, Int64Array, StringArray};

use super::*;
use crate::changelog::{SourceTx, TxId};
use crate::sinks::iceberg::plan::{self, CellSource, FileLimits, KeyRef, RowRef};
use crate::test_fixtures::{changes, del, ins, schema, upd};

const SOFT: CdcColumns = CdcColumns {
    soft_deletes: true,
    row_metadata: false,
    defaults: true,
};

fn meta() -> CommitMeta {
    CommitMeta {
        position: "0/16B3748".into(),
    }
}

/// `cs` as a streamed run: of a source transaction.
fn streamed(cs: &[crate::test_fixtures::C]) -> TableChanges {
    let mut run = changes(cs);
    run.source_tx = Some(Arc::new(SourceTx {
        position: "0/20".parse().unwrap(),
        commit_micros: 1_700_000_000_000_000,
        id: TxId::Xid(7),
    }));
    run
}

fn soft(cs: &[crate::test_fixtures::C]) -> TableChanges {
    let (_, mut out) = SOFT
        .apply(&schema(), &[streamed(cs)], false, None, &meta())
        .unwrap()
        .unwrap();
    out.remove(0)
}

fn deleted(c: &TableChanges) -> Vec<bool> {
    let at = c.schema.column_index(DELETED).unwrap();
    let flags = c
        .rows
        .column(at)
        .as_any()
        .downcast_ref::<BooleanArray>()
        .unwrap();
    (0..flags.len()).map(|i| flags.value(i)).collect()
}

fn ids(c: &TableChanges) -> Vec<i64> {
    let ids = c
        .rows
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    ids.values().to_vec()
}

#[test]
fn a_delete_becomes_an_update_flagging_the_row_and_an_insert_an_upsert() {
    let c = soft(&[ins(1, "x"), del(1), ins(1, "y")]);
    assert_eq!(c.ops, vec![Op::Update, Op::Update, Op::Update]);
    assert_eq!(deleted(&c), vec![false, true, false]);
    // The delete carries only its key: the sink completes the rest from the row.
    assert!(c.is_present(0, 1) && !c.is_present(1, 1) && !c.is_present(2, 1));
    assert!(c.is_present(1, 2));
    assert_eq!(
        c.schema.columns.last().unwrap().initial_default.as_deref(),
        Some("false")
    );
}

#[test]
fn a_copy_keeps_its_inserts() {
    let (_, out) = SOFT
        .apply(
            &schema(),
            &[changes(&[ins(1, "x"), ins(2, "y")])],
            true,
            None,
            &meta(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(out[0].ops, vec![Op::Insert, Op::Insert]);
}

#[test]
fn a_key_change_flags_the_old_key_and_the_planner_keeps_its_row() {
    let c = soft(&[ins(1, "x"), (Op::Update, 2, Some(1), None, Some(20))]);
    assert_eq!(c.ops, vec![Op::Update, Op::Update, Op::Update]);
    assert_eq!(c.key_changed, vec![false, false, true]);
    assert_eq!(ids(&c), vec![1, 1, 2]);
    assert_eq!(deleted(&c), vec![false, true, false]);
    assert!(c.is_present(0, 1) && !c.is_present(1, 1) && !c.is_present(2, 1));
    let p = plan::plan_keeping_old_keys(&[c], &[0], FileLimits::default()).unwrap();
    // The first insert is replaced by its flagged version, which stays; the new key's absent
    // `a` comes from the old key's row.
    assert_eq!(p.files.len(), 1);
    let rows = &p.files[0].rows;
    assert_eq!(
        rows,
        &vec![RowRef { batch: 0, row: 1 }, RowRef { batch: 0, row: 2 }]
    );
    let a_of_new = p.files[0]
        .fills
        .iter()
        .find(|f| f.pos == 1 && f.column == 1);
    assert_eq!(
        a_of_new.map(|f| f.source),
        Some(CellSource::Change(RowRef { batch: 0, row: 0 }))
    );
    // A flagged row of the new key in the table (deleted earlier) is replaced.
    assert!(p.equality_deletes.contains(&KeyRef {
        batch: 0,
        row: 2,
        old: false
    }));
}

#[test]
fn truncate_is_refused_with_what_to_do() {
    let e = SOFT
        .apply(
            &schema(),
            &[streamed(&[(Op::Truncate, 0, None, None, None)])],
            false,
            None,
            &meta(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("TRUNCATE") && e.contains("resync"), "{e}");
}

#[test]
fn a_source_column_of_the_same_name_is_refused() {
    let mut s = (*schema()).clone();
    s.columns[1].name = DELETED.into();
    let e = SOFT.schema(&s, None).unwrap_err().to_string();
    assert!(e.contains("_cdc_deleted") && e.contains("rename"), "{e}");
    let meta_only = CdcColumns {
        soft_deletes: false,
        row_metadata: true,
        defaults: false,
    };
    assert!(meta_only.schema(&s, None).is_ok());
}

#[test]
fn row_metadata_fills_each_row_and_hard_deletes_stay() {
    let cdc = CdcColumns {
        soft_deletes: false,
        row_metadata: true,
        defaults: true,
    };
    let (table, out) = cdc
        .apply(
            &schema(),
            &[streamed(&[ins(1, "x"), upd(1, None, 3), del(1)])],
            false,
            None,
            &meta(),
        )
        .unwrap()
        .unwrap();
    let c = &out[0];
    assert_eq!(c.ops, vec![Op::Insert, Op::Update, Op::Delete]);
    let at = table.column_index(POSITION).unwrap();
    let positions = c
        .rows
        .column(at)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert!((0..3).all(|i| positions.value(i) == "0/20"));
    let at = table.column_index(COMMIT_TS).unwrap();
    let ts = c
        .rows
        .column(at)
        .as_any()
        .downcast_ref::<arrow_array::TimestampMicrosecondArray>()
        .unwrap();
    assert!((0..3).all(|i| ts.value(i) == 1_700_000_000_000_000));
    // A copy's rows: the checkpoint's position, no commit time; its TRUNCATE passes.
    let (_, out) = SOFT
        .apply(
            &schema(),
            &[changes(&[(Op::Truncate, 0, None, None, None), ins(1, "x")])],
            false,
            None,
            &meta(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(out[0].ops, vec![Op::Truncate, Op::Insert]);
    let (table, out) = cdc
        .apply(&schema(), &[changes(&[ins(1, "x")])], false, None, &meta())
        .unwrap()
        .unwrap();
    let at = table.column_index(COMMIT_TS).unwrap();
    assert!(out[0].rows.column(at).is_null(0));
    let at = table.column_index(POSITION).unwrap();
    assert_eq!(
        out[0]
            .rows
            .column(at)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .value(0),
        "0/16B3748"
    );
    assert_eq!(table.columns.len(), schema().columns.len() + 2);
    assert!(CdcColumns::default()
        .apply(&schema(), &[], false, None, &meta())
        .unwrap()
        .is_none());
}

#[test]
fn added_columns_stay_where_the_table_has_them_when_the_source_adds_one() {
    let mut source = (*schema()).clone();
    let mut c = source.columns[2].clone();
    c.name = "c".into();
    source.columns.push(c);
    let existing: Vec<String> = ["id", "a", "b", DELETED].map(String::from).to_vec();
    let (table, order) = SOFT.schema(&source, Some(&existing)).unwrap();
    let names: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["id", "a", "b", DELETED, "c"]);
    assert_eq!(order[3], Place::Added(DELETED));
    assert_eq!(table.primary_key, vec![0]);
    // A new table, or a table that did not have it: appended.
    let (table, _) = SOFT.schema(&source, Some(&existing[..3])).unwrap();
    assert_eq!(table.columns.last().unwrap().name, DELETED);
}
