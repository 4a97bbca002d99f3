//! Where a rewritten row lands: pure. Rows of one input file keep their order; the rows its
//! deletion vector deletes are dropped; the kept ones follow each other in the output file from
//! the position the previous inputs of that output ended at ([`Landed::Together`]). The same
//! mapping drives the filter that drops deleted rows and the primary-key index's new locations
//! (a key moves from `(old file, p)` to `(output, new position of p)`).
//!
//! When the rewrite splits rows by the current spec's partitions or puts them in the table's
//! sort order (`rewrite.rs`), the kept rows of one input are scattered over the outputs: each
//! lands where the layout put it, recorded row by row ([`Landed::Scattered`]).

use arrow_array::BooleanArray;

use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;

/// Walks one input file's rows batch by batch, placing each in the output.
pub(crate) struct Placer<'a> {
    deleted: Option<&'a DeletionVector>,
    /// Position in the input of the next row.
    next_old: u64,
    /// Position in the output of the next kept row.
    next_new: u64,
}

impl<'a> Placer<'a> {
    /// Places an input whose deletion vector is `deleted` from output position `start`.
    pub fn new(deleted: Option<&'a DeletionVector>, start: u64) -> Placer<'a> {
        Placer {
            deleted,
            next_old: 0,
            next_new: start,
        }
    }

    /// The output position of each of the next `rows` input rows (`None`: deleted, dropped).
    pub fn next_batch(&mut self, rows: usize) -> Vec<Option<u64>> {
        let mut out = Vec::with_capacity(rows);
        for _ in 0..rows {
            let old = self.next_old;
            self.next_old += 1;
            if self.deleted.is_some_and(|d| d.contains(old)) {
                out.push(None);
            } else {
                out.push(Some(self.next_new));
                self.next_new += 1;
            }
        }
        out
    }

    /// The output position after the last kept row so far (where the next input starts).
    pub fn end(&self) -> u64 {
        self.next_new
    }
}

/// Where the kept rows of one input landed, by their rank among its kept rows (the row at
/// position `p` of an input whose vector deleted `d` rows before `p` has rank `p - d`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Landed {
    /// In `output`, one after the other from position `start`.
    Together { output: String, start: u64 },
    /// Row of rank `n` in `outputs[at[n].0]` at position `at[n].1`.
    Scattered {
        outputs: Vec<String>,
        at: Vec<(u32, u32)>,
    },
}

impl Landed {
    /// The output and position of the kept row of rank `rank` (`None`: the input kept fewer).
    pub fn of(&self, rank: u64) -> Option<(&str, u64)> {
        match self {
            Landed::Together { output, start } => Some((output, start + rank)),
            Landed::Scattered { outputs, at } => {
                let &(file, position) = at.get(usize::try_from(rank).ok()?)?;
                let output = outputs.get(file as usize)?;
                Some((output, u64::from(position)))
            }
        }
    }
}

/// The filter keeping the placed rows of a batch.
pub(crate) fn keep_mask(placed: &[Option<u64>]) -> BooleanArray {
    placed.iter().map(|p| Some(p.is_some())).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kept_rows_follow_each_other_across_batches_and_inputs() {
        let dv = DeletionVector::from_positions([0, 3, 4]).unwrap();
        let mut first = Placer::new(Some(&dv), 0);
        assert_eq!(first.next_batch(3), vec![None, Some(0), Some(1)]);
        assert_eq!(first.next_batch(3), vec![None, None, Some(2)]);
        assert_eq!(first.end(), 3);
        // The next input of the same output starts where this one ended; no vector: all kept.
        let mut second = Placer::new(None, first.end());
        assert_eq!(second.next_batch(2), vec![Some(3), Some(4)]);
        assert_eq!(second.end(), 5);
    }

    #[test]
    fn a_scattered_input_lands_row_by_row() {
        let landed = Landed::Scattered {
            outputs: vec!["a".into(), "b".into()],
            at: vec![(1, 4), (0, 0), (1, 0)],
        };
        assert_eq!(landed.of(0), Some(("b", 4)));
        assert_eq!(landed.of(1), Some(("a", 0)));
        assert_eq!(landed.of(3), None);
        let together = Landed::Together {
            output: "c".into(),
            start: 5,
        };
        assert_eq!(together.of(2), Some(("c", 7)));
    }

    #[test]
    fn a_fully_deleted_input_places_nothing() {
        let dv = DeletionVector::from_positions([0, 1]).unwrap();
        let mut p = Placer::new(Some(&dv), 7);
        let placed = p.next_batch(2);
        assert_eq!(placed, vec![None, None]);
        assert_eq!(p.end(), 7);
        assert_eq!(keep_mask(&placed), BooleanArray::from(vec![false, false]));
        assert_eq!(
            keep_mask(&[Some(1), None]),
            BooleanArray::from(vec![true, false])
        );
    }
}
