//! The replication connection's pure half: command text, message layouts and field parsing.
//! `replication.rs` does the I/O with these; keeping them apart keeps that file about the session.

use bytes::{Buf, Bytes};
use pgwire_replication::protocol::messages::ErrorFields;
use pgwire_replication::protocol::replication::PG_EPOCH_MICROS;
use pgwire_replication::PgWireError;
use std::time::{SystemTime, UNIX_EPOCH};

use super::StartOptions;
use crate::changelog::Lsn;
use crate::sources::SourceError;

/// The `START_REPLICATION` command for `opts` (protocol §55.4; pgoutput options in §55.5).
pub fn start_replication_sql(slot: &str, start: Lsn, opts: &StartOptions) -> String {
    let mut sql = format!(
        "START_REPLICATION SLOT {} LOGICAL {} (proto_version '{}', publication_names '{}'",
        quote_ident(slot),
        start,
        opts.proto_version,
        opts.publications
            .iter()
            .map(|p| quote_ident(p))
            .collect::<Vec<_>>()
            .join(",")
            .replace('\'', "''"),
    );
    if opts.streaming && opts.proto_version >= 2 {
        sql.push_str(", streaming 'on'");
    }
    if opts.messages {
        sql.push_str(", messages 'true'");
    }
    sql.push(')');
    sql
}

/// `CREATE_REPLICATION_SLOT` in the syntax of the server: the option list of Postgres 15+, or the
/// `[NO]EXPORT_SNAPSHOT` keyword of older servers (protocol §55.4).
pub fn create_slot_sql(slot: &str, server_major: u32, export: bool) -> String {
    let slot = quote_ident(slot);
    match (server_major >= 15 || server_major == 0, export) {
        (true, true) => {
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'export')")
        }
        (true, false) => {
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'nothing')")
        }
        (false, true) => format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT"),
        (false, false) => {
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput NOEXPORT_SNAPSHOT")
        }
    }
}

/// The major version in a `server_version` ParameterStatus (`name\0value\0`), e.g. 15 from
/// `15.18 (Debian 15.18-0+deb12u1)`.
pub(crate) fn server_major_version(payload: &[u8]) -> Option<u32> {
    let mut parts = payload.split(|&b| b == 0);
    if parts.next()? != b"server_version" {
        return None;
    }
    let value = std::str::from_utf8(parts.next()?).ok()?;
    let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A standby status update: `'r'`, write, flush, apply, client time (µs since 2000-01-01), reply.
pub fn encode_status(
    write: Lsn,
    flush: Lsn,
    apply: Lsn,
    client_time_pg_micros: i64,
    reply_requested: bool,
) -> [u8; 34] {
    let mut out = [0u8; 34];
    out[0] = b'r';
    out[1..9].copy_from_slice(&write.0.to_be_bytes());
    out[9..17].copy_from_slice(&flush.0.to_be_bytes());
    out[17..25].copy_from_slice(&apply.0.to_be_bytes());
    out[25..33].copy_from_slice(&client_time_pg_micros.to_be_bytes());
    out[33] = u8::from(reply_requested);
    out
}

/// A double-quoted SQL identifier (`"` doubled), as the replication grammar accepts.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub(super) fn now_pg_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    unix - PG_EPOCH_MICROS
}

pub(crate) fn len_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(crate) fn sasl_offers_scram(data: &[u8]) -> bool {
    data.split(|&b| b == 0).any(|m| m == b"SCRAM-SHA-256")
}

pub(crate) fn server_error(payload: &[u8]) -> String {
    let f = ErrorFields::parse(payload);
    let mut s = f.to_error_string();
    if let Some(d) = f.detail {
        s.push_str(": ");
        s.push_str(&d);
    }
    if let Some(h) = f.hint {
        s.push_str(" (hint: ");
        s.push_str(&h);
        s.push(')');
    }
    s
}

pub(crate) fn describe(e: &PgWireError) -> String {
    e.to_string()
}

pub(super) fn with_context(e: SourceError, context: &str) -> SourceError {
    match e {
        SourceError::Server { detail, .. } => SourceError::Server {
            context: context.to_owned(),
            detail,
        },
        other => other,
    }
}

pub(super) fn first_word(sql: &str) -> &str {
    sql.split_whitespace().next().unwrap_or(sql)
}

/// Parses a DataRow ('D'): Int16 column count, then per column Int32 length (-1 = NULL) and bytes.
pub(super) fn parse_data_row(mut p: Bytes) -> Result<Vec<Option<Bytes>>, SourceError> {
    let malformed = || SourceError::Protocol("malformed DataRow".to_owned());
    if p.remaining() < 2 {
        return Err(malformed());
    }
    let n = p.get_i16();
    let mut row = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for _ in 0..n {
        if p.remaining() < 4 {
            return Err(malformed());
        }
        let len = p.get_i32();
        match usize::try_from(len) {
            Err(_) => row.push(None),
            Ok(len) if len <= p.remaining() => row.push(Some(p.split_to(len))),
            Ok(_) => return Err(malformed()),
        }
    }
    Ok(row)
}

pub(super) fn text_column<'r>(
    row: &'r [Option<Bytes>],
    index: usize,
    what: &str,
) -> Result<&'r str, SourceError> {
    row.get(index)
        .and_then(|v| v.as_ref())
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| SourceError::Protocol(format!("{what} missing or not text")))
}

pub(super) fn parse_lsn(text: &str) -> Result<Lsn, SourceError> {
    text.parse::<Lsn>()
        .map_err(|e| SourceError::Protocol(e.to_string()))
}
