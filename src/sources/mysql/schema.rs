//! A captured table's schema and per-column converters, built one way from
//! `information_schema` rows (pure), for both the binlog stream and the initial copy.
//!
//! The binlog's TABLE_MAP event carries column types but, unless `binlog_row_metadata=FULL`, no
//! names, signedness, ENUM/SET members or primary key; `information_schema` has them all on every
//! server version, so cdcd reads it once per table and checks each TABLE_MAP against it (column
//! count, and names when FULL metadata sends them). A mismatch means the table changed after the
//! event was written: DDL seen in the binlog stops the pipeline before that happens (`assembler/mod.rs`).

use std::sync::Arc;

use crate::changelog::{Column, KeyOrigin, TableId, TableSchema};

use super::types::{map_column, parse_default, ColumnDefault, ColumnInfo, Kind, TypeError};

/// A table as cdcd decodes it.
#[derive(Debug, Clone)]
pub struct TableEntry {
    pub schema: Arc<TableSchema>,
    /// Per column, how its values convert.
    pub kinds: Vec<Kind>,
    /// Per column, its default: what an INSERT's MINIMAL image that leaves it out means.
    pub defaults: Vec<ColumnDefault>,
    /// Where `schema.primary_key` came from (`key.rs`).
    pub key_origin: KeyOrigin,
    /// The `information_schema.columns` rows the entry was built from (or their successors after
    /// an `ALTER TABLE`, `ddl.rs`): the next DDL applies to these.
    pub columns: Vec<ColumnInfo>,
    /// The table's default character set, for text columns a DDL adds without one.
    pub charset: String,
    /// Names of columns an `ALTER TABLE` dropped (since cdcd first saw the table): a later
    /// column under one of them is refused (`Assembler::alter`), as the lake cannot tell it
    /// from the dropped one.
    pub dropped: Vec<String>,
}

impl TableEntry {
    /// The schema, to adjust before the entry is shared.
    pub fn schema_mut(&mut self) -> &mut TableSchema {
        Arc::make_mut(&mut self.schema)
    }
}

/// Builds the entry from `information_schema.columns` rows (in ordinal order) and the key's
/// column names (in key order; a primary key unless the caller sets `key_origin`).
pub fn build_entry(
    id: TableId,
    columns: &[ColumnInfo],
    key: &[String],
) -> Result<TableEntry, TypeError> {
    let mut cols = Vec::with_capacity(columns.len());
    let mut kinds = Vec::with_capacity(columns.len());
    for info in columns {
        let (kind, data_type) = map_column(info)?;
        // MariaDB's JSON is a longtext with a json_valid check: named JSON, as MySQL's, so a
        // sink that stores JSON apart from text (`json = "variant"`) knows it.
        // A declared SRID in the name, as MySQL's DDL writes it (`point srid 4326`): the
        // sink's CRS for the column (`spatial = "geometry"`).
        let source_type = match kind {
            Kind::Json => "json".to_owned(),
            Kind::Geometry(srid) if srid != 0 => format!("{} srid {srid}", info.column_type),
            _ => info.column_type.clone(),
        };
        cols.push(Column {
            name: info.name.clone(),
            data_type,
            nullable: info.nullable,
            source_type,
            initial_default: None,
            former_names: info.former_names.clone(),
        });
        kinds.push(kind);
    }
    let defaults = columns
        .iter()
        .map(|c| parse_default(c.default.as_deref(), c.nullable))
        .collect();
    let primary_key = key
        .iter()
        .filter_map(|k| columns.iter().position(|c| &c.name == k))
        .collect();
    Ok(TableEntry {
        schema: Arc::new(TableSchema {
            id,
            columns: cols,
            primary_key,
        }),
        kinds,
        defaults,
        key_origin: if key.is_empty() {
            KeyOrigin::FullRow
        } else {
            KeyOrigin::PrimaryKey
        },
        columns: columns.to_vec(),
        charset: "utf8mb4".to_owned(),
        dropped: Vec::new(),
    })
}

/// Whether `table` matches one of the `db.table` patterns (`*` matches any run of characters).
pub fn matches_patterns(patterns: &[String], table: &TableId) -> bool {
    patterns.iter().any(|p| match p.split_once('.') {
        Some((db, name)) => glob(db, &table.namespace) && glob(name, &table.name),
        None => false,
    })
}

fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len()).any(|i| tail.get(i..).is_some_and(|t| glob(rest, t)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_with_wildcards() {
        let pats = vec!["shop.*".to_owned(), "crm.cust*".to_owned()];
        assert!(matches_patterns(&pats, &TableId::new("shop", "orders")));
        assert!(matches_patterns(&pats, &TableId::new("crm", "customers")));
        assert!(!matches_patterns(&pats, &TableId::new("crm", "leads")));
        assert!(!matches_patterns(&pats, &TableId::new("shopx", "orders")));
    }

    #[test]
    fn key_columns_are_found_by_name() {
        let c = |name: &str| ColumnInfo {
            name: name.into(),
            data_type: "int".into(),
            column_type: "int(11)".into(),
            ..Default::default()
        };
        let e = build_entry(TableId::new("s", "t"), &[c("a"), c("b")], &["b".to_owned()]).unwrap();
        assert_eq!(e.schema.primary_key, vec![1]);
    }
}
