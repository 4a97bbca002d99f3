//! Bringing a table's schema to the changes' before a commit writes under it (`schema.rs` holds
//! the pure comparison, [`schema::evolution`]; this is its I/O).
//!
//! A schema change is a new `schema-N` file, written create-if-absent before the commit that
//! first writes under it, as Paimon's `SchemaManager` commits one: a crash between the two leaves
//! a schema no snapshot uses yet, and the changes replayed after it were read under the older
//! schema ([`Tables::behind`] widens them instead of refusing a "narrowing"). Refused: a column
//! added with a default the existing rows must read (Paimon has no initial default), a column
//! name an earlier schema of the lineage had (cdcd reads older files by name), and with
//! `source.schema_change = "stop"` any change.

use std::sync::Arc;

use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::lsm::schema::{self, PaimonSchema};
use crate::sinks::lsm::table::{self, TableState};
use crate::sinks::lsm::tables::{Handle, Tables};
use crate::sinks::SinkError;

impl Tables {
    /// The schema the table already has when `changes` were read under an older one
    /// ([`schema::Evolution::Behind`]: a schema change whose commit did not land wrote its schema
    /// file, then the changes before the DDL were replayed), with the changes widened to it;
    /// `None` when the changes can be committed as they are.
    pub(in crate::sinks::lsm) async fn behind(
        &self,
        schema: &TableSchema,
        changes: &[TableChanges],
        handle: &Arc<Handle>,
    ) -> Result<Option<(Arc<TableSchema>, Vec<TableChanges>)>, SinkError> {
        let table = &schema.id;
        let mut guard = handle.state.lock().await;
        self.ensure_loaded(table, &mut guard).await?;
        let Some(state) = guard.as_ref() else {
            return Ok(None);
        };
        let wanted = schema::paimon_schema(
            schema,
            self.table_options(table),
            &state.schema.partition_keys,
        )?;
        let forward = renames(schema, &state.schema);
        let behind = match schema::evolution(&state.schema, &wanted, &forward) {
            schema::Evolution::Behind => true,
            // A rename whose schema file landed before the crash: the table's older names
            // lead back to the changes' ones.
            schema::Evolution::Incompatible(_) => {
                schema::behind_by_renames(&state.schema, &wanted, &state.aliases)
            }
            schema::Evolution::Same | schema::Evolution::To(_) => false,
        };
        if !behind {
            return Ok(None);
        }
        // Only a schema the table really had is a replay; anything else (a narrowing on the
        // source) is left to `ensure_created`, which refuses it.
        let mut had = false;
        for id in (state.lineage_start..state.schema.id).rev() {
            let older = table::read_schema(&self.warehouse, &state.location, id).await?;
            if older.is_some_and(|older| schema::difference(&older, &wanted).is_none()) {
                had = true;
                break;
            }
        }
        if !had {
            return Ok(None);
        }
        let mut newer =
            schema::table_schema(table, &state.schema).map_err(|detail| SinkError::Corrupt {
                path: state.location.clone(),
                detail,
            })?;
        for column in &mut newer.columns {
            column.former_names = state
                .aliases
                .iter()
                .filter(|(_, now)| **now == column.name)
                .map(|(old, _)| old.clone())
                .collect();
        }
        let newer = Arc::new(newer);
        let widened = changes
            .iter()
            .map(|c| c.evolve(&newer))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| SinkError::Arrow {
                context: format!("widening the changes of {table} to the table's schema"),
                source,
            })?;
        tracing::info!(table = %table, schema_id = state.schema.id, "the table is already at a newer schema: committing the older changes widened to it");
        Ok(Some((newer, widened)))
    }

    /// Refuses changes that add a column with a default the table's existing rows must read:
    /// Paimon has no initial default (a column added to a Paimon table reads NULL in older
    /// files), so they would read NULL where the source holds the default.
    pub(in crate::sinks::lsm) async fn refuse_added_defaults(
        &self,
        schema: &TableSchema,
        slot: &mut Option<TableState>,
    ) -> Result<(), SinkError> {
        if schema.columns.iter().all(|c| c.initial_default.is_none()) {
            return Ok(());
        }
        self.ensure_loaded(&schema.id, slot).await?;
        let Some(state) = slot.as_ref() else {
            return Ok(());
        };
        let added: Vec<&str> = schema
            .columns
            .iter()
            .filter(|c| c.initial_default.is_some())
            .filter(|c| !state.schema.fields.iter().any(|f| f.name == c.name))
            .map(|c| c.name.as_str())
            .collect();
        if added.is_empty() {
            return Ok(());
        }
        Err(SinkError::SchemaChanged {
            table: schema.id.clone(),
            detail: format!(
                "column {} is added with a default the existing rows hold; a Paimon table has no initial default (they would read NULL)",
                added.join(", ")
            ),
        })
    }

    /// The table's state in `slot`, loaded, or created with schema `wanted` when it does not
    /// exist; evolved to `wanted` when that adds columns or widens types (a new `schema-N`
    /// file before the commit that first writes under it); refused otherwise.
    pub(in crate::sinks::lsm) async fn ensure_created<'a>(
        &self,
        changes_schema: &TableSchema,
        slot: &'a mut Option<TableState>,
        wanted: &schema::PaimonSchema,
    ) -> Result<&'a mut TableState, SinkError> {
        let table = &changes_schema.id;
        self.ensure_loaded(table, slot).await?;
        if slot.is_none() {
            let location = self.table_location(table);
            table::create_schema(&self.warehouse, &location, wanted).await?;
            tracing::info!(table = %table, location = %location, "created Paimon table");
            self.ensure_loaded(table, slot).await?;
        }
        let evolution = match slot.as_ref() {
            Some(state) => schema::evolution(
                &state.schema,
                wanted,
                &renames(changes_schema, &state.schema),
            ),
            None => {
                return Err(SinkError::Corrupt {
                    path: self.table_location(table),
                    detail: "schema/schema-0 exists but cannot be loaded".into(),
                })
            }
        };
        if let schema::Evolution::To(next) = &evolution {
            self.evolve(table, slot, next).await?;
        }
        self.set_changelog_producer(table, slot, wanted).await?;
        let Some(state) = slot.as_mut() else {
            return Err(SinkError::Corrupt {
                path: self.table_location(table),
                detail: "the table vanished while its schema evolved".into(),
            });
        };
        match evolution {
            schema::Evolution::Same => Ok(state),
            schema::Evolution::To(_) => {
                if let Some(detail) = schema::difference(&state.schema, wanted) {
                    return Err(SinkError::SchemaChanged {
                        table: table.clone(),
                        detail,
                    });
                }
                tracing::info!(table = %table, schema_id = state.schema.id, "evolved the Paimon table's schema");
                Ok(state)
            }
            schema::Evolution::Behind | schema::Evolution::Incompatible(_) => {
                Err(SinkError::SchemaChanged {
                    table: table.clone(),
                    detail: schema::difference(&state.schema, wanted).unwrap_or_default(),
                })
            }
        }
    }

    /// Brings an existing table's `changelog-producer` option to `wanted`'s (`changelog` turned on
    /// or off for it) in a schema of its own, as Paimon's `ALTER TABLE … SET` does: readers pick
    /// the changelog files or the data files as the stream by it. Not a schema change of the
    /// source's, so `schema_change = "stop"` does not hold it back.
    async fn set_changelog_producer(
        &self,
        table: &TableId,
        slot: &mut Option<TableState>,
        wanted: &PaimonSchema,
    ) -> Result<(), SinkError> {
        const OPTION: &str = "changelog-producer";
        let Some(current) = slot.as_ref().map(|s| &s.schema) else {
            return Ok(());
        };
        let want = wanted.options.get(OPTION).filter(|v| *v != "none");
        let has = current.options.get(OPTION).filter(|v| *v != "none");
        if want == has {
            return Ok(());
        }
        let mut next = current.clone();
        next.id += 1;
        next.time_millis = chrono::Utc::now().timestamp_millis();
        match want {
            Some(v) => next.options.insert(OPTION.to_owned(), v.clone()),
            None => next.options.remove(OPTION),
        };
        let location = self.table_location(table);
        table::create_schema(&self.warehouse, &location, &next).await?;
        tracing::info!(table = %table, schema_id = next.id, changelog = want.is_some(), "set the Paimon table's changelog-producer");
        *slot = None;
        self.ensure_loaded(table, slot).await
    }

    /// Writes `next` as the table's next schema and reloads the table into `slot`, unless
    /// `source.schema_change = "stop"` or a name `next` adds is one an earlier schema had.
    async fn evolve(
        &self,
        table: &TableId,
        slot: &mut Option<TableState>,
        next: &PaimonSchema,
    ) -> Result<(), SinkError> {
        if self.schema_change.for_table(table) == crate::config::SchemaChange::Stop {
            let detail = slot
                .as_ref()
                .and_then(|state| schema::difference(&state.schema, next))
                .unwrap_or_default();
            return Err(SinkError::SchemaChanged {
                table: table.clone(),
                detail: format!(
                    "{detail}; source.schema_change = \"stop\" (for this table) keeps the lake's schema as it is (change it by hand, or set schema_change = \"evolve\" for it)"
                ),
            });
        }
        let location = self.table_location(table);
        let current = slot.as_ref().map(|s| (s.schema.clone(), s.lineage_start));
        if let Some((current, lineage_start)) = current {
            self.refuse_reused_names(table, &location, &current, lineage_start, next)
                .await?;
        }
        // A schema file left by an attempt whose commit did not land, or another writer's,
        // may hold this id already: it wins, and must then be this evolution.
        table::create_schema(&self.warehouse, &location, next).await?;
        crate::failpoints::crash_point(crate::failpoints::LSM_SCHEMA_WRITTEN);
        *slot = None;
        self.ensure_loaded(table, slot).await
    }

    /// Refuses `next` when a column it adds (or renames a column to) has the name of a column
    /// an earlier schema of the lineage (from `lineage_start` on) had: cdcd reads older files by
    /// name (lookups, compaction), so a dropped column's old values would show through.
    async fn refuse_reused_names(
        &self,
        table: &TableId,
        location: &str,
        current: &PaimonSchema,
        lineage_start: i64,
        next: &PaimonSchema,
    ) -> Result<(), SinkError> {
        // Added columns, and columns renamed to a new name.
        let added: Vec<&str> = next
            .fields
            .iter()
            .filter(|f| {
                f.id > current.highest_field_id
                    || current
                        .fields
                        .iter()
                        .any(|c| c.id == f.id && c.name != f.name)
            })
            .map(|f| f.name.as_str())
            .collect();
        for id in lineage_start..current.id {
            let older = table::read_schema(&self.warehouse, location, id).await?;
            if let Some(name) = older.and_then(|o| {
                added
                    .iter()
                    .find(|a| o.fields.iter().any(|f| f.name == **a))
                    .map(|a| a.to_string())
            }) {
                return Err(SinkError::SchemaChanged {
                    table: table.clone(),
                    detail: format!(
                        "column {name} is added (or a column renamed to it) after an earlier column of that name was dropped or renamed, which cdcd does not apply"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The renames `changes_schema` declares (its columns' former names) from the table's current
/// column names.
fn renames(changes_schema: &TableSchema, table: &PaimonSchema) -> Vec<(String, String)> {
    changes_schema.renames_from(table.fields.iter().map(|f| f.name.as_str()))
}
