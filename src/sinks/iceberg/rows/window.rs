//! Partial updates replayed inside an upsert window whose row the table does not hold.
//!
//! Where it sits: between the commit's lookup of current rows (`lookup.rs`) and writing the data
//! files. The pipeline marks changes replayed over a copy that may already reflect them
//! (`TableChanges::upsert_window`, `pipeline/upsert.rs`). Inside the window a partial update
//! (absent columns, key unchanged) can find no row: the row existed before the update but not at
//! the snapshot its chunk was copied at, so a later change inside the window deletes it or moves
//! its key away (the argument: `sources/mysql/copy.rs`). Such an update, and every row of the
//! commit that takes an absent value from it, is dropped: the later delete would have removed
//! them, and a later key change of the same row finds no row either and stops the sink (the
//! values it would carry are in no copied chunk). Outside the window a missing row stays an error.
//!
//! Pure: it edits the plan (rows, fills, position deletes) before anything is written.

use crate::changelog::{TableChanges, TableSchema};
use crate::sinks::iceberg::plan::{CellSource, KeyRef, Plan, PlannedFile, RowRef};
use crate::sinks::SinkError;

/// Per lookup key: whether the table may lack its row (a partial update with its key unchanged,
/// inside an upsert window).
pub(crate) fn droppable(changes: &[TableChanges], lookups: &[KeyRef]) -> Vec<bool> {
    lookups
        .iter()
        .map(|k| {
            !k.old
                && changes
                    .get(k.batch as usize)
                    .is_some_and(|c| c.upsert_window)
        })
        .collect()
}

/// Removes from `plan` every row with an absent cell taken from a lookup row that is `missing`,
/// and returns how many. A key change among them is returned as the error: it cannot be dropped.
pub(crate) fn drop_unfillable(
    plan: &mut Plan,
    changes: &[TableChanges],
    missing: &[bool],
) -> Result<usize, RowRef> {
    let unfillable = |source: CellSource| match source {
        CellSource::Table(n) => missing.get(n as usize).copied().unwrap_or(false),
        CellSource::Change(_) => false,
    };
    // New position of each planned row per file (`None`: dropped), and each file's new index.
    let mut moved: Vec<Vec<Option<u32>>> = Vec::with_capacity(plan.files.len());
    let mut file_index: Vec<Option<u32>> = Vec::with_capacity(plan.files.len());
    let mut files = Vec::with_capacity(plan.files.len());
    let mut dropped = 0;
    for file in std::mem::take(&mut plan.files) {
        let mut gone = vec![false; file.rows.len()];
        for fill in file.fills.iter().filter(|f| unfillable(f.source)) {
            if let Some(g) = gone.get_mut(fill.pos as usize) {
                *g = true;
            }
        }
        let mut kept = PlannedFile {
            rows: Vec::with_capacity(file.rows.len()),
            fills: Vec::with_capacity(file.fills.len()),
        };
        let mut map = Vec::with_capacity(file.rows.len());
        for (row, &g) in file.rows.iter().zip(&gone) {
            if !g {
                map.push(Some(kept.rows.len() as u32));
                kept.rows.push(*row);
                continue;
            }
            let rekeyed = changes
                .get(row.batch as usize)
                .and_then(|c| c.key_changed.get(row.row as usize))
                .copied()
                .unwrap_or(false);
            if rekeyed {
                return Err(*row);
            }
            map.push(None);
            dropped += 1;
        }
        for fill in &file.fills {
            if let Some(Some(pos)) = map.get(fill.pos as usize) {
                kept.fills
                    .push(crate::sinks::iceberg::plan::Fill { pos: *pos, ..*fill });
            }
        }
        if kept.rows.is_empty() {
            file_index.push(None);
        } else {
            file_index.push(Some(files.len() as u32));
            files.push(kept);
        }
        moved.push(map);
    }
    plan.files = files;
    let deletes = std::mem::take(&mut plan.position_deletes);
    plan.position_deletes = deletes
        .into_iter()
        .filter_map(|(f, pos)| {
            let new_file = file_index.get(f as usize).copied().flatten()?;
            let new_pos = moved
                .get(f as usize)?
                .get(pos as usize)
                .copied()
                .flatten()?;
            Some((new_file, new_pos))
        })
        .collect();
    plan.position_deletes.sort_unstable();
    Ok(dropped)
}

/// A key change inside an upsert window whose old row the table does not hold (`window.rs`).
pub(crate) fn key_change_error(
    schema: &TableSchema,
    changes: &[TableChanges],
    row: RowRef,
) -> SinkError {
    let key = crate::sinks::iceberg::files::writer::key_batch(
        changes,
        &[KeyRef {
            batch: row.batch,
            row: row.row,
            old: false,
        }],
        &schema.primary_key,
        &TableChanges::keys_schema(schema),
    )
    .map(|b| super::lookup::key_text(&b, 0))
    .unwrap_or_else(|_| "?".into());
    SinkError::Data {
        table: schema.id.clone(),
        detail: format!(
            "cannot complete a partial update: a key change to {key} inside the upsert window of a resumed copy leaves columns unchanged, but the row it moves is in no copied chunk (copy the table again: drop it, or use binlog_row_image = FULL)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::iceberg::plan::Fill;

    /// One update of `public.t (id int8 key, t text)` to id 3 with `t` absent; `rekey`: from id 2.
    fn partial_update(rekey: bool) -> TableChanges {
        use arrow_array::builder::Int64Builder;
        use std::sync::Arc;

        use crate::changelog::{Op, TableChangesBuilder};
        use crate::test_fixtures::{column, table};
        use arrow_schema::DataType;
        let columns = vec![
            column("id", DataType::Int64, true, "x"),
            column("t", DataType::Utf8, true, "x"),
        ];
        let schema = Arc::new(table("public", "t", columns, vec![0]));
        let mut b = TableChangesBuilder::new(schema, 1);
        b.begin(Op::Update);
        let int = |b: &mut dyn arrow_array::builder::ArrayBuilder, v| {
            b.as_any_mut()
                .downcast_mut::<Int64Builder>()
                .unwrap()
                .append_value(v)
        };
        int(b.value(0).unwrap(), 3);
        b.absent(1).unwrap();
        if rekey {
            int(b.old_key(0).unwrap(), 2);
        } else {
            b.no_old_key().unwrap();
        }
        let mut c = b.finish().unwrap();
        c.upsert_window = true;
        c
    }

    #[test]
    fn only_window_updates_with_their_key_unchanged_may_miss_their_row() {
        let kept = partial_update(false);
        let mut outside = partial_update(false);
        outside.upsert_window = false;
        let changes = [kept, outside];
        let key = |batch, old| KeyRef { batch, row: 0, old };
        assert_eq!(
            droppable(&changes, &[key(0, false), key(0, true), key(1, false)]),
            [true, false, false]
        );
    }

    #[test]
    fn a_key_change_filled_from_a_missing_row_is_refused() {
        let changes = [partial_update(true)];
        let mut plan = one_row_filled_from_the_table();
        assert_eq!(drop_unfillable(&mut plan, &changes, &[true]), Err(r(0, 0)));
        let changes = [partial_update(false)];
        let mut plan = one_row_filled_from_the_table();
        assert_eq!(drop_unfillable(&mut plan, &changes, &[true]), Ok(1));
        assert!(plan.files.is_empty());
    }

    fn r(batch: u32, row: u32) -> RowRef {
        RowRef { batch, row }
    }

    /// A plan of one row whose column 1 comes from table lookup 0.
    fn one_row_filled_from_the_table() -> Plan {
        Plan {
            files: vec![PlannedFile {
                rows: vec![r(0, 0)],
                fills: vec![Fill {
                    pos: 0,
                    column: 1,
                    source: CellSource::Table(0),
                }],
            }],
            ..Plan::default()
        }
    }

    #[test]
    fn rows_filled_from_a_missing_row_are_dropped_and_positions_follow() {
        // File 0: rows 0..3; row 1 takes a value from lookup 0 (missing), row 2 from lookup 1.
        // File 1: one row filled from lookup 0 only: the file goes away.
        let mut plan = Plan {
            files: vec![
                PlannedFile {
                    rows: vec![r(0, 0), r(0, 1), r(0, 2)],
                    fills: vec![
                        Fill {
                            pos: 1,
                            column: 1,
                            source: CellSource::Table(0),
                        },
                        Fill {
                            pos: 2,
                            column: 1,
                            source: CellSource::Table(1),
                        },
                    ],
                },
                PlannedFile {
                    rows: vec![r(0, 3)],
                    fills: vec![Fill {
                        pos: 0,
                        column: 2,
                        source: CellSource::Table(0),
                    }],
                },
                PlannedFile {
                    rows: vec![r(0, 4)],
                    fills: vec![],
                },
            ],
            position_deletes: vec![(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)],
            ..Plan::default()
        };
        let changes: Vec<TableChanges> = Vec::new();
        let n = drop_unfillable(&mut plan, &changes, &[true, false]).unwrap();
        assert_eq!(n, 2);
        assert_eq!(plan.files.len(), 2);
        assert_eq!(plan.files[0].rows, [r(0, 0), r(0, 2)]);
        assert_eq!(
            plan.files[0].fills,
            [Fill {
                pos: 1,
                column: 1,
                source: CellSource::Table(1)
            }]
        );
        assert_eq!(plan.files[1].rows, [r(0, 4)]);
        assert_eq!(plan.position_deletes, [(0, 0), (0, 1), (1, 0)]);
    }
}
