use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_schema::DataType;

use super::*;
use crate::changelog::TableChangesBuilder;
use crate::test_fixtures::{changes, schema};

/// One change: op, key, optional old key, and `a`/`b` (None = absent).
#[derive(Clone, Copy)]
struct C {
    op: Op,
    id: i64,
    old: Option<i64>,
    a: Option<&'static str>,
    b: Option<i64>,
}

fn ins(id: i64, a: &'static str) -> C {
    C {
        op: Op::Insert,
        id,
        old: None,
        a: Some(a),
        b: Some(id),
    }
}
fn upd(id: i64, a: Option<&'static str>) -> C {
    C {
        op: Op::Update,
        id,
        old: None,
        a,
        b: Some(id),
    }
}
fn rekey(old: i64, id: i64, a: Option<&'static str>) -> C {
    C {
        old: Some(old),
        ..upd(id, a)
    }
}
fn del(id: i64) -> C {
    C {
        op: Op::Delete,
        id,
        old: None,
        a: None,
        b: None,
    }
}
fn trunc() -> C {
    C {
        op: Op::Truncate,
        id: 0,
        old: None,
        a: None,
        b: None,
    }
}

/// The changes `cs` as one batch of the fixtures' `public.t` (its `b` as `c.b`, not `id * 10`).
fn batch(cs: &[C]) -> TableChanges {
    let cs: Vec<_> = cs.iter().map(|c| (c.op, c.id, c.old, c.a, c.b)).collect();
    changes(&cs)
}

fn run(cs: &[C]) -> Plan {
    plan(&[batch(cs)], &[0], FileLimits::default()).unwrap()
}

fn rr(row: u32) -> RowRef {
    RowRef { batch: 0, row }
}
fn kr(row: u32, old: bool) -> KeyRef {
    KeyRef { batch: 0, row, old }
}

#[test]
fn inserts_only_append() {
    let p = run(&[ins(1, "x"), ins(2, "y")]);
    assert_eq!(p.files.len(), 1);
    assert_eq!(p.files[0].rows, vec![rr(0), rr(1)]);
    assert!(p.equality_deletes.is_empty() && p.position_deletes.is_empty());
    assert!(!p.truncate);
}

#[test]
fn update_of_an_earlier_row_is_an_equality_delete_plus_append() {
    let p = run(&[upd(7, Some("new"))]);
    assert_eq!(p.equality_deletes, vec![kr(0, false)]);
    assert_eq!(p.files[0].rows, vec![rr(0)]);
    assert!(p.lookups.is_empty(), "a whole row needs no lookup");
}

#[test]
fn update_within_the_commit_drops_the_open_row() {
    let p = run(&[ins(1, "x"), upd(1, Some("y"))]);
    assert_eq!(p.files[0].rows, vec![rr(1)]);
    assert!(p.equality_deletes.is_empty(), "key 1 was not in the table");
    assert!(p.position_deletes.is_empty());
}

#[test]
fn superseded_row_in_a_closed_file_gets_a_position_delete() {
    let limits = FileLimits {
        max_rows: 2,
        max_bytes: usize::MAX,
    };
    let cs = [
        ins(1, "a"),
        ins(2, "b"),
        ins(3, "c"),
        upd(1, Some("z")),
        del(2),
    ];
    let p = plan(&[batch(&cs)], &[0], limits).unwrap();
    assert_eq!(p.files.len(), 2);
    assert_eq!(p.files[0].rows, vec![rr(0), rr(1)]);
    assert_eq!(p.files[1].rows, vec![rr(2), rr(3)]);
    assert_eq!(p.position_deletes, vec![(0, 0), (0, 1)]);
    assert!(p.equality_deletes.is_empty());
}

#[test]
fn rolls_by_estimated_bytes() {
    let limits = FileLimits {
        max_rows: usize::MAX,
        max_bytes: 1,
    };
    let p = plan(&[batch(&[ins(1, "a"), ins(2, "b")])], &[0], limits).unwrap();
    assert_eq!(p.files.len(), 2);
}

#[test]
fn delete_of_an_earlier_row_is_one_equality_delete() {
    let p = run(&[del(5), del(5), upd(6, Some("x")), del(6)]);
    assert_eq!(p.equality_deletes, vec![kr(0, false), kr(2, false)]);
    assert!(p.files.is_empty(), "the update's row was dropped");
}

#[test]
fn reinsert_after_delete() {
    let p = run(&[del(5), ins(5, "again")]);
    assert_eq!(p.equality_deletes, vec![kr(0, false)]);
    assert_eq!(p.files[0].rows, vec![rr(1)]);
}

#[test]
fn key_change_deletes_the_old_key() {
    let p = run(&[rekey(1, 2, Some("x"))]);
    assert_eq!(p.equality_deletes, vec![kr(0, true)]);
    assert_eq!(p.files[0].rows, vec![rr(0)]);
    let p = run(&[ins(1, "x"), rekey(1, 2, Some("y")), upd(2, Some("z"))]);
    assert!(p.equality_deletes.is_empty());
    assert_eq!(p.files[0].rows, vec![rr(2)]);
}

#[test]
fn truncate_discards_everything_before_it() {
    let p = run(&[ins(1, "x"), del(9), trunc(), ins(2, "y"), del(3)]);
    assert!(p.truncate);
    assert_eq!(p.files[0].rows, vec![rr(3)]);
    assert!(
        p.equality_deletes.is_empty(),
        "nothing older survives a truncate"
    );
}

#[test]
fn partial_update_from_the_table_is_looked_up_once() {
    let p = run(&[upd(4, None), upd(4, None)]);
    assert_eq!(p.lookups, vec![kr(0, false)]);
    assert_eq!(p.equality_deletes, vec![kr(0, false)]);
    assert_eq!(p.files[0].rows, vec![rr(1)]);
    assert_eq!(
        p.files[0].fills,
        vec![Fill {
            pos: 0,
            column: 1,
            source: CellSource::Table(0)
        }]
    );
}

#[test]
fn partial_update_from_this_commit() {
    let p = run(&[ins(1, "x"), upd(1, None), upd(1, None)]);
    assert!(p.lookups.is_empty());
    assert_eq!(
        p.files[0].fills,
        vec![Fill {
            pos: 0,
            column: 1,
            source: CellSource::Change(rr(0))
        }]
    );
    let p = run(&[rekey(1, 2, None)]);
    assert_eq!(
        p.lookups,
        vec![kr(0, true)],
        "completed from the old key's row"
    );
}

#[test]
fn partial_update_of_a_missing_row_is_an_error() {
    for cs in [
        vec![del(1), upd(1, None)],
        vec![trunc(), upd(1, None)],
        vec![ins(1, "x"), del(1), upd(1, None)],
    ] {
        let err = plan(&[batch(&cs)], &[0], FileLimits::default()).unwrap_err();
        assert!(
            matches!(err, PlanError::Incomplete { column: 1, .. }),
            "{err}"
        );
    }
}

#[test]
fn spans_batches() {
    let p = plan(
        &[batch(&[ins(1, "x")]), batch(&[upd(1, None)])],
        &[0],
        FileLimits::default(),
    )
    .unwrap();
    assert_eq!(p.files[0].rows, vec![RowRef { batch: 1, row: 0 }]);
    assert_eq!(
        p.files[0].fills[0].source,
        CellSource::Change(RowRef { batch: 0, row: 0 })
    );
}

#[test]
fn empty_changes_plan_nothing() {
    assert_eq!(
        plan(&[], &[0], FileLimits::default()).unwrap(),
        Plan::default()
    );
}

// The insert fast path (plan/inserts.rs): taken only when distinctness is shown by order, and
// then the same plan as the general path; every other input goes to the general path.

fn ids(range: std::ops::RangeInclusive<i64>) -> Vec<C> {
    range.map(|id| ins(id, "x")).collect()
}

/// Whether the fast path takes `changes`, and the plan `plan` makes, checked equal to the
/// general path's.
fn fast_and_general(changes: &[TableChanges], limits: FileLimits) -> (bool, Plan) {
    let converter = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
    let keys: Vec<Rows> = changes
        .iter()
        .map(|c| encode_keys(&converter, &c.rows, &[0]).unwrap())
        .collect();
    let bytes: Vec<usize> = changes
        .iter()
        .map(|c| c.rows.get_array_memory_size() / c.len().max(1))
        .collect();
    let fast = inserts::plan_distinct_inserts(changes, &[0], &keys, &bytes, limits).is_some();
    let planned = plan(changes, &[0], limits).unwrap();
    let general = plan_with(changes, &[0], limits, Route::General, false).unwrap();
    assert_eq!(planned, general, "the fast path planned otherwise");
    (fast, planned)
}

#[test]
fn distinct_inserts_in_disjoint_batches_take_the_fast_path() {
    // Batches out of key order (parallel chunk readers), an empty one, files cut at 4 rows.
    let changes = [
        batch(&ids(1..=5)),
        batch(&ids(20..=22)),
        batch(&[]),
        batch(&ids(6..=8)),
    ];
    let limits = FileLimits {
        max_rows: 4,
        max_bytes: usize::MAX,
    };
    let (fast, p) = fast_and_general(&changes, limits);
    assert!(fast);
    assert_eq!(p.files.len(), 3);
    assert_eq!(p.data_rows(), 11);
    assert_eq!(p.files[1].rows[0], RowRef { batch: 0, row: 4 });
    let last: Vec<RowRef> = (0..3).map(|row| RowRef { batch: 3, row }).collect();
    assert_eq!(p.files[2].rows, last, "the empty batch is skipped");
    assert!(p.position_deletes.is_empty() && p.equality_deletes.is_empty());
    assert!(p.lookups.is_empty() && !p.truncate);
}

#[test]
fn a_leading_truncate_marker_takes_the_fast_path_as_a_truncate() {
    // A fresh table's first copy commit: the marker batch, then the copy's batches.
    let changes = [batch(&[trunc()]), batch(&ids(10..=12)), batch(&ids(1..=2))];
    let (fast, p) = fast_and_general(&changes, FileLimits::default());
    assert!(fast);
    assert!(p.truncate);
    assert_eq!(p.data_rows(), 5);
    assert_eq!(p.files[0].rows[0], RowRef { batch: 1, row: 0 });
    // A truncate after rows is not a marker: the general path.
    let (fast, p) = fast_and_general(
        &[batch(&ids(1..=2)), batch(&[trunc()]), batch(&ids(3..=4))],
        FileLimits::default(),
    );
    assert!(!fast);
    assert!(p.truncate);
    assert_eq!(p.data_rows(), 2);
}

#[test]
fn fast_path_rolls_by_estimated_bytes_like_the_general_path() {
    let changes = [batch(&ids(1..=10)), batch(&ids(11..=13))];
    let row = changes[0].rows.get_array_memory_size() / 10;
    let limits = FileLimits {
        max_rows: usize::MAX,
        max_bytes: row * 3 + 1,
    };
    let (fast, p) = fast_and_general(&changes, limits);
    assert!(fast);
    assert!(p.files.len() >= 3, "{} files", p.files.len());
}

#[test]
fn duplicate_keys_go_to_the_general_path() {
    // Across batches: the later insert replaces the earlier, still open, row.
    let (fast, p) = fast_and_general(
        &[batch(&ids(1..=3)), batch(&ids(3..=4))],
        FileLimits::default(),
    );
    assert!(!fast);
    assert_eq!(p.data_rows(), 4);
    assert!(!p.files[0].rows.contains(&RowRef { batch: 0, row: 2 }));
    // Within a batch (not strictly increasing).
    let (fast, p) = fast_and_general(&[batch(&[ins(1, "a"), ins(1, "b")])], FileLimits::default());
    assert!(!fast);
    assert_eq!(p.files[0].rows, vec![rr(1)]);
}

#[test]
fn distinct_keys_out_of_order_are_shown_distinct_by_sorting() {
    let (fast, p) = fast_and_general(
        &[batch(&[ins(3, "a"), ins(1, "b"), ins(2, "c")])],
        FileLimits::default(),
    );
    assert!(fast, "descending step");
    assert_eq!(p.data_rows(), 3);
    let (fast, p) = fast_and_general(
        &[batch(&[ins(1, "a"), ins(5, "b")]), batch(&[ins(3, "c")])],
        FileLimits::default(),
    );
    assert!(
        fast,
        "ranges [1,5] and [3,3] overlap though the keys are distinct"
    );
    assert_eq!(p.data_rows(), 3);
    // Out of order and repeated: the general path.
    let (fast, p) = fast_and_general(
        &[
            batch(&[ins(4, "a"), ins(2, "b")]),
            batch(&[ins(3, "c"), ins(4, "d")]),
        ],
        FileLimits::default(),
    );
    assert!(!fast);
    assert_eq!(p.data_rows(), 3);
}

#[test]
fn other_ops_go_to_the_general_path() {
    for cs in [
        vec![ins(1, "a"), del(7)],
        vec![ins(1, "a"), upd(2, Some("b"))],
        vec![ins(1, "a"), trunc(), ins(2, "b")],
    ] {
        let (fast, p) = fast_and_general(&[batch(&cs)], FileLimits::default());
        assert!(!fast);
        assert!(!p.equality_deletes.is_empty() || p.truncate);
    }
}

#[test]
fn absent_cells_and_null_keys_are_still_reported() {
    let partial = C {
        a: None,
        ..ins(2, "a")
    };
    let changes = [batch(&[ins(1, "a"), partial])];
    let err = plan(&changes, &[0], FileLimits::default()).unwrap_err();
    assert!(
        matches!(err, PlanError::Incomplete { column: 1, .. }),
        "{err}"
    );

    let mut b = TableChangesBuilder::new(schema(), 2);
    for id in [Some(1), None] {
        b.begin(Op::Insert);
        let key = b.value(0).unwrap().as_any_mut();
        let key = key.downcast_mut::<Int64Builder>().unwrap();
        match id {
            Some(id) => key.append_value(id),
            None => key.append_null(),
        }
        let a = b.value(1).unwrap().as_any_mut();
        a.downcast_mut::<StringBuilder>().unwrap().append_value("a");
        let v = b.value(2).unwrap().as_any_mut();
        v.downcast_mut::<Int64Builder>().unwrap().append_value(0);
        b.no_old_key().unwrap();
    }
    let err = plan(&[b.finish().unwrap()], &[0], FileLimits::default()).unwrap_err();
    assert!(matches!(err, PlanError::NullKey { .. }), "{err}");
}

/// A keyless table (issue 23) is an append table: equal rows stay two rows, a truncate drops
/// what came before it, and an update, a delete or a partial insert is refused, never guessed.
#[test]
fn keyless_tables_append_duplicates_and_refuse_updates_and_deletes() {
    let limits = FileLimits {
        max_rows: 2,
        ..FileLimits::default()
    };
    let cs = [
        ins(1, "a"),
        ins(1, "a"),
        trunc(),
        ins(1, "a"),
        ins(1, "a"),
        ins(2, "b"),
    ];
    let p = plan(&[batch(&cs)], &[], limits).unwrap();
    assert!(p.truncate);
    assert_eq!(
        p.files.iter().map(|f| f.rows.clone()).collect::<Vec<_>>(),
        vec![vec![rr(3), rr(4)], vec![rr(5)]]
    );
    assert!(p.equality_deletes.is_empty() && p.position_deletes.is_empty() && p.lookups.is_empty());
    let err = plan(&[batch(&[ins(1, "a"), upd(1, Some("x"))])], &[], limits).unwrap_err();
    assert!(matches!(err, PlanError::Keyless { .. }), "{err}");
    // A delete whose before image lacks columns does not identify a row of a multiset.
    let err = plan(&[batch(&[ins(1, "a"), del(1)])], &[], limits).unwrap_err();
    assert!(
        matches!(err, PlanError::PartialImage { column: 1 }),
        "{err}"
    );
    let partial = C {
        b: None,
        ..ins(1, "a")
    };
    let err = plan(&[batch(&[partial])], &[], limits).unwrap_err();
    assert!(
        matches!(err, PlanError::KeylessAbsent { column: 2 }),
        "{err}"
    );
}

/// A delete of a keyless table with its whole before image (issue 23).
fn gone(id: i64, a: &'static str) -> C {
    C {
        op: Op::Delete,
        a: Some(a),
        ..ins(id, a)
    }
}

fn keyless(cs: &[C], max_rows: usize) -> Result<Plan, PlanError> {
    let limits = FileLimits {
        max_rows,
        ..FileLimits::default()
    };
    plan(&[batch(cs)], &[], limits)
}

/// Issue 23, multisets: a delete removes exactly one equal row — the newest copy this commit
/// wrote (dropped while its file is open, a position delete once it is closed), else one copy of
/// an earlier snapshot (`row_deletes`, located by the commit) — and never an equality delete.
#[test]
fn multiset_deletes_remove_one_equal_row_each() {
    // Three copies, one deleted: the open copy is dropped, the closed file keeps two.
    let p = keyless(&[ins(1, "a"), ins(1, "a"), ins(1, "a"), gone(1, "a")], 2).unwrap();
    assert_eq!(
        p.files.iter().map(|f| f.rows.clone()).collect::<Vec<_>>(),
        vec![vec![rr(0), rr(1)]]
    );
    assert!(p.position_deletes.is_empty() && p.row_deletes.is_empty());
    assert!(p.equality_deletes.is_empty() && p.lookups.is_empty());

    // Copies in a closed file get position deletes; one delete more than this commit's copies
    // takes a row of the table.
    let p = keyless(
        &[
            ins(1, "a"),
            ins(1, "a"),
            gone(1, "a"),
            gone(1, "a"),
            gone(1, "a"),
        ],
        2,
    )
    .unwrap();
    assert_eq!(p.position_deletes, vec![(0, 0), (0, 1)]);
    assert_eq!(p.row_deletes, vec![rr(4)]);
    assert!(p.equality_deletes.is_empty());

    // Rows differing in any column are different rows.
    let p = keyless(&[ins(1, "a"), gone(1, "b"), gone(2, "a")], 10).unwrap();
    assert_eq!(p.row_deletes, vec![rr(1), rr(2)]);
    assert_eq!(p.files.len(), 1);
}

/// An update arrives as delete(before) + insert(after), in order: a delete never takes a copy
/// inserted after it, and an update of every copy leaves as many new rows.
#[test]
fn multiset_updates_keep_order_and_counts() {
    // The table's (1,a) becomes (1,b), which becomes (1,a) again: one table row deleted, one row
    // written, equal to the one removed.
    let p = keyless(&[gone(1, "a"), ins(1, "b"), gone(1, "b"), ins(1, "a")], 10).unwrap();
    assert_eq!(p.row_deletes, vec![rr(0)]);
    assert_eq!(
        p.files.iter().map(|f| f.rows.clone()).collect::<Vec<_>>(),
        vec![vec![rr(3)]]
    );
    // Two table copies of (1,a) both updated to (1,c): two table rows, two new rows.
    let p = keyless(&[gone(1, "a"), ins(1, "c"), gone(1, "a"), ins(1, "c")], 10).unwrap();
    assert_eq!(p.row_deletes, vec![rr(0), rr(2)]);
    assert_eq!(p.files.iter().map(|f| f.rows.len()).sum::<usize>(), 2);
}

/// A truncate forgets the deletes before it; a delete after it with no copy written since
/// names a row that cannot exist and stops, never skipped.
#[test]
fn multiset_truncate_and_missing_rows() {
    let p = keyless(&[gone(1, "a"), trunc(), ins(2, "b"), gone(2, "b")], 10).unwrap();
    assert!(p.truncate);
    assert!(p.row_deletes.is_empty() && p.files.is_empty() && p.position_deletes.is_empty());
    let err = keyless(&[trunc(), ins(1, "a"), gone(1, "a"), gone(1, "a")], 10).unwrap_err();
    assert!(
        matches!(err, PlanError::NoSuchRow { row } if row == rr(3)),
        "{err}"
    );
}
