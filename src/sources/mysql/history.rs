//! The schema history of captured tables: which columns a table had from which binlog position on,
//! so every rows event is decoded with the shape in force where it was written, after a restart
//! too (pure; stored by the pipeline through [`SourceStateStore`](crate::sources::SourceStateStore)
//! as `<warehouse>/_cdcd/<pipeline>/source-state.json`).
//!
//! Why it is needed: a restart re-reads the binlog from the oldest table checkpoint, which may lie
//! before an `ALTER TABLE` cdcd already applied; `information_schema` then shows the table after
//! the change, but the rows events before it were written with the old columns. Debezium keeps a
//! "schema history topic" for the same reason.
//!
//! What is recorded: when the stream starts, every captured table without a history gets one
//! version, its columns from `information_schema` (`from = None`: in force until the first DDL
//! cdcd sees; the assumption cdcd always made, checked against every TABLE_MAP); each DDL adds the
//! version after it with the position right after the DDL's transaction. So a DDL made while cdcd
//! was down is replayed onto the version the restart position had, not onto the table as it is
//! now. The stream writes the history before it reads past the DDL, so no checkpoint past a
//! DDL exists without its version on record; a crash before that write leaves checkpoints before
//! the DDL, whose replay applies the DDL again to the old version and records the same result
//! (replays are idempotent: a version at the same position replaces the one recorded).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::schema::{build_entry, TableEntry};
use super::types::ColumnInfo;
use crate::changelog::{KeyOrigin, Position, TableId};

/// Every recorded table's versions, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SchemaHistory {
    /// Keyed by `db.table`.
    tables: BTreeMap<String, Vec<SchemaVersion>>,
}

/// A table's columns from a position on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaVersion {
    /// The position right after the DDL that made this version (`cdcd.position` text); `None`:
    /// the version cdcd loaded before the first DDL it saw.
    pub from: Option<String>,
    pub columns: Vec<ColumnInfo>,
    /// The key's columns in key order, and where the key came from (`primary_key`,
    /// `replica_identity_index`, `key_columns`, `none`).
    pub key: Vec<String>,
    pub key_origin: String,
    /// The table's default character set.
    pub charset: String,
    /// Per column, the initial default it was added with (`changelog::Column::initial_default`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub initial_defaults: Vec<Option<String>>,
    /// Names of columns dropped up to this version (`TableEntry::dropped`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// The DDL's text (shortened), for people reading the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
}

/// The history file could not be understood.
#[derive(Debug, thiserror::Error)]
#[error("schema history: {0}")]
pub struct HistoryError(pub String);

impl SchemaHistory {
    pub fn from_json(bytes: &[u8]) -> Result<SchemaHistory, HistoryError> {
        serde_json::from_slice(bytes).map_err(|e| HistoryError(e.to_string()))
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Strings, booleans and integers only: serializing cannot fail.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// The entry `table` had at `start` (the newest version whose DDL is at or before it, else the
    /// version before the first DDL); `None` when the table has no history.
    pub fn in_force(
        &self,
        table: &TableId,
        start: &Position,
    ) -> Result<Option<TableEntry>, HistoryError> {
        let Some(versions) = self.tables.get(&table.to_string()) else {
            return Ok(None);
        };
        let mut chosen = None;
        for version in versions.iter().rev() {
            match &version.from {
                None => {
                    chosen = Some(version);
                    break;
                }
                Some(text) => {
                    let from: Position = text
                        .parse()
                        .map_err(|e| HistoryError(format!("{table}: position {text:?}: {e}")))?;
                    if start.covers(&from) {
                        chosen = Some(version);
                        break;
                    }
                }
            }
        }
        chosen.map(|v| v.entry(table)).transpose()
    }

    /// Records that the DDL `statement`, ending at `at`, changed `before` into `after`.
    pub fn record(
        &mut self,
        before: &TableEntry,
        after: &TableEntry,
        at: &Position,
        statement: &str,
    ) {
        let versions = self.tables.entry(before.schema.id.to_string()).or_default();
        if versions.is_empty() {
            versions.push(SchemaVersion::of(before, None, None));
        }
        let from = at.to_string();
        // A replayed DDL (after a restart) lands at the position it had: replace, never repeat.
        if let Some(i) = versions
            .iter()
            .position(|v| v.from.as_deref() == Some(from.as_str()))
        {
            versions.truncate(i);
        }
        let statement: String = statement.chars().take(300).collect();
        versions.push(SchemaVersion::of(after, Some(from), Some(statement)));
    }

    /// Starts `entry`'s table's history with `entry` (the version before any DDL cdcd will see)
    /// unless it has one; true when it was added.
    pub fn adopt(&mut self, entry: &TableEntry) -> bool {
        let versions = self.tables.entry(entry.schema.id.to_string()).or_default();
        if !versions.is_empty() {
            return false;
        }
        versions.push(SchemaVersion::of(entry, None, None));
        true
    }

    /// Forgets `table` (it was copied again: `information_schema` describes it at the copy).
    pub fn forget(&mut self, table: &TableId) -> bool {
        self.tables.remove(&table.to_string()).is_some()
    }
}

impl SchemaVersion {
    fn of(entry: &TableEntry, from: Option<String>, statement: Option<String>) -> SchemaVersion {
        SchemaVersion {
            from,
            columns: entry.columns.clone(),
            key: entry
                .schema
                .key_names()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            key_origin: entry.key_origin.label().to_owned(),
            charset: entry.charset.clone(),
            initial_defaults: if entry
                .schema
                .columns
                .iter()
                .any(|c| c.initial_default.is_some())
            {
                entry
                    .schema
                    .columns
                    .iter()
                    .map(|c| c.initial_default.clone())
                    .collect()
            } else {
                Vec::new()
            },
            dropped: entry.dropped.clone(),
            statement,
        }
    }

    fn entry(&self, table: &TableId) -> Result<TableEntry, HistoryError> {
        let mut entry = build_entry(table.clone(), &self.columns, &self.key)
            .map_err(|e| HistoryError(format!("{table}: {e}")))?;
        entry.key_origin = match self.key_origin.as_str() {
            "primary_key" => KeyOrigin::PrimaryKey,
            "key_columns" => KeyOrigin::Override,
            "none" => KeyOrigin::Keyless,
            other => KeyOrigin::IdentityIndex(other.to_owned()),
        };
        entry.charset = self.charset.clone();
        entry.dropped = self.dropped.clone();
        for (column, default) in entry
            .schema_mut()
            .columns
            .iter_mut()
            .zip(&self.initial_defaults)
        {
            column.initial_default = default.clone();
        }
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(columns: &[(&str, &str)]) -> TableEntry {
        let infos: Vec<ColumnInfo> = columns
            .iter()
            .map(|(name, ty)| ColumnInfo {
                name: (*name).into(),
                data_type: (*ty).into(),
                column_type: (*ty).into(),
                nullable: *name != "id",
                ..ColumnInfo::default()
            })
            .collect();
        build_entry(TableId::new("shop", "t"), &infos, &["id".to_owned()]).unwrap()
    }

    fn file(f: &str, pos: u64) -> Position {
        format!("{f}:{pos}").parse().unwrap()
    }

    #[test]
    fn the_version_in_force_follows_the_start_and_replays_replace() {
        let v0 = entry(&[("id", "int")]);
        let v1 = entry(&[("id", "int"), ("a", "int")]);
        let v2 = entry(&[("id", "int"), ("a", "bigint")]);
        let mut h = SchemaHistory::default();
        let t = TableId::new("shop", "t");
        assert!(h.in_force(&t, &file("bin.000001", 4)).unwrap().is_none());
        h.record(
            &v0,
            &v1,
            &file("bin.000001", 500),
            "ALTER TABLE t ADD a int",
        );
        h.record(
            &v1,
            &v2,
            &file("bin.000002", 100),
            "ALTER TABLE t MODIFY a bigint",
        );
        let at = |p: Position| h.in_force(&t, &p).unwrap().unwrap().schema.columns.clone();
        assert_eq!(at(file("bin.000001", 4)), v0.schema.columns);
        assert_eq!(at(file("bin.000001", 500)), v1.schema.columns);
        assert_eq!(at(file("bin.000001", 900)), v1.schema.columns);
        assert_eq!(at(file("bin.000003", 4)), v2.schema.columns);
        // A restart before the second DDL replays it: one version per DDL, not two.
        h.record(
            &v1,
            &v2,
            &file("bin.000002", 100),
            "ALTER TABLE t MODIFY a bigint",
        );
        let back = SchemaHistory::from_json(&h.to_json()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.tables["shop.t"].len(), 3);
        assert_eq!(
            back.in_force(&t, &file("bin.000001", 4))
                .unwrap()
                .unwrap()
                .key_origin,
            KeyOrigin::PrimaryKey
        );
        assert!(h.clone().forget(&t));
    }

    #[test]
    fn initial_defaults_of_added_columns_survive_a_reload() {
        let v0 = entry(&[("id", "int")]);
        let mut v1 = entry(&[("id", "int"), ("k", "int")]);
        v1.schema_mut().columns[1].initial_default = Some("5".into());
        let mut h = SchemaHistory::default();
        h.record(
            &v0,
            &v1,
            &file("bin.000001", 500),
            "ALTER TABLE t ADD k int DEFAULT 5",
        );
        let back = SchemaHistory::from_json(&h.to_json()).unwrap();
        let t = TableId::new("shop", "t");
        let now = back.in_force(&t, &file("bin.000002", 4)).unwrap().unwrap();
        assert_eq!(now.schema.columns[1].initial_default.as_deref(), Some("5"));
        let then = back.in_force(&t, &file("bin.000001", 4)).unwrap().unwrap();
        assert!(then
            .schema
            .columns
            .iter()
            .all(|c| c.initial_default.is_none()));
    }
}
