//! JSON columns as Iceberg v3 `variant` (`json = "variant"` in `[sink.tables."…"]`,
//! docs/table-settings.md): the type in the table's schema, the Parquet form of its values, and
//! the conversions between the JSON text the sources decode and that form.
//!
//! The changelog keeps JSON as text (Arrow `Utf8`) for every sink and mapping; only the Iceberg
//! sink's file boundary converts it: text → variant when a data file is written ([`cast`] to the
//! file schema), variant → text when one is read back (the lookup that completes an update whose
//! unchanged TOAST jsonb the source left out, compaction). So the initial copy, the stream and a
//! completed partial update share one value model, and a value that went through a file once
//! comes back as the same JSON.
//!
//! **The schema model.** iceberg 0.10.1's `Type` has no variant. cdcd holds a variant column as
//! an empty struct ([`placeholder`]), a type cdcd never maps a source column to, and rewrites it
//! to the spec's `"variant"` where table metadata leaves the process ([`metadata_file_bytes`], the
//! catalogs' request bodies) and back where it enters ([`parse_metadata`]): a field whose
//! `"type"` is `"variant"` and nothing else. The schema iceberg's `ManifestWriter` embeds in each
//! manifest keeps the placeholder: it is written and read back by iceberg's own Avro code, which
//! could not read `"variant"` there, and readers take a table's schema from its metadata.
//!
//! **The Parquet form.** A group annotated VARIANT holding `metadata` and `value` (required
//! binaries, unshredded): parquet 58's writer puts the annotation on a struct field carrying the
//! `arrow.parquet.variant` extension type, and DuckDB 1.5.5 reads it. That is the form of the
//! values everywhere in cdcd; only the Parquet encoding shreds the paths that recur in a file
//! (`variant_shredding.rs`), and reading a file back unshreds them ([`cast`]).
//!
//! **Why the JSON parsing here is cdcd's own.** `parquet-variant-json` reads numbers through
//! serde_json's `f64`, so `12345678901234567890` or `0.1000000000000000000001` would lose digits.
//! Here objects, arrays and strings are still parsed by serde_json (as raw values, level by
//! level), but each number is read from its text: an integer that fits i64 as the smallest
//! integer type, any other number of up to 38 significant digits (and scale up to 38) as an
//! exact decimal, the rest as a double. The binary encoding is parquet-variant's builder's.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, StringArray, StructArray};
use arrow_schema::{ArrowError, DataType, Field, Fields};
use iceberg::spec::{StructType, TableMetadata, Type};
use parquet_variant::{
    ObjectFieldBuilder, Variant, VariantBuilderExt, VariantDecimal16, VariantDecimal4,
    VariantDecimal8,
};
use parquet_variant_compute::{unshred_variant, VariantArray, VariantArrayBuilder};
use parquet_variant_json::VariantToJson;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::changelog::{Column, TableSchema};
use crate::config::{JsonAs, TableSettings};
use crate::sinks::SinkError;

/// The spec's name of the type in table metadata.
const VARIANT: &str = "variant";
/// The Arrow extension type name parquet writes as the VARIANT annotation.
const EXTENSION: &str = "arrow.parquet.variant";

/// How cdcd's schema model holds a variant column (see the module doc).
pub(crate) fn placeholder() -> Type {
    Type::Struct(StructType::new(vec![]))
}

/// Whether `ty` is a variant column's type.
pub(crate) fn is_variant(ty: &Type) -> bool {
    matches!(ty, Type::Struct(s) if s.fields().is_empty())
}

/// The type's name as the spec writes it, for messages.
pub(crate) fn type_name(ty: &Type) -> String {
    if is_variant(ty) {
        VARIANT.to_owned()
    } else {
        ty.to_string()
    }
}

/// Whether a source column holds JSON: Postgres `json`/`jsonb`, MySQL/MariaDB `JSON`.
pub(crate) fn is_json(col: &Column) -> bool {
    col.data_type == DataType::Utf8
        && matches!(
            col.source_type.to_ascii_lowercase().as_str(),
            "json" | "jsonb"
        )
}

/// Whether the settings store `col` as a variant: a JSON column that `json` (and `json_columns`,
/// when set) chooses.
pub(crate) fn chosen(settings: &TableSettings, col: &Column) -> bool {
    is_json(col) && settings.json_for(&col.name) == JsonAs::Variant
}

/// Refuses a `json_columns` name that is not a JSON column of `table`: a misspelt name would
/// otherwise leave the column a string without a word. Both sinks ask before anything is written.
pub(crate) fn check_json_columns(
    table: &TableSchema,
    settings: &TableSettings,
) -> Result<(), SinkError> {
    let Some(names) = settings.json_columns.as_ref() else {
        return Ok(());
    };
    let json: Vec<&str> = table
        .columns
        .iter()
        .filter(|c| is_json(c))
        .map(|c| c.name.as_str())
        .collect();
    match names.iter().find(|n| !json.contains(&n.as_str())) {
        None => Ok(()),
        Some(name) => {
            Err(SinkError::Data {
                table: table.id.clone(),
                detail: format!(
                "json_columns names {name:?}, which is not a JSON column of the table (its JSON \
                 columns: {}): correct or remove the name in its [sink.tables.\"…\"] section",
                if json.is_empty() { "none".to_owned() } else { json.join(", ") }
            ),
            })
        }
    }
}

/// The Arrow type of a variant column in cdcd's data files.
pub(crate) fn arrow_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("metadata", DataType::Binary, false),
        Field::new("value", DataType::Binary, false),
    ]))
}

/// Whether `dt` is a variant column's Arrow type (cdcd writes no other struct).
fn is_variant_arrow(dt: &DataType) -> bool {
    matches!(dt, DataType::Struct(f) if f.first().is_some_and(|m| m.name() == "metadata"))
}

/// `field` of a data file schema as written: a variant column (the empty struct iceberg maps
/// the [`placeholder`] to) becomes [`arrow_type`] with the extension type that makes the
/// Parquet writer annotate it; other fields are returned as they are.
pub(crate) fn file_field(field: &Field) -> Field {
    match field.data_type() {
        DataType::Struct(f) if f.is_empty() => {
            let mut metadata = field.metadata().clone();
            metadata.insert("ARROW:extension:name".to_owned(), EXTENSION.to_owned());
            metadata.insert("ARROW:extension:metadata".to_owned(), String::new());
            field
                .clone()
                .with_data_type(arrow_type())
                .with_metadata(metadata)
        }
        _ => field.clone(),
    }
}

/// `array` as `to`: JSON text into a variant column, a variant column back into JSON text,
/// anything else by Arrow's cast.
pub(crate) fn cast(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    let from = array.data_type();
    if is_variant_arrow(to) && !is_variant_arrow(from) {
        let text = arrow_cast::cast(array, &DataType::Utf8)?;
        return json_to_variant(&text);
    }
    if is_variant_arrow(from) && !is_variant_arrow(to) {
        let text: ArrayRef = Arc::new(variant_to_json(array)?);
        return arrow_cast::cast(&text, to);
    }
    if is_variant_arrow(from) && from != to {
        return to_file_layout(&unshredded(array)?);
    }
    arrow_cast::cast(array, to)
}

/// JSON texts (`Utf8`) as variant values; SQL NULL stays NULL, JSON `null` is the variant null.
pub(crate) fn json_to_variant(texts: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    let texts = texts
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| ArrowError::CastError(format!("JSON as {}", texts.data_type())))?;
    let mut builder = VariantArrayBuilder::new(texts.len());
    for i in 0..texts.len() {
        if texts.is_null(i) {
            builder.append_null();
        } else {
            append_json(texts.value(i), &mut builder)?;
        }
    }
    to_file_layout(&builder.build())
}

/// `values` with the children as [`arrow_type`] has them (the builder makes binary views).
fn to_file_layout(values: &VariantArray) -> Result<ArrayRef, ArrowError> {
    let inner = values.inner();
    let DataType::Struct(fields) = arrow_type() else {
        return Err(ArrowError::CastError("variant layout".into()));
    };
    let value = values
        .value_field()
        .ok_or_else(|| ArrowError::CastError("a shredded variant without values".into()))?;
    let columns = vec![
        arrow_cast::cast(values.metadata_field(), &DataType::Binary)?,
        arrow_cast::cast(value, &DataType::Binary)?,
    ];
    Ok(Arc::new(StructArray::try_new(
        fields,
        columns,
        inner.nulls().cloned(),
    )?))
}

/// `values` (a file's variant column, shredded or not: `variant_shredding.rs`) with every
/// value whole in `value`.
fn unshredded(values: &ArrayRef) -> Result<VariantArray, ArrowError> {
    let values = VariantArray::try_new(values.as_ref())?;
    match values.typed_value_field() {
        Some(_) => unshred_variant(&values),
        None => Ok(values),
    }
}

/// Variant values as JSON texts; NULL stays NULL.
pub(crate) fn variant_to_json(values: &ArrayRef) -> Result<StringArray, ArrowError> {
    let values = unshredded(values)?;
    let mut texts = Vec::with_capacity(values.len());
    for i in 0..values.len() {
        if values.is_null(i) {
            texts.push(None);
        } else {
            texts.push(Some(values.try_value(i)?.to_json_string()?));
        }
    }
    Ok(StringArray::from(texts))
}

fn invalid(detail: impl std::fmt::Display) -> ArrowError {
    ArrowError::InvalidArgumentError(format!("not JSON: {detail}"))
}

/// Appends the JSON value `text` to `builder` (see the module doc for numbers).
fn append_json(text: &str, builder: &mut impl VariantBuilderExt) -> Result<(), ArrowError> {
    let text = text.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r'));
    match text.as_bytes().first() {
        Some(b'{') => {
            // Duplicate keys (a Postgres `json` value may have them): the last wins, as jsonb.
            let fields: BTreeMap<String, &RawValue> =
                serde_json::from_str(text).map_err(invalid)?;
            let mut object = builder.try_new_object()?;
            for (key, value) in &fields {
                let mut field = ObjectFieldBuilder::new(key, &mut object);
                append_json(value.get(), &mut field)?;
            }
            object.finish();
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).map_err(invalid)?;
            let mut list = builder.try_new_list()?;
            for item in &items {
                append_json(item.get(), &mut list)?;
            }
            list.finish();
        }
        Some(b'"') => {
            let s: String = serde_json::from_str(text).map_err(invalid)?;
            builder.append_value(s.as_str());
        }
        _ => match serde_json::from_str::<Value>(text).map_err(invalid)? {
            Value::Null => builder.append_value(Variant::Null),
            Value::Bool(b) => builder.append_value(b),
            Value::Number(_) => builder.append_value(number(text)?),
            other => return Err(invalid(other)),
        },
    }
    Ok(())
}

/// The most significant digits an exact variant decimal holds.
const MAX_DIGITS: usize = 38;

/// A JSON number's text (already checked to be one) as a variant: see the module doc.
fn number(text: &str) -> Result<Variant<'static, 'static>, ArrowError> {
    if let Ok(i) = text.parse::<i64>() {
        return Ok(smallest_int(i));
    }
    if let Some(exact) = decimal(text) {
        return Ok(exact);
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(Variant::Double(f)),
        _ => Err(invalid(format!(
            "the number {text} is beyond a double's range and has more than {MAX_DIGITS} digits"
        ))),
    }
}

fn smallest_int(i: i64) -> Variant<'static, 'static> {
    if let Ok(v) = i8::try_from(i) {
        Variant::Int8(v)
    } else if let Ok(v) = i16::try_from(i) {
        Variant::Int16(v)
    } else if let Ok(v) = i32::try_from(i) {
        Variant::Int32(v)
    } else {
        Variant::Int64(i)
    }
}

/// `text` as an exact decimal of the smallest width, or an integer when it has no fraction and
/// fits i64 (`1e3`); `None` when it needs more than [`MAX_DIGITS`] digits or scale.
fn decimal(text: &str) -> Option<Variant<'static, 'static>> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits = format!("{int}{frac}");
    let mut scale = i64::try_from(frac.len()).ok()? - exponent;
    if scale < 0 {
        let zeros = usize::try_from(-scale).ok().filter(|z| *z <= MAX_DIGITS)?;
        digits.push_str(&"0".repeat(zeros));
        scale = 0;
    }
    let digits = match digits.trim_start_matches('0') {
        "" => "0",
        d => d,
    };
    if digits.len() > MAX_DIGITS || scale > MAX_DIGITS as i64 {
        return None;
    }
    let magnitude: i128 = digits.parse().ok()?;
    let unscaled = if negative { -magnitude } else { magnitude };
    let scale = u8::try_from(scale).ok()?;
    if scale == 0 {
        if let Ok(i) = i64::try_from(unscaled) {
            return Some(smallest_int(i));
        }
    }
    let width = digits.len().max(usize::from(scale));
    if width <= 9 {
        let v = VariantDecimal4::try_new(i32::try_from(unscaled).ok()?, scale).ok()?;
        Some(v.into())
    } else if width <= 18 {
        let v = VariantDecimal8::try_new(i64::try_from(unscaled).ok()?, scale).ok()?;
        Some(v.into())
    } else {
        VariantDecimal16::try_new(unscaled, scale)
            .ok()
            .map(Into::into)
    }
}

/// `metadata` as the JSON of a metadata file (compact, as Iceberg-Java writes it: pretty-printing
/// was 7.5 % of the CPU in the 1,000-table run, issue 37): the spec's `"variant"` where
/// cdcd's model holds its [`placeholder`]. A table without variant columns is written straight
/// from iceberg's serializer, as before variant existed.
pub(crate) fn metadata_file_bytes(metadata: &TableMetadata) -> Result<Vec<u8>, serde_json::Error> {
    let has_variant = metadata.schemas_iter().any(|s| {
        s.as_struct().fields().iter().any(|f| {
            is_variant(&f.field_type) || crate::sinks::iceberg::geometry::geometry_crs(f).is_some()
        })
    });
    if !has_variant {
        return serde_json::to_vec(metadata);
    }
    let mut json = serde_json::to_value(metadata)?;
    to_spec(&mut json);
    serde_json::to_vec(&json)
}

/// Parses table metadata JSON (a metadata file, a catalog's answer) into cdcd's model.
pub(crate) fn parse_metadata(bytes: &[u8]) -> Result<TableMetadata, serde_json::Error> {
    let mut json: Value = serde_json::from_slice(bytes)?;
    from_spec(&mut json);
    serde_json::from_value(json)
}

/// Rewrites every field's placeholder type in `json` (any JSON holding schemas) to `"variant"`,
/// and geometry columns to theirs (`geometry.rs`).
pub(crate) fn to_spec(json: &mut Value) {
    crate::sinks::iceberg::geometry::to_spec(json);
    rewrite(json, &|ty: &Value| {
        (ty.get("type").and_then(Value::as_str) == Some("struct")
            && ty
                .get("fields")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty))
        .then(|| Value::String(VARIANT.to_owned()))
    });
}

/// Rewrites every field of type `"variant"` in `json` to cdcd's placeholder, and geometry
/// columns to theirs (`geometry.rs`).
pub(crate) fn from_spec(json: &mut Value) {
    crate::sinks::iceberg::geometry::from_spec(json);
    rewrite(json, &|ty: &Value| {
        (ty.as_str() == Some(VARIANT))
            .then(|| serde_json::json!({ "type": "struct", "fields": [] }))
    });
}

/// Replaces the `"type"` of every schema field object (one with `id` and `name`) in `json` with
/// what `replace` gives for it.
fn rewrite(json: &mut Value, replace: &impl Fn(&Value) -> Option<Value>) {
    match json {
        Value::Object(map) => {
            if map.contains_key("id") && map.contains_key("name") {
                if let Some(new) = map.get("type").and_then(replace) {
                    map.insert("type".to_owned(), new);
                }
            }
            for v in map.values_mut() {
                rewrite(v, replace);
            }
        }
        Value::Array(items) => {
            for v in items {
                rewrite(v, replace);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn round_trip(texts: &[Option<&str>]) -> Vec<Option<String>> {
        let input: ArrayRef = Arc::new(StringArray::from(texts.to_vec()));
        let variants = json_to_variant(&input).unwrap();
        assert_eq!(variants.data_type(), &arrow_type());
        let back = variant_to_json(&variants).unwrap();
        back.iter().map(|v| v.map(str::to_owned)).collect()
    }

    fn parsed(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn json_values_come_back_equal() {
        let texts = [
            Some(r#"{"a": 1, "b": [true, null, "x"], "c": {"d": -2.5}}"#),
            Some("[]"),
            Some("{}"),
            Some("null"),
            None,
            Some(r#""caf\u00e9 \ud83d\ude00 ü""#),
            Some("12"),
            Some("-40000"),
            Some("9007199254740993"),
            Some("true"),
        ];
        let back = round_trip(&texts);
        for (t, b) in texts.iter().zip(&back) {
            match (t, b) {
                (None, None) => {}
                (Some(t), Some(b)) => assert_eq!(parsed(t), parsed(b), "{t} came back as {b}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            back[3].as_deref(),
            Some("null"),
            "JSON null is not SQL NULL"
        );
        assert_eq!(back[4], None);
        // An exponent with no fraction left is an integer.
        assert_eq!(round_trip(&[Some("1.5e3")])[0].as_deref(), Some("1500"));
    }

    #[test]
    fn numbers_keep_their_digits() {
        let texts = [
            "12345678901234567890",
            "-0.1000000000000000000001",
            "123456789012345678901234567890.12345678",
            "1.10",
            "1e-30",
        ];
        let back = round_trip(&texts.map(Some));
        let exact = |s: &str| -> String {
            // Compares numbers by value: the digits, with the decimal point and trailing zeros
            // normalized.
            let v: f64 = s.parse().unwrap();
            format!("{v:e}")
        };
        assert_eq!(back[0].as_deref(), Some("12345678901234567890"));
        assert_eq!(back[1].as_deref(), Some("-0.1000000000000000000001"));
        assert_eq!(
            back[2].as_deref(),
            Some("123456789012345678901234567890.12345678")
        );
        assert_eq!(exact(back[3].as_deref().unwrap()), exact("1.1"));
        assert_eq!(exact(back[4].as_deref().unwrap()), exact("1e-30"));
        // Beyond 38 digits: a double, the nearest one.
        let huge = round_trip(&[Some("1e300")]);
        assert_eq!(exact(huge[0].as_deref().unwrap()), exact("1e300"));
    }

    #[test]
    fn rejects_what_is_not_json() {
        let input: ArrayRef = Arc::new(StringArray::from(vec!["{nope"]));
        assert!(json_to_variant(&input).is_err());
    }

    #[test]
    fn a_decoded_variant_reads_back_through_cast() {
        let input: ArrayRef = Arc::new(StringArray::from(vec![Some(r#"{"k":[1,2]}"#), None]));
        let v = cast(&input, &arrow_type()).unwrap();
        let text = cast(&v, &DataType::Utf8).unwrap();
        let text = text.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(text.value(0), r#"{"k":[1,2]}"#);
        assert!(text.is_null(1));
    }

    #[test]
    fn metadata_names_the_type_variant() {
        let mut json = serde_json::json!({
            "schemas": [{"fields": [
                {"id": 1, "name": "id", "required": true, "type": "long"},
                {"id": 2, "name": "doc", "required": false, "type": {"type": "struct", "fields": []}}
            ]}],
            "refs": {"main": {"type": "branch", "snapshot-id": 1}}
        });
        let original = json.clone();
        to_spec(&mut json);
        assert_eq!(json["schemas"][0]["fields"][1]["type"], "variant");
        assert_eq!(json["schemas"][0]["fields"][0]["type"], "long");
        assert_eq!(json["refs"]["main"]["type"], "branch");
        from_spec(&mut json);
        assert_eq!(json, original);
    }

    #[test]
    fn json_columns_choose_which_json_columns_are_variants() {
        use crate::sinks::iceberg::schema::iceberg_schema_for;
        use crate::test_fixtures::{column, table, table_settings};
        let t = table(
            "public",
            "t",
            vec![
                column("id", DataType::Int64, false, "int8"),
                column("a", DataType::Utf8, true, "jsonb"),
                column("b", DataType::Utf8, true, "json"),
                column("s", DataType::Utf8, true, "text"),
            ],
            vec![0],
        );
        let settings = |columns: &[&str]| {
            let names: Vec<String> = columns.iter().map(|c| format!("{c:?}")).collect();
            let section = format!("json = \"variant\"\njson_columns = [{}]", names.join(", "));
            table_settings(&t.id, &section)
        };
        let schema = iceberg_schema_for(&t, &settings(&["b"])).unwrap();
        let fields = schema.as_struct().fields();
        assert!(
            !is_variant(&fields[1].field_type),
            "a is not named: a string"
        );
        assert!(is_variant(&fields[2].field_type));
        for wrong in ["s", "c"] {
            let e = iceberg_schema_for(&t, &settings(&["a", wrong]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("json_columns names {wrong:?}"))
                    && e.contains("its JSON columns: a, b"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_jsonb_column_is_a_variant_in_the_schema_the_metadata_and_the_parquet_file() {
        use crate::sinks::iceberg::files::{decode, encode};
        use crate::sinks::iceberg::schema::{data_file_schema, iceberg_schema_as};
        use crate::test_fixtures::{column, table};
        let t = table(
            "public",
            "t",
            vec![
                column("id", DataType::Int64, false, "int8"),
                column("jb", DataType::Utf8, true, "jsonb"),
                column("s", DataType::Utf8, true, "text"),
            ],
            vec![0],
        );
        let plain = crate::config::SpatialAs::Plain;
        let schema = iceberg_schema_as(&t, crate::config::JsonAs::Variant, plain).unwrap();
        let fields = schema.as_struct().fields();
        assert!(is_variant(&fields[1].field_type));
        assert!(
            !is_variant(&fields[2].field_type),
            "a text column stays a string"
        );
        let strings = iceberg_schema_as(&t, crate::config::JsonAs::String, plain).unwrap();
        assert!(!is_variant(&strings.as_struct().fields()[1].field_type));

        // Table metadata: "variant" on disk, the placeholder in memory, nothing else changed.
        let meta = crate::sinks::iceberg::commit::publish::new_table(
            &t.id,
            "file:///tmp/t",
            schema.clone(),
            iceberg::spec::FormatVersion::V3,
            std::collections::HashMap::new(),
        )
        .unwrap();
        let bytes = metadata_file_bytes(&meta).unwrap();
        let on_disk: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(on_disk["schemas"][0]["fields"][1]["type"], "variant");
        assert_eq!(on_disk["schemas"][0]["fields"][2]["type"], "string");
        assert_eq!(parse_metadata(&bytes).unwrap(), meta);

        // The data file: a VARIANT-annotated group, read back as the same JSON.
        let file_schema = data_file_schema(&schema).unwrap();
        let texts: ArrayRef = Arc::new(StringArray::from(vec![
            Some(r#"{"a":[1,2.5,null]}"#),
            Some("null"),
            None,
        ]));
        let columns = vec![
            Arc::new(arrow_array::Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            cast(&texts, file_schema.field(1).data_type()).unwrap(),
            Arc::new(StringArray::from(vec!["x", "y", "z"])) as ArrayRef,
        ];
        let batch = arrow_array::RecordBatch::try_new(file_schema.clone(), columns).unwrap();
        let parquet = encode::encode_parquet(&[batch]).unwrap();
        let reader = parquet::file::reader::SerializedFileReader::new(parquet.clone()).unwrap();
        use parquet::file::reader::FileReader;
        let root = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .root_schema()
            .clone();
        let group = &root.get_fields()[1];
        assert!(
            matches!(
                group.get_basic_info().logical_type_ref(),
                Some(parquet::basic::LogicalType::Variant { .. })
            ),
            "{group:?}"
        );
        assert_eq!(
            group.get_basic_info().id(),
            2,
            "the field id is on the group"
        );
        let back = decode::decode(&parquet, "t.parquet", None).unwrap();
        let text = cast(back[0].column(1), &DataType::Utf8).unwrap();
        let text = text.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(text.value(0), r#"{"a":[1,2.5,null]}"#);
        assert_eq!(text.value(1), "null");
        assert!(text.is_null(2));
    }
}
