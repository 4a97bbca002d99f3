//! Column renames from the `cdcd.ddl` logical decoding messages of the optional event trigger
//! (`migrations/postgres/002_ddl_capture.sql`), pure.
//!
//! pgoutput's Relation message carries no column identity: a column renamed from `b` to `c` and
//! a column `b` dropped while `c` is added look the same, so without more cdcd stops at either
//! (`TableSchema::evolves_to`). The trigger writes, inside each `ALTER TABLE`'s own transaction,
//! a transactional message (`pg_logical_emit_message(true, 'cdcd.ddl', …)`) per altered object:
//! the table's oid, for a column its attnum and identity (`schema.table.column`, the name after
//! the command) and the statement's text (`current_query()`). For a renamed column the old name
//! is in the statement only, so it is parsed (the `sqlparser` crate's PostgreSQL dialect) and
//! the `RENAME [COLUMN] old TO new` of this table whose new name is the message's column is the
//! rename. A statement the parser cannot read (a `DO` block, a function body) yields no rename:
//! the Relation diff then stops cdcd as without the trigger, never a guess.

use sqlparser::ast::{AlterTableOperation, Ident, ObjectName, Statement};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::changelog::TableId;

/// The logical decoding message prefix the trigger writes.
pub const PREFIX: &str = "cdcd.ddl";

/// One message of the trigger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct DdlMessage {
    /// `pg_class.oid` of the altered table (the Relation message's `oid`).
    pub relid: u32,
    /// The column's attnum; 0 for a command on the table itself.
    pub attnum: i32,
    /// `pg_event_trigger_ddl_commands().object_identity`: `schema.table` or
    /// `schema.table.column`, each part quoted where Postgres would quote it.
    pub object: String,
    /// The text of the statement the client sent (may hold several statements).
    pub query: String,
}

impl DdlMessage {
    pub fn parse(content: &[u8]) -> Result<DdlMessage, String> {
        serde_json::from_slice(content).map_err(|e| format!("a {PREFIX} message: {e}"))
    }

    /// `(old, new)` when this message is a column rename of `table` that the statement spells
    /// out; `None` for any other command, or a statement the parser cannot read.
    pub fn rename(&self, table: &TableId) -> Option<(String, String)> {
        if self.attnum <= 0 {
            return None;
        }
        let new = last_identifier(&self.object)?;
        let statements = Parser::parse_sql(&PostgreSqlDialect {}, &self.query).ok()?;
        statements.iter().find_map(|statement| {
            let Statement::AlterTable(alter) = statement else {
                return None;
            };
            if !names_table(&alter.name, table) {
                return None;
            }
            alter.operations.iter().find_map(|op| match op {
                AlterTableOperation::RenameColumn {
                    old_column_name,
                    new_column_name,
                } if folded(new_column_name) == new => Some((folded(old_column_name), new.clone())),
                _ => None,
            })
        })
    }
}

impl DdlMessage {
    /// The columns of `table` the statement drops (`ALTER TABLE … DROP [COLUMN] c`), for a
    /// command on the table itself; empty for anything else or an unreadable statement.
    pub fn dropped_columns(&self, table: &TableId) -> Vec<String> {
        if self.attnum != 0 {
            return Vec::new();
        }
        let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, &self.query) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for statement in &statements {
            let Statement::AlterTable(alter) = statement else {
                continue;
            };
            if !names_table(&alter.name, table) {
                continue;
            }
            for op in &alter.operations {
                if let AlterTableOperation::DropColumn { column_names, .. } = op {
                    out.extend(column_names.iter().map(folded));
                }
            }
        }
        out
    }
}

/// An identifier as Postgres stores it: unquoted ones are folded to lower case.
fn folded(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

/// Whether `name` (`table` or `schema.table`, as written) can be `table`. An unqualified name is
/// taken as the table the trigger reported (the message's oid already says which one it is).
fn names_table(name: &ObjectName, table: &TableId) -> bool {
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|p| p.as_ident().map(folded))
        .collect();
    match parts.as_slice() {
        [t] => *t == table.name,
        [s, t] => *s == table.namespace && *t == table.name,
        [_, s, t] => *s == table.namespace && *t == table.name,
        _ => false,
    }
}

/// The last part of an object identity (`public.t."New Col"` → `New Col`): quoted parts lose
/// their quotes and doubled inner quotes, unquoted ones are already as stored.
fn last_identifier(identity: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut chars = identity.chars().peekable();
    while chars.peek().is_some() {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    '"' => break,
                    c => part.push(c),
                }
            }
            if chars.peek() == Some(&'.') {
                chars.next();
            }
        } else {
            for c in chars.by_ref() {
                if c == '.' {
                    break;
                }
                part.push(c);
            }
        }
        parts.push(part);
    }
    parts.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(attnum: i32, object: &str, query: &str) -> DdlMessage {
        DdlMessage {
            relid: 16384,
            attnum,
            object: object.into(),
            query: query.into(),
        }
    }

    #[test]
    fn reads_the_trigger_json() {
        let m = DdlMessage::parse(
            br#"{"relid" : 16384, "attnum" : 2, "object" : "public.t.c", "query" : "ALTER TABLE t RENAME b TO c"}"#,
        )
        .unwrap();
        assert_eq!(m, message(2, "public.t.c", "ALTER TABLE t RENAME b TO c"));
        assert!(DdlMessage::parse(b"not json").is_err());
    }

    #[test]
    fn finds_the_dropped_columns() {
        let t = TableId::new("public", "t");
        let m = message(
            0,
            "public.t",
            "ALTER TABLE t DROP COLUMN b, DROP c; ALTER TABLE u DROP x",
        );
        assert_eq!(m.dropped_columns(&t), ["b", "c"]);
        assert!(message(2, "public.t.b", "ALTER TABLE t DROP b")
            .dropped_columns(&t)
            .is_empty());
    }

    #[test]
    fn finds_the_rename_the_statement_spells_out() {
        let t = TableId::new("public", "t");
        let rename = |attnum, object, query| message(attnum, object, query).rename(&t);
        assert_eq!(
            rename(2, "public.t.c", "ALTER TABLE t RENAME COLUMN b TO c"),
            Some(("b".into(), "c".into()))
        );
        assert_eq!(
            rename(2, "public.t.c", "alter table public.T rename B to C"),
            Some(("b".into(), "c".into())),
            "unquoted names fold to lower case"
        );
        assert_eq!(
            rename(
                3,
                r#"public.t."New ""Col""""#,
                r#"ALTER TABLE "t" RENAME "Old" TO "New ""Col""""#
            ),
            Some(("Old".into(), r#"New "Col""#.into()))
        );
        // Several statements in one query: each message picks its own rename.
        let q = "ALTER TABLE t RENAME b TO c; ALTER TABLE t RENAME c TO d";
        assert_eq!(rename(2, "public.t.c", q), Some(("b".into(), "c".into())));
        assert_eq!(rename(2, "public.t.d", q), Some(("c".into(), "d".into())));
        // Not a rename of this table, a table-level command, an unreadable statement.
        assert_eq!(rename(2, "public.t.c", "ALTER TABLE u RENAME b TO c"), None);
        assert_eq!(
            rename(2, "public.t.c", "ALTER TABLE other.t RENAME b TO c"),
            None
        );
        assert_eq!(
            rename(0, "public.t", "ALTER TABLE t ADD COLUMN c int"),
            None
        );
        assert_eq!(
            rename(
                2,
                "public.t.c",
                "DO $$ BEGIN EXECUTE 'ALTER TABLE t RENAME b TO c'; END $$"
            ),
            None
        );
    }
}
