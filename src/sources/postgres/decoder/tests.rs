//! Decoder tests: messages captured from a real Postgres 15 server, messages built byte by byte for
//! what that server cannot send (two-phase, protocol 4), and malformed input.

use super::*;

use super::captured::{captured_v1, captured_v2, hex};
use super::message_bytes::Msg;

fn v1() -> DecodeOptions {
    DecodeOptions::new(1)
}

fn streamed(proto_version: u32) -> DecodeOptions {
    DecodeOptions {
        proto_version,
        in_stream: true,
    }
}

fn values<'a>(t: &TupleData<'a>) -> Vec<ColumnValue<'a>> {
    t.iter().collect()
}

use ColumnValue::{Null, Text, UnchangedToast};

// ---- protocol 1, captured ----

#[test]
fn begin_and_commit() {
    let begin = hex(captured_v1::BEGIN);
    assert_eq!(
        decode(&begin, v1()).unwrap(),
        PgOutputMessage::Begin {
            final_lsn: Lsn(0x0199_7718),
            commit_time: 0x0003_0476_460e_6223,
            xid: 744,
        }
    );
    let commit = hex(captured_v1::COMMIT);
    assert_eq!(
        decode(&commit, v1()).unwrap(),
        PgOutputMessage::Commit {
            flags: 0,
            commit_lsn: Lsn(0x0199_7718),
            end_lsn: Lsn(0x0199_7748),
            commit_time: 0x0003_0476_460e_6223,
        }
    );
    // 2025-era commit times land after 2020 once moved to the Unix epoch.
    assert!(pg_time_to_unix_micros(0x0003_0476_460e_6223) > 1_577_836_800_000_000);
}

#[test]
fn relation_default_identity() {
    let bytes = hex(captured_v1::RELATION_ITEMS);
    let PgOutputMessage::Relation(rel) = decode(&bytes, v1()).unwrap() else {
        panic!("not a relation")
    };
    assert_eq!(rel.xid, None);
    assert_eq!(rel.oid, 16391);
    assert_eq!(
        (rel.namespace.as_str(), rel.name.as_str()),
        ("public", "dec_items")
    );
    assert_eq!(rel.replica_identity, ReplicaIdentity::Default);
    let cols: Vec<_> = rel
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.is_key(), c.type_oid, c.type_modifier))
        .collect();
    assert_eq!(
        cols,
        [
            ("id", true, 23, -1),
            ("name", false, 25, -1),
            ("big", false, 25, -1),
            ("score", false, 701, -1)
        ]
    );
}

#[test]
fn relation_full_identity() {
    let bytes = hex(captured_v1::RELATION_FULL);
    let PgOutputMessage::Relation(rel) = decode(&bytes, v1()).unwrap() else {
        panic!("not a relation")
    };
    assert_eq!(rel.replica_identity, ReplicaIdentity::Full);
    assert!(rel.columns.iter().all(RelationColumn::is_key));
}

#[test]
fn insert_with_nulls() {
    let bytes = hex(captured_v1::INSERT_NULLS);
    let PgOutputMessage::Insert { xid, relation, new } = decode(&bytes, v1()).unwrap() else {
        panic!("not an insert")
    };
    assert_eq!((xid, relation, new.len()), (None, 16391, 4));
    assert_eq!(values(&new), [Text(b"2"), Null, Text(b"small"), Null]);
}

#[test]
fn update_with_unchanged_toast() {
    let bytes = hex(captured_v1::UPDATE_TOAST);
    let PgOutputMessage::Update { old, new, .. } = decode(&bytes, v1()).unwrap() else {
        panic!("not an update")
    };
    assert_eq!(old, None);
    assert_eq!(
        values(&new),
        [Text(b"1"), Text(b"beta"), UnchangedToast, Text(b"1.5")]
    );
}

#[test]
fn update_with_old_key() {
    let bytes = hex(captured_v1::UPDATE_KEY);
    let PgOutputMessage::Update { old, new, .. } = decode(&bytes, v1()).unwrap() else {
        panic!("not an update")
    };
    let Some(OldTuple::Key(key)) = old else {
        panic!("no old key")
    };
    assert_eq!(values(&key), [Text(b"2"), Null, Null, Null]);
    assert_eq!(values(&new), [Text(b"10"), Null, Text(b"small"), Null]);
}

#[test]
fn update_with_old_row() {
    let bytes = hex(captured_v1::UPDATE_OLD);
    let PgOutputMessage::Update {
        relation, old, new, ..
    } = decode(&bytes, v1()).unwrap()
    else {
        panic!("not an update")
    };
    assert_eq!(relation, 16398);
    let old = old.unwrap();
    assert!(matches!(old, OldTuple::Full(_)));
    assert_eq!(values(old.tuple()), [Text(b"7"), Text(b"seven")]);
    assert_eq!(values(&new), [Text(b"7"), Text(b"SEVEN")]);
}

#[test]
fn delete_by_key() {
    let bytes = hex(captured_v1::DELETE_KEY);
    let PgOutputMessage::Delete { xid, relation, old } = decode(&bytes, v1()).unwrap() else {
        panic!("not a delete")
    };
    assert_eq!((xid, relation), (None, 16391));
    let OldTuple::Key(key) = old else {
        panic!("not a key")
    };
    assert_eq!(values(&key), [Text(b"10"), Null, Null, Null]);
}

#[test]
fn delete_by_old_row() {
    let bytes = Msg::new(b'D')
        .u32(16398)
        .u8(b'O')
        .tuple(&[Text(b"7"), Text(b"SEVEN")])
        .0;
    let PgOutputMessage::Delete { old, .. } = decode(&bytes, v1()).unwrap() else {
        panic!("not a delete")
    };
    assert!(matches!(old, OldTuple::Full(_)));
    assert_eq!(values(old.tuple()), [Text(b"7"), Text(b"SEVEN")]);
}

#[test]
fn message_and_truncate() {
    let bytes = hex(captured_v1::MESSAGE);
    assert_eq!(
        decode(&bytes, v1()).unwrap(),
        PgOutputMessage::Message {
            xid: None,
            transactional: true,
            lsn: Lsn(0x0199_7a48),
            prefix: "dec_prefix",
            content: b"hello",
        }
    );
    let bytes = hex(captured_v1::TRUNCATE);
    assert_eq!(
        decode(&bytes, v1()).unwrap(),
        PgOutputMessage::Truncate {
            xid: None,
            options: 0,
            relations: vec![16398],
        }
    );
}

// ---- protocol 1, built ----

#[test]
fn origin_type_and_binary_columns() {
    let origin = Msg::new(b'O').i64(0x1234).cstr("node_a").0;
    assert_eq!(
        decode(&origin, v1()).unwrap(),
        PgOutputMessage::Origin {
            origin_lsn: Lsn(0x1234),
            name: "node_a",
        }
    );
    let ty = Msg::new(b'Y').u32(16411).cstr("public").cstr("mood").0;
    assert_eq!(
        decode(&ty, v1()).unwrap(),
        PgOutputMessage::Type {
            xid: None,
            oid: 16411,
            namespace: "public",
            name: "mood",
        }
    );
    let insert = Msg::new(b'I')
        .u32(7)
        .u8(b'N')
        .tuple(&[ColumnValue::Binary(&[0, 0, 0, 42]), Text(b""), Null])
        .0;
    let PgOutputMessage::Insert { new, .. } = decode(&insert, v1()).unwrap() else {
        panic!("not an insert")
    };
    assert_eq!(
        values(&new),
        [ColumnValue::Binary(&[0, 0, 0, 42]), Text(b""), Null]
    );
    assert_eq!(new.iter().len(), 3);
}

#[test]
fn truncate_options_and_several_relations() {
    let bytes = Msg::new(b'T').i32(3).u8(3).u32(1).u32(2).u32(3).0;
    assert_eq!(
        decode(&bytes, v1()).unwrap(),
        PgOutputMessage::Truncate {
            xid: None,
            options: 3,
            relations: vec![1, 2, 3],
        }
    );
}

#[test]
fn empty_tuple_and_non_transactional_message() {
    let insert = Msg::new(b'I').u32(9).u8(b'N').tuple(&[]).0;
    let PgOutputMessage::Insert { new, .. } = decode(&insert, v1()).unwrap() else {
        panic!("not an insert")
    };
    assert!(new.is_empty());
    let msg = Msg::new(b'M').u8(0).i64(5).cstr("p").i32(0).0;
    assert_eq!(
        decode(&msg, v1()).unwrap(),
        PgOutputMessage::Message {
            xid: None,
            transactional: false,
            lsn: Lsn(5),
            prefix: "p",
            content: b"",
        }
    );
}

// ---- protocol 2 streaming, captured ----

#[test]
fn stream_block_markers() {
    let s2 = DecodeOptions::new(2);
    assert_eq!(
        decode(&hex(captured_v2::STREAM_START_FIRST), s2).unwrap(),
        PgOutputMessage::StreamStart {
            xid: 755,
            first_segment: true,
        }
    );
    assert_eq!(
        decode(&hex(captured_v2::STREAM_START_NEXT), s2).unwrap(),
        PgOutputMessage::StreamStart {
            xid: 755,
            first_segment: false,
        }
    );
    // Stream Stop arrives inside the block; it has no xid either way.
    assert_eq!(
        decode(&hex(captured_v2::STREAM_STOP), streamed(2)).unwrap(),
        PgOutputMessage::StreamStop
    );
    assert_eq!(
        decode(&hex(captured_v2::STREAM_COMMIT), s2).unwrap(),
        PgOutputMessage::StreamCommit {
            xid: 755,
            flags: 0,
            commit_lsn: Lsn(0x01a1_6298),
            end_lsn: Lsn(0x01a1_62c8),
            commit_time: 0x0003_0476_46ce_7fc4,
        }
    );
}

#[test]
fn stream_abort_v2() {
    let s2 = DecodeOptions::new(2);
    assert_eq!(
        decode(&hex(captured_v2::STREAM_ABORT_TOP), s2).unwrap(),
        PgOutputMessage::StreamAbort {
            xid: 756,
            subxid: 756,
            abort_lsn: None,
            abort_time: None,
        }
    );
    assert_eq!(
        decode(&hex(captured_v2::STREAM_ABORT_SUBXACT), s2).unwrap(),
        PgOutputMessage::StreamAbort {
            xid: 757,
            subxid: 758,
            abort_lsn: None,
            abort_time: None,
        }
    );
}

#[test]
fn streamed_changes_carry_xid() {
    let s = streamed(2);
    assert_eq!(
        decode(&hex(captured_v2::MESSAGE), s).unwrap(),
        PgOutputMessage::Message {
            xid: Some(755),
            transactional: true,
            lsn: Lsn(0x019a_37c8),
            prefix: "dec_s",
            content: b"in-stream",
        }
    );
    assert_eq!(
        decode(&hex(captured_v2::TYPE), s).unwrap(),
        PgOutputMessage::Type {
            xid: Some(755),
            oid: 16411,
            namespace: "public",
            name: "dec_mood",
        }
    );
    let PgOutputMessage::Relation(rel) = decode(&hex(captured_v2::RELATION), s).unwrap() else {
        panic!("not a relation")
    };
    assert_eq!(
        (rel.xid, rel.oid, rel.name.as_str()),
        (Some(755), 16417, "dec_stream")
    );
    assert_eq!(rel.columns.get(1).map(|c| c.type_oid), Some(16411));

    let bytes = hex(captured_v2::INSERT);
    let PgOutputMessage::Insert { xid, relation, new } = decode(&bytes, s).unwrap() else {
        panic!("not an insert")
    };
    assert_eq!((xid, relation), (Some(757), 16417));
    assert_eq!(values(&new), [Text(b"9000"), Text(b"ok"), Text(b"top")]);

    let mut bytes = hex(captured_v2::UPDATE_HEAD);
    bytes.extend_from_slice(&[b'p'; 100]);
    let PgOutputMessage::Update { xid, old, new, .. } = decode(&bytes, s).unwrap() else {
        panic!("not an update")
    };
    assert_eq!((xid, old), (Some(755), None));
    assert_eq!(
        values(&new),
        [Text(b"1"), Text(b"happy"), Text(&[b'p'; 100])]
    );

    let bytes = hex(captured_v2::DELETE);
    let PgOutputMessage::Delete { xid, old, .. } = decode(&bytes, s).unwrap() else {
        panic!("not a delete")
    };
    assert_eq!(xid, Some(755));
    assert_eq!(values(old.tuple()), [Text(b"2"), Null, Null]);
}

#[test]
fn streamed_truncate_carries_xid() {
    let bytes = Msg::new(b'T').u32(900).i32(2).u8(1).u32(10).u32(11).0;
    assert_eq!(
        decode(&bytes, streamed(2)).unwrap(),
        PgOutputMessage::Truncate {
            xid: Some(900),
            options: 1,
            relations: vec![10, 11],
        }
    );
}

#[test]
fn protocol_1_never_reads_an_xid() {
    // Protocol 1 has no streaming: even if the caller thinks it is in a stream, there is no xid.
    let bytes = hex(captured_v1::INSERT_NULLS);
    assert!(matches!(
        decode(&bytes, streamed(1)).unwrap(),
        PgOutputMessage::Insert { xid: None, .. }
    ));
}

#[test]
fn wrong_stream_state_is_an_error_not_a_misread() {
    // An xid-prefixed change read as unprefixed: the relation oid swallows the xid and the 'N'
    // marker is not where it should be.
    let err = decode(&hex(captured_v2::INSERT), v1()).unwrap_err();
    assert!(matches!(
        err,
        DecodeError::Invalid {
            message: "Insert",
            field: "new tuple marker",
            offset: 5,
            ..
        }
    ));
    // An unprefixed change read as prefixed.
    assert!(decode(&hex(captured_v1::DELETE_KEY), streamed(2)).is_err());
}

// ---- protocol 3 two-phase, built (the test server has max_prepared_transactions = 0) ----

#[test]
fn two_phase_messages() {
    let v3 = DecodeOptions::new(3);
    let bytes = Msg::new(b'b')
        .i64(100)
        .i64(200)
        .i64(300)
        .u32(5)
        .cstr("gid1")
        .0;
    assert_eq!(
        decode(&bytes, v3).unwrap(),
        PgOutputMessage::BeginPrepare {
            prepare_lsn: Lsn(100),
            end_lsn: Lsn(200),
            prepare_time: 300,
            xid: 5,
            gid: "gid1",
        }
    );
    let bytes = Msg::new(b'P')
        .u8(0)
        .i64(100)
        .i64(200)
        .i64(300)
        .u32(5)
        .cstr("gid1")
        .0;
    assert_eq!(
        decode(&bytes, v3).unwrap(),
        PgOutputMessage::Prepare {
            flags: 0,
            prepare_lsn: Lsn(100),
            end_lsn: Lsn(200),
            prepare_time: 300,
            xid: 5,
            gid: "gid1",
        }
    );
    let bytes = Msg::new(b'K')
        .u8(0)
        .i64(400)
        .i64(500)
        .i64(600)
        .u32(5)
        .cstr("gid1")
        .0;
    assert_eq!(
        decode(&bytes, v3).unwrap(),
        PgOutputMessage::CommitPrepared {
            flags: 0,
            commit_lsn: Lsn(400),
            end_lsn: Lsn(500),
            commit_time: 600,
            xid: 5,
            gid: "gid1",
        }
    );
    let bytes = Msg::new(b'r')
        .u8(0)
        .i64(200)
        .i64(700)
        .i64(300)
        .i64(800)
        .u32(5)
        .cstr("gid1")
        .0;
    assert_eq!(
        decode(&bytes, v3).unwrap(),
        PgOutputMessage::RollbackPrepared {
            flags: 0,
            prepare_end_lsn: Lsn(200),
            rollback_end_lsn: Lsn(700),
            prepare_time: 300,
            rollback_time: 800,
            xid: 5,
            gid: "gid1",
        }
    );
    let bytes = Msg::new(b'p')
        .u8(0)
        .i64(100)
        .i64(200)
        .i64(300)
        .u32(6)
        .cstr("g2")
        .0;
    assert_eq!(
        decode(&bytes, v3).unwrap(),
        PgOutputMessage::StreamPrepare {
            flags: 0,
            prepare_lsn: Lsn(100),
            end_lsn: Lsn(200),
            prepare_time: 300,
            xid: 6,
            gid: "g2",
        }
    );
}

// ---- protocol 4, built (the test server is 15; protocol 4 needs 16) ----

#[test]
fn stream_abort_v4_parallel_carries_lsn_and_time() {
    let bytes = Msg::new(b'A').u32(757).u32(758).i64(0x1afb800).i64(42).0;
    assert_eq!(
        decode(&bytes, DecodeOptions::new(4)).unwrap(),
        PgOutputMessage::StreamAbort {
            xid: 757,
            subxid: 758,
            abort_lsn: Some(Lsn(0x1afb800)),
            abort_time: Some(42),
        }
    );
    // Protocol 4 without `streaming = parallel` sends the short form.
    assert_eq!(
        decode(&hex(captured_v2::STREAM_ABORT_TOP), DecodeOptions::new(4)).unwrap(),
        PgOutputMessage::StreamAbort {
            xid: 756,
            subxid: 756,
            abort_lsn: None,
            abort_time: None,
        }
    );
    // Before protocol 4 the extra fields are not part of the message.
    assert!(matches!(
        decode(&bytes, DecodeOptions::new(2)),
        Err(DecodeError::TrailingBytes {
            offset: 9,
            extra: 16,
            ..
        })
    ));
    // A half-present tail is truncated, not ignored.
    assert!(matches!(
        decode(bytes.get(..13).unwrap(), DecodeOptions::new(4)),
        Err(DecodeError::Truncated {
            field: "abort LSN",
            offset: 9,
            ..
        })
    ));
}

#[test]
fn streamed_changes_v4() {
    let bytes = Msg::new(b'U')
        .u32(77)
        .u32(16417)
        .u8(b'K')
        .tuple(&[Text(b"1")])
        .u8(b'N')
        .tuple(&[Text(b"2")])
        .0;
    let PgOutputMessage::Update { xid, old, new, .. } = decode(&bytes, streamed(4)).unwrap() else {
        panic!("not an update")
    };
    assert_eq!(xid, Some(77));
    assert_eq!(values(old.unwrap().tuple()), [Text(b"1")]);
    assert_eq!(values(&new), [Text(b"2")]);
}

// ---- malformed input ----

#[test]
fn errors_name_message_field_and_offset() {
    assert_eq!(decode(&[], v1()), Err(DecodeError::Empty));
    assert_eq!(
        decode(b"Z", v1()),
        Err(DecodeError::UnknownMessage { tag: b'Z' })
    );
    let begin = hex(captured_v1::BEGIN);
    assert_eq!(
        decode(begin.get(..12).unwrap(), v1()),
        Err(DecodeError::Truncated {
            message: "Begin",
            field: "commit timestamp",
            offset: 9,
            needed: 8,
            available: 3,
        })
    );
    let mut long = begin.clone();
    long.push(0);
    assert_eq!(
        decode(&long, v1()),
        Err(DecodeError::TrailingBytes {
            message: "Begin",
            offset: 21,
            extra: 1,
        })
    );
    // Column 1 of the insert has kind 'x'.
    let bad_kind = Msg::new(b'I').u32(1).u8(b'N').u16(2).u8(b'n').u8(b'x').0;
    let err = decode(&bad_kind, v1()).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::InvalidColumn {
                message: "Insert",
                column: 1,
                field: "column kind",
                offset: 9,
                ..
            }
        ),
        "{err:?}"
    );
    let negative = Msg::new(b'I').u32(1).u8(b'N').u16(1).u8(b't').i32(-2).0;
    assert!(matches!(
        decode(&negative, v1()),
        Err(DecodeError::InvalidColumn {
            field: "column length",
            offset: 9,
            ..
        })
    ));
    let short_value = Msg::new(b'I')
        .u32(1)
        .u8(b'N')
        .u16(1)
        .u8(b't')
        .i32(10)
        .u8(b'a')
        .0;
    let err = decode(&short_value, v1()).unwrap_err();
    assert!(matches!(
        err,
        DecodeError::InvalidColumn {
            column: 0,
            field: "column value",
            offset: 13,
            ..
        }
    ));
    assert!(err.to_string().contains("Insert"), "{err}");
    let bad_utf8 = Msg::new(b'O').i64(1).u8(0xff).u8(0).0;
    assert!(matches!(
        decode(&bad_utf8, v1()),
        Err(DecodeError::Invalid {
            field: "origin name",
            offset: 9,
            ..
        })
    ));
    let unterminated = Msg::new(b'Y').u32(1).cstr("ns").u8(b'a').0;
    assert!(matches!(
        decode(&unterminated, v1()),
        Err(DecodeError::Truncated {
            field: "type name",
            ..
        })
    ));
    let bad_identity = Msg::new(b'R').u32(1).cstr("a").cstr("b").u8(b'z').u16(0).0;
    assert!(matches!(
        decode(&bad_identity, v1()),
        Err(DecodeError::Invalid {
            field: "replica identity",
            ..
        })
    ));
    let bad_marker = Msg::new(b'D').u32(1).u8(b'N').tuple(&[]).0;
    assert!(matches!(
        decode(&bad_marker, v1()),
        Err(DecodeError::Invalid {
            field: "old tuple marker",
            offset: 5,
            ..
        })
    ));
}

#[test]
fn huge_counts_do_not_allocate() {
    let truncate = Msg::new(b'T').i32(i32::MAX).u8(0).0;
    assert!(matches!(
        decode(&truncate, v1()),
        Err(DecodeError::Truncated {
            field: "relation count",
            ..
        })
    ));
    let negative = Msg::new(b'T').i32(-1).u8(0).0;
    assert!(matches!(
        decode(&negative, v1()),
        Err(DecodeError::Invalid {
            field: "relation count",
            ..
        })
    ));
    let message = Msg::new(b'M').u8(1).i64(0).cstr("p").i32(i32::MAX).0;
    assert!(matches!(
        decode(&message, v1()),
        Err(DecodeError::Truncated {
            field: "content length",
            ..
        })
    ));
    let relation = Msg::new(b'R')
        .u32(1)
        .cstr("a")
        .cstr("b")
        .u8(b'd')
        .u16(u16::MAX)
        .0;
    assert!(matches!(
        decode(&relation, v1()),
        Err(DecodeError::Truncated {
            field: "column flags",
            ..
        })
    ));
    let tuple = Msg::new(b'I').u32(1).u8(b'N').u16(u16::MAX).0;
    assert!(matches!(
        decode(&tuple, v1()),
        Err(DecodeError::InvalidColumn { column: 0, .. })
    ));
}

/// Every valid test message, with the options it decodes under.
fn corpus() -> Vec<(Vec<u8>, DecodeOptions)> {
    let mut out: Vec<(Vec<u8>, DecodeOptions)> = [
        captured_v1::BEGIN,
        captured_v1::COMMIT,
        captured_v1::RELATION_ITEMS,
        captured_v1::INSERT_NULLS,
        captured_v1::UPDATE_TOAST,
        captured_v1::UPDATE_KEY,
        captured_v1::DELETE_KEY,
        captured_v1::RELATION_FULL,
        captured_v1::UPDATE_OLD,
        captured_v1::MESSAGE,
        captured_v1::TRUNCATE,
        captured_v2::STREAM_START_FIRST,
        captured_v2::STREAM_COMMIT,
        captured_v2::STREAM_ABORT_SUBXACT,
    ]
    .iter()
    .map(|h| (hex(h), v1()))
    .collect();
    for h in [
        captured_v2::MESSAGE,
        captured_v2::TYPE,
        captured_v2::RELATION,
        captured_v2::INSERT,
        captured_v2::DELETE,
        captured_v2::STREAM_STOP,
    ] {
        out.push((hex(h), streamed(2)));
    }
    out.push((
        Msg::new(b'A').u32(1).u32(2).i64(3).i64(4).0,
        DecodeOptions::new(4),
    ));
    out.push((
        Msg::new(b'r')
            .u8(0)
            .i64(1)
            .i64(2)
            .i64(3)
            .i64(4)
            .u32(5)
            .cstr("g")
            .0,
        v1(),
    ));
    out.push((
        Msg::new(b'K').u8(0).i64(1).i64(2).i64(3).u32(5).cstr("g").0,
        v1(),
    ));
    out.push((Msg::new(b'b').i64(1).i64(2).i64(3).u32(5).cstr("g").0, v1()));
    out.push((
        Msg::new(b'p').u8(0).i64(1).i64(2).i64(3).u32(5).cstr("g").0,
        v1(),
    ));
    out.push((Msg::new(b'O').i64(1).cstr("o").0, v1()));
    out
}

/// Decodes and, on success, reads every tuple value: neither may panic.
fn exercise(bytes: &[u8], opts: DecodeOptions) -> bool {
    let Ok(msg) = decode(bytes, opts) else {
        return false;
    };
    let tuples: Vec<&TupleData<'_>> = match &msg {
        PgOutputMessage::Insert { new, .. } => vec![new],
        PgOutputMessage::Update { old, new, .. } => {
            old.iter().map(OldTuple::tuple).chain([new]).collect()
        }
        PgOutputMessage::Delete { old, .. } => vec![old.tuple()],
        _ => vec![],
    };
    for t in tuples {
        assert_eq!(t.iter().count(), t.len());
    }
    let _ = format!("{msg:?}");
    true
}

#[test]
fn every_prefix_fails_cleanly() {
    for (bytes, opts) in corpus() {
        assert!(
            exercise(&bytes, opts),
            "corpus message {bytes:02x?} must decode"
        );
        for end in 0..bytes.len() {
            let prefix = bytes.get(..end).unwrap();
            // Stream Abort's protocol-4 tail is optional, so its 9-byte prefix is valid.
            let valid = opts.proto_version >= 4 && end == 9;
            assert_eq!(exercise(prefix, opts), valid, "prefix {prefix:02x?}");
        }
    }
}

#[test]
fn random_and_mutated_bytes_never_panic() {
    // xorshift64: deterministic, no dependency.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let tags = b"BCORYIUDTMSEcAbPKrp";
    let all_opts = [v1(), streamed(2), DecodeOptions::new(3), streamed(4)];
    for i in 0..20_000 {
        let len = (next() % 64) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if let Some(first) = bytes.first_mut() {
            *first = tags[(next() % tags.len() as u64) as usize];
        }
        exercise(&bytes, all_opts[i % all_opts.len()]);
    }
    for (bytes, _) in corpus() {
        for _ in 0..500 {
            let mut mutated = bytes.clone();
            let at = (next() % mutated.len() as u64) as usize;
            mutated[at] = next() as u8;
            for opts in all_opts {
                exercise(&mutated, opts);
            }
        }
    }
}
