//! Binlog pieces `mysql_common` does not decode, from bytes (pure): MariaDB's GTID (0xa2) and
//! GTID_LIST (0xa3) events, and which captured tables a QUERY event's DDL touches.
//!
//! Everything else (event framing, checksums, TABLE_MAP, rows events v1/v2, MySQL GTID events,
//! JSONB, TRANSACTION_PAYLOAD) is `mysql_common`'s; `assembler/mod.rs` turns both into transactions.

use crate::changelog::{GtidList, MariaGtid};

/// MariaDB event type codes (sql/log_event.h).
pub const MARIADB_ANNOTATE_ROWS: u8 = 0xa0;
pub const MARIADB_BINLOG_CHECKPOINT: u8 = 0xa1;
pub const MARIADB_GTID: u8 = 0xa2;
pub const MARIADB_GTID_LIST: u8 = 0xa3;

/// A decoding failure, with what was being read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// A MariaDB GTID event: the start of an event group (transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MariaGtidEvent {
    pub gtid: MariaGtid,
    /// `FL_STANDALONE`: the group is one event (a DDL) with no XID/COMMIT after it.
    pub standalone: bool,
}

/// MariaDB `Gtid_log_event` flags (sql/log_event.h).
const FL_STANDALONE: u8 = 1;

/// Decodes a GTID event's data (after the 19-byte header, before the checksum):
/// `seq_no u64le, domain_id u32le, flags u8, …` (MariaDB KB "GTID_EVENT"). The server id is the
/// event header's.
pub fn mariadb_gtid(data: &[u8], server_id: u32) -> Result<MariaGtidEvent, DecodeError> {
    let short = || DecodeError(format!("MariaDB GTID event of {} bytes", data.len()));
    let seq = u64::from_le_bytes(
        data.get(0..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(short)?,
    );
    let domain = u32::from_le_bytes(
        data.get(8..12)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(short)?,
    );
    let flags = *data.get(12).ok_or_else(short)?;
    Ok(MariaGtidEvent {
        gtid: MariaGtid {
            domain,
            server: server_id,
            seq,
        },
        standalone: flags & FL_STANDALONE != 0,
    })
}

/// Decodes a GTID_LIST event's data: `count u32le` (low 28 bits; the top 4 are flags), then
/// `count × (domain u32le, server u32le, seq u64le)` (MariaDB KB "GTID_LIST_EVENT").
pub fn mariadb_gtid_list(data: &[u8]) -> Result<GtidList, DecodeError> {
    let short = || DecodeError(format!("MariaDB GTID_LIST event of {} bytes", data.len()));
    let head: [u8; 4] = data
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(short)?;
    let count = (u32::from_le_bytes(head) & 0x0fff_ffff) as usize;
    let mut list = GtidList::default();
    for i in 0..count {
        let at = 4 + i * 16;
        let entry = data.get(at..at + 16).ok_or_else(short)?;
        let u32_at = |o: usize| {
            entry
                .get(o..o + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let seq = entry
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        let (Some(domain), Some(server), Some(seq)) = (u32_at(0), u32_at(4), seq) else {
            return Err(short());
        };
        // A list may name a domain more than once (one per server); the highest seq wins.
        if list.seq(domain) <= seq {
            list.apply(MariaGtid {
                domain,
                server,
                seq,
            });
        }
    }
    Ok(list)
}

/// What a QUERY event means to the transaction being assembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    Begin,
    Commit,
    Rollback,
    /// DDL on `tables` (`db.table`, as written or qualified with the event's database).
    Ddl {
        verb: DdlVerb,
        tables: Vec<(String, String)>,
    },
    /// Anything else (SAVEPOINT, GRANT, statements on other objects, …).
    Other,
}

/// The DDL verbs that change a table's rows or shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdlVerb {
    Create,
    Alter,
    Drop,
    Rename,
    Truncate,
}

/// Classifies a QUERY event's SQL. `default_db` is the event's current database, used for
/// unqualified table names. Comments at the start are skipped.
pub fn classify(sql: &str, default_db: &str) -> Statement {
    let words = tokens(sql);
    let upper = |i: usize| words.get(i).map(|w| w.to_ascii_uppercase());
    let Some(first) = upper(0) else {
        return Statement::Other;
    };
    match first.as_str() {
        "BEGIN" => return Statement::Begin,
        "COMMIT" => return Statement::Commit,
        "ROLLBACK" if upper(1).as_deref() != Some("TO") => return Statement::Rollback,
        "XA" => return Statement::Other,
        _ => {}
    }
    let verb = match first.as_str() {
        "CREATE" => DdlVerb::Create,
        "ALTER" => DdlVerb::Alter,
        "DROP" => DdlVerb::Drop,
        "RENAME" => DdlVerb::Rename,
        "TRUNCATE" => DdlVerb::Truncate,
        _ => return Statement::Other,
    };
    // Skip modifiers until TABLE (CREATE OR REPLACE TEMPORARY TABLE, ALTER ONLINE IGNORE TABLE, …).
    let mut i = 1;
    let mut temporary = false;
    while let Some(w) = upper(i) {
        match w.as_str() {
            "TABLE" | "TABLES" => break,
            "TEMPORARY" => temporary = true,
            "OR" | "REPLACE" | "ONLINE" | "OFFLINE" | "IGNORE" => {}
            _ if verb == DdlVerb::Truncate => {
                // TRUNCATE [TABLE] name
                i -= 1;
                break;
            }
            _ => return Statement::Other,
        }
        i += 1;
    }
    if temporary {
        return Statement::Other;
    }
    i += 1;
    if matches!(upper(i).as_deref(), Some("IF")) {
        // IF [NOT] EXISTS
        i += if upper(i + 1).as_deref() == Some("NOT") {
            3
        } else {
            2
        };
    }
    let mut tables = Vec::new();
    let mut expect_name = true;
    while let Some(w) = words.get(i) {
        let up = w.to_ascii_uppercase();
        if expect_name {
            tables.push(qualify(w, default_db));
            expect_name = false;
            if verb == DdlVerb::Alter || verb == DdlVerb::Create || verb == DdlVerb::Truncate {
                break;
            }
        } else if w == "," || (verb == DdlVerb::Rename && up == "TO") {
            expect_name = true;
        } else if verb == DdlVerb::Drop && (up == "RESTRICT" || up == "CASCADE") {
            break;
        }
        i += 1;
    }
    Statement::Ddl { verb, tables }
}

fn qualify(name: &str, default_db: &str) -> (String, String) {
    let parts = split_name(name);
    match parts.as_slice() {
        [db, table] => (db.clone(), table.clone()),
        [table] => (default_db.to_owned(), table.clone()),
        _ => (default_db.to_owned(), name.to_owned()),
    }
}

/// `` `a`.`b` `` / `a.b` / `b` into its unquoted parts.
fn split_name(name: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut quoted = false;
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' if quoted && chars.peek() == Some(&'`') => {
                chars.next();
                if let Some(p) = parts.last_mut() {
                    p.push('`');
                }
            }
            '`' => quoted = !quoted,
            '.' if !quoted => parts.push(String::new()),
            c => {
                if let Some(p) = parts.last_mut() {
                    p.push(c);
                }
            }
        }
    }
    parts
}

/// Splits SQL into words, names (`` `x`.`y` `` kept whole), ',' and '('; skips comments.
fn tokens(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = sql.chars().peekable();
    let mut quoted = false;
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            out.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        if quoted {
            cur.push(c);
            if c == '`' {
                if chars.peek() == Some(&'`') {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                } else {
                    quoted = false;
                }
            }
            continue;
        }
        match c {
            '`' => {
                cur.push(c);
                quoted = true;
            }
            '/' if chars.peek() == Some(&'*') => {
                flush(&mut cur, &mut out);
                chars.next();
                let mut prev = ' ';
                for n in chars.by_ref() {
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
            }
            '#' => {
                flush(&mut cur, &mut out);
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                flush(&mut cur, &mut out);
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
            }
            ',' | '(' | ';' => {
                flush(&mut cur, &mut out);
                out.push(c.to_string());
            }
            c if c.is_whitespace() => flush(&mut cur, &mut out),
            c => cur.push(c),
        }
    }
    flush(&mut cur, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mariadb_gtid_event_from_bytes() {
        let mut data = 42u64.to_le_bytes().to_vec();
        data.extend(7u32.to_le_bytes());
        data.push(FL_STANDALONE | 2);
        data.extend(99u64.to_le_bytes());
        let ev = mariadb_gtid(&data, 3).unwrap();
        assert_eq!(ev.gtid.to_string_triple(), (7, 3, 42));
        assert!(ev.standalone);
        assert!(mariadb_gtid(&data[..10], 3).is_err());
    }

    #[test]
    fn mariadb_gtid_list_from_bytes() {
        let mut data = (2u32 | (1 << 28)).to_le_bytes().to_vec();
        for (d, s, q) in [(0u32, 1u32, 42u64), (1, 2, 7)] {
            data.extend(d.to_le_bytes());
            data.extend(s.to_le_bytes());
            data.extend(q.to_le_bytes());
        }
        assert_eq!(
            mariadb_gtid_list(&data).unwrap().to_string(),
            "0-1-42,1-2-7"
        );
        assert!(mariadb_gtid_list(&data[..20]).is_err());
    }

    impl MariaGtid {
        fn to_string_triple(self) -> (u32, u32, u64) {
            (self.domain, self.server, self.seq)
        }
    }

    fn ddl(sql: &str) -> (DdlVerb, Vec<(String, String)>) {
        match classify(sql, "shop") {
            Statement::Ddl { verb, tables } => (verb, tables),
            other => panic!("{sql}: {other:?}"),
        }
    }

    fn t(db: &str, table: &str) -> (String, String) {
        (db.into(), table.into())
    }

    #[test]
    fn ddl_names_its_tables() {
        assert_eq!(
            ddl("ALTER TABLE `orders` ADD COLUMN x int"),
            (DdlVerb::Alter, vec![t("shop", "orders")])
        );
        assert_eq!(
            ddl("/* c */ drop table if exists a, `other`.`b` /* generated by server */"),
            (DdlVerb::Drop, vec![t("shop", "a"), t("other", "b")])
        );
        assert_eq!(
            ddl("RENAME TABLE a TO b, c TO d"),
            (
                DdlVerb::Rename,
                vec![
                    t("shop", "a"),
                    t("shop", "b"),
                    t("shop", "c"),
                    t("shop", "d")
                ]
            )
        );
        assert_eq!(ddl("truncate x"), (DdlVerb::Truncate, vec![t("shop", "x")]));
        assert_eq!(
            ddl("TRUNCATE TABLE s.x"),
            (DdlVerb::Truncate, vec![t("s", "x")])
        );
        assert_eq!(
            ddl("create table if not exists n (id int primary key)"),
            (DdlVerb::Create, vec![t("shop", "n")])
        );
        assert_eq!(classify("BEGIN", "x"), Statement::Begin);
        assert_eq!(classify("COMMIT", "x"), Statement::Commit);
        assert_eq!(
            classify("CREATE TEMPORARY TABLE t (a int)", "x"),
            Statement::Other
        );
        assert_eq!(classify("CREATE USER u", "x"), Statement::Other);
        assert_eq!(classify("ROLLBACK TO SAVEPOINT s", "x"), Statement::Other);
    }
}
