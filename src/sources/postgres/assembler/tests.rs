//! Assembler tests on synthetic pgoutput bytes (layouts per the Postgres docs, "Logical
//! Replication Message Formats"), protocol 3 as Postgres 15 sends it.

use super::*;
use crate::changelog::SourceTx;
use crate::sources::postgres::decoder::message_bytes::{Msg, TOAST};
use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::Array;

const INT4: u32 = 23;
const TEXT: u32 = 25;
const T1: u32 = 16384;
const T2: u32 = 16390;
const OTHER: u32 = 16400;

fn begin(final_lsn: u64, xid: u32) -> Bytes {
    Msg::new(b'B').u64(final_lsn).u64(1_000_000).u32(xid).done()
}

fn commit(end_lsn: u64) -> Bytes {
    Msg::new(b'C')
        .u8(0)
        .u64(end_lsn - 8)
        .u64(end_lsn)
        .u64(1_000_000)
        .done()
}

/// `public.<name>(id int4 key, body text, n int4)`.
fn relation(xid: Option<u32>, oid: u32, name: &str) -> Bytes {
    let mut b = Msg::new(b'R')
        .xid(xid)
        .u32(oid)
        .cstr("public")
        .cstr(name)
        .u8(b'd')
        .u16(3);
    for (col, ty, key) in [
        ("id", INT4, true),
        ("body", TEXT, false),
        ("n", INT4, false),
    ] {
        b = b.u8(u8::from(key)).cstr(col).u32(ty).i32(-1);
    }
    b.done()
}

fn insert(xid: Option<u32>, oid: u32, row: &[Option<&str>]) -> Bytes {
    Msg::new(b'I')
        .xid(xid)
        .u32(oid)
        .u8(b'N')
        .text_tuple(row)
        .done()
}

fn update(
    xid: Option<u32>,
    oid: u32,
    old: Option<(u8, &[Option<&str>])>,
    new: &[Option<&str>],
) -> Bytes {
    let mut b = Msg::new(b'U').xid(xid).u32(oid);
    if let Some((kind, row)) = old {
        b = b.u8(kind).text_tuple(row);
    }
    b.u8(b'N').text_tuple(new).done()
}

fn delete(xid: Option<u32>, oid: u32, kind: u8, row: &[Option<&str>]) -> Bytes {
    Msg::new(b'D')
        .xid(xid)
        .u32(oid)
        .u8(kind)
        .text_tuple(row)
        .done()
}

fn truncate(xid: Option<u32>, oids: &[u32]) -> Bytes {
    let mut b = Msg::new(b'T').xid(xid).u32(oids.len() as u32).u8(0);
    for o in oids {
        b = b.u32(*o);
    }
    b.done()
}

fn stream_start(xid: u32) -> Bytes {
    Msg::new(b'S').u32(xid).u8(1).done()
}

fn stream_stop() -> Bytes {
    Msg::new(b'E').done()
}

fn stream_commit(xid: u32, end_lsn: u64) -> Bytes {
    Msg::new(b'c')
        .u32(xid)
        .u8(0)
        .u64(end_lsn - 8)
        .u64(end_lsn)
        .u64(2_000_000)
        .done()
}

fn stream_abort(xid: u32, subxid: u32) -> Bytes {
    Msg::new(b'A').u32(xid).u32(subxid).done()
}

fn assembler_with(memory: usize, dir: &std::path::Path) -> Assembler {
    let captured = [TableId::new("public", "t1"), TableId::new("public", "t2")];
    let keys = captured
        .iter()
        .map(|t| (t.clone(), vec!["id".to_owned()]))
        .collect();
    Assembler::new(
        AssemblerConfig {
            proto_version: 3,
            stream_memory_bytes: memory,
            spill_dir: dir.to_path_buf(),
        },
        captured,
        keys,
    )
}

/// Feeds all messages; returns what came out.
fn feed(a: &mut Assembler, msgs: &[Bytes]) -> Vec<Assembled> {
    msgs.iter()
        .filter_map(|m| a.feed(Lsn(1), m.clone()).unwrap())
        .collect()
}

fn one_tx(out: Vec<Assembled>) -> Transaction {
    assert_eq!(out.len(), 1, "{out:?}");
    match out.into_iter().next().unwrap() {
        Assembled::Transaction(t) => t,
        other => panic!("expected a transaction, got {other:?}"),
    }
}

fn ints(c: &TableChanges, col: usize) -> Vec<Option<i32>> {
    let a = c.rows.column(col).as_primitive::<Int32Type>();
    (0..a.len())
        .map(|i| (!a.is_null(i)).then(|| a.value(i)))
        .collect()
}

fn texts(c: &TableChanges, col: usize) -> Vec<Option<String>> {
    let a = c.rows.column(col).as_string::<i32>();
    (0..a.len())
        .map(|i| (!a.is_null(i)).then(|| a.value(i).to_owned()))
        .collect()
}

fn present(c: &TableChanges, col: usize) -> Vec<bool> {
    (0..c.len()).map(|r| c.is_present(col, r)).collect()
}

#[test]
fn plain_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let out = feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            insert(None, T1, &[Some("1"), Some("a"), None]),
            insert(None, T1, &[Some("2"), Some("b"), Some("5")]),
            commit(120),
        ],
    );
    let tx = one_tx(out);
    assert_eq!(tx.position, Position::Postgres(Lsn(120)));
    assert_eq!(tx.commit_time_micros, 946_684_800_000_000 + 1_000_000);
    assert_eq!(tx.changes.len(), 1);
    let c = &tx.changes[0];
    let source = SourceTx {
        position: Position::Postgres(Lsn(120)),
        commit_micros: 946_684_800_000_000 + 1_000_000,
        id: TxId::Xid(7),
    };
    assert_eq!(
        c.source_tx.as_deref(),
        Some(&source),
        "every run names its transaction"
    );
    assert_eq!(c.ops, vec![Op::Insert, Op::Insert]);
    assert_eq!(ints(c, 0), vec![Some(1), Some(2)]);
    assert_eq!(texts(c, 1), vec![Some("a".into()), Some("b".into())]);
    assert_eq!(ints(c, 2), vec![None, Some(5)]);
    assert!(!c.has_absent(), "NULL is a value, not absent");
    assert_eq!(c.key_changed, vec![false, false]);
    assert_eq!(c.schema.primary_key, vec![0]);
    assert!(a.is_idle());
}

#[test]
fn unchanged_toast_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let tx = one_tx(feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            update(None, T1, None, &[Some("1"), TOAST, Some("9")]),
            commit(120),
        ],
    ));
    let c = &tx.changes[0];
    assert_eq!(c.ops, vec![Op::Update]);
    assert_eq!(present(c, 1), vec![false]);
    assert_eq!(present(c, 2), vec![true]);
    assert_eq!(ints(c, 2), vec![Some(9)]);
    assert_eq!(c.key_changed, vec![false]);
}

#[test]
fn key_change_carries_the_old_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let tx = one_tx(feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            update(
                None,
                T1,
                Some((b'K', &[Some("1"), None, None])),
                &[Some("2"), Some("x"), Some("3")],
            ),
            // A full old row whose key did not change: no old key.
            update(
                None,
                T1,
                Some((b'O', &[Some("2"), Some("x"), Some("3")])),
                &[Some("2"), Some("y"), Some("3")],
            ),
            commit(120),
        ],
    ));
    let c = &tx.changes[0];
    assert_eq!(c.key_changed, vec![true, false]);
    let old = c.old_keys.column(0).as_primitive::<Int32Type>();
    assert_eq!(old.value(0), 1);
    assert_eq!(ints(c, 0), vec![Some(2), Some(2)]);
}

#[test]
fn delete_carries_the_key_and_leaves_the_rest_absent() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let tx = one_tx(feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            delete(None, T1, b'K', &[Some("4"), None, None]),
            delete(None, T1, b'O', &[Some("5"), Some("z"), None]),
            commit(120),
        ],
    ));
    let c = &tx.changes[0];
    assert_eq!(c.ops, vec![Op::Delete, Op::Delete]);
    assert_eq!(ints(c, 0), vec![Some(4), Some(5)]);
    assert_eq!(present(c, 1), vec![false, true]);
    assert_eq!(
        present(c, 2),
        vec![false, true],
        "a full old row's NULL is a value"
    );
    assert_eq!(texts(c, 1)[1].as_deref(), Some("z"));
}

#[test]
fn delete_without_a_key_value_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    feed(&mut a, &[relation(None, T1, "t1"), begin(100, 7)]);
    let e = a
        .feed(Lsn(1), delete(None, T1, b'K', &[None, None, None]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("public.t1") && e.contains("REPLICA IDENTITY"),
        "{e}"
    );
}

#[test]
fn truncate_of_captured_tables() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let tx = one_tx(feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            relation(None, OTHER, "other"),
            begin(100, 7),
            truncate(None, &[T1, OTHER]),
            commit(120),
        ],
    ));
    assert_eq!(tx.changes.len(), 1);
    let c = &tx.changes[0];
    assert_eq!(c.schema.id, TableId::new("public", "t1"));
    assert_eq!(c.ops, vec![Op::Truncate]);
    assert!((0..3).all(|col| !c.is_present(col, 0)));
}

#[test]
fn two_tables_in_one_transaction_make_runs_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let tx = one_tx(feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            relation(None, T2, "t2"),
            relation(None, OTHER, "other"),
            begin(100, 7),
            insert(None, T1, &[Some("1"), None, None]),
            insert(None, T1, &[Some("2"), None, None]),
            insert(None, OTHER, &[Some("9"), None, None]),
            insert(None, T2, &[Some("3"), None, None]),
            insert(None, T1, &[Some("4"), None, None]),
            commit(120),
        ],
    ));
    let tables: Vec<(String, usize)> = tx
        .changes
        .iter()
        .map(|c| (c.schema.id.name.clone(), c.len()))
        .collect();
    assert_eq!(
        tables,
        vec![("t1".into(), 2), ("t2".into(), 1), ("t1".into(), 1)]
    );
    assert_eq!(tx.change_count(), 4);
}

#[test]
fn a_transaction_without_captured_changes_is_skipped_at_its_end_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let out = feed(
        &mut a,
        &[
            relation(None, OTHER, "other"),
            begin(100, 7),
            insert(None, OTHER, &[Some("1"), None, None]),
            commit(130),
        ],
    );
    assert!(matches!(out.as_slice(), [Assembled::Skipped(Lsn(130))]));
}

#[test]
fn a_new_relation_layout_starts_a_new_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let renamed = renamed_relation();
    let tx = one_tx(feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            insert(None, T1, &[Some("1"), None, None]),
            relation(None, T1, "t1"),
            insert(None, T1, &[Some("2"), None, None]),
            renamed,
            insert(None, T1, &[Some("3"), None, None]),
            commit(120),
        ],
    ));
    let lens: Vec<usize> = tx.changes.iter().map(TableChanges::len).collect();
    assert_eq!(lens, vec![2, 1], "an identical Relation keeps the run");
    assert_eq!(tx.changes[1].schema.columns[1].name, "text");
}

#[test]
fn streamed_transaction_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let out = feed(
        &mut a,
        &[
            stream_start(50),
            relation(Some(50), T1, "t1"),
            insert(Some(50), T1, &[Some("1"), None, None]),
            stream_stop(),
            // A whole other transaction between two blocks of the streamed one.
            begin(90, 60),
            insert(None, T1, &[Some("7"), None, None]),
            commit(100),
            stream_start(50),
            insert(Some(51), T1, &[Some("2"), None, None]),
            update(Some(50), T1, None, &[Some("1"), TOAST, Some("4")]),
            stream_stop(),
        ],
    );
    assert_eq!(out.len(), 1, "only the regular transaction so far");
    assert!(a.is_idle());
    let tx = one_tx(feed(&mut a, &[stream_commit(50, 200)]));
    assert_eq!(tx.position, Position::Postgres(Lsn(200)));
    let c = &tx.changes[0];
    let source = c.source_tx.as_deref().map(|s| (&s.position, &s.id));
    assert_eq!(
        source,
        Some((&Position::Postgres(Lsn(200)), &TxId::Xid(50))),
        "a streamed transaction's changes name its top-level xid"
    );
    assert_eq!(c.ops, vec![Op::Insert, Op::Insert, Op::Update]);
    assert_eq!(ints(c, 0), vec![Some(1), Some(2), Some(1)]);
    assert_eq!(present(c, 1), vec![true, true, false]);
}

/// What the stream layer (`stream.rs`) needs to make a Relation message's catalog reads at the
/// right moment: the transaction a payload belongs to (sent committed, or streamed while open)
/// and which payload ends a streamed one.
#[test]
fn the_open_transaction_and_a_streams_end_are_told() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    assert_eq!(a.open_xid(), None);
    feed(&mut a, &[begin(90, 60)]);
    assert_eq!(a.open_xid(), Some(OpenXid::Committed(60)));
    feed(&mut a, &[commit(100), stream_start(50)]);
    assert_eq!(a.open_xid(), Some(OpenXid::Streamed(50)));
    feed(&mut a, &[stream_stop()]);
    assert_eq!(a.open_xid(), None);
    assert_eq!(
        a.stream_end(&stream_commit(50, 200)),
        Some(StreamEnd::Committed(50))
    );
    assert_eq!(
        a.stream_end(&stream_abort(50, 50)),
        Some(StreamEnd::Aborted(50))
    );
    assert_eq!(
        a.stream_end(&stream_abort(50, 51)),
        None,
        "a subtransaction"
    );
    assert_eq!(a.stream_end(&commit(300)), None);
}

/// Defaults read at a streamed transaction's commit serve every Relation message of the table in
/// its replay: the one before the column was added, and the one after.
#[test]
fn defaults_serve_every_relation_of_a_streamed_replay() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let with_c = {
        let mut b = Msg::new(b'R')
            .xid(Some(50))
            .u32(T1)
            .cstr("public")
            .cstr("t1")
            .u8(b'd')
            .u16(4);
        for (col, ty, key) in [
            ("id", INT4, true),
            ("body", TEXT, false),
            ("n", INT4, false),
            ("c", INT4, false),
        ] {
            b = b.u8(u8::from(key)).cstr(col).u32(ty).i32(-1);
        }
        b.done()
    };
    feed(
        &mut a,
        &[
            stream_start(50),
            relation(Some(50), T1, "t1"),
            insert(Some(50), T1, &[Some("1"), None, None]),
            with_c,
            insert(Some(50), T1, &[Some("2"), None, None, Some("5")]),
            stream_stop(),
        ],
    );
    a.set_added_defaults(T1, HashMap::from([("c".to_owned(), "7".to_owned())]));
    let tx = one_tx(feed(&mut a, &[stream_commit(50, 200)]));
    let last = tx.changes.last().unwrap();
    let c = last.schema.column_index("c").unwrap();
    assert_eq!(last.schema.columns[c].initial_default.as_deref(), Some("7"));
}

#[test]
fn streamed_transaction_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let out = feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            stream_start(50),
            insert(Some(50), T1, &[Some("1"), None, None]),
            stream_stop(),
            stream_abort(50, 50),
            // A commit of an xid with nothing buffered produces nothing to write.
            stream_commit(50, 300),
        ],
    );
    assert!(matches!(out.as_slice(), [Assembled::Skipped(Lsn(300))]));
    assert_eq!(a.stream_memory_bytes(), 0);
}

#[test]
fn streamed_subtransaction_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            stream_start(50),
            insert(Some(50), T1, &[Some("1"), None, None]),
            insert(Some(51), T1, &[Some("2"), None, None]),
            insert(Some(52), T1, &[Some("3"), None, None]),
            stream_stop(),
            stream_abort(50, 51),
        ],
    );
    let tx = one_tx(feed(&mut a, &[stream_commit(50, 200)]));
    assert_eq!(ints(&tx.changes[0], 0), vec![Some(1), Some(3)]);
}

#[test]
fn streamed_transaction_spills_past_a_tiny_memory_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(64, dir.path());
    let mut msgs = vec![relation(None, T1, "t1"), stream_start(50)];
    for i in 0..100 {
        let id = i.to_string();
        let sub = if i % 10 == 3 { 51 } else { 50 };
        msgs.push(insert(Some(sub), T1, &[Some(&id), Some("payload"), None]));
    }
    msgs.push(stream_stop());
    feed(&mut a, &msgs);
    assert!(a.stream_memory_bytes() <= 64);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "spilled");
    feed(&mut a, &[stream_abort(50, 51)]);
    let tx = one_tx(feed(&mut a, &[stream_commit(50, 400)]));
    let ids = ints(&tx.changes[0], 0);
    assert_eq!(ids.len(), 90);
    assert!(ids.iter().all(|v| v.unwrap() % 10 != 3));
    assert_eq!(ids[0], Some(0));
    assert_eq!(ids[89], Some(99));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "spill removed"
    );
}

#[test]
fn relation_zero_lsn_and_protocol_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    // Relation messages carry no position; feeding one at WAL 0/0 is fine.
    assert!(a
        .feed(Lsn::ZERO, relation(None, T1, "t1"))
        .unwrap()
        .is_none());
    let e = a.feed(Lsn(5), commit(10)).unwrap_err().to_string();
    assert!(e.contains("without Begin"), "{e}");
    let e = a
        .feed(Lsn(5), insert(None, 999, &[Some("1")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside a transaction"), "{e}");
    a.feed(Lsn(5), begin(10, 1)).unwrap();
    let e = a
        .feed(Lsn(5), insert(None, 999, &[Some("1")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("relation 999"), "{e}");
    let e = a
        .feed(Lsn(5), insert(None, T1, &[Some("x"), None, None]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("public.t1") && e.contains("column id"), "{e}");
    assert!(a.feed(Lsn(5), Bytes::from_static(b"Z")).is_err());
}

#[test]
fn unknown_types_are_reported_then_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    let rel = Msg::new(b'R')
        .u32(T1)
        .cstr("public")
        .cstr("t1")
        .u8(b'd')
        .u16(2)
        .u8(1)
        .cstr("id")
        .u32(INT4)
        .i32(-1)
        .u8(0)
        .cstr("mood")
        .u32(70000)
        .i32(-1)
        .done();
    assert_eq!(a.missing_types(&rel).unwrap(), vec![70000]);
    let info = TypeInfo {
        oid: 70000,
        namespace: "public".into(),
        name: "mood".into(),
        typtype: b'e',
        element: None,
        base: None,
    };
    a.add_types(&[70000], HashMap::from([(70000, info)]));
    assert!(a.missing_types(&rel).unwrap().is_empty());
    a.feed(Lsn(1), rel).unwrap();
    a.feed(Lsn(1), begin(10, 1)).unwrap();
    let row = Msg::new(b'I')
        .u32(T1)
        .u8(b'N')
        .text_tuple(&[Some("1"), Some("happy")])
        .done();
    a.feed(Lsn(1), row).unwrap();
    let tx = one_tx(feed(&mut a, &[commit(20)]));
    assert_eq!(texts(&tx.changes[0], 1), vec![Some("happy".into())]);
    assert!(tx.changes[0].schema.columns[1]
        .source_type
        .starts_with("mood"));
}

/// `public.t1` without a key (issue 23).
fn keyless_assembler(dir: &std::path::Path) -> Assembler {
    let t1 = TableId::new("public", "t1");
    Assembler::new(
        AssemblerConfig {
            proto_version: 3,
            stream_memory_bytes: 1 << 20,
            spill_dir: dir.to_path_buf(),
        },
        [t1.clone()],
        HashMap::from([(t1, Vec::new())]),
    )
}

/// REPLICA IDENTITY FULL on a keyless table: an UPDATE is Delete(old row) + Insert(new row, an
/// unchanged TOAST column taken from the old row), a DELETE a Delete of the whole old row.
#[test]
fn keyless_full_identity_changes_are_whole_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = keyless_assembler(dir.path());
    let old: &[Option<&str>] = &[Some("1"), Some("long"), Some("5")];
    let out = feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            update(None, T1, Some((b'O', old)), &[Some("2"), TOAST, Some("5")]),
            delete(None, T1, b'O', &[Some("2"), Some("long"), None]),
            commit(120),
        ],
    );
    let tx = one_tx(out);
    let c = &tx.changes[0];
    assert!(c.schema.primary_key.is_empty());
    assert_eq!(c.ops, vec![Op::Delete, Op::Insert, Op::Delete]);
    assert_eq!(ints(c, 0), vec![Some(1), Some(2), Some(2)]);
    assert_eq!(
        texts(c, 1),
        vec![
            Some("long".into()),
            Some("long".into()),
            Some("long".into())
        ]
    );
    assert_eq!(ints(c, 2), vec![Some(5), Some(5), None]);
    assert!(!c.has_absent(), "every image is whole");
}

/// Without the whole old row (identity DEFAULT sends none), or with a column of it left out,
/// nothing says which equal row changed: the source stops naming the table.
#[test]
fn keyless_changes_without_a_whole_old_row_stop() {
    let dir = tempfile::tempdir().unwrap();
    for msg in [
        update(None, T1, None, &[Some("1"), Some("a"), None]),
        delete(None, T1, b'O', &[Some("1"), TOAST, None]),
    ] {
        let mut a = keyless_assembler(dir.path());
        feed(&mut a, &[relation(None, T1, "t1"), begin(100, 7)]);
        let e = a.feed(Lsn(1), msg).unwrap_err().to_string();
        assert!(
            e.contains("public.t1") && e.contains("REPLICA IDENTITY FULL"),
            "{e}"
        );
    }
}

/// A `'M'` logical decoding message (transactional, outside a stream block).
fn logical_message(prefix: &str, content: &str) -> Bytes {
    let mut b = Msg::new(b'M')
        .u8(1)
        .u64(90)
        .cstr(prefix)
        .u32(content.len() as u32);
    b.0.extend_from_slice(content.as_bytes());
    b.done()
}

/// `public.t1` with column `body` renamed to `text`.
fn renamed_relation() -> Bytes {
    let mut b = Msg::new(b'R')
        .u32(T1)
        .cstr("public")
        .cstr("t1")
        .u8(b'd')
        .u16(3);
    for (col, ty, key) in [
        ("id", INT4, true),
        ("text", TEXT, false),
        ("n", INT4, false),
    ] {
        b = b.u8(u8::from(key)).cstr(col).u32(ty).i32(-1);
    }
    b.done()
}

#[test]
fn the_ddl_triggers_rename_becomes_former_names_and_is_saved() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    a.set_table_oids([(T1, TableId::new("public", "t1"))].into());
    let ddl = format!(
        r#"{{"relid": {T1}, "attnum": 2, "object": "public.t1.text", "query": "ALTER TABLE t1 RENAME body TO text"}}"#
    );
    let out = feed(
        &mut a,
        &[
            relation(None, T1, "t1"),
            begin(100, 7),
            insert(None, T1, &[Some("1"), None, None]),
            logical_message("cdcd.ddl", &ddl),
            logical_message("someone.else", "not json"),
            renamed_relation(),
            insert(None, T1, &[Some("2"), None, None]),
            commit(120),
        ],
    );
    let tx = one_tx(out);
    assert_eq!(
        tx.changes[0].schema.columns[1].former_names,
        Vec::<String>::new()
    );
    let after = &tx.changes[1].schema.columns[1];
    assert_eq!(
        (after.name.as_str(), after.former_names.clone()),
        ("text", vec!["body".to_owned()])
    );
    let saved = a.ddl_changed().expect("the rename is to be saved");
    assert_eq!(
        saved.former[&TableId::new("public", "t1")]["text"],
        ["body"]
    );
    assert!(a.ddl_changed().is_none(), "saved once");

    // A restart after the slot moved past the message: the saved names carry the rename.
    let mut b = assembler_with(1 << 20, dir.path());
    b.set_table_oids([(T1, TableId::new("public", "t1"))].into());
    b.seed_ddl(saved);
    let tx = one_tx(feed(
        &mut b,
        &[
            renamed_relation(),
            begin(200, 8),
            insert(None, T1, &[Some("3"), None, None]),
            commit(220),
        ],
    ));
    assert_eq!(tx.changes[0].schema.columns[1].former_names, ["body"]);
    // A replayed message changes nothing.
    feed(
        &mut b,
        &[
            begin(300, 9),
            logical_message("cdcd.ddl", &ddl),
            commit(320),
        ],
    );
    assert!(b.ddl_changed().is_none());
}

#[test]
fn a_renamed_or_recreated_captured_table_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    a.set_table_oids([(T1, TableId::new("public", "t1"))].into());
    // The captured oid under another name: renamed.
    let err = a
        .feed(Lsn(1), relation(None, T1, "t9"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("renamed to public.t9"), "{err}");

    let mut a = assembler_with(1 << 20, dir.path());
    a.set_table_oids([(T1, TableId::new("public", "t1"))].into());
    // The captured name under another oid: the caller asks whether T1 still exists.
    let other = relation(None, OTHER, "t1");
    assert_eq!(a.foreign_relation(&other), Some((OTHER, T1)));
    assert_eq!(a.foreign_relation(&relation(None, T1, "t1")), None);
    // T1 is gone: dropped and created again.
    let err = a.feed(Lsn(1), other.clone()).unwrap_err().to_string();
    assert!(err.contains("dropped and created again"), "{err}");
    // T1 exists: an older table of that name (a replay), whose changes are skipped.
    a.mark_stale(OTHER);
    let out = feed(
        &mut a,
        &[
            other,
            begin(100, 7),
            insert(None, OTHER, &[Some("1"), None, None]),
            commit(120),
        ],
    );
    assert!(matches!(out.as_slice(), [Assembled::Skipped(_)]), "{out:?}");
}

#[test]
fn a_column_under_a_dropped_columns_name_is_an_error_after_the_drop_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = assembler_with(1 << 20, dir.path());
    a.set_table_oids([(T1, TableId::new("public", "t1"))].into());
    let drop = format!(
        r#"{{"relid": {T1}, "attnum": 0, "object": "public.t1", "query": "ALTER TABLE t1 DROP COLUMN body"}}"#
    );
    // The DDL's transaction (message at 0/90), then a transaction whose Relation shows `body`
    // again: a new column of the dropped one's name.
    feed(
        &mut a,
        &[
            begin(100, 7),
            logical_message("cdcd.ddl", &drop),
            commit(120),
        ],
    );
    let saved = a.ddl_changed().expect("the drop is to be saved");
    let err = a
        .feed(Lsn(1), begin(200, 8))
        .and_then(|_| a.feed(Lsn(1), relation(None, T1, "t1")))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("column body takes the name of a column dropped earlier"),
        "{err}"
    );

    // After a restart, a replay of a transaction from before the drop shows the old column.
    let mut b = assembler_with(1 << 20, dir.path());
    b.set_table_oids([(T1, TableId::new("public", "t1"))].into());
    b.seed_ddl(saved);
    let tx = one_tx(feed(
        &mut b,
        &[
            begin(80, 6),
            relation(None, T1, "t1"),
            insert(None, T1, &[Some("1"), Some("old"), None]),
            commit(85),
        ],
    ));
    assert_eq!(tx.changes[0].len(), 1);
}
