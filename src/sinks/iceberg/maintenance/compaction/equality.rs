//! The deletes a rewrite of a format-v2 (equality-delete) table applies, and the delete files it
//! can then drop.
//!
//! Iceberg spec, "Scan Planning": a position delete applies to a data file when the file's data
//! sequence number is ≤ the delete's; an equality delete applies when the file's is strictly <
//! the delete's. A rewrite writes the kept rows at the data sequence number of the snapshot it
//! chose on (its starting sequence number, as Iceberg-Java's `use-starting-sequence-number`
//! does), at or above every delete it read, so it must apply all of them to the rows it copies:
//! none of them reaches the copies afterwards. Equality deletes committed while it ran have
//! higher sequence numbers and do reach them; a position delete committed meanwhile naming one
//! of its inputs would not, and makes the rewrite stale (`inputs_deleted_since`). Then:
//! - a position delete file whose referenced data files were all rewritten applies to nothing;
//! - an equality delete file of sequence S applies to nothing once no live data file has a
//!   sequence number below S (outputs have the starting one, at or above S).
//!
//! Both are dropped with the rewrite (what Iceberg-Java's `RewriteDataFiles` leaves to
//! `rewrite_position_delete_files` and `remove-dangling-deletes`). The data files a rewrite
//! leaves in place count as rewritten here when their deleted rows are converted to positions in
//! the same commit (`convert.rs`). A table's delete files are all
//! read for this, every cycle that rewrites: cdcd's tables carry one small position and one
//! equality delete file per commit, and each rewrite removes those it made useless.

use std::collections::{HashMap, HashSet};

use arrow_array::RecordBatch;
use arrow_row::RowConverter;
use arrow_schema::{ArrowError, Schema as ArrowSchema, SchemaRef};
use iceberg::spec::{DataFileFormat, Schema};

use crate::changelog::TableId;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::deletes::position_deletes::read_pairs;
use crate::sinks::iceberg::files::decode::{decode, project};
use crate::sinks::iceberg::files::manifest::read;
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::rows::row_converter;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The deletes of a v2 table as a rewrite of `chosen` files needs them.
#[derive(Default)]
pub(crate) struct V2Deletes {
    /// Per chosen data file: (sequence of the delete file, position) of its position deletes.
    positions: HashMap<String, Vec<(i64, u64)>>,
    /// Encoded key → the highest sequence number of an equality delete naming it.
    keys: HashMap<Vec<u8>, i64>,
    /// The equality key columns (as the table's data files hold them) and their encoder.
    key_schema: Option<(SchemaRef, RowConverter)>,
    /// Position delete files referencing only chosen data files.
    only_chosen: HashSet<String>,
}

impl V2Deletes {
    /// Reads every position and equality delete file of `live` (a v2 table whose current schema
    /// is `schema` and data file schema `file_schema`) for a rewrite of `chosen`.
    pub async fn load(
        warehouse: &Warehouse,
        table: &TableId,
        live: &LiveState,
        schema: &Schema,
        file_schema: &SchemaRef,
        chosen: &HashSet<&str>,
    ) -> Result<V2Deletes, SinkError> {
        let mut out = V2Deletes::default();
        for f in &live.files.position_deletes {
            let path = f.file.file_path();
            if f.file.file_format() == DataFileFormat::Puffin {
                return Err(SinkError::Data {
                    table: table.clone(),
                    detail: format!("{path}: a deletion vector in a format v2 table"),
                });
            }
            let mut only_chosen = true;
            for (file, at) in read_pairs(warehouse, path).await? {
                if chosen.contains(file.as_str()) {
                    out.positions
                        .entry(file)
                        .or_default()
                        .push((f.sequence, at));
                } else {
                    only_chosen = false;
                }
            }
            if only_chosen {
                out.only_chosen.insert(path.to_owned());
            }
        }
        for f in &live.files.equality_deletes {
            let path = f.file.file_path();
            if out.key_schema.is_none() {
                out.key_schema = Some(key_schema(table, schema, file_schema, f)?);
            }
            let Some((keys_schema, codec)) = &out.key_schema else {
                continue;
            };
            let arrow = |source: ArrowError| SinkError::Arrow {
                context: format!("reading the keys of {path}"),
                source,
            };
            for batch in decode(&read(warehouse, path).await?, path, None)? {
                let cols = project(&batch, keys_schema).map_err(arrow)?;
                let rows = codec.convert_columns(&cols).map_err(arrow)?;
                for r in rows.iter() {
                    let seq = out.keys.entry(r.data().to_vec()).or_insert(f.sequence);
                    *seq = (*seq).max(f.sequence);
                }
            }
        }
        Ok(out)
    }

    /// The equality key columns, as the table's data files name them (empty: no equality
    /// delete is live).
    pub fn key_names(&self) -> Vec<String> {
        self.key_schema
            .as_ref()
            .map(|(s, _)| s.fields().iter().map(|f| f.name().clone()).collect())
            .unwrap_or_default()
    }

    /// The rows of data file `path` (data sequence number `sequence`, rows `batches`: at least
    /// the key columns) the table's deletes delete, as a vector (`None`: none).
    pub fn vector(
        &self,
        path: &str,
        sequence: i64,
        batches: &[RecordBatch],
    ) -> Result<Option<DeletionVector>, SinkError> {
        let mut dv = DeletionVector::new();
        let corrupt = |e: crate::sinks::iceberg::deletes::deletion_vector::DeletionVectorError| {
            SinkError::Corrupt {
                path: path.to_owned(),
                detail: format!("a deleted position: {e}"),
            }
        };
        for &(seq, pos) in self.positions.get(path).into_iter().flatten() {
            if seq >= sequence {
                dv.insert(pos).map_err(corrupt)?;
            }
        }
        if let (Some((keys_schema, codec)), false) = (&self.key_schema, self.keys.is_empty()) {
            let arrow = |source: ArrowError| SinkError::Arrow {
                context: format!("encoding the keys of {path}"),
                source,
            };
            let mut offset = 0u64;
            for batch in batches {
                let cols = project(batch, keys_schema).map_err(arrow)?;
                let rows = codec.convert_columns(&cols).map_err(arrow)?;
                for (r, row) in rows.iter().enumerate() {
                    if self.keys.get(row.data()).is_some_and(|&s| s > sequence) {
                        dv.insert(offset + r as u64).map_err(corrupt)?;
                    }
                }
                offset += batch.num_rows() as u64;
            }
        }
        Ok((!dv.is_empty()).then_some(dv))
    }

    /// The delete files the rewrite of `removed` makes useless (see the module doc).
    pub fn droppable(&self, live: &LiveState, removed: &HashSet<&str>) -> HashSet<String> {
        let remaining: Vec<i64> = live
            .files
            .data
            .iter()
            .filter(|f| !removed.contains(f.file.file_path()))
            .map(|f| f.sequence)
            .collect();
        let equality: Vec<(String, i64)> = live
            .files
            .equality_deletes
            .iter()
            .map(|f| (f.file.file_path().to_owned(), f.sequence))
            .collect();
        let mut out = dangling_equality(&equality, &remaining);
        out.extend(self.only_chosen.iter().cloned());
        out
    }
}

/// Whether a position delete file of `live` committed after data sequence number `since`
/// deletes a row of one of `inputs`: such a delete, committed while a rewrite of `inputs` ran,
/// would not reach the rewritten rows (cdcd's keyed tables never write one: their position
/// deletes name rows of their own commit; a keyless table's can).
pub(crate) async fn inputs_deleted_since(
    warehouse: &Warehouse,
    live: &LiveState,
    since: i64,
    inputs: &HashSet<&str>,
) -> Result<bool, SinkError> {
    // A file naming its one data file (`referenced_data_file`) is answered without reading it.
    let may_hit = |f: &&crate::sinks::iceberg::files::manifest::LiveFile| {
        f.sequence > since
            && f.file
                .referenced_data_file()
                .is_none_or(|r| inputs.contains(r.as_str()))
    };
    for f in live.files.position_deletes.iter().filter(may_hit) {
        let deleted = read_pairs(warehouse, f.file.file_path()).await?;
        if deleted
            .iter()
            .any(|(file, _)| inputs.contains(file.as_str()))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The equality delete files (path, sequence) that apply to none of the data files whose
/// sequence numbers are `remaining`: pure.
pub(crate) fn dangling_equality(equality: &[(String, i64)], remaining: &[i64]) -> HashSet<String> {
    let oldest = remaining.iter().copied().min();
    equality
        .iter()
        .filter(|(_, s)| oldest.is_none_or(|o| o >= *s))
        .map(|(p, _)| p.clone())
        .collect()
}

/// The key columns `f`'s equality ids name, typed as the table's data files hold them.
fn key_schema(
    table: &TableId,
    schema: &Schema,
    file_schema: &SchemaRef,
    f: &crate::sinks::iceberg::files::manifest::LiveFile,
) -> Result<(SchemaRef, RowConverter), SinkError> {
    let bad = |detail: String| SinkError::Data {
        table: table.clone(),
        detail: format!("compaction skipped: {detail}"),
    };
    let ids = f.file.equality_ids().unwrap_or_default();
    if ids.is_empty() {
        return Err(bad(format!("{} has no equality ids", f.file.file_path())));
    }
    let mut fields = Vec::with_capacity(ids.len());
    for id in ids {
        let name = schema
            .name_by_field_id(id)
            .ok_or_else(|| bad(format!("equality id {id} is not in the schema")))?;
        let field = file_schema
            .field_with_name(name)
            .map_err(|e| bad(e.to_string()))?;
        fields.push(field.clone());
    }
    let keys = std::sync::Arc::new(ArrowSchema::new(fields));
    let codec = row_converter(&keys).map_err(|e| bad(e.to_string()))?;
    Ok((keys, codec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_equality_delete_dangles_once_no_older_data_file_remains() {
        let eq = [("e3".to_owned(), 3), ("e5".to_owned(), 5)];
        // A data file of sequence 4 remains: e5 still applies to it, e3 does not (4 ≥ 3).
        assert_eq!(
            dangling_equality(&eq, &[4, 7]),
            HashSet::from(["e3".to_owned()])
        );
        // Same sequence: an equality delete does not apply to its own commit's files.
        assert_eq!(dangling_equality(&eq, &[5]).len(), 2);
        assert!(dangling_equality(&eq, &[2]).is_empty());
        assert_eq!(dangling_equality(&eq, &[]).len(), 2);
    }
}
