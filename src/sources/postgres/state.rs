//! What the Postgres source keeps beside the checkpoints (`_cdcd/<pipeline>/source-state.json`,
//! through [`SourceStateStore`](crate::sources::SourceStateStore)): each captured table's
//! `pg_class` oid as cdcd last streamed it, its columns' numbers, and the former names of renamed
//! columns (pure).
//!
//! Why: pgoutput says nothing when a table is dropped and created again under the same name. If
//! that happens while cdcd is not running, the new table's rows made before cdcd added it back
//! to the publication were never published, and its later changes would be applied over the old
//! table's rows in the lake. The oid tells the two tables apart: a captured table whose oid
//! changed since cdcd last streamed it stops cdcd at start, unless it is being copied anew.
//! (While cdcd runs, the assembler notices the same from the Relation messages.)
//!
//! The same for a column: one dropped and added again under the same name gets a new `attnum`,
//! and when it is the table's last column pgoutput's Relation message looks exactly as before
//! (same names, same types). The lake column would keep the old column's values for rows that
//! read NULL (or the new default) in the source. cdcd compares each captured column's `attnum`
//! with the recorded one at start and at each Relation message of the table, and stops on a
//! change (`readded`).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::assembler::TableDdl;
use crate::changelog::{Lsn, TableId};
use crate::sources::SourceError;

/// The stop for a column `readded` (name, recorded and current `attnum`) of `table`.
pub fn readded_column(table: &TableId, readded: &(String, i16, i16)) -> SourceError {
    let (column, was, now) = readded;
    SourceError::Table {
        table: table.clone(),
        detail: format!(
            "column {column} was dropped and added again (column number {was}, now {now}): its lake column still holds the dropped column's values, which the source no longer has, and the replication stream cannot tell the two apart. Copy the table again: `cdcd resync --table {table}`, then start cdcd"
        ),
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgSourceState {
    /// `schema.table` → oid.
    #[serde(default)]
    pub table_oids: BTreeMap<String, u32>,
    /// `schema.table` → column → the names it had before, oldest first, from the DDL trigger's
    /// renames (`ddl.rs`). Kept so a restart between a rename and the table's next change (the
    /// slot has moved past the trigger's message) still renames the lake's column.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub former_names: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// `schema.table` → the columns the DDL trigger reported dropped, each with the LSN of its
    /// message (`ddl.rs`): a column under such a name later is refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dropped_columns: BTreeMap<String, Vec<(String, String)>>,
    /// `schema.table` → column → its `attnum` when cdcd last read the catalog.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub column_attnums: BTreeMap<String, BTreeMap<String, i16>>,
}

impl PgSourceState {
    pub fn from_json(bytes: &[u8]) -> Result<PgSourceState, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Strings and integers only: serializing cannot fail.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// The captured tables (`current`: their oids now) whose oid is not the recorded one,
    /// leaving out `copying` (copied anew now, from the current table).
    pub fn recreated(
        &self,
        current: &HashMap<u32, TableId>,
        copying: &[TableId],
    ) -> Vec<(TableId, u32, u32)> {
        let mut out: Vec<(TableId, u32, u32)> = current
            .iter()
            .filter(|(_, table)| !copying.contains(table))
            .filter_map(|(&oid, table)| {
                let recorded = *self.table_oids.get(&table.to_string())?;
                (recorded != oid).then(|| (table.clone(), recorded, oid))
            })
            .collect();
        out.sort();
        out
    }

    /// What the DDL trigger told about `tables`, for the assembler (an unreadable LSN drops
    /// that entry: it only ever makes cdcd stop, never skip).
    pub fn ddl(&self, tables: &[TableId]) -> TableDdl {
        let mut out = TableDdl::default();
        for t in tables {
            if let Some(names) = self.former_names.get(&t.to_string()) {
                out.former.insert(
                    t.clone(),
                    names.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                );
            }
            if let Some(dropped) = self.dropped_columns.get(&t.to_string()) {
                out.dropped.insert(
                    t.clone(),
                    dropped
                        .iter()
                        .filter_map(|(name, lsn)| Some((name.clone(), lsn.parse::<Lsn>().ok()?)))
                        .collect(),
                );
            }
        }
        out
    }

    /// Replaces what is kept for the tables in `ddl`.
    pub fn set_ddl(&mut self, ddl: &TableDdl) {
        for (table, names) in &ddl.former {
            self.former_names.insert(
                table.to_string(),
                names.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            );
        }
        for (table, dropped) in &ddl.dropped {
            self.dropped_columns.insert(
                table.to_string(),
                dropped
                    .iter()
                    .map(|(name, lsn)| (name.clone(), lsn.to_string()))
                    .collect(),
            );
        }
    }

    /// The columns of `table` whose `attnum` now (`now`, by name) is not the recorded one, with
    /// both numbers: each was dropped and added again since.
    pub fn readded(&self, table: &TableId, now: &BTreeMap<String, i16>) -> Vec<(String, i16, i16)> {
        let Some(recorded) = self.column_attnums.get(&table.to_string()) else {
            return Vec::new();
        };
        now.iter()
            .filter_map(|(name, &at)| {
                let was = *recorded.get(name)?;
                (was != at).then(|| (name.clone(), was, at))
            })
            .collect()
    }

    /// Records `now` as `table`'s column numbers; whether that changed anything.
    pub fn set_attnums(&mut self, table: &TableId, now: BTreeMap<String, i16>) -> bool {
        let key = table.to_string();
        if self.column_attnums.get(&key) == Some(&now) {
            return false;
        }
        self.column_attnums.insert(key, now);
        true
    }

    /// Forgets what the DDL trigger said of `table` (it is copied anew).
    pub fn forget_ddl(&mut self, table: &TableId) {
        self.former_names.remove(&table.to_string());
        self.dropped_columns.remove(&table.to_string());
    }

    /// Records `current` (tables no longer captured keep their entry: they may come back).
    pub fn record(&mut self, current: &HashMap<u32, TableId>) {
        for (&oid, table) in current {
            self.table_oids.insert(table.to_string(), oid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_whose_number_changed_was_added_again() {
        let t = TableId::new("public", "t");
        let mut state = PgSourceState::default();
        let cols = |v: &[(&str, i16)]| -> BTreeMap<String, i16> {
            v.iter().map(|(n, a)| ((*n).to_owned(), *a)).collect()
        };
        let first = cols(&[("id", 1), ("b", 2)]);
        assert!(state.readded(&t, &first).is_empty(), "nothing recorded yet");
        assert!(state.set_attnums(&t, first.clone()));
        assert!(!state.set_attnums(&t, first.clone()), "unchanged");
        let back = PgSourceState::from_json(&state.to_json()).unwrap();
        assert_eq!(back, state);
        // Dropped (absent) or added (new name): no stop; `b` again under number 4: a stop.
        assert!(state.readded(&t, &cols(&[("id", 1), ("c", 3)])).is_empty());
        assert_eq!(
            state.readded(&t, &cols(&[("id", 1), ("b", 4)])),
            [("b".to_owned(), 2, 4)]
        );
        assert!(state
            .readded(&TableId::new("public", "u"), &first)
            .is_empty());
    }

    #[test]
    fn a_changed_oid_is_a_recreated_table_unless_it_is_copied_anew() {
        let t = TableId::new("public", "t");
        let u = TableId::new("public", "u");
        let mut state = PgSourceState::default();
        let first: HashMap<u32, TableId> = [(10, t.clone()), (11, u.clone())].into();
        assert!(
            state.recreated(&first, &[]).is_empty(),
            "nothing recorded yet"
        );
        state.record(&first);
        let back = PgSourceState::from_json(&state.to_json()).unwrap();
        assert_eq!(back, state);
        assert!(state.recreated(&first, &[]).is_empty());
        let later: HashMap<u32, TableId> = [(20, t.clone()), (11, u.clone())].into();
        assert_eq!(state.recreated(&later, &[]), [(t.clone(), 10, 20)]);
        assert!(state.recreated(&later, &[t]).is_empty(), "copied anew");
        assert!(PgSourceState::from_json(b"{}")
            .unwrap()
            .table_oids
            .is_empty());
    }

    #[test]
    fn renames_and_drops_round_trip() {
        let t = TableId::new("public", "t");
        let mut ddl = TableDdl::default();
        ddl.former
            .insert(t.clone(), [("c".to_owned(), vec!["b".to_owned()])].into());
        ddl.dropped
            .insert(t.clone(), vec![("x".to_owned(), Lsn(0x1_0000_0090))]);
        let mut state = PgSourceState::default();
        state.set_ddl(&ddl);
        let back = PgSourceState::from_json(&state.to_json()).unwrap();
        assert_eq!(back.ddl(&[t]), ddl);
    }
}
