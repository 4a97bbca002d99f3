//! The merge of sorted runs (pure): encoded data files in, one sorted run out, a batch at a
//! time. Per key the row with the highest sequence number wins, as Paimon's `deduplicate` merge
//! engine decides; `pick.rs` chose the runs and whether deletes may be dropped, `worker.rs` reads
//! the files and puts the result.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, Int8Type};
use arrow_array::{Int64Array, Int8Array, RecordBatch};
use arrow_row::{RowConverter, Rows};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::sinks::lsm::schema::{FileSchemas, KIND_DELETE};
use crate::sinks::lsm::writer::{FileError, RunWriter};

/// Rows per output batch of [`merge_runs`].
const MERGE_BATCH_ROWS: usize = 8192;

/// One input run being merged: its reader, the current batch and position.
struct Cursor {
    reader: ParquetRecordBatchReader,
    /// The run's files after the one being read, in key order.
    rest: std::vec::IntoIter<Bytes>,
    batch: RecordBatch,
    keys: Rows,
    seq: Int64Array,
    kind: Int8Array,
    pos: usize,
    /// Index of `batch` in the merge's held batches.
    held: usize,
    done: bool,
}

impl Cursor {
    /// Moves to the next non-empty batch; `done` at the end.
    fn next_batch(&mut self, conv: &RowConverter, schemas: &FileSchemas) -> Result<(), FileError> {
        let nk = schemas.key.len();
        loop {
            let Some(b) = self.reader.next() else {
                match self.rest.next() {
                    Some(data) => {
                        self.reader = open(data)?;
                        continue;
                    }
                    None => {
                        self.done = true;
                        return Ok(());
                    }
                }
            };
            let b = b?;
            if b.num_rows() == 0 {
                continue;
            }
            let b = crate::sinks::lsm::writer::to_table_shape(&b, schemas)?;
            self.keys = conv.convert_columns(b.columns().get(..nk).unwrap_or_default())?;
            let (Some(seq), Some(kind)) = (
                b.column(nk).as_primitive_opt::<Int64Type>(),
                b.column(nk + 1).as_primitive_opt::<Int8Type>(),
            ) else {
                return Err(FileError::Shape(
                    "_SEQUENCE_NUMBER or _VALUE_KIND has the wrong type".into(),
                ));
            };
            self.seq = seq.clone();
            self.kind = kind.clone();
            self.batch = b;
            self.pos = 0;
            return Ok(());
        }
    }
}

fn open(data: Bytes) -> Result<ParquetRecordBatchReader, FileError> {
    Ok(ParquetRecordBatchReaderBuilder::try_new(data)?
        .with_batch_size(MERGE_BATCH_ROWS)
        .build()?)
}

/// Merges sorted runs (each a list of encoded data files in key order, together sorted with one
/// row per key, as `placement::chains` groups them) into `out`, a batch at a time: per key the row with
/// the highest sequence number wins (the deduplicate merge engine), deletes dropped when
/// `drop_deletes`. Memory: the encoded inputs plus one decoded batch per run, never a whole
/// decoded run.
pub fn merge_runs(
    inputs: Vec<Vec<Bytes>>,
    schemas: &FileSchemas,
    drop_deletes: bool,
    out: &mut RunWriter,
) -> Result<(), FileError> {
    let conv = schemas.key_converter()?;
    let mut cursors = Vec::with_capacity(inputs.len());
    for run in inputs {
        let mut rest = run.into_iter();
        let Some(data) = rest.next() else {
            continue;
        };
        let mut c = Cursor {
            reader: open(data)?,
            rest,
            batch: RecordBatch::new_empty(schemas.file.clone()),
            keys: conv.empty_rows(0, 0),
            seq: Int64Array::from(Vec::<i64>::new()),
            kind: Int8Array::from(Vec::<i8>::new()),
            pos: 0,
            held: 0,
            done: false,
        };
        c.next_batch(&conv, schemas)?;
        if !c.done {
            cursors.push(c);
        }
    }
    let mut held: Vec<RecordBatch> = Vec::new();
    for c in &mut cursors {
        c.held = held.len();
        held.push(c.batch.clone());
    }
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(MERGE_BATCH_ROWS);
    let mut same: Vec<usize> = Vec::with_capacity(cursors.len());
    loop {
        // The smallest key; among equal keys the highest sequence number.
        let mut best: Option<usize> = None;
        for (i, c) in cursors.iter().enumerate() {
            if c.done {
                continue;
            }
            let Some(b) = best.and_then(|b| cursors.get(b)) else {
                best = Some(i);
                continue;
            };
            let ord = c.keys.row(c.pos).cmp(&b.keys.row(b.pos));
            if ord.is_lt() || (ord.is_eq() && c.seq.value(c.pos) > b.seq.value(b.pos)) {
                best = Some(i);
            }
        }
        let Some(w) = best else { break };
        let Some(winner) = cursors.get(w) else { break };
        if !(drop_deletes && winner.kind.value(winner.pos) == KIND_DELETE) {
            picks.push((winner.held, winner.pos));
        }
        // Every cursor at the winning key moves on (older versions are dropped).
        same.clear();
        for (i, c) in cursors.iter().enumerate() {
            if !c.done && c.keys.row(c.pos) == winner.keys.row(winner.pos) {
                same.push(i);
            }
        }
        let mut reloaded = false;
        for &i in &same {
            let Some(c) = cursors.get_mut(i) else {
                continue;
            };
            c.pos += 1;
            if c.pos >= c.batch.num_rows() {
                c.next_batch(&conv, schemas)?;
                if !c.done {
                    c.held = held.len();
                    held.push(c.batch.clone());
                    reloaded = true;
                }
            }
        }
        if picks.len() >= MERGE_BATCH_ROWS || (reloaded && held.len() > 4 * cursors.len()) {
            flush(&mut picks, &mut held, &mut cursors, schemas, out)?;
        }
    }
    flush(&mut picks, &mut held, &mut cursors, schemas, out)
}

/// Writes the picked rows and keeps only the batches the cursors still read.
fn flush(
    picks: &mut Vec<(usize, usize)>,
    held: &mut Vec<RecordBatch>,
    cursors: &mut [Cursor],
    schemas: &FileSchemas,
    out: &mut RunWriter,
) -> Result<(), FileError> {
    if !picks.is_empty() {
        let mut cols = Vec::with_capacity(schemas.file.fields().len());
        for c in 0..schemas.file.fields().len() {
            let arrays: Vec<&dyn arrow_array::Array> =
                held.iter().map(|b| b.column(c).as_ref()).collect();
            cols.push(arrow_select::interleave::interleave(&arrays, picks)?);
        }
        out.write(&RecordBatch::try_new(schemas.file.clone(), cols)?)?;
        picks.clear();
    }
    held.clear();
    for c in cursors.iter_mut().filter(|c| !c.done) {
        c.held = held.len();
        held.push(c.batch.clone());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(schemas: &FileSchemas, keys: &[i64], seq_base: i64, delete_every: i64) -> Bytes {
        use arrow_array::ArrayRef;
        use std::sync::Arc;
        let k: ArrayRef = Arc::new(Int64Array::from(keys.to_vec()));
        let seq: ArrayRef = Arc::new(Int64Array::from_iter_values(
            keys.iter().map(|k| seq_base + k),
        ));
        let kind: ArrayRef = Arc::new(Int8Array::from_iter_values(keys.iter().map(|k| {
            if delete_every > 0 && k % delete_every == 0 {
                KIND_DELETE
            } else {
                0
            }
        })));
        let v: ArrayRef = Arc::new(Int64Array::from_iter_values(keys.iter().map(|_| seq_base)));
        let batch = schemas
            .batch(vec![k.clone()], seq, kind, vec![k, v])
            .unwrap();
        let mut w = RunWriter::new(schemas).unwrap();
        w.write(&batch).unwrap();
        Bytes::from(w.finish().unwrap().0)
    }

    #[test]
    fn merge_runs_keeps_the_newest_version_across_batches() {
        use crate::changelog::{Column, TableId, TableSchema};
        use arrow_schema::DataType;
        let col = |n: &str| Column {
            name: n.into(),
            data_type: DataType::Int64,
            nullable: true,
            source_type: String::new(),
            initial_default: None,
            former_names: Vec::new(),
        };
        let schemas = FileSchemas::new(&TableSchema {
            id: TableId::new("p", "t"),
            columns: vec![col("id"), col("v")],
            primary_key: vec![0],
        });
        let old: Vec<i64> = (0..20_000).collect();
        let new: Vec<i64> = (0..20_000).filter(|k| k % 2 == 0).collect();
        // The old run in two files (a chained bottom run), the new one in one.
        let (low, high) = old.split_at(7_000);
        let inputs = vec![
            vec![run(&schemas, &new, 100_000, 4)],
            vec![run(&schemas, low, 0, 0), run(&schemas, high, 0, 0)],
        ];
        let mut out = RunWriter::new(&schemas).unwrap();
        merge_runs(inputs, &schemas, true, &mut out).unwrap();
        let (bytes, stats) = out.finish().unwrap();
        assert_eq!(stats.rows(), 15_000, "odd keys, and even keys not deleted");
        let batch = crate::sinks::lsm::writer::decode(Bytes::from(bytes), &schemas).unwrap();
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let v = batch.column(4).as_primitive::<Int64Type>();
        assert!(
            ids.values().windows(2).all(|w| w[0] < w[1]),
            "sorted, unique"
        );
        for i in 0..batch.num_rows() {
            let want = if ids.value(i) % 2 == 0 { 100_000 } else { 0 };
            assert_eq!(v.value(i), want, "key {}", ids.value(i));
            assert!(ids.value(i) % 4 != 0);
        }
        let meta = stats.describe("f".into(), 1, 5, 1).unwrap();
        assert_eq!((meta.min_sequence, meta.max_sequence), (1, 119_998));
    }
}
