//! The locate step: what a commit needs from the rows of earlier snapshots. Partial updates
//! (absent columns, e.g. unchanged TOAST values) are completed from the current rows, read
//! through the primary-key index on v3 (`lookup::fetch`) or by scanning the key columns of the
//! live files on v2 (`lookup::lookup`); inside an upsert window a partial update of a row the
//! table no longer holds is dropped (`rows/window.rs`). On v3 the rows this commit deletes from
//! earlier snapshots are located through the index, for their deletion vectors; the rows a
//! keyless multiset table's deletes remove are located by content (`rows/multiset.rs`), on v3 for
//! deletion vectors and on v2 for position deletes.

use arrow_array::RecordBatch;

use super::{Cached, Found, RowDelta};
use crate::changelog::TableChanges;
use crate::sinks::iceberg::files::writer;
use crate::sinks::iceberg::rows::locator::{IndexLocator, RowLocator};
use crate::sinks::iceberg::rows::{lookup, multiset, window};
use crate::sinks::iceberg::schema::Projection;
use crate::sinks::SinkError;

impl RowDelta<'_> {
    /// Finds the rows to complete and (v3) where the rows to delete are; may drop partial
    /// updates from the plan.
    pub(super) async fn locate(&mut self, cached: &Cached<'_>) -> Result<Found, SinkError> {
        let lookup = match self.lookup_rows(cached).await? {
            Some((rows, missing)) if missing.contains(&true) => {
                self.drop_unfillable(&missing)?;
                Some(rows)
            }
            other => other.map(|(rows, _)| rows),
        };
        let removed_keys = self.removed_keys(cached)?;
        let located = match (cached.index.get(), &removed_keys) {
            (Some(index), Some(keys)) => {
                let (files, dvs) = (&cached.live.files, &cached.live.dvs);
                IndexLocator::new(index, files, dvs).locate(keys).await?
            }
            _ => Vec::new(),
        };
        // A keyless multiset table has no index: its deleted rows are found by content.
        let located = if self.plan.row_deletes.is_empty() {
            located
        } else {
            let (files, dvs) = (&cached.live.files, &cached.live.dvs);
            let (schema, changes) = (self.input.schema, self.input.changes);
            multiset::locate(
                self.target.warehouse,
                schema,
                files,
                dvs,
                changes,
                &self.plan.row_deletes,
                &self.projection(),
            )
            .await?
            .into_iter()
            .map(Some)
            .collect()
        };
        Ok(Found {
            lookup,
            removed_keys,
            located,
        })
    }

    /// The current rows of the plan's lookup keys and which keys have none (`None`: no lookups).
    async fn lookup_rows(
        &self,
        cached: &Cached<'_>,
    ) -> Result<Option<(RecordBatch, Vec<bool>)>, SinkError> {
        let (schema, changes) = (self.input.schema, self.input.changes);
        let keys = &self.plan.lookups;
        if keys.is_empty() {
            return Ok(None);
        }
        let warehouse = self.target.warehouse;
        let (files, dvs) = (&cached.live.files, &cached.live.dvs);
        let droppable = window::droppable(changes, keys);
        let found = match cached.index.get() {
            Some(index) => {
                let keys_schema = TableChanges::keys_schema(schema);
                let keys = writer::key_batch(changes, keys, &schema.primary_key, &keys_schema)
                    .map_err(self.arrow("gathering lookup keys"))?;
                let at = IndexLocator::new(index, files, dvs).locate(&keys).await?;
                lookup::fetch(
                    warehouse,
                    schema,
                    &keys,
                    &at,
                    &droppable,
                    &self.projection(),
                )
                .await?
            }
            None => {
                let projection = self.projection();
                lookup::lookup(
                    warehouse,
                    schema,
                    cached.live,
                    changes,
                    keys,
                    &droppable,
                    &projection,
                )
                .await?
            }
        };
        Ok(Some(found))
    }

    /// How rows of earlier files read under the schema this commit writes: renamed columns by
    /// field id, columns added since with their initial default.
    fn projection(&self) -> Projection {
        Projection::of(self.base.metadata.current_schema())
    }

    /// Drops from the plan the partial updates whose lookup row is `missing` (allowed only inside
    /// an upsert window; a key change among them is an error).
    fn drop_unfillable(&mut self, missing: &[bool]) -> Result<(), SinkError> {
        let (schema, changes) = (self.input.schema, self.input.changes);
        let dropped = window::drop_unfillable(&mut self.plan, changes, missing)
            .map_err(|row| window::key_change_error(schema, changes, row))?;
        if dropped > 0 {
            tracing::info!(table = %schema.id, rows = dropped, "dropped partial updates of rows deleted later inside the upsert window");
        }
        Ok(())
    }

    /// v3 (the index is open): the keys whose row in an earlier snapshot this commit removes.
    fn removed_keys(&self, cached: &Cached<'_>) -> Result<Option<RecordBatch>, SinkError> {
        let keys = &self.plan.equality_deletes;
        if cached.index.get().is_none() || keys.is_empty() {
            return Ok(None);
        }
        let schema = self.input.schema;
        let keys_schema = TableChanges::keys_schema(schema);
        writer::key_batch(self.input.changes, keys, &schema.primary_key, &keys_schema)
            .map(Some)
            .map_err(self.arrow("gathering keys to locate"))
    }
}
