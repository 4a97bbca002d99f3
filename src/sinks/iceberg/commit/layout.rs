//! The layout step: the plan's data files split by the table's current partition spec and their
//! rows put in its current sort order (`partitioning/`), read from the metadata this commit
//! builds on, so a spec or sort order another engine set takes effect here. It runs after the
//! locate step, since a partial update's partition source column may come from the lookup, and
//! before the file step, which writes each file with its [`Placement`]. Also where a v2 commit's
//! equality deletes go: under a spec without fields, so that they apply in every partition.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::{publish, RowDelta};
use crate::sinks::iceberg::files::writer::{self, Placement};
use crate::sinks::iceberg::partitioning::{split_plan, Layout};
use crate::sinks::iceberg::schema;
use crate::sinks::SinkError;

impl RowDelta<'_> {
    /// Splits the plan's data files by partition and orders their rows (`lookup`: the rows that
    /// complete partial updates); returns where each file of the plan, as split, sits.
    pub(super) fn lay_out(
        &mut self,
        lookup: Option<&RecordBatch>,
    ) -> Result<Vec<Placement>, SinkError> {
        let table = self.table().clone();
        let layout = Layout::of(self.base()).map_err(|e| SinkError::Data {
            table: table.clone(),
            detail: format!(
                "the table's partition spec {} or sort order {}: {e}",
                self.base().default_partition_spec_id(),
                self.base().default_sort_order_id()
            ),
        })?;
        let spec_id = layout.spec.spec_id();
        if layout.is_plain() {
            return Ok(vec![
                Placement::unpartitioned(spec_id);
                self.plan.files.len()
            ]);
        }
        let file_schema = schema::data_file_schema(self.base().current_schema())?;
        let mut arranged = Vec::with_capacity(self.plan.files.len());
        for f in &self.plan.files {
            let columns = writer::column_batch(
                self.input.changes,
                f,
                lookup,
                &file_schema,
                layout.columns(),
            )
            .map_err(self.arrow("gathering partition and sort columns"))?;
            arranged.push(layout.arrange(&columns).map_err(|e| SinkError::Data {
                table: table.clone(),
                detail: format!("partitioning rows: {e}"),
            })?);
        }
        let partitions =
            split_plan(&mut self.plan, arranged).map_err(|detail| SinkError::Data {
                table: table.clone(),
                detail: format!("splitting the plan by partition: {detail}"),
            })?;
        Ok(partitions
            .into_iter()
            .map(|partition| Placement {
                spec_id,
                partition,
                sort_order_id: layout.sort_order_id,
            })
            .collect())
    }

    /// The spec a v2 commit's equality deletes are written under: the default one when it has no
    /// field, else a spec without fields, added to the metadata this commit publishes when the
    /// table has none (`publish::with_unpartitioned_spec`). `None` when the commit writes none.
    pub(super) fn equality_spec(&mut self) -> Result<Option<i32>, SinkError> {
        if self.v3 || self.plan.equality_deletes.is_empty() {
            return Ok(None);
        }
        let default = self.base().default_partition_spec();
        if default.fields().is_empty() {
            return Ok(Some(default.spec_id()));
        }
        let (with, spec_id) = publish::with_unpartitioned_spec(self.table(), &self.base)?;
        if with.metadata.partition_specs_iter().len() != self.base().partition_specs_iter().len() {
            tracing::info!(table = %self.table(), spec_id, "adding an unpartitioned partition spec (not the default) for equality deletes that apply in every partition");
            self.base = Arc::new(with);
        }
        Ok(Some(spec_id))
    }
}
