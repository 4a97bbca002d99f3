//! Spatial columns as Iceberg v3 `geometry` (`spatial = "geometry"` in `[sink.tables."…"]`,
//! docs/table-settings.md): which source columns are spatial, their CRS, the type in the table's
//! schema, the Parquet form of the values and their bounds in the manifests.
//!
//! The changelog keeps what the sources decode (PostGIS: the hex EWKB text output, `Utf8`;
//! MySQL/MariaDB: WKB after the 4-byte SRID prefix, `Binary`); only the Iceberg sink's file
//! boundary converts, as for variants (`variant.rs`): to ISO WKB when a data file is written
//! ([`cast`] to the file schema), back to the changelog's form when one is read
//! ([`read_back`]: the lookup that completes an update whose unchanged TOAST geometry the source
//! left out). Values are rewritten by `wkb.rs`.
//!
//! **The CRS.** From the column's SRID: PostGIS's typmod (`geometry(Point,4326)` →
//! `EPSG:4326`), a MySQL 8 column's `SRID n`, a MariaDB column's `REF_SYSTEM_ID=n` (the MySQL
//! source names them `point srid 4326`). SRID 0 (PostGIS's "unknown", an unconstrained
//! `geometry`, a MySQL/MariaDB column that declares none) is the spec's default, `OGC:CRS84`
//! (longitude, latitude), which is what SRID-0 data holds in practice; a value that carries
//! another SRID than its column maps to (PostGIS EWKB; a MariaDB value, whose SRID the source
//! keeps as EWKB then, since MariaDB does not enforce `REF_SYSTEM_ID`) is an error naming it,
//! never a mislabeled row.
//!
//! **The schema model.** iceberg 0.10.1's `Type` has no geometry. cdcd holds a geometry column
//! as a `binary` field whose doc is [`MARKER`] and the CRS, and rewrites it to the spec's
//! `"geometry(<crs>)"` where table metadata leaves the process and back where it enters (with
//! the variant rewrite, `variant.rs`). A `binary` bound is its bytes, so the manifests carry
//! the spec's geometry bounds unchanged; the schema iceberg's `ManifestWriter` embeds in each
//! manifest keeps `binary` (readers take a table's schema from its metadata).
//!
//! **What the sources send.** pgoutput and the initial copy send PostGIS's text output, hex
//! EWKB: the copy of a table with a geometry column uses text COPY, as for every type without
//! a binary decoder (`snapshot/binary.rs`), so both paths give the same text. The MySQL source
//! reads binlog and copy bytes (a 4-byte SRID, then WKB) and keeps the WKB.
//!
//! **The Parquet form.** ISO WKB in a `binary` column annotated GEOMETRY (parquet's
//! `geospatial` feature writes the annotation for a field carrying the `geoarrow.wkb` extension
//! type, and the bounding box statistics with it). parquet 58.4.1 writes a non-default CRS into
//! the annotation as a JSON string (quoted); readers here take the CRS from the table schema.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, StringBuilder};
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{ArrowError, DataType, Field};
use iceberg::spec::{Datum, NestedField, PrimitiveType, Type};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use serde_json::Value;

use crate::changelog::{Column, TableSchema};
use crate::sinks::iceberg::wkb;
use crate::sinks::SinkError;

/// The doc of a geometry column in cdcd's schema model; the CRS follows (empty: the default).
const MARKER: &str = "cdcd:geometry:";
/// The Arrow extension type parquet writes as the GEOMETRY annotation.
const EXTENSION: &str = "geoarrow.wkb";
/// The spec's default CRS, which a geometry type without a parameter has.
const DEFAULT_CRS: &str = "OGC:CRS84";

/// What a source column is, spatially.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Spatial {
    /// A geometry with this SRID (0: none declared).
    Geometry { srid: u32 },
    /// PostGIS `geography`.
    Geography,
}

/// Whether `col` is a spatial column, and which: PostGIS `geometry`/`geography` (text, named by
/// the source with its typmod), MySQL/MariaDB `geometry`, `point`, … (binary WKB).
pub(crate) fn spatial(col: &Column) -> Option<Spatial> {
    let ty = col.source_type.to_ascii_lowercase();
    match col.data_type {
        DataType::Utf8 => {
            // `geometry`, `geometry(Point,4326)`, `postgis.geometry(…)`.
            let name = ty.rsplit_once('.').map_or(ty.as_str(), |(_, n)| n);
            let (base, params) = name.split_once('(').unwrap_or((name, ""));
            match base {
                "geography" => Some(Spatial::Geography),
                "geometry" => {
                    let srid = params
                        .trim_end_matches(')')
                        .rsplit_once(',')
                        .and_then(|(_, s)| s.trim().parse::<u32>().ok())
                        .unwrap_or(0);
                    Some(Spatial::Geometry { srid })
                }
                _ => None,
            }
        }
        DataType::Binary => {
            // `point`, or with a declared SRID `point srid 4326` (the MySQL source).
            let (base, srid) = match ty.split_once(" srid ") {
                Some((base, srid)) => (base, srid.trim().parse::<u32>().ok()?),
                None => (ty.as_str(), 0),
            };
            matches!(
                base,
                "geometry"
                    | "point"
                    | "linestring"
                    | "polygon"
                    | "multipoint"
                    | "multilinestring"
                    | "multipolygon"
                    | "geometrycollection"
                    | "geomcollection"
            )
            .then_some(Spatial::Geometry { srid })
        }
        _ => None,
    }
}

/// The CRS of a column of SRID `srid`: `None` for the default.
pub(crate) fn crs(srid: u32) -> Option<String> {
    (srid != 0).then(|| format!("EPSG:{srid}"))
}

/// A geometry column of CRS `crs` in cdcd's schema model.
pub(crate) fn placeholder(field: NestedField, crs: Option<&str>) -> NestedField {
    let mut field = field;
    field.field_type = Box::new(Type::Primitive(PrimitiveType::Binary));
    field.with_doc(format!("{MARKER}{}", crs.unwrap_or("")))
}

/// The CRS of `field` when it is a geometry column (`Some(None)`: the default CRS).
pub(crate) fn geometry_crs(field: &NestedField) -> Option<Option<&str>> {
    let crs = field.doc.as_deref()?.strip_prefix(MARKER)?;
    matches!(*field.field_type, Type::Primitive(PrimitiveType::Binary))
        .then_some((!crs.is_empty()).then_some(crs))
}

/// `field`, the Iceberg field of `col` in `table`, as a geometry when `col` is spatial
/// (`spatial = "geometry"`); refused with the reason where a geometry cannot stand.
pub(crate) fn column_field(
    table: &TableSchema,
    col: &Column,
    field: NestedField,
) -> Result<NestedField, SinkError> {
    let refused = |detail: String| SinkError::Data {
        table: table.id.clone(),
        detail,
    };
    let srid = match spatial(col) {
        None => return Ok(field),
        Some(Spatial::Geography) => {
            return Err(refused(format!(
                "column {} is a PostGIS geography: spatial = \"geometry\" does not write \
                 Iceberg's geography type (no reader here reads it: DuckDB 1.5.5 reads geometry \
                 only, pyiceberg 0.12 and Spark 3.5 neither), so nothing could check the \
                 replica; keep spatial = \"plain\" for this table, or store it as geometry",
                col.name
            )))
        }
        Some(Spatial::Geometry { srid }) => srid,
    };
    let keep = "keep spatial = \"plain\" for this table";
    if field.required {
        return Err(refused(format!(
            "column {} is spatial and part of the primary key: spatial = \"geometry\" cannot \
             apply to it (Iceberg orders and compares no geometry); {keep}",
            col.name
        )));
    }
    if table.primary_key.is_empty() {
        // A keyless table's deletes find their rows by comparing whole rows (`rows/multiset.rs`)
        // with the source's bytes, which a geometry rewritten as ISO WKB does not keep.
        return Err(refused(format!(
            "spatial = \"geometry\" needs a primary key: a delete of a table without one finds \
             its row by comparing whole rows with the source's bytes (column {}), which a \
             geometry rewritten as ISO WKB does not keep; {keep}, or give it a key \
             (source.key_columns)",
            col.name
        )));
    }
    if col.initial_default.is_some() {
        return Err(refused(format!(
            "column {} is spatial and added with a default, which cdcd does not write as a \
             geometry's initial-default; add it without a default, or {keep}",
            col.name
        )));
    }
    Ok(placeholder(field, crs(srid).as_deref()))
}

/// `field`'s type as the spec writes it, for messages.
pub(crate) fn type_name(field: &NestedField) -> String {
    match geometry_crs(field) {
        Some(Some(crs)) => format!("geometry({crs})"),
        Some(None) => "geometry".to_owned(),
        None => crate::sinks::iceberg::variant::type_name(&field.field_type),
    }
}

/// Rewrites every geometry column in `json` (any JSON holding schemas) to the spec's type.
pub(crate) fn to_spec(json: &mut Value) {
    fields(json, &mut |field| {
        let Some(crs) = field
            .get("doc")
            .and_then(Value::as_str)
            .and_then(|d| d.strip_prefix(MARKER))
            .map(str::to_owned)
        else {
            return;
        };
        if field.get("type").and_then(Value::as_str) != Some("binary") {
            return;
        }
        let ty = match crs.as_str() {
            "" => "geometry".to_owned(),
            crs => format!("geometry({crs})"),
        };
        field.insert("type".to_owned(), Value::String(ty));
        field.remove("doc");
    });
}

/// Rewrites every field of type `"geometry"`/`"geometry(<crs>)"` in `json` to cdcd's model.
pub(crate) fn from_spec(json: &mut Value) {
    fields(json, &mut |field| {
        let Some(ty) = field.get("type").and_then(Value::as_str) else {
            return;
        };
        let crs = match ty {
            "geometry" => "",
            _ => match ty
                .strip_prefix("geometry(")
                .and_then(|c| c.strip_suffix(')'))
            {
                Some(crs) => crs.trim(),
                None => return,
            },
        };
        // The default written out is the default.
        let crs = if crs == DEFAULT_CRS { "" } else { crs };
        let doc = format!("{MARKER}{crs}");
        field.insert("type".to_owned(), Value::String("binary".to_owned()));
        field.insert("doc".to_owned(), Value::String(doc));
    });
}

/// Calls `f` on every schema field object (one with `id` and `name`) in `json`.
fn fields(json: &mut Value, f: &mut impl FnMut(&mut serde_json::Map<String, Value>)) {
    match json {
        Value::Object(map) => {
            if map.contains_key("id") && map.contains_key("name") {
                f(map);
            }
            for v in map.values_mut() {
                fields(v, f);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| fields(v, f)),
        _ => {}
    }
}

/// `field` of a data file schema as written: a geometry column (its doc is the [`MARKER`])
/// carries the extension type that makes the Parquet writer annotate it GEOMETRY.
pub(crate) fn file_field(field: Field) -> Field {
    let Some(crs) = field
        .metadata()
        .get("doc")
        .and_then(|d| d.strip_prefix(MARKER))
        .map(str::to_owned)
    else {
        return field;
    };
    let mut metadata = field.metadata().clone();
    metadata.remove("doc");
    let extension = match crs.as_str() {
        "" => serde_json::json!({}),
        crs => serde_json::json!({ "crs": crs }),
    };
    metadata.insert("ARROW:extension:name".to_owned(), EXTENSION.to_owned());
    metadata.insert("ARROW:extension:metadata".to_owned(), extension.to_string());
    field.with_metadata(metadata)
}

/// Whether a file of `schema` has geometry columns (whose bounds [`file_bounds`] reads).
pub(crate) fn has_geometry(schema: &arrow_schema::Schema) -> bool {
    schema.fields().iter().any(|f| file_srid(f).is_some())
}

/// The SRID of a geometry file field (`Some(0)`: the default CRS); `None` for other fields.
fn file_srid(field: &Field) -> Option<u32> {
    if field
        .metadata()
        .get("ARROW:extension:name")
        .map(String::as_str)
        != Some(EXTENSION)
    {
        return None;
    }
    let crs = field
        .metadata()
        .get("ARROW:extension:metadata")
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .and_then(|m| m.get("crs").and_then(Value::as_str).map(str::to_owned));
    Some(match crs.as_deref() {
        None | Some(DEFAULT_CRS) | Some("") => 0,
        Some(crs) => crs
            .strip_prefix("EPSG:")
            .and_then(|n| n.parse().ok())
            .unwrap_or(u32::MAX),
    })
}

/// `array` as `to`: source values (hex EWKB text, WKB) into a geometry column as ISO WKB;
/// anything else as `variant::cast` does it.
pub(crate) fn cast(array: &ArrayRef, to: &Field) -> Result<ArrayRef, ArrowError> {
    let Some(srid) = file_srid(to) else {
        return crate::sinks::iceberg::variant::cast(array, to.data_type());
    };
    let mut out = BinaryBuilder::with_capacity(array.len(), 0);
    let mut append = |value: Option<&[u8]>, hex: bool| -> Result<(), ArrowError> {
        let Some(value) = value else {
            out.append_null();
            return Ok(());
        };
        let bytes;
        let raw = if hex {
            bytes = wkb::from_hex(value).map_err(invalid)?;
            bytes.as_slice()
        } else {
            value
        };
        let iso = wkb::to_iso(raw).map_err(invalid)?;
        match iso.srid {
            Some(s) if s != srid && !(srid == 0 && s == 4326) => {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "a geometry of SRID {s} in a column of {}: the column's CRS comes from its \
                     declared SRID (spatial = \"geometry\")",
                    crs(srid).unwrap_or_else(|| format!("SRID 0 ({DEFAULT_CRS})"))
                )))
            }
            _ => {}
        }
        out.append_value(&iso.bytes);
        Ok(())
    };
    if let Some(texts) = array.as_any().downcast_ref::<StringArray>() {
        for v in texts {
            append(v.map(str::as_bytes), true)?;
        }
    } else {
        let binary = arrow_cast::cast(array, &DataType::Binary)?;
        let Some(values) = binary.as_any().downcast_ref::<BinaryArray>() else {
            return Err(ArrowError::CastError(format!(
                "{} as a geometry",
                array.data_type()
            )));
        };
        for v in values {
            append(v, false)?;
        }
    }
    // iceberg maps `binary` to Arrow's LargeBinary.
    arrow_cast::cast(&out.finish(), to.data_type())
}

fn invalid(e: wkb::WkbError) -> ArrowError {
    ArrowError::InvalidArgumentError(e.to_string())
}

/// `array`, a column of a data file described by `from`, as `to`: a geometry read back as text
/// is its ISO WKB in hex, which [`cast`] reads again (PostGIS's form, without the SRID).
pub(crate) fn read_back(
    array: &ArrayRef,
    from: &Field,
    to: &Field,
) -> Result<ArrayRef, ArrowError> {
    if file_srid(from).is_none() || to.data_type() != &DataType::Utf8 {
        return cast(array, to);
    }
    let binary = arrow_cast::cast(array, &DataType::Binary)?;
    let Some(values) = binary.as_any().downcast_ref::<BinaryArray>() else {
        return Err(ArrowError::CastError("a geometry as text".into()));
    };
    let mut out = StringBuilder::with_capacity(values.len(), 0);
    for v in values {
        match v {
            Some(v) => out.append_value(wkb::to_hex(v)),
            None => out.append_null(),
        }
    }
    Ok(Arc::new(out.finish()))
}

/// Bounds of a data file's columns, by field id.
pub(crate) type Bounds = HashMap<i32, Datum>;

/// The Iceberg lower and upper bounds of every geometry column of `batches` (written in the
/// file schema), by field id: the spec's bound points.
pub(crate) fn bounds(batches: &[RecordBatch]) -> Result<(Bounds, Bounds), ArrowError> {
    let (mut lower, mut upper) = (HashMap::new(), HashMap::new());
    let Some(schema) = batches.first().map(RecordBatch::schema) else {
        return Ok((lower, upper));
    };
    for (i, field) in schema.fields().iter().enumerate() {
        if file_srid(field).is_none() {
            continue;
        }
        let Some(id) = field
            .metadata()
            .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
            .and_then(|v| v.parse::<i32>().ok())
        else {
            continue;
        };
        let mut bbox = wkb::Bbox::default();
        for batch in batches {
            let values = arrow_cast::cast(batch.column(i), &DataType::Binary)?;
            let Some(values) = values.as_any().downcast_ref::<BinaryArray>() else {
                return Err(ArrowError::CastError("geometry values as binary".into()));
            };
            for v in values.iter().flatten() {
                bbox.merge(&wkb::to_iso(v).map_err(invalid)?.bbox);
            }
        }
        if let Some((lo, hi)) = bbox.iceberg_bounds() {
            lower.insert(id, Datum::binary(lo));
            upper.insert(id, Datum::binary(hi));
        }
    }
    Ok((lower, upper))
}

/// [`bounds`] of an encoded Parquet data file: only its geometry columns are decoded (none
/// when it has none: the footer alone is read).
pub(crate) fn file_bounds(bytes: &bytes::Bytes) -> Result<(Bounds, Bounds), ParquetError> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())?;
    let roots: Vec<usize> = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| file_srid(f).is_some())
        .map(|(i, _)| i)
        .collect();
    if roots.is_empty() {
        return Ok((Bounds::new(), Bounds::new()));
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let batches = builder
        .with_projection(mask)
        .build()?
        .collect::<Result<Vec<_>, _>>()?;
    bounds(&batches).map_err(ParquetError::from)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::test_fixtures::column;

    #[test]
    fn spatial_columns_and_their_srid() {
        let pg = |t: &str| spatial(&column("g", DataType::Utf8, true, t));
        assert_eq!(
            pg("geometry(Point,4326)"),
            Some(Spatial::Geometry { srid: 4326 })
        );
        assert_eq!(pg("geometry"), Some(Spatial::Geometry { srid: 0 }));
        assert_eq!(pg("geometry(PointZ)"), Some(Spatial::Geometry { srid: 0 }));
        assert_eq!(
            pg("postgis.geometry(Polygon,3857)"),
            Some(Spatial::Geometry { srid: 3857 })
        );
        assert_eq!(pg("geography(Point,4326)"), Some(Spatial::Geography));
        assert_eq!(pg("text"), None);
        let my = |t: &str| spatial(&column("g", DataType::Binary, true, t));
        assert_eq!(my("point"), Some(Spatial::Geometry { srid: 0 }));
        assert_eq!(
            my("geometry srid 4326"),
            Some(Spatial::Geometry { srid: 4326 })
        );
        assert_eq!(my("blob"), None);
        assert_eq!(my("blob srid 4326"), None);
    }

    #[test]
    fn a_spatial_key_or_keyless_table_is_refused_with_the_reason() {
        use crate::config::{JsonAs, SpatialAs};
        use crate::sinks::iceberg::schema::iceberg_schema_as;
        use crate::test_fixtures::table;
        let cols = || {
            vec![
                column("id", DataType::Int64, false, "int8"),
                column("g", DataType::Binary, false, "point"),
            ]
        };
        let keyed_by_g = table("db", "t", cols(), vec![1]);
        let e = iceberg_schema_as(&keyed_by_g, JsonAs::String, SpatialAs::Geometry)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("column g is spatial and part of the primary key"),
            "{e}"
        );
        let keyless = table("db", "t", cols(), vec![]);
        let e = iceberg_schema_as(&keyless, JsonAs::String, SpatialAs::Geometry)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a primary key"), "{e}");
        // Without the opt-in both stay binary, as before.
        iceberg_schema_as(&keyless, JsonAs::String, SpatialAs::Plain).unwrap();
    }

    #[test]
    fn metadata_names_the_type_geometry_with_its_crs() {
        let mut json = serde_json::json!({"schemas": [{"fields": [
            {"id": 1, "name": "g", "required": false, "type": "binary", "doc": "cdcd:geometry:EPSG:3857"},
            {"id": 2, "name": "h", "required": false, "type": "binary", "doc": "cdcd:geometry:"},
            {"id": 3, "name": "b", "required": false, "type": "binary"}
        ]}]});
        let original = json.clone();
        to_spec(&mut json);
        assert_eq!(
            json["schemas"][0]["fields"][0]["type"],
            "geometry(EPSG:3857)"
        );
        assert!(json["schemas"][0]["fields"][0].get("doc").is_none());
        assert_eq!(json["schemas"][0]["fields"][1]["type"], "geometry");
        assert_eq!(json["schemas"][0]["fields"][2]["type"], "binary");
        from_spec(&mut json);
        assert_eq!(json, original);
    }

    #[test]
    fn values_become_iso_wkb_and_read_back_as_text() {
        let field = file_field(Field::new("g", DataType::LargeBinary, true).with_metadata(
            HashMap::from([("doc".into(), "cdcd:geometry:EPSG:4326".into())]),
        ));
        let texts: ArrayRef = Arc::new(StringArray::from(vec![
            Some("0101000020E6100000000000000000F03F0000000000000040"),
            None,
        ]));
        let iso = cast(&texts, &field).unwrap();
        let back = read_back(&iso, &field, &Field::new("g", DataType::Utf8, true)).unwrap();
        let again = cast(&back, &field).unwrap();
        assert_eq!(&again, &iso);
        assert!(back.is_null(1));
        // A value of another SRID is refused.
        let other: ArrayRef = Arc::new(StringArray::from(vec![
            "0101000020110F0000000000000000F03F0000000000000040",
        ]));
        let e = cast(&other, &field).unwrap_err().to_string();
        assert!(e.contains("SRID 3857") && e.contains("EPSG:4326"), "{e}");
    }

    #[test]
    fn a_geometry_column_is_annotated_in_parquet_and_bounded_in_the_manifest() {
        use crate::sinks::iceberg::files::encode;
        use crate::sinks::iceberg::schema::{data_file_schema, iceberg_schema_as};
        use crate::test_fixtures::table;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let t = table(
            "public",
            "t",
            vec![
                column("id", DataType::Int64, false, "int8"),
                column("g", DataType::Utf8, true, "geometry(Geometry,3857)"),
            ],
            vec![0],
        );
        let json = crate::config::JsonAs::String;
        let schema = iceberg_schema_as(&t, json, crate::config::SpatialAs::Geometry).unwrap();
        assert_eq!(
            type_name(&schema.as_struct().fields()[1]),
            "geometry(EPSG:3857)"
        );
        let plain = iceberg_schema_as(&t, json, crate::config::SpatialAs::Plain).unwrap();
        assert_eq!(type_name(&plain.as_struct().fields()[1]), "string");

        let file_schema = data_file_schema(&schema).unwrap();
        // PostGIS: 'SRID=3857;LINESTRING(1 5, -2 7)', 'SRID=3857;POINT(4 -1)'.
        let line = "0102000020110F000002000000000000000000F03F0000000000001440\
                    00000000000000C00000000000001C40";
        let point = "0101000020110F00000000000000001040000000000000F0BF";
        let texts: ArrayRef = Arc::new(StringArray::from(vec![Some(line), None, Some(point)]));
        let columns = vec![
            Arc::new(arrow_array::Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            cast(&texts, file_schema.field(1)).unwrap(),
        ];
        let batch = RecordBatch::try_new(file_schema.clone(), columns).unwrap();
        let (lower, upper) = bounds(std::slice::from_ref(&batch)).unwrap();
        let xy = |d: &Datum| -> Vec<f64> {
            let iceberg::spec::PrimitiveLiteral::Binary(b) = d.literal() else {
                panic!("{d:?}")
            };
            b.chunks(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        assert_eq!(xy(&lower[&2]), [-2.0, -1.0]);
        assert_eq!(xy(&upper[&2]), [4.0, 7.0]);

        let parquet = encode::encode_parquet(&[batch]).unwrap();
        // Compaction's files: the same bounds, read back from the encoded file.
        assert_eq!(file_bounds(&parquet).unwrap(), (lower, upper));
        let reader = SerializedFileReader::new(parquet).unwrap();
        let root = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .root_schema()
            .clone();
        let g = &root.get_fields()[1];
        assert!(
            matches!(
                g.get_basic_info().logical_type_ref(),
                Some(parquet::basic::LogicalType::Geometry { .. })
            ),
            "{g:?}"
        );
        assert_eq!(g.get_basic_info().id(), 2, "the field id is kept");
    }
}
