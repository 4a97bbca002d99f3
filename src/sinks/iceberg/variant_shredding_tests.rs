#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arrow_array::{Int64Array, StringArray};
use serde_json::Value;

use super::*;
use crate::sinks::iceberg::files::{decode, encode};
use crate::sinks::iceberg::variant;

/// A batch of `id` and the variant column `j` holding `texts`.
fn batch(texts: &[Option<String>]) -> RecordBatch {
    let j = variant::file_field(&Field::new("j", DataType::Struct(Fields::empty()), true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        j,
    ]));
    let input: ArrayRef = Arc::new(StringArray::from(texts.to_vec()));
    let ids: Vec<i64> = (0..texts.len() as i64).collect();
    let columns = vec![
        Arc::new(Int64Array::from(ids)) as ArrayRef,
        variant::json_to_variant(&input).unwrap(),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

fn texts(rows: &[&str]) -> Vec<Option<String>> {
    rows.iter()
        .map(|r| (*r != "NULL").then(|| (*r).to_owned()))
        .collect()
}

fn json(texts: &ArrayRef) -> Vec<Option<Value>> {
    let texts = variant::variant_to_json(texts).unwrap();
    texts
        .iter()
        .map(|t| t.map(|t| serde_json::from_str(t).unwrap()))
        .collect()
}

/// The names and types of the picked fields, `a.b` for nested ones.
fn picked(fields: &[(String, Shape)], prefix: &str, out: &mut Vec<String>) {
    for (name, shape) in fields {
        match shape {
            Shape::Scalar(s) => out.push(format!("{prefix}{name} {s:?}")),
            Shape::Object(inner) => picked(inner, &format!("{prefix}{name}."), out),
        }
    }
}

fn paths(b: &RecordBatch) -> Vec<String> {
    let s = Shredding::pick(b).unwrap();
    let mut out = Vec::new();
    picked(&s.columns[1], "", &mut out);
    out
}

#[test]
fn the_fields_half_the_rows_hold_with_one_type_are_picked() {
    let mut rows = Vec::new();
    for i in 0..10 {
        let m = if i < 6 {
            format!("{i}")
        } else {
            format!("\"{i}\"")
        };
        let rare = if i < 2 { r#", "rare": 1"# } else { "" };
        let o = if i < 8 {
            format!(r#"{{"x": {i}, "y": [1], "z": {{"deep": true}}}}"#)
        } else {
            "7".to_owned()
        };
        rows.push(format!(
            r#"{{"a": {i}, "s": "v{i}", "m": {m}, "o": {o}, "d": 1.{i}5, "f": 1e300, "b": false, "l": [1]{rare}}}"#
        ));
    }
    rows.push("NULL".to_owned());
    let b = batch(&texts(&rows.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(
        paths(&b),
        [
            "a Int",
            "b Boolean",
            "d Decimal(2)",
            "f Double",
            "m Int",
            "o.x Int",
            "o.z.deep Boolean",
            "s String",
        ],
        "an array (l, o.y), a field of fewer than half the rows (rare) and the NULL row do not count"
    );

    // Not objects, or no field in half the rows: not shredded at all.
    let b = batch(&texts(&["1", r#"{"a": 1}"#, "[1]", "\"s\""]));
    assert!(paths(&b).is_empty());
    assert_eq!(Shredding::pick(&b).unwrap().apply(&b).unwrap(), b);
}

#[test]
fn at_most_sixteen_fields_a_column_the_most_frequent_first() {
    let rows: Vec<String> = (0..4)
        .map(|r| {
            let fields: Vec<String> = (0..20)
                .filter(|f| r < 2 || *f >= 4)
                .map(|f| format!("\"k{f:02}\": {f}"))
                .collect();
            format!("{{{}}}", fields.join(", "))
        })
        .collect();
    let b = batch(&texts(&rows.iter().map(String::as_str).collect::<Vec<_>>()));
    let got = paths(&b);
    assert_eq!(got.len(), MAX_PATHS);
    assert!(
        got.iter().all(|p| p.as_str() >= "k04"),
        "the fields every row holds go first: {got:?}"
    );
}

/// Every kind of value against the picked types: the shredded file reads back (through
/// Parquet and cdcd's own reader) as the JSON it was written from, and the typed columns hold
/// the values of their type only.
#[tokio::test]
async fn shredded_values_read_back_as_written() {
    let rows = [
        r#"{"a": 1, "s": "x", "o": {"x": 10, "keep": [1]}, "other": {"q": null}}"#,
        r#"{"a": 2, "s": "y", "o": {"x": 11}}"#,
        r#"{"a": 3, "s": "z", "o": {"x": "eleven"}}"#,
        r#"{"a": 4, "s": "w", "o": 5}"#,
        r#"{"a": 9223372036854775807, "s": "", "o": {"x": -1}}"#,
        r#"{"a": "text", "s": 1, "o": {"x": null}}"#,
        r#"{"a": 1.5, "s": null, "o": {}}"#,
        r#"{"a": true, "o": {"x": 12345678901234567890}}"#,
        r#"{"s": "only s"}"#,
        r#"{}"#,
        "null",
        "NULL",
        "[1, {\"a\": 1}]",
        "42",
        r#""a string""#,
    ];
    let regular: Vec<String> = (0..12)
        .map(|i| format!(r#"{{"a": {i}, "s": "r{i}", "o": {{"x": {i}}}}}"#))
        .collect();
    let all: Vec<&str> = rows
        .into_iter()
        .chain(regular.iter().map(String::as_str))
        .collect();
    let b = batch(&texts(&all));
    let expected = json(b.column(1));
    let shredding = Shredding::pick(&b).unwrap();
    assert_eq!(paths(&b), ["a Int", "o.x Int", "s String"]);
    let shredded = shredding.apply(&b).unwrap();
    let j = shredded
        .column(1)
        .as_any()
        .downcast_ref::<StructArray>()
        .unwrap();
    let typed = j.column_by_name("typed_value").unwrap();
    let typed = typed.as_any().downcast_ref::<StructArray>().unwrap();
    let a = typed.column_by_name("a").unwrap();
    let a = a.as_any().downcast_ref::<StructArray>().unwrap();
    let a_typed = a.column_by_name("typed_value").unwrap();
    let a_typed = a_typed.as_any().downcast_ref::<Int64Array>().unwrap();
    let got: Vec<Option<i64>> = a_typed.iter().take(8).collect();
    assert_eq!(
        got,
        [
            Some(1),
            Some(2),
            Some(3),
            Some(4),
            Some(i64::MAX),
            None,
            None,
            None
        ],
        "a string, a decimal and a boolean stay in the field's value"
    );
    assert_eq!(json(shredded.column(1)), expected, "unshredded in memory");

    // Through a Parquet file, as the sink writes and reads it.
    let parquet = encode::encode_parquet(std::slice::from_ref(&b)).unwrap();
    let back = decode::decode(&parquet, "t.parquet", None).unwrap();
    assert_eq!(
        back[0].schema().field(1).data_type(),
        shredded.schema().field(1).data_type()
    );
    assert_eq!(json(back[0].column(1)), expected, "read back from Parquet");
    let text = variant::cast(back[0].column(1), &DataType::Utf8).unwrap();
    let text = text.as_any().downcast_ref::<StringArray>().unwrap();
    assert_eq!(
        text.value(4),
        r#"{"a":9223372036854775807,"o":{"x":-1},"s":""}"#
    );
    let layout = variant::cast(back[0].column(1), &variant::arrow_type()).unwrap();
    assert_eq!(layout.data_type(), &variant::arrow_type());
    assert_eq!(json(&layout), expected, "compaction's unshredded layout");

    // A file written batch by batch (compaction) shreds every batch as its first picks.
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let path = object_store::path::Path::from("t.parquet");
    let (s, at) = (Arc::clone(&store), path.clone());
    let part = b.clone();
    let uploaded = tokio::task::spawn_blocking(move || {
        let mut file = encode::StreamingFile::new(&s, at, &part.slice(0, 5)).unwrap();
        file.write(&part.slice(0, 5)).unwrap();
        file.write(&part.slice(5, part.num_rows() - 5)).unwrap();
        file.finish().unwrap()
    })
    .await
    .unwrap();
    let parquet = object_store::ObjectStoreExt::get(&store, &path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(uploaded.size, parquet.len() as u64);
    let back = decode::decode(&parquet, "t.parquet", None).unwrap();
    let all = arrow_select::concat::concat_batches(&back[0].schema(), &back).unwrap();
    assert_eq!(json(all.column(1)), expected, "streamed");
}
