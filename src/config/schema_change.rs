//! `source.schema_change`, a key both sources take: what a schema change of a captured table
//! does, as written ([`RawSchemaChange`], in each source's raw section) and validated per table
//! ([`SchemaChangePolicy`], which the sinks and the pipeline consult).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::context::Context;
use super::error::ConfigError;
use crate::changelog::TableId;

/// `source.schema_change`: what a schema change of a captured table does (either source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaChange {
    /// The lake's table follows the changes it can express (README, "Schema changes"); the
    /// others stop cdcd.
    #[default]
    Evolve,
    /// Every change of a lake table's schema stops cdcd before the transaction that needs it,
    /// naming the table and the change: for pipelines whose lake schema is changed only by hand.
    Stop,
    /// As `Evolve`, and a change the lake table cannot express starts that table's online
    /// resync instead of a stop: the other tables stream on (`pipeline/schema_resync.rs`).
    Resync,
}

impl SchemaChange {
    fn parse(value: &str) -> Option<SchemaChange> {
        match value {
            "evolve" => Some(SchemaChange::Evolve),
            "stop" => Some(SchemaChange::Stop),
            "resync" => Some(SchemaChange::Resync),
            _ => None,
        }
    }
}

/// `source.schema_change` as written: one mode for every table (`"stop"`), or a map of tables to
/// modes where `"*"` names the rest (`{ "public.audit" = "stop", "*" = "resync" }`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum RawSchemaChange {
    All(String),
    PerTable(BTreeMap<String, String>),
}

impl Default for RawSchemaChange {
    fn default() -> Self {
        RawSchemaChange::All("evolve".to_owned())
    }
}

/// `source.schema_change`, validated: the mode of each table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchemaChangePolicy {
    /// Tables not named below (`"*"`, or the single mode).
    pub rest: SchemaChange,
    pub tables: BTreeMap<TableId, SchemaChange>,
}

impl SchemaChangePolicy {
    /// One mode for every table.
    pub fn all(mode: SchemaChange) -> SchemaChangePolicy {
        SchemaChangePolicy {
            rest: mode,
            tables: BTreeMap::new(),
        }
    }

    /// What a schema change of `table` does.
    pub fn for_table(&self, table: &TableId) -> SchemaChange {
        self.tables.get(table).copied().unwrap_or(self.rest)
    }

    /// Whether any table is resynced on a change its lake table cannot express.
    pub fn resyncs_any(&self) -> bool {
        self.rest == SchemaChange::Resync
            || self.tables.values().any(|m| *m == SchemaChange::Resync)
    }

    pub(super) fn validate(
        raw: RawSchemaChange,
        ctx: &Context<'_>,
        container: &str,
    ) -> Result<SchemaChangePolicy, ConfigError> {
        const KEY: &str = "source.schema_change";
        let mode = |value: &str, table: Option<&str>| {
            SchemaChange::parse(value).ok_or_else(|| {
                let at = table.map(|t| format!(" for {t:?}")).unwrap_or_default();
                ctx.invalid(
                    KEY,
                    format!("{value:?}{at} is not \"evolve\", \"stop\" or \"resync\""),
                )
            })
        };
        match raw {
            RawSchemaChange::All(value) => Ok(SchemaChangePolicy::all(mode(&value, None)?)),
            RawSchemaChange::PerTable(map) => {
                let mut policy = SchemaChangePolicy::default();
                for (table, value) in map {
                    let m = mode(&value, Some(&table))?;
                    if table == "*" {
                        policy.rest = m;
                        continue;
                    }
                    let id =
                        ctx.one_table(KEY, &table, container, " or \"*\" (every other table)")?;
                    policy.tables.insert(id, m);
                }
                Ok(policy)
            }
        }
    }
}
