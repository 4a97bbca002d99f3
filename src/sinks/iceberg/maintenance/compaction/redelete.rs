//! The deletes a format-v3 compaction carries over: pure, positions in and positions out.
//!
//! The rewrite reads each input with the deletion vector it had when the cycle chose it, and
//! runs outside the table's lock (`mod.rs` says why), so a streaming commit meanwhile may delete
//! more rows of an input: the input then has a larger vector in the snapshot the compaction
//! commits on. Iceberg's rule for a rewrite (spec, "Deletion Vectors": a rewrite must not
//! resurrect rows; Iceberg-Java's `validateNoNewDeletesForDataFiles` fails such a rewrite) is that
//! those deletes are not lost. cdcd re-applies them instead of failing: every row deleted since
//! is deleted at its place in the output, by a vector the `replace` snapshot adds. A row's place
//! is where `moves.rs` put it, by its rank among the input's kept rows (its position minus the
//! rows the vector used had deleted before it): the output position the input started at plus
//! that rank, or (rows split by partition or sorted) the place recorded for that rank.
//!
//! The compaction cannot commit on the newer snapshot at all (`Stale`) when an input left the
//! table or its vector lost a position: neither is a streaming commit's doing (another writer's,
//! a resync's swap, a truncate); the next cycle decides again.

use std::collections::{BTreeMap, HashSet};

use super::moves::Landed;
use crate::sinks::iceberg::deletes::commit_vectors::LiveDvs;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;

/// One input of a rewrite as it was placed in its output.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// The input data file.
    pub input: String,
    /// Its rows (the data file's record count).
    pub rows: u64,
    /// Where its kept rows went.
    pub landed: Landed,
    /// The vector the rewrite applied (`None`: no row was deleted).
    pub used: Option<DeletionVector>,
}

/// What the snapshot a compaction commits on asks of it.
#[derive(Debug, PartialEq)]
pub(crate) enum Carry {
    /// Positions to delete in outputs (by output file; absent: none).
    Deletes(BTreeMap<String, DeletionVector>),
    /// The rewrite does not apply to that snapshot, for this reason.
    Stale(String),
}

/// The output positions of the rows `now` (the live vectors of the snapshot committed on, whose
/// live data files are `live`) deletes that the rewrite did not drop.
pub(crate) fn carried_deletes(placed: &[Placed], live: &HashSet<&str>, now: &LiveDvs) -> Carry {
    let mut out: BTreeMap<String, DeletionVector> = BTreeMap::new();
    let empty = DeletionVector::new();
    for p in placed {
        if !live.contains(p.input.as_str()) {
            return Carry::Stale(format!("{} left the table", p.input));
        }
        let used = p.used.as_ref().unwrap_or(&empty);
        let Some(current) = now.get(&p.input).map(|d| &d.dv) else {
            if used.is_empty() {
                continue;
            }
            return Carry::Stale(format!("{} lost its deletion vector", p.input));
        };
        if !current.covers(used) {
            return Carry::Stale(format!("{}'s deletion vector lost positions", p.input));
        }
        for position in current.iter().filter(|&q| !used.contains(q)) {
            if position >= p.rows {
                return Carry::Stale(format!(
                    "{}'s deletion vector deletes row {position} of {}",
                    p.input, p.rows
                ));
            }
            let rank = position - used.deleted_before(position);
            let Some((output, moved)) = p.landed.of(rank) else {
                return Carry::Stale(format!("{} kept no row of rank {rank}", p.input));
            };
            let inserted = out.entry(output.to_owned()).or_default().insert(moved);
            if inserted.is_err() {
                return Carry::Stale(format!("{output} has no row {moved}"));
            }
        }
    }
    Carry::Deletes(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sinks::iceberg::deletes::commit_vectors::LiveDv;
    use crate::sinks::iceberg::files::manifest::LiveFile;
    use crate::sinks::iceberg::maintenance::compaction::moves::Placer;
    use iceberg::spec::{DataContentType, DataFileBuilder, DataFileFormat, Struct};
    use std::sync::Arc;

    fn dv(positions: &[u64]) -> DeletionVector {
        DeletionVector::from_positions(positions.iter().copied()).unwrap()
    }

    fn live_dv(data_file: &str, positions: &[u64]) -> (String, LiveDv) {
        let file = DataFileBuilder::default()
            .content(DataContentType::PositionDeletes)
            .file_path(format!("{data_file}.puffin"))
            .file_format(DataFileFormat::Puffin)
            .partition(Struct::empty())
            .record_count(positions.len() as u64)
            .file_size_in_bytes(1)
            .build()
            .unwrap();
        let entry = LiveFile {
            file,
            sequence: 1,
            snapshot_id: 1,
            manifest: Arc::from("m"),
            spec_id: 0,
        };
        (
            data_file.to_owned(),
            LiveDv {
                entry,
                dv: dv(positions),
            },
        )
    }

    fn placed(input: &str, rows: u64, start: u64, used: &[u64]) -> Placed {
        Placed {
            input: input.into(),
            rows,
            landed: Landed::Together {
                output: "out".into(),
                start,
            },
            used: (!used.is_empty()).then(|| dv(used)),
        }
    }

    #[test]
    fn rows_deleted_since_follow_rows_split_by_partition() {
        // a: 5 rows, row 1 deleted when rewritten; kept rows 0, 2, 3, 4 (ranks 0..4) went to
        // p1 at 3, p0 at 0, p1 at 0, p0 at 2. Since: rows 2 and 4 deleted.
        let inputs = [Placed {
            input: "a".into(),
            rows: 5,
            landed: Landed::Scattered {
                outputs: vec!["p0".into(), "p1".into()],
                at: vec![(1, 3), (0, 0), (1, 0), (0, 2)],
            },
            used: Some(dv(&[1])),
        }];
        let now = LiveDvs::from([live_dv("a", &[1, 2, 4])]);
        let live = HashSet::from(["a"]);
        let Carry::Deletes(out) = carried_deletes(&inputs, &live, &now) else {
            panic!("stale");
        };
        assert_eq!(out, BTreeMap::from([("p0".to_owned(), dv(&[0, 2]))]));
    }

    #[test]
    fn rows_deleted_since_are_deleted_where_the_placer_put_them() {
        // a: 6 rows, rows 1 and 4 deleted when rewritten: 0,2,3,5 land at 0..4.
        // b: 3 rows, none deleted: land at 4..7.
        let inputs = [placed("a", 6, 0, &[1, 4]), placed("b", 3, 4, &[])];
        // Since: a lost rows 3 and 5 (and still 1, 4), b lost row 0.
        let now = LiveDvs::from([live_dv("a", &[1, 3, 4, 5]), live_dv("b", &[0])]);
        let live = HashSet::from(["a", "b"]);
        let Carry::Deletes(out) = carried_deletes(&inputs, &live, &now) else {
            panic!("stale");
        };
        assert_eq!(out, BTreeMap::from([("out".to_owned(), dv(&[2, 3, 4]))]));
        // The same answer as placing the rows one by one.
        let used = dv(&[1, 4]);
        let mut placer = Placer::new(Some(&used), 0);
        let at = placer.next_batch(6);
        assert_eq!((at[3], at[5]), (Some(2), Some(3)));
    }

    #[test]
    fn nothing_deleted_since_carries_nothing() {
        let inputs = [placed("a", 4, 0, &[1])];
        let now = LiveDvs::from([live_dv("a", &[1])]);
        let live = HashSet::from(["a"]);
        assert_eq!(
            carried_deletes(&inputs, &live, &now),
            Carry::Deletes(BTreeMap::new())
        );
    }

    #[test]
    fn an_input_gone_or_a_vector_that_shrank_is_stale() {
        let inputs = [placed("a", 4, 0, &[1, 2])];
        let gone = HashSet::new();
        let now = LiveDvs::from([live_dv("a", &[1, 2])]);
        assert!(matches!(
            carried_deletes(&inputs, &gone, &now),
            Carry::Stale(_)
        ));
        let live = HashSet::from(["a"]);
        let shrank = LiveDvs::from([live_dv("a", &[1])]);
        assert!(matches!(
            carried_deletes(&inputs, &live, &shrank),
            Carry::Stale(_)
        ));
        assert!(matches!(
            carried_deletes(&inputs, &live, &LiveDvs::new()),
            Carry::Stale(_)
        ));
        let past_the_end = LiveDvs::from([live_dv("a", &[1, 2, 9])]);
        assert!(matches!(
            carried_deletes(&inputs, &live, &past_the_end),
            Carry::Stale(_)
        ));
    }
}
