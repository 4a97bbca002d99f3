//! Table schemas for the changelog, built one way whether the columns come from a Relation message
//! (streaming) or from `pg_attribute` (the initial copy).
//!
//! Where it sits: `assembler/mod.rs` builds a schema on every Relation message of a captured table, and
//! `mod.rs` builds one per table before the copy. Building both the same way matters: the pipeline
//! commits a table's buffer early when a batch arrives with a different schema, so the copy's
//! schema and the stream's must compare equal when the table did not change.

use super::types::{ColumnType, TypeInfo};
use crate::changelog::{Column, TableId, TableSchema};
use crate::sources::SourceError;

/// One column as a Relation message or the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDef {
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod` (-1: none).
    pub type_modifier: i32,
    /// Flagged as a replica identity key column (Relation messages only).
    pub key_flag: bool,
}

/// The schema and per-column types of `table`. `key_names`: the key in key order (from
/// `key::resolve`); `None` falls back to the key flags. Key columns are not nullable, every
/// other column is (the catalog's NOT NULL is not in Relation messages, so it is not used).
pub fn build_schema(
    table: TableId,
    columns: &[ColumnDef],
    key_names: Option<&[String]>,
    lookup: &dyn Fn(u32) -> Option<TypeInfo>,
) -> Result<(TableSchema, Vec<ColumnType>), SourceError> {
    let primary_key: Vec<usize> = match key_names {
        Some(names) => names
            .iter()
            .map(|n| {
                columns
                    .iter()
                    .position(|c| &c.name == n)
                    .ok_or_else(|| SourceError::Table {
                        table: table.clone(),
                        detail: format!(
                            "primary key column {n} is not among the replicated columns"
                        ),
                    })
            })
            .collect::<Result<_, _>>()?,
        None => columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.key_flag)
            .map(|(i, _)| i)
            .collect(),
    };
    // A resolved key may be empty (a keyless append table, `key.rs`); without a resolution,
    // a Relation message that flags no key column leaves nothing to replicate by.
    if primary_key.is_empty() && key_names.is_none() {
        return Err(SourceError::Table {
            table,
            detail: "no key: add a PRIMARY KEY, a REPLICA IDENTITY USING INDEX or a source.key_columns entry, or remove it from source.tables".to_owned(),
        });
    }
    let types: Vec<ColumnType> = columns
        .iter()
        .map(|c| ColumnType::resolve(c.type_oid, c.type_modifier, lookup))
        .collect();
    let columns = columns
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(i, (c, t))| Column {
            name: c.name.clone(),
            data_type: t.data_type(),
            nullable: !primary_key.contains(&i),
            source_type: t.source_name(),
            initial_default: None,
            former_names: Vec::new(),
        })
        .collect();
    Ok((
        TableSchema {
            id: table,
            columns,
            primary_key,
        },
        types,
    ))
}

/// The type OIDs among `columns` that `ColumnType::resolve` would ask `known` about and `known`
/// cannot answer (`None` from `known` = never looked up).
pub fn unresolved_types(
    columns: &[ColumnDef],
    known: &dyn Fn(u32) -> Option<Option<TypeInfo>>,
) -> Vec<u32> {
    let missing = std::cell::RefCell::new(Vec::new());
    let lookup = |oid: u32| -> Option<TypeInfo> {
        match known(oid) {
            Some(info) => info,
            None => {
                missing.borrow_mut().push(oid);
                None
            }
        }
    };
    for c in columns {
        let _ = ColumnType::resolve(c.type_oid, c.type_modifier, &lookup);
    }
    let mut missing = missing.into_inner();
    missing.sort_unstable();
    missing.dedup();
    missing
}
