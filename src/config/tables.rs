//! `[sink.tables."<table or glob>"]`: per-table settings. The keys as written
//! ([`RawTableSettings`], whose field docs are the user docs), their checks, and the settings one
//! table runs with ([`TableSettings`], resolved from every section that matches it by
//! [`TablesConfig::resolve`]).
//!
//! A section's key is a source table name (`schema.table` Postgres, `db.table` MySQL) or a glob
//! of them, matched as `source.tables` patterns are (`*` is any run of characters). Several
//! sections may match one table; each key is taken from the most specific section that sets it:
//! the exact name first, then the glob with the most characters other than `*`. Two globs that
//! are equally specific, both match a table and both set a key that no more specific section
//! sets are refused for that table (at start and by `cdcd check`), naming both. `properties` merge per property name the same way; the sink sets
//! them over `[sink.table_properties]` (docs/table-settings.md).
//!
//! What is checked here needs no table: the keys' shape, the partition and sort expressions,
//! which keys apply to the sink's kind. Whether a column exists and a transform applies to its
//! type is checked where the table's schema is known: the Iceberg sink's `layout.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use iceberg::spec::{NullOrder, SortDirection, Transform};
use serde::Deserialize;

use super::context::Context;
use super::error::ConfigError;
use crate::changelog::TableId;

/// `[sink.tables."<table or glob>"]`: settings of the tables the key names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTableSettings {
    /// Iceberg: the partition spec, one field per entry: a column (`"region"`, identity) or a
    /// transform of one: `identity(c)`, `bucket(N, c)`, `truncate(W, c)`, `year(c)`,
    /// `month(c)`, `day(c)`, `hour(c)`, `void(c)`. LSM: column names. `[]`: unpartitioned.
    /// Unset: the table's spec is left as it is.
    #[serde(default)]
    pub partition_by: Option<Vec<String>>,
    /// Iceberg: the sort order, one field per entry: a column or transform as in `partition_by`,
    /// then optionally `asc`/`desc` and `nulls first`/`nulls last` (`"id desc nulls last"`).
    /// `[]`: unsorted. Unset: the table's order is left as it is.
    #[serde(default)]
    pub sort_by: Option<Vec<String>>,
    /// Iceberg table properties set on the table when cdcd creates it, over
    /// `[sink.table_properties]`.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// LSM: fixed buckets of the table when cdcd creates it, 1 to 1024 (default `sink.buckets`).
    #[serde(default)]
    pub buckets: Option<u32>,
    /// Also keep every change as a stream: Iceberg, the append-only table `<table>_changelog`
    /// beside the table; LSM, Paimon changelog files (`changelog-producer = input`). Default false.
    #[serde(default)]
    pub changelog: Option<bool>,
    /// Iceberg: how long the changelog table keeps changes, in days (`"30d"`) or hours
    /// (`"36h"`): maintenance drops each day partition of `_cdc_commit_ts` once the whole day
    /// is older than this. Unset: kept forever.
    #[serde(default)]
    pub changelog_retention: Option<String>,
    /// `"hard"` (default): a source delete removes the row. `"soft"`: the row stays, with
    /// `_cdc_deleted = true`, until its key is inserted again.
    #[serde(default)]
    pub deletes: Option<Deletes>,
    /// Add `_cdc_commit_ts` and `_cdc_position` to the table's rows: when and where in the
    /// source each row was last written. Default false.
    #[serde(default)]
    pub row_metadata: Option<bool>,
    /// How Postgres `json`/`jsonb` and MySQL `JSON` columns are stored: `"string"` (default,
    /// the JSON text) or `"variant"` (Iceberg v3 `variant`: `delete_mode = "deletion-vectors"`
    /// tables only; read by DuckDB, not by pyiceberg 0.12 or Spark 3.5; Paimon `VARIANT`, read
    /// by pypaimon).
    #[serde(default)]
    pub json: Option<JsonAs>,
    /// With `json = "variant"`: only these JSON columns are variants; the table's other JSON
    /// columns stay strings. Unset: every JSON column.
    #[serde(default)]
    pub json_columns: Option<Vec<String>>,
    /// How PostGIS `geometry` and MySQL/MariaDB spatial columns are stored: `"plain"` (default:
    /// PostGIS's hex EWKB text, MySQL's WKB binary) or `"geometry"` (Iceberg v3 `geometry` with
    /// the column's CRS: `delete_mode = "deletion-vectors"` tables only; read by DuckDB, not by
    /// pyiceberg 0.12 or Spark 3.5).
    #[serde(default)]
    pub spatial: Option<SpatialAs>,
}

/// `spatial`: the Iceberg type of a spatial column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpatialAs {
    /// What the column maps to without the opt-in: PostGIS's text output (hex EWKB) as a
    /// `string`, MySQL's WKB as `binary`.
    #[default]
    Plain,
    /// An Iceberg v3 `geometry(<crs>)`.
    Geometry,
}

impl fmt::Display for SpatialAs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpatialAs::Plain => "plain",
            SpatialAs::Geometry => "geometry",
        })
    }
}

/// `json`: the Iceberg type of a JSON column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JsonAs {
    /// The JSON text, an Iceberg `string`.
    #[default]
    String,
    /// An Iceberg v3 `variant`.
    Variant,
}

impl fmt::Display for JsonAs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JsonAs::String => "string",
            JsonAs::Variant => "variant",
        })
    }
}

/// `deletes`: what a source delete does to the row in the lake.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Deletes {
    /// The row is removed.
    #[default]
    Hard,
    /// The row stays, flagged `_cdc_deleted = true`.
    Soft,
}

impl fmt::Display for Deletes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Deletes::Hard => "hard",
            Deletes::Soft => "soft",
        })
    }
}

/// Which sink the sections are for: some keys apply to one kind only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    Iceberg,
    Lsm,
}

impl SinkKind {
    fn name(self) -> &'static str {
        match self {
            SinkKind::Iceberg => "iceberg",
            SinkKind::Lsm => "lsm",
        }
    }
}

/// One partition field as configured: a transform of a source column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    pub column: String,
    pub transform: Transform,
}

impl fmt::Display for PartitionField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_transform(f, self.transform, &self.column)
    }
}

/// One sort field as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortField {
    pub column: String,
    pub transform: Transform,
    pub direction: SortDirection,
    pub null_order: NullOrder,
}

impl fmt::Display for SortField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_transform(f, self.transform, &self.column)?;
        let direction = match self.direction {
            SortDirection::Ascending => "asc",
            SortDirection::Descending => "desc",
        };
        let nulls = match self.null_order {
            NullOrder::First => "first",
            NullOrder::Last => "last",
        };
        write!(f, " {direction} nulls {nulls}")
    }
}

/// `transform` of `column` as the config writes it (`day(created_at)`, `bucket(16, id)`, `id`).
fn write_transform(f: &mut impl fmt::Write, transform: Transform, column: &str) -> fmt::Result {
    match transform {
        Transform::Identity => write!(f, "{column}"),
        Transform::Bucket(n) => write!(f, "bucket({n}, {column})"),
        Transform::Truncate(w) => write!(f, "truncate({w}, {column})"),
        other => write!(f, "{other}({column})"),
    }
}

/// Where a setting was written, for messages: `p.toml: key \`sink.tables."public.*".sort_by\``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub key: String,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: key `{}`", self.file, self.key)
    }
}

impl Origin {
    /// The configuration error for this setting.
    pub fn invalid(&self, detail: impl fmt::Display) -> ConfigError {
        // `ConfigError::Invalid` holds a `&'static str` key; a section's key is the user's
        // table name, so the message is built here in the same words.
        ConfigError::Parse {
            file: self.file.clone(),
            detail: format!("key `{}`: {detail}", self.key),
        }
    }
}

/// A setting and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured<T> {
    pub value: T,
    pub origin: Origin,
}

/// The settings of one table, resolved from every section that matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSettings {
    /// `None`: no section sets `partition_by`; the table's spec is left as it is.
    pub partition_by: Option<Configured<Vec<PartitionField>>>,
    /// `None`: no section sets `sort_by`; the table's sort order is left as it is.
    pub sort_by: Option<Configured<Vec<SortField>>>,
    /// The sections' `properties`, to be set over `[sink.table_properties]` (Iceberg).
    pub properties: BTreeMap<String, String>,
    /// Buckets of a new LSM table; `None`: `sink.buckets`.
    pub buckets: Option<u32>,
    /// Keep every change as a stream (`changelog = true`).
    pub changelog: bool,
    /// `changelog_retention`: how long the changelog table keeps changes (`None`: forever).
    pub changelog_retention: Option<Duration>,
    pub deletes: Deletes,
    /// `_cdc_commit_ts` and `_cdc_position` on the table's rows.
    pub row_metadata: bool,
    /// The Iceberg type of the table's JSON columns ([`Self::json_for`]: per column).
    pub json: JsonAs,
    /// `json_columns`: the JSON columns `json` applies to; `None`: all of them.
    pub json_columns: Option<Vec<String>>,
    /// The Iceberg type of the table's spatial columns.
    pub spatial: SpatialAs,
}

impl TableSettings {
    /// How the JSON column `column` is stored: `json`, for the columns `json_columns` names
    /// when it names any.
    pub fn json_for(&self, column: &str) -> JsonAs {
        match &self.json_columns {
            Some(names) if !names.iter().any(|n| n == column) => JsonAs::String,
            _ => self.json,
        }
    }
}

/// One `[sink.tables."<key>"]` section, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Section {
    /// The key as written (`public.orders`, `public.*_log`).
    key: String,
    schema: String,
    table: String,
    /// No `*`: names one table.
    exact: bool,
    /// Characters other than `*`: the more, the more specific a glob.
    literal: usize,
    partition_by: Option<Vec<PartitionField>>,
    sort_by: Option<Vec<SortField>>,
    properties: BTreeMap<String, String>,
    buckets: Option<u32>,
    changelog: Option<bool>,
    changelog_retention: Option<Duration>,
    deletes: Option<Deletes>,
    row_metadata: Option<bool>,
    json: Option<JsonAs>,
    json_columns: Option<Vec<String>>,
    spatial: Option<SpatialAs>,
}

impl Section {
    fn matches(&self, table: &TableId) -> bool {
        crate::sources::postgres::publication::glob_match(&self.schema, &table.namespace)
            && crate::sources::postgres::publication::glob_match(&self.table, &table.name)
    }

    fn origin(&self, file: &str, field: &str) -> Origin {
        Origin {
            file: file.to_owned(),
            key: section_key(&self.key, Some(field)),
        }
    }
}

/// `sink.tables."<key>"` (`.<field>`).
fn section_key(key: &str, field: Option<&str>) -> String {
    match field {
        Some(field) => format!("sink.tables.{key:?}.{field}"),
        None => format!("sink.tables.{key:?}"),
    }
}

/// The validated `[sink.tables.*]` sections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablesConfig {
    /// The file, for messages.
    file: String,
    /// Most specific first: exact names, then globs by [`Section::literal`].
    sections: Vec<Section>,
}

impl TablesConfig {
    /// Checks each section for a sink of `kind`.
    pub fn validate(
        raw: BTreeMap<String, RawTableSettings>,
        kind: SinkKind,
        ctx: &Context<'_>,
    ) -> Result<TablesConfig, ConfigError> {
        let mut sections = Vec::with_capacity(raw.len());
        for (key, raw) in raw {
            sections.push(Section::validate(key, raw, kind, ctx.file)?);
        }
        sections.sort_by(|a, b| {
            b.exact
                .cmp(&a.exact)
                .then(b.literal.cmp(&a.literal))
                .then(a.key.cmp(&b.key))
        });
        Ok(TablesConfig {
            file: ctx.file.to_owned(),
            sections,
        })
    }

    /// No section at all.
    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }

    /// The section keys as written, most specific first (`cdcd check`).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.sections.iter().map(|s| s.key.as_str())
    }

    /// Whether the section `key` names at least one of `tables`.
    pub fn key_matches_any(&self, key: &str, tables: &[TableId]) -> bool {
        self.sections
            .iter()
            .filter(|s| s.key == key)
            .any(|s| tables.iter().any(|t| s.matches(t)))
    }

    /// `table`'s settings: each key from the most specific section that sets it. Refused when
    /// two equally specific globs match `table` and both set a key no more specific section sets.
    pub fn resolve(&self, table: &TableId) -> Result<TableSettings, ConfigError> {
        let matching: Vec<&Section> = self.sections.iter().filter(|s| s.matches(table)).collect();
        let partition_by = self
            .pick(table, &matching, "partition_by", |s| {
                s.partition_by.is_some()
            })?
            .and_then(|s| {
                let origin = s.origin(&self.file, "partition_by");
                s.partition_by
                    .clone()
                    .map(|value| Configured { value, origin })
            });
        let sort_by = self
            .pick(table, &matching, "sort_by", |s| s.sort_by.is_some())?
            .and_then(|s| {
                let origin = s.origin(&self.file, "sort_by");
                s.sort_by.clone().map(|value| Configured { value, origin })
            });
        let at = |key| (table, &matching[..], key);
        let buckets = self.value(at("buckets"), |s| s.buckets)?;
        let changelog = self
            .value(at("changelog"), |s| s.changelog)?
            .unwrap_or_default();
        let changelog_retention =
            self.value(at("changelog_retention"), |s| s.changelog_retention)?;
        let deletes = self
            .value(at("deletes"), |s| s.deletes)?
            .unwrap_or_default();
        let row_metadata = self
            .value(at("row_metadata"), |s| s.row_metadata)?
            .unwrap_or_default();
        let json = self.value(at("json"), |s| s.json)?.unwrap_or_default();
        let json_columns = self.value(at("json_columns"), |s| s.json_columns.clone())?;
        let spatial = self
            .value(at("spatial"), |s| s.spatial)?
            .unwrap_or_default();
        let mut properties = BTreeMap::new();
        for name in matching.iter().flat_map(|s| s.properties.keys()) {
            if properties.contains_key(name) {
                continue;
            }
            let at = format!("properties.{name:?}");
            if let Some(value) = self
                .pick(table, &matching, &at, |s| s.properties.contains_key(name))?
                .and_then(|s| s.properties.get(name))
            {
                properties.insert(name.clone(), value.clone());
            }
        }
        Ok(TableSettings {
            partition_by,
            sort_by,
            properties,
            buckets,
            changelog,
            changelog_retention,
            deletes,
            row_metadata,
            json,
            json_columns,
            spatial,
        })
    }

    /// The most specific of `matching` (most specific first) that `sets` the key `field`;
    /// refused when the next one that sets it is a glob as specific.
    /// The value of a key (`(table, matching sections, key)`) from the section [`Self::pick`]
    /// chooses.
    fn value<T>(
        &self,
        (table, matching, field): (&TableId, &[&Section], &str),
        get: impl Fn(&Section) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        Ok(self
            .pick(table, matching, field, |s| get(s).is_some())?
            .and_then(get))
    }

    fn pick<'a>(
        &self,
        table: &TableId,
        matching: &[&'a Section],
        field: &str,
        sets: impl Fn(&Section) -> bool,
    ) -> Result<Option<&'a Section>, ConfigError> {
        let mut setters = matching.iter().filter(|s| sets(s));
        let Some(first) = setters.next() else {
            return Ok(None);
        };
        match setters.next() {
            Some(second) if !first.exact && first.literal == second.literal => Err(Origin {
                file: self.file.clone(),
                key: "sink.tables".to_owned(),
            }
            .invalid(format!(
                "{table} matches both {:?} and {:?}, equally specific globs that both set \
                 {field}: add a section [sink.tables.\"{table}\"] or make one glob name more of \
                 the table",
                first.key, second.key
            ))),
            _ => Ok(Some(first)),
        }
    }
}

impl Section {
    fn validate(
        key: String,
        raw: RawTableSettings,
        kind: SinkKind,
        file: &str,
    ) -> Result<Section, ConfigError> {
        let at = |field: &str| Origin {
            file: file.to_owned(),
            key: section_key(&key, Some(field)),
        };
        let (schema, table) = match key.split_once('.') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('.') => {
                (a.to_owned(), b.to_owned())
            }
            _ => {
                return Err(Origin {
                    file: file.to_owned(),
                    key: section_key(&key, None),
                }
                .invalid(
                    "is not a table name or glob: write it as in source.tables, e.g. \
                     [sink.tables.\"public.orders\"] or [sink.tables.\"public.*_log\"]",
                ))
            }
        };
        let only_for = |field: &str, owner: SinkKind, why: &str| {
            at(field).invalid(format!("applies to {} sinks only{why}", owner.name()))
        };
        match kind {
            SinkKind::Iceberg if raw.buckets.is_some() => {
                return Err(only_for(
                    "buckets",
                    SinkKind::Lsm,
                    " (in Iceberg, buckets are a partition transform: partition_by = \
                     [\"bucket(16, id)\"])",
                ))
            }
            SinkKind::Lsm if raw.sort_by.is_some() => {
                return Err(only_for(
                    "sort_by",
                    SinkKind::Iceberg,
                    " (a Paimon table is sorted by its primary key)",
                ))
            }
            SinkKind::Lsm if !raw.properties.is_empty() => {
                return Err(only_for("properties", SinkKind::Iceberg, ""))
            }
            SinkKind::Lsm if raw.changelog_retention.is_some() => {
                return Err(only_for(
                    "changelog_retention",
                    SinkKind::Iceberg,
                    " (a Paimon changelog is kept by the table's changelog.time-retained and \
                     changelog.num-retained options)",
                ))
            }
            SinkKind::Lsm if raw.spatial == Some(SpatialAs::Geometry) => {
                return Err(at("spatial").invalid(
                    "\"geometry\" applies to iceberg sinks only: Paimon has no geometry type; \
                     use spatial = \"plain\"",
                ))
            }
            _ => {}
        }
        if let Some(b) = raw.buckets {
            if !(1..=1024).contains(&b) {
                return Err(at("buckets").invalid(format!("{b}: use 1 to 1024")));
            }
        }
        let partition_by = match raw.partition_by {
            None => None,
            Some(list) => Some(partition_fields(&list, kind, &at("partition_by"))?),
        };
        let sort_by = match raw.sort_by {
            None => None,
            Some(list) => Some(sort_fields(&list, &at("sort_by"))?),
        };
        if let Some(columns) = &raw.json_columns {
            json_columns(columns, raw.json, &at("json_columns"))?;
        }
        let changelog_retention = match raw.changelog_retention {
            None => None,
            Some(text) => Some(retention(&text).ok_or_else(|| {
                at("changelog_retention").invalid(format!(
                    "{text:?} is not a retention: write a whole number of days or hours, \
                         e.g. \"30d\" or \"36h\""
                ))
            })?),
        };
        Ok(Section {
            exact: !key.contains('*'),
            literal: key.chars().filter(|c| *c != '*').count(),
            key,
            schema,
            table,
            partition_by,
            sort_by,
            properties: raw.properties,
            buckets: raw.buckets,
            changelog: raw.changelog,
            changelog_retention,
            deletes: raw.deletes,
            row_metadata: raw.row_metadata,
            json: raw.json,
            json_columns: raw.json_columns,
            spatial: raw.spatial,
        })
    }
}

/// `json_columns`: names, each once, in a section that sets `json = "variant"` (the key narrows
/// it; beside `"string"` or a glob's `json` it would say nothing, or something else than it reads).
fn json_columns(
    columns: &[String],
    json: Option<JsonAs>,
    origin: &Origin,
) -> Result<(), ConfigError> {
    if json != Some(JsonAs::Variant) {
        return Err(origin.invalid(
            "narrows json = \"variant\" to the columns it names: set json = \"variant\" in \
             the same section",
        ));
    }
    if columns.is_empty() {
        return Err(origin.invalid(
            "names no column: name the JSON columns to store as variant, or remove the key (every \
             JSON column of the table)",
        ));
    }
    for (i, name) in columns.iter().enumerate() {
        if columns.iter().take(i).any(|c| c == name) {
            return Err(origin.invalid(format!("{name:?} is named twice")));
        }
    }
    Ok(())
}

/// `changelog_retention`: `"30d"` or `"36h"`; `None` when it is neither.
fn retention(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (n, unit) = t.split_at(t.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "d" => n.checked_mul(86_400)?,
        "h" => n.checked_mul(3_600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// The forms `partition_by` and `sort_by` take, for messages.
const FORMS: &str = "a column name, or identity(c), bucket(N, c), truncate(W, c), year(c), \
                     month(c), day(c), hour(c) or void(c)";

fn partition_fields(
    list: &[String],
    kind: SinkKind,
    origin: &Origin,
) -> Result<Vec<PartitionField>, ConfigError> {
    let mut fields: Vec<PartitionField> = Vec::with_capacity(list.len());
    for text in list {
        let (column, transform) = expression(text).map_err(|why| origin.invalid(why))?;
        if kind == SinkKind::Lsm && transform != Transform::Identity {
            return Err(origin.invalid(format!(
                "{text:?}: Paimon partitions by column values and has no partition transforms: \
                 name the column ({column:?}), or add a column holding the value to the source table"
            )));
        }
        let field = PartitionField { column, transform };
        if fields.contains(&field) {
            return Err(origin.invalid(format!("{text:?} is listed twice")));
        }
        fields.push(field);
    }
    Ok(fields)
}

fn sort_fields(list: &[String], origin: &Origin) -> Result<Vec<SortField>, ConfigError> {
    let mut fields: Vec<SortField> = Vec::with_capacity(list.len());
    for text in list {
        let field = sort_field(text).map_err(|why| origin.invalid(why))?;
        if fields
            .iter()
            .any(|f| f.column == field.column && f.transform == field.transform)
        {
            return Err(origin.invalid(format!("{text:?} sorts by a field listed before")));
        }
        fields.push(field);
    }
    Ok(fields)
}

/// `"id"`, `"id desc"`, `"day(ts) asc nulls last"`. As in Iceberg and SQL, nulls come first in
/// ascending order and last in descending order unless the entry says otherwise.
fn sort_field(text: &str) -> Result<SortField, String> {
    let trimmed = text.trim();
    let split = match trimmed.find(')') {
        Some(close) if trimmed.contains('(') => close + 1,
        _ => trimmed.find(char::is_whitespace).unwrap_or(trimmed.len()),
    };
    let (expr, rest) = trimmed.split_at(split);
    let (column, transform) = expression(expr)?;
    let words: Vec<String> = rest.split_whitespace().map(str::to_lowercase).collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let (direction, nulls) = match words.as_slice() {
        [] => (SortDirection::Ascending, None),
        ["asc"] => (SortDirection::Ascending, None),
        ["desc"] => (SortDirection::Descending, None),
        ["nulls", n] => (SortDirection::Ascending, Some(*n)),
        ["asc", "nulls", n] => (SortDirection::Ascending, Some(*n)),
        ["desc", "nulls", n] => (SortDirection::Descending, Some(*n)),
        _ => {
            return Err(format!(
                "{text:?}: after the column, write asc or desc, then nulls first or nulls last \
                 (e.g. \"{expr} desc nulls last\")"
            ))
        }
    };
    let null_order = match (nulls, direction) {
        (Some("first"), _) => NullOrder::First,
        (Some("last"), _) => NullOrder::Last,
        (Some(other), _) => {
            return Err(format!(
                "{text:?}: nulls {other:?}: write nulls first or nulls last"
            ))
        }
        (None, SortDirection::Ascending) => NullOrder::First,
        (None, SortDirection::Descending) => NullOrder::Last,
    };
    Ok(SortField {
        column,
        transform,
        direction,
        null_order,
    })
}

/// A column or a transform of one: `"region"`, `"day(created_at)"`, `"bucket(16, id)"`. The
/// argument order of `bucket` and `truncate` may be either (Spark takes `truncate(c, W)` too),
/// and the plural time names Spark's DDL uses (`days(ts)`) are accepted.
fn expression(text: &str) -> Result<(String, Transform), String> {
    let t = text.trim();
    let Some(open) = t.find('(') else {
        return column_name(t, text).map(|c| (c, Transform::Identity));
    };
    let Some(inner) = t[open + 1..].strip_suffix(')') else {
        return Err(format!(
            "{text:?} is not {FORMS} (a \")\" is missing or misplaced)"
        ));
    };
    let name = t[..open].trim().to_ascii_lowercase();
    let args: Vec<&str> = inner.split(',').map(str::trim).collect();
    let one = |transform: Transform| match args.as_slice() {
        [column] => column_name(column, text).map(|c| (c, transform)),
        _ => Err(format!(
            "{text:?}: {name} takes one column, e.g. {name}(created_at)"
        )),
    };
    let sized = |make: fn(u32) -> String, what: &str| {
        let (n, column) = match args.as_slice() {
            [a, b] => match (a.parse::<u32>(), b.parse::<u32>()) {
                (Ok(n), Err(_)) => (n, *b),
                (Err(_), Ok(n)) => (n, *a),
                _ => return Err(format!("{text:?}: write {name}({what}, column)")),
            },
            _ => return Err(format!("{text:?}: write {name}({what}, column)")),
        };
        if n == 0 {
            return Err(format!("{text:?}: the {what} must be at least 1"));
        }
        let transform = make(n)
            .parse::<Transform>()
            .map_err(|e| format!("{text:?}: {e}"))?;
        column_name(column, text).map(|c| (c, transform))
    };
    match name.as_str() {
        "identity" => one(Transform::Identity),
        "year" | "years" => one(Transform::Year),
        "month" | "months" => one(Transform::Month),
        "day" | "days" => one(Transform::Day),
        "hour" | "hours" => one(Transform::Hour),
        "void" => one(Transform::Void),
        "bucket" => sized(|n| format!("bucket[{n}]"), "N"),
        "truncate" => sized(|w| format!("truncate[{w}]"), "W"),
        _ => Err(format!(
            "{text:?}: {name:?} is not a transform; use {FORMS}"
        )),
    }
}

/// A column name as an expression holds it; `text` is the whole entry, for the message.
fn column_name(name: &str, text: &str) -> Result<String, String> {
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || "(),\"'`".contains(c)) {
        return Err(format!("{text:?} is not {FORMS}"));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
#[path = "tables_tests.rs"]
mod tests;
