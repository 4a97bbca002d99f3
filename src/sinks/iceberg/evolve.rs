//! At start ([`Sink::prepare`](crate::sinks::Sink::prepare)): an existing table whose configured
//! partition spec or sort order (`[sink.tables.*]`) is not its default gets them, in one metadata
//! commit of its own before anything is written, logged once. What it builds is `layout.rs`'s;
//! this is the I/O: load through the catalog, commit through it, under the table's slot so a
//! maintenance commit cannot take the version meanwhile. A table that does not exist yet gets
//! its layout when it is created (`load_or_create`).

use super::files::metadata::Loaded;
use super::tables::Tables;
use super::{changelog, layout};
use crate::changelog::TableId;
use crate::config::TableSettings;
use crate::sinks::cdc_columns::CdcColumns;
use crate::sinks::SinkError;

/// The configured layout made the default of one table (an action over the [`Tables`] cache,
/// as `commit::RowDelta` is).
pub(super) struct EvolveLayout<'a> {
    tables: &'a Tables,
    table: &'a TableId,
}

impl<'a> EvolveLayout<'a> {
    pub(super) fn new(tables: &'a Tables, table: &'a TableId) -> EvolveLayout<'a> {
        EvolveLayout { tables, table }
    }

    /// Makes the table's default spec and sort order the configured ones, if it exists and they
    /// are not. Refuses settings that do not fit its schema.
    pub(super) async fn commit(&self) -> Result<(), SinkError> {
        let (tables, table) = (self.tables, self.table);
        let settings = tables.settings.resolve(table)?;
        if settings.partition_by.is_none() && settings.sort_by.is_none() {
            return Ok(());
        }
        let slot = tables.slot(table);
        let _held = slot.lock().await;
        let Some(base) = tables.load(table).await? else {
            return Ok(());
        };
        let Some(evolved) = evolved(table, &settings, &base)? else {
            return Ok(());
        };
        let shown = layout::describe(&evolved.metadata);
        let published = tables
            .commit_metadata_and_sweep(table, &base, evolved.metadata)
            .await?;
        tracing::info!(
            table = %table,
            spec = %shown.partition_spec,
            order = %shown.sort_order,
            spec_changed = evolved.spec_id.is_some(),
            order_changed = evolved.order_id.is_some(),
            version = published.version,
            "evolved the table's partition spec and sort order to the configured ones"
        );
        Ok(())
    }

    /// `cdcd check`'s line on `table`'s layout: the existing table's spec and order, and what
    /// the next start changes; the configured layout of a table not created yet (`None` when
    /// nothing is configured for it). `Err`: what the start or the table's creation refuses.
    pub(super) async fn check(&self) -> Result<Option<String>, SinkError> {
        let (tables, table) = (self.tables, self.table);
        let settings = tables.settings.resolve(table)?;
        let Some(base) = tables.load(table).await? else {
            let mut parts = Vec::new();
            if let Some(p) = &settings.partition_by {
                let fields: Vec<String> = p.value.iter().map(ToString::to_string).collect();
                parts.push(format!("partition_by [{}]", fields.join(", ")));
            }
            if let Some(s) = &settings.sort_by {
                let fields: Vec<String> = s.value.iter().map(ToString::to_string).collect();
                parts.push(format!("sort_by [{}]", fields.join(", ")));
            }
            parts.extend(CdcColumns::of(&settings, true).describe());
            parts.extend(changelog::describe(table, &settings));
            return Ok((!parts.is_empty()).then(|| {
                format!(
                    "table {table}: not created yet; created with {} (columns and types are \
                     checked then)",
                    parts.join(", ")
                )
            }));
        };
        let meta = &base.metadata;
        let now = layout::describe(meta);
        let evolved = evolved(table, &settings, &base)?;
        let mut line = format!(
            "table {table}: partition {}; sort {}",
            now.partition_spec, now.sort_order
        );
        if let Some(evolved) = evolved {
            let next = layout::describe(&evolved.metadata);
            line.push_str(&format!(
                "; the next start evolves it to partition {}; sort {}",
                next.partition_spec, next.sort_order
            ));
        }
        if let Some(cdc) = CdcColumns::of(&settings, true).describe() {
            line.push_str(&format!("; {cdc}"));
        }
        if let Some(changelog) = changelog::describe(table, &settings) {
            line.push_str(&format!("; {changelog}"));
        }
        Ok(Some(line))
    }
}

/// The table `base` with the layout `settings` configure bound to its current schema: `None`
/// when it already has them.
fn evolved(
    table: &TableId,
    settings: &TableSettings,
    base: &Loaded,
) -> Result<Option<layout::Evolved>, SinkError> {
    let meta = &base.metadata;
    let bound = layout::bind(table, settings, meta.current_schema(), Some(meta))?;
    layout::evolve(meta, &base.file, &bound).map_err(|source| SinkError::Iceberg {
        context: format!("evolving the partition spec and sort order of {table}"),
        source,
    })
}
