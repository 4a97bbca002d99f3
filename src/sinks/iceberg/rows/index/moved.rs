//! A compaction's moved keys, written as index runs before its commit and installed by it
//! (`sinks/pk_index/prepared.rs` has the protocol and why): the index side of
//! `maintenance/compaction`'s step between the rewrite and the commit.
//!
//! [`TableIndex::reserve_rewrite`] (under the table's lock) reserves the runs;
//! [`RewriteRuns::write`] (without it) encodes the outputs' keys and writes them;
//! [`TableIndex::record_prepared_rewrite`] (under the lock, after the compaction's commit)
//! installs them. The rows a streaming commit deleted while the rewrite ran are deleted again in
//! the outputs (`redelete.rs`); their keys already point at their newer rows, or nowhere, so
//! those keys' current entries are read before the install and put back on top of it.

use arrow_array::{RecordBatch, UInt32Array};
use arrow_row::RowConverter;
use arrow_schema::SchemaRef;

use super::{index_error, RewrittenOutput, TableIndex};
use crate::changelog::TableId;
use crate::sinks::iceberg::files::decode::project;
use crate::sinks::iceberg::rows::row_converter;
use crate::sinks::pk_index::{IndexChange, IndexOp, InstallError, PreparedRuns, Reservation};
use crate::sinks::SinkError;

/// Runs reserved for one rewrite's outputs, to write without the table's lock.
pub(crate) struct RewriteRuns {
    reservation: Reservation,
    codec: RowConverter,
    keys_schema: SchemaRef,
    table: TableId,
}

impl TableIndex {
    /// Reserves the runs of a rewrite of `rows` rows into `outputs` (their paths, in the order
    /// [`RewriteRuns::write`] gets their keys).
    pub async fn reserve_rewrite(
        &mut self,
        outputs: &[&str],
        rows: u64,
    ) -> Result<RewriteRuns, SinkError> {
        let reservation = self
            .index
            .reserve_runs(outputs, rows)
            .await
            .map_err(|e| index_error(&self.table, e))?;
        let codec = row_converter(&self.keys_schema).map_err(|source| SinkError::Arrow {
            context: format!("encoding the keys of {}", self.table),
            source,
        })?;
        Ok(RewriteRuns {
            reservation,
            codec,
            keys_schema: self.keys_schema.clone(),
            table: self.table.clone(),
        })
    }

    /// Records committed compaction snapshot `snapshot_id` as [`record_rewrite`](Self::record_rewrite)
    /// does, with the moved keys' runs `prepared` written beforehand: installs them and puts the
    /// current entries of the keys whose rows `outputs` delete back on top. Runs this index did
    /// not reserve (it was reopened or cleared since) are deleted and the keys moved the old way.
    pub async fn record_prepared_rewrite(
        &mut self,
        removed: &[&str],
        outputs: &[RewrittenOutput<'_>],
        prepared: PreparedRuns,
        snapshot_id: i64,
    ) -> Result<(), SinkError> {
        if !self.index.owns(&prepared) {
            prepared.discard().await;
            return self.record_rewrite(removed, outputs, snapshot_id).await;
        }
        let deleted = self.deleted_keys(outputs)?;
        let wanted: Vec<&[u8]> = deleted.iter().map(|k| k.as_slice()).collect();
        let current = self
            .index
            .get_many(&wanted)
            .await
            .map_err(|e| index_error(&self.table, e))?;
        match self.index.install_prepared(prepared).await {
            Ok(()) => {}
            Err(InstallError::NotOurs(prepared)) => {
                prepared.discard().await;
                return self.record_rewrite(removed, outputs, snapshot_id).await;
            }
            Err(InstallError::Index(e)) => return Err(index_error(&self.table, e)),
        }
        self.index
            .apply(wanted.iter().zip(current).map(|(key, now)| IndexChange {
                key,
                op: now.map_or(IndexOp::Remove, IndexOp::Upsert),
            }))
            .map_err(|e| index_error(&self.table, e))?;
        self.index.remove_files(removed.iter().copied());
        self.index
            .persist(snapshot_id)
            .await
            .map_err(|e| index_error(&self.table, e))
    }

    /// Forgets `files` (outputs of a compaction that did not commit, interned by
    /// [`reserve_rewrite`](Self::reserve_rewrite)).
    pub fn forget_files(&mut self, files: &[&str]) {
        self.index.remove_files(files.iter().copied());
    }

    /// The encoded keys of the output rows the compaction's snapshot deletes.
    fn deleted_keys(&self, outputs: &[RewrittenOutput<'_>]) -> Result<Vec<Vec<u8>>, SinkError> {
        let mut keys = Vec::new();
        for output in outputs {
            let Some(deleted) = output.deleted else {
                continue;
            };
            let mut offset = 0u64;
            for batch in output.keys {
                let end = offset + batch.num_rows() as u64;
                let rows: Vec<u32> = deleted
                    .iter()
                    .skip_while(|&p| p < offset)
                    .take_while(|&p| p < end)
                    .filter_map(|p| u32::try_from(p - offset).ok())
                    .collect();
                offset = end;
                if rows.is_empty() {
                    continue;
                }
                let arrow = |source| SinkError::Arrow {
                    context: format!("encoding the deleted keys of {}", output.path),
                    source,
                };
                let taken = arrow_select::take::take_record_batch(batch, &UInt32Array::from(rows))
                    .map_err(arrow)?;
                let cols = project(&taken, &self.keys_schema).map_err(arrow)?;
                let encoded = self.codec.convert_columns(&cols).map_err(arrow)?;
                keys.extend(encoded.iter().map(|k| k.data().to_vec()));
            }
        }
        Ok(keys)
    }
}

impl RewriteRuns {
    /// Writes the runs: each output's keys (`outputs[i]` holds the key columns of the `i`-th
    /// reserved output's rows, in position order). A failure deletes what was written.
    pub async fn write(mut self, outputs: &[&[RecordBatch]]) -> Result<PreparedRuns, SinkError> {
        match self.add_outputs(outputs).await {
            Ok(()) => self
                .reservation
                .finish()
                .await
                .map_err(|e| index_error(&self.table, e)),
            Err(e) => {
                self.reservation.discard().await;
                Err(e)
            }
        }
    }

    async fn add_outputs(&mut self, outputs: &[&[RecordBatch]]) -> Result<(), SinkError> {
        for (file, batches) in outputs.iter().enumerate() {
            let mut position = 0u64;
            for batch in batches.iter() {
                let arrow = |source| SinkError::Arrow {
                    context: format!("encoding the rewritten keys of {}", self.table),
                    source,
                };
                let cols = project(batch, &self.keys_schema).map_err(arrow)?;
                let keys = self.codec.convert_columns(&cols).map_err(arrow)?;
                for key in keys.iter() {
                    self.reservation
                        .add(file, key.data(), position)
                        .await
                        .map_err(|e| index_error(&self.table, e))?;
                    position += 1;
                }
            }
        }
        Ok(())
    }
}
