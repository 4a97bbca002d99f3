//! The file steps: a commit's data files (`files/writer.rs` gathers and encodes them), then its
//! deletes: on v3 one deletion vector per touched data file, merged with that file's live
//! vector, each in its own Puffin file (`deletes/`); on v2 one position delete file (rows this
//! commit superseded, and rows of earlier snapshots a keyless multiset table's deletes remove)
//! and one equality delete file (keys of earlier snapshots).

use std::collections::{BTreeMap, HashSet};

use arrow_array::RecordBatch;
use iceberg::spec::DataContentType;

use super::{DataFiles, Deletes, Found, RowDelta};
use crate::sinks::iceberg::deletes::commit_vectors::{self, LiveDvs, NewDvs};
use crate::sinks::iceberg::files::writer;
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::rows::locator::RowAddress;
use crate::sinks::iceberg::schema;
use crate::sinks::SinkError;

impl RowDelta<'_> {
    /// Writes the plan's data files, completing partial rows from `lookup`.
    pub(super) async fn write_data(
        &self,
        lookup: Option<&RecordBatch>,
    ) -> Result<DataFiles, SinkError> {
        let file_schema = schema::data_file_schema(self.base().current_schema())?;
        let mut files = Vec::with_capacity(self.plan.files.len());
        let mut paths = Vec::with_capacity(self.plan.files.len());
        for (i, f) in self.plan.files.iter().enumerate() {
            let path = self.names.data_file(i);
            let batches = writer::data_batches(self.input.changes, f, lookup, &file_schema)
                .map_err(self.arrow("gathering data rows"))?;
            let file = writer::write_file(
                self.target.warehouse,
                self.table(),
                path.clone(),
                batches,
                DataContentType::Data,
                None,
            )
            .await?;
            files.push(file);
            paths.push(path);
        }
        Ok(DataFiles {
            files,
            paths,
            schema: file_schema,
        })
    }

    /// Writes the deletes: vectors on v3, delete files on v2.
    pub(super) async fn write_deletes(
        &self,
        live: &LiveState,
        found: &Found,
        data: &DataFiles,
    ) -> Result<Deletes, SinkError> {
        if self.v3 {
            self.write_vectors(&live.dvs, &found.located, &data.paths)
                .await
        } else {
            self.write_v2_deletes(data, &found.located).await
        }
    }

    /// v3: marks the `located` rows of earlier snapshots and the superseded rows of this
    /// commit's files (`paths`) deleted, merges each vector with the live one it replaces and
    /// writes the vectors.
    async fn write_vectors(
        &self,
        live_dvs: &LiveDvs,
        located: &[Option<RowAddress>],
        paths: &[String],
    ) -> Result<Deletes, SinkError> {
        let table = self.table();
        let mut new_dvs = NewDvs::default();
        for addr in located.iter().flatten() {
            new_dvs.delete(table, &addr.file, addr.pos, live_dvs)?;
        }
        for &(f, pos) in &self.plan.position_deletes {
            if let Some(path) = paths.get(f as usize) {
                new_dvs.delete(table, path, u64::from(pos), live_dvs)?;
            }
        }
        new_dvs.merge_live(live_dvs);
        let replaced: HashSet<String> = new_dvs
            .dvs
            .keys()
            .filter(|f| live_dvs.contains_key(*f))
            .cloned()
            .collect();
        // One Puffin file per vector. With several blobs in one Puffin file (as Iceberg-Java
        // writes, and as the spec allows: each entry names its blob by `content_offset` and
        // `content_size_in_bytes`), DuckDB 1.5.5 applies a neighbouring blob to the wrong
        // data file after some commits (seen again in tests/s3/crash.rs and s3/standby.rs; Spark
        // and pyiceberg read the same tables right). One blob per file sidesteps it at the
        // cost of more small files.
        let mut files = Vec::new();
        for (i, (file, vector)) in new_dvs.dvs.iter().enumerate() {
            let path = self.names.vector_file(i);
            let one = BTreeMap::from([(file.clone(), vector.clone())]);
            files.extend(
                commit_vectors::write_puffin(self.target.warehouse, table, &path, &one).await?,
            );
        }
        Ok(Deletes {
            files,
            deleted_rows: new_dvs.deleted,
            replaced,
            vectors: new_dvs.dvs,
        })
    }

    /// v2: the position delete file (rows this commit superseded, and the `located` rows of
    /// earlier snapshots a keyless multiset table's deletes remove) and the equality delete file.
    async fn write_v2_deletes(
        &self,
        data: &DataFiles,
        located: &[Option<RowAddress>],
    ) -> Result<Deletes, SinkError> {
        let plan = &self.plan;
        let files = writer::write_v2_deletes(
            self.target.warehouse,
            &writer::Planned {
                schema: self.input.schema,
                changes: self.input.changes,
                plan,
            },
            &data.paths,
            located,
            &data.schema,
            &writer::V2DeletePaths {
                position: self.names.position_deletes(),
                equality: self.names.equality_deletes(),
            },
        )
        .await?;
        Ok(Deletes {
            files,
            deleted_rows: (plan.position_deletes.len()
                + located.iter().flatten().count()
                + plan.equality_deletes.len()) as u64,
            ..Deletes::default()
        })
    }
}
