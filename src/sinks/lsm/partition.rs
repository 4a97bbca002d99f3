//! Partitioned Paimon tables: which partition a row belongs to ([`PartitionKeys`]), the
//! partition as Paimon stores it ([`Partition`]: the `_PARTITION` `BinaryRow` of manifest entries
//! and the `<col>=<value>/` directories of its data files), and [`Slot`], a (partition, bucket)
//! pair: the unit a Paimon table keeps its sorted runs in, and so the unit cdcd writes, compacts
//! and expires.
//!
//! The directory of a partition is Paimon's filesystem layout (Java `PartitionPathUtils`,
//! `InternalRowPartitionComputer`): `<name>=<value>/` per partition key, the value the column's
//! text (a NULL or blank one is the table's `partition.default-name`, `__DEFAULT_PARTITION__`),
//! with the characters Java escapes written `%XX`. Readers derive the directory from the entry's
//! `_PARTITION` row, so the two must agree byte for byte. Readers do not all agree with each
//! other: pypaimon 2.1 formats the value with Python's `str()` and escapes nothing, and Java's
//! default (`partition.legacy-name = true`) writes a DATE as its epoch day number. So cdcd
//! partitions only by column types whose text is the same in every reader (integers, strings,
//! dates with `partition.legacy-name = false`, which cdcd sets on the tables it creates), and
//! documents that a string value holding a character Java escapes is read by Java readers only.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

use super::binary_row;
use super::manifest::Stats;
use super::schema::PaimonSchema;

/// Paimon's `partition.default-name` default: the directory value of a NULL or blank partition
/// value.
pub const DEFAULT_PARTITION_NAME: &str = "__DEFAULT_PARTITION__";

/// The table option under which Java Paimon formats partition values by casting them to
/// strings (`false`), as pypaimon does, rather than by their internal form (a DATE as a day
/// number).
pub const LEGACY_NAME_OPTION: &str = "partition.legacy-name";

/// One partition of a table: its `_PARTITION` row and its directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition {
    /// The serialized `BinaryRow` of the partition values (arity prefix included).
    pub row: Arc<[u8]>,
    /// `<name>=<value>/` per partition key, in key order; empty for an unpartitioned table.
    pub path: Arc<str>,
}

impl Partition {
    /// The one partition of an unpartitioned table: the empty row, the table's own directory.
    pub fn none() -> Partition {
        Partition {
            row: Arc::from(binary_row::empty_row()),
            path: Arc::from(""),
        }
    }
}

/// A (partition, bucket): where a Paimon table keeps a set of sorted runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot {
    pub partition: Partition,
    pub bucket: i32,
}

impl Slot {
    /// Bucket `bucket` of an unpartitioned table.
    pub fn unpartitioned(bucket: i32) -> Slot {
        Slot {
            partition: Partition::none(),
            bucket,
        }
    }

    /// `<partition dirs>bucket-<n>` under the table.
    pub fn dir(&self) -> String {
        format!("{}bucket-{}", self.partition.path, self.bucket)
    }
}

/// Why cdcd does not partition by a column of stored type `dt`; `None`: it does.
pub fn type_refusal(dt: &DataType) -> Option<&'static str> {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Utf8
        | DataType::Date32 => None,
        DataType::Timestamp(..) => Some(
            "a timestamp's text holds ':', which Java Paimon escapes in the directory name and \
             pypaimon does not, so one of them would not find the files: partition by a DATE \
             column (or an integer or string column holding the value)",
        ),
        DataType::Boolean => Some(
            "Java Paimon names a boolean partition `true` and pypaimon `True`, so one of them \
             would not find the files: partition by an integer or string column",
        ),
        _ => Some(
            "cdcd partitions Paimon tables by integer, string and DATE columns only: the \
             directory name of other types differs between Paimon readers or is not exact",
        ),
    }
}

/// A table's partition keys: the columns, their stored types and the default name (the
/// default value: unpartitioned).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PartitionKeys {
    pub names: Vec<String>,
    /// Index of each partition key among the table's columns.
    pub columns: Vec<usize>,
    /// Stored (data file) types.
    pub types: Vec<DataType>,
    default_name: String,
}

impl PartitionKeys {
    /// The partition keys of the table whose schema is `schema`.
    pub fn of(schema: &PaimonSchema) -> Result<PartitionKeys, String> {
        let mut keys = PartitionKeys {
            names: Vec::new(),
            columns: Vec::new(),
            types: Vec::new(),
            default_name: schema
                .options
                .get("partition.default-name")
                .cloned()
                .unwrap_or_else(|| DEFAULT_PARTITION_NAME.to_owned()),
        };
        for name in &schema.partition_keys {
            let (i, field) = schema
                .fields
                .iter()
                .enumerate()
                .find(|(_, f)| &f.name == name)
                .ok_or_else(|| format!("partition key {name} is not a column"))?;
            let dt = super::schema::stored_type(&field.data_type).ok_or_else(|| {
                format!(
                    "partition key {name}: type {} is not one cdcd writes",
                    field.data_type
                )
            })?;
            if let Some(why) = type_refusal(&dt) {
                return Err(format!("partition key {name} ({}): {why}", field.data_type));
            }
            keys.names.push(name.clone());
            keys.columns.push(i);
            keys.types.push(dt);
        }
        if !keys.names.is_empty()
            && schema.options.get(LEGACY_NAME_OPTION).map(String::as_str) != Some("false")
            && keys.types.contains(&DataType::Date32)
        {
            return Err(format!(
                "a DATE partition key with {LEGACY_NAME_OPTION} not false: Java Paimon would name \
                 its directories by day number"
            ));
        }
        Ok(keys)
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The partition of row `row` of `values`, the partition keys' columns (stored types) in
    /// key order.
    pub fn partition_of(&self, values: &[&dyn Array], row: usize) -> Result<Partition, String> {
        if self.is_empty() {
            return Ok(Partition::none());
        }
        let mut buf = Vec::new();
        binary_row::encode(&mut buf, values, row).map_err(|e| e.to_string())?;
        let path = self.path(values, row)?;
        Ok(Partition {
            row: Arc::from(buf),
            path: Arc::from(path),
        })
    }

    /// The partition whose `_PARTITION` row is `row` (from a manifest entry).
    pub fn decode(&self, row: &[u8]) -> Result<Partition, String> {
        if self.is_empty() {
            return Ok(Partition::none());
        }
        let values = binary_row::decode(row, &self.types).map_err(|e| e.to_string())?;
        let refs: Vec<&dyn Array> = values.iter().map(|a| a.as_ref()).collect();
        Ok(Partition {
            row: Arc::from(row),
            path: Arc::from(self.path(&refs, 0)?),
        })
    }

    /// `<name>=<value>/` per key for row `row` of `values`.
    fn path(&self, values: &[&dyn Array], row: usize) -> Result<String, String> {
        let mut path = String::new();
        for (name, array) in self.names.iter().zip(values) {
            let text = value_text(*array, row)?;
            let text = match text {
                Some(t) if !blank(&t) => t,
                _ => self.default_name.clone(),
            };
            path.push_str(&escape(name));
            path.push('=');
            path.push_str(&escape(&text));
            path.push('/');
        }
        Ok(path)
    }

    /// `_PARTITION_STATS` of a manifest whose entries lie in `partitions`: per key the least
    /// and greatest non-NULL value and the count of NULLs (Paimon's `SimpleStats`).
    pub fn stats<'p>(
        &self,
        partitions: impl Iterator<Item = &'p Partition>,
    ) -> Result<Stats, String> {
        if self.is_empty() {
            let empty = binary_row::empty_row();
            return Ok(Stats {
                min: empty.clone(),
                max: empty,
                null_counts: Vec::new(),
            });
        }
        let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); self.types.len()];
        for p in partitions {
            let values = binary_row::decode(&p.row, &self.types).map_err(|e| e.to_string())?;
            for (c, v) in columns.iter_mut().zip(values) {
                c.push(v);
            }
        }
        let mut mins: Vec<ArrayRef> = Vec::with_capacity(self.types.len());
        let mut maxs: Vec<ArrayRef> = Vec::with_capacity(self.types.len());
        let mut null_counts = Vec::with_capacity(self.types.len());
        for (values, dt) in columns.iter().zip(&self.types) {
            let refs: Vec<&dyn Array> = values.iter().map(|a| a.as_ref()).collect();
            let all = if refs.is_empty() {
                arrow_array::new_null_array(dt, 0)
            } else {
                arrow_select::concat::concat(&refs).map_err(|e| e.to_string())?
            };
            null_counts.push(all.null_count() as i64);
            let order =
                arrow_ord::sort::sort_to_indices(&all, None, None).map_err(|e| e.to_string())?;
            let non_null: Vec<u32> = order
                .values()
                .iter()
                .copied()
                .filter(|&i| all.is_valid(i as usize))
                .collect();
            let pick = |i: Option<&u32>| match i {
                Some(&i) => all.slice(i as usize, 1),
                None => arrow_array::new_null_array(dt, 1),
            };
            mins.push(pick(non_null.first()));
            maxs.push(pick(non_null.last()));
        }
        let encode = |arrays: &[ArrayRef]| {
            let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
            let mut buf = Vec::new();
            binary_row::encode(&mut buf, &refs, 0).map(|_| buf)
        };
        Ok(Stats {
            min: encode(&mins).map_err(|e| e.to_string())?,
            max: encode(&maxs).map_err(|e| e.to_string())?,
            null_counts,
        })
    }
}

/// The text of a partition value as Java Paimon casts it to a string (and pypaimon's `str()`
/// gives for these types); `None` for NULL.
fn value_text(array: &dyn Array, row: usize) -> Result<Option<String>, String> {
    if array.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match array.data_type() {
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row).to_string(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row).to_string(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row).to_string(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::Utf8 => array.as_string::<i32>().value(row).to_owned(),
        DataType::Date32 => {
            let days = array.as_primitive::<Date32Type>().value(row);
            date_text(days).ok_or_else(|| {
                format!("the date {days} days from 1970-01-01 is outside the years 1 to 9999, which Paimon readers name differently")
            })?
        }
        other => return Err(format!("no partition directory name for type {other}")),
    }))
}

/// `yyyy-MM-dd` of a day number (Java `DateTimeUtils.formatDate`, Python `date.__str__`),
/// for the years both write the same way.
fn date_text(days: i32) -> Option<String> {
    use chrono::Datelike;
    let date = chrono::NaiveDate::from_num_days_from_ce_opt(days.checked_add(719_163)?)?;
    (1..=9999)
        .contains(&date.year())
        .then(|| format!("{:04}-{:02}-{:02}", date.year(), date.month(), date.day()))
}

/// Java `StringUtils.isNullOrWhitespaceOnly`: every char is `Character.isWhitespace`.
fn blank(text: &str) -> bool {
    text.chars().all(|c| {
        (c.is_whitespace() && !matches!(c, '\u{00A0}' | '\u{2007}' | '\u{202F}'))
            || ('\u{1C}'..='\u{1F}').contains(&c)
    })
}

/// Java `PartitionPathUtils.escapePathName`: control characters and `"#%'*/:=?\{}[]^` and DEL
/// as `%XX` (upper-case hex).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let escaped = c < ' '
            || matches!(
                c,
                '"' | '#'
                    | '%'
                    | '\''
                    | '*'
                    | '/'
                    | ':'
                    | '='
                    | '?'
                    | '\\'
                    | '\u{7F}'
                    | '{'
                    | '}'
                    | '['
                    | ']'
                    | '^'
            );
        if escaped {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use arrow_array::{Date32Array, Int64Array, StringArray};

    fn keys(types: Vec<DataType>) -> PartitionKeys {
        PartitionKeys {
            names: (0..types.len()).map(|i| format!("k{i}")).collect(),
            columns: (0..types.len()).collect(),
            types,
            default_name: DEFAULT_PARTITION_NAME.into(),
        }
    }

    #[test]
    fn directories_as_java_paimon_names_them() {
        let k = keys(vec![DataType::Utf8, DataType::Int64, DataType::Date32]);
        let s = StringArray::from(vec![Some("eu"), Some("a/b:c%"), Some("  "), None]);
        let n = Int64Array::from(vec![Some(-3), Some(7), None, Some(0)]);
        let d = Date32Array::from(vec![Some(19_723), Some(0), Some(-1), None]);
        let cols: Vec<&dyn Array> = vec![&s, &n, &d];
        let paths: Vec<String> = (0..4)
            .map(|r| k.partition_of(&cols, r).unwrap().path.to_string())
            .collect();
        assert_eq!(paths[0], "k0=eu/k1=-3/k2=2024-01-01/");
        assert_eq!(paths[1], "k0=a%2Fb%3Ac%25/k1=7/k2=1970-01-01/");
        assert_eq!(
            paths[2],
            "k0=__DEFAULT_PARTITION__/k1=__DEFAULT_PARTITION__/k2=1969-12-31/"
        );
        assert_eq!(
            paths[3],
            "k0=__DEFAULT_PARTITION__/k1=0/k2=__DEFAULT_PARTITION__/"
        );
        // The manifest's row decodes back to the same directory.
        let p = k.partition_of(&cols, 1).unwrap();
        assert_eq!(k.decode(&p.row).unwrap(), p);
    }

    #[test]
    fn stats_hold_least_and_greatest_and_nulls() {
        let k = keys(vec![DataType::Utf8]);
        let s = StringArray::from(vec![Some("us"), None, Some("eu"), Some("zz")]);
        let parts: Vec<Partition> = (0..4)
            .map(|r| k.partition_of(&[&s as &dyn Array], r).unwrap())
            .collect();
        let stats = k.stats(parts.iter()).unwrap();
        let min = binary_row::decode(&stats.min, &k.types).unwrap();
        let max = binary_row::decode(&stats.max, &k.types).unwrap();
        assert_eq!(min[0].as_string::<i32>().value(0), "eu");
        assert_eq!(max[0].as_string::<i32>().value(0), "zz");
        assert_eq!(stats.null_counts, vec![1]);
    }
}
