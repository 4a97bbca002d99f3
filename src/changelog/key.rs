//! Which columns identify a table's rows, and where that choice came from.
//!
//! Where it sits: each source resolves a key per captured table before it streams (Postgres:
//! primary key, then `REPLICA IDENTITY USING INDEX`, then `source.key_columns`; MySQL: primary key,
//! then `source.key_columns`) and builds its [`TableSchema`](super::TableSchema)'s `primary_key`
//! from it; `cdcd check` and `cdcd status` show it. Sinks only see the resulting key indexes.

use std::fmt;

use super::TableId;

/// Where a table's key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The table's PRIMARY KEY.
    PrimaryKey,
    /// Postgres `REPLICA IDENTITY USING INDEX` on this unique, non-partial index over NOT NULL
    /// columns.
    IdentityIndex(String),
    /// `source.key_columns`: the user vouches that the columns are unique.
    Override,
    /// Nothing identifies a row, and updates and deletes do not reach cdcd: replicated
    /// insert-only (Postgres: a keyless table under REPLICA IDENTITY DEFAULT, published through
    /// the inserts-only publication).
    Keyless,
    /// Nothing but the whole row identifies it: the table is a multiset, and an update or delete
    /// carries the whole before image (Postgres `REPLICA IDENTITY FULL` without a key; MySQL and
    /// MariaDB keyless tables, whose binlog carries every update and delete, with
    /// `binlog_row_image = FULL`). A delete removes one row equal to its before image; an update
    /// is that delete and an insert. `TableSchema::primary_key` is empty, as for [`Keyless`].
    ///
    /// [`Keyless`]: KeyOrigin::Keyless
    FullRow,
}

/// A captured table's key: its column names in key order (empty when keyless) and their origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableKey {
    pub table: TableId,
    pub columns: Vec<String>,
    pub origin: KeyOrigin,
}

impl KeyOrigin {
    /// A short label (`cdcd status --json`'s `key_origin`).
    pub fn label(&self) -> &'static str {
        match self {
            KeyOrigin::PrimaryKey => "primary_key",
            KeyOrigin::IdentityIndex(_) => "replica_identity_index",
            KeyOrigin::Override => "key_columns",
            KeyOrigin::Keyless => "none",
            KeyOrigin::FullRow => "full_row",
        }
    }
}

impl fmt::Display for KeyOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyOrigin::PrimaryKey => f.write_str("primary key"),
            KeyOrigin::IdentityIndex(index) => write!(f, "replica identity index {index}"),
            KeyOrigin::Override => f.write_str("source.key_columns"),
            KeyOrigin::Keyless => f.write_str("no key"),
            KeyOrigin::FullRow => f.write_str("full row identity (multiset)"),
        }
    }
}

impl TableKey {
    /// `(a, b)`, or `-` when keyless.
    pub fn describe_columns(&self) -> String {
        if self.columns.is_empty() {
            "-".to_owned()
        } else {
            format!("({})", self.columns.join(", "))
        }
    }
}

impl fmt::Display for TableKey {
    /// `cdcd check`'s line: `table public.t: key (a, b) from the primary key`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.origin {
            KeyOrigin::Keyless => write!(
                f,
                "table {}: no key: replicated insert-only (on Postgres its UPDATE and DELETE are not \
                 published, on MySQL they stop cdcd); if they matter, give it a primary key or \
                 source.key_columns",
                self.table
            ),
            KeyOrigin::FullRow => write!(
                f,
                "table {}: no key: full row identity (multiset): an UPDATE or DELETE changes one \
                 row equal to its whole before image, duplicates stay duplicates (Postgres: \
                 REPLICA IDENTITY FULL; MySQL/MariaDB: needs binlog_row_image = FULL)",
                self.table
            ),
            _ => write!(
                f,
                "table {}: key {} from {}",
                self.table,
                self.describe_columns(),
                self.origin
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_columns_and_the_origin() {
        let key = TableKey {
            table: TableId::new("public", "events"),
            columns: vec!["tenant_id".into(), "event_id".into()],
            origin: KeyOrigin::Override,
        };
        assert_eq!(
            key.to_string(),
            "table public.events: key (tenant_id, event_id) from source.key_columns"
        );
        let index = TableKey {
            origin: KeyOrigin::IdentityIndex("events_uq".into()),
            ..key
        };
        assert!(index
            .to_string()
            .ends_with("from replica identity index events_uq"));
        let keyless = TableKey {
            columns: Vec::new(),
            origin: KeyOrigin::Keyless,
            ..index
        };
        assert!(keyless
            .to_string()
            .starts_with("table public.events: no key: replicated insert-only"));
        let full = TableKey {
            origin: KeyOrigin::FullRow,
            ..keyless
        };
        assert!(full
            .to_string()
            .starts_with("table public.events: no key: full row identity (multiset)"));
        assert_eq!(full.origin.label(), "full_row");
    }
}
