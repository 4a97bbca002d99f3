//! Pure parts of the replication connection: command text, status layout, DataRow parsing.

use super::wire::{sasl_offers_scram, server_major_version};
use super::*;

#[test]
fn start_sql_asks_for_streaming_only_when_the_protocol_has_it() {
    let mut opts = StartOptions {
        proto_version: 3,
        publications: vec!["cdcd_shop".into()],
        streaming: true,
        messages: false,
    };
    assert_eq!(
        start_replication_sql("cdcd_shop", Lsn(0x16B3748), &opts),
        "START_REPLICATION SLOT \"cdcd_shop\" LOGICAL 0/16B3748 (proto_version '3', publication_names '\"cdcd_shop\"', streaming 'on')"
    );
    opts.proto_version = 1;
    opts.messages = true;
    opts.publications.push("cdcd_shop_inserts".into());
    assert_eq!(
        start_replication_sql("s", Lsn::ZERO, &opts),
        "START_REPLICATION SLOT \"s\" LOGICAL 0/0 (proto_version '1', publication_names '\"cdcd_shop\",\"cdcd_shop_inserts\"', messages 'true')"
    );
}

#[test]
fn status_update_layout() {
    let b = encode_status(Lsn(1), Lsn(2), Lsn(3), 4, true);
    assert_eq!(b[0], b'r');
    assert_eq!(&b[1..9], &1u64.to_be_bytes());
    assert_eq!(&b[9..17], &2u64.to_be_bytes());
    assert_eq!(&b[17..25], &3u64.to_be_bytes());
    assert_eq!(&b[25..33], &4i64.to_be_bytes());
    assert_eq!(b[33], 1);
}

#[test]
fn data_rows_parse_and_reject_truncation() {
    let mut p = vec![0u8, 2];
    p.extend_from_slice(&3i32.to_be_bytes());
    p.extend_from_slice(b"abc");
    p.extend_from_slice(&(-1i32).to_be_bytes());
    let row = parse_data_row(Bytes::from(p.clone())).unwrap();
    assert_eq!(row, vec![Some(Bytes::from_static(b"abc")), None]);
    p.truncate(5);
    assert!(parse_data_row(Bytes::from(p)).is_err());
}

#[test]
fn sasl_mechanisms() {
    assert!(sasl_offers_scram(b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"));
    assert!(!sasl_offers_scram(b"SCRAM-SHA-256-PLUS\0\0"));
}

#[test]
fn identifiers_are_quoted() {
    assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
}

#[test]
fn slot_creation_syntax_follows_the_server() {
    assert_eq!(
        create_slot_sql("s", 15, true),
        "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export')"
    );
    assert_eq!(
        create_slot_sql("s", 14, false),
        "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput NOEXPORT_SNAPSHOT"
    );
    assert_eq!(
        server_major_version(b"server_version\x0015.18 (Debian 15.18-0+deb12u1)\x00"),
        Some(15)
    );
    assert_eq!(server_major_version(b"TimeZone\x00UTC\x00"), None);
}
