//! What a test checks straight in an Iceberg table's files, where the readers have no say: the
//! identifier fields its metadata declares, and the kinds of file its data folder holds.

use std::path::Path;

/// The newest `*.metadata.json` of the table declares no identifier fields in any schema (a
/// keyless table is an append table or a multiset).
pub fn assert_no_identifier_fields(table_dir: &Path) {
    let meta = std::fs::read_dir(table_dir.join("metadata"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|f| f.to_string_lossy().ends_with(".metadata.json"))
        .max_by_key(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
        .unwrap();
    let text = std::fs::read_to_string(&meta).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    for s in doc["schemas"].as_array().unwrap() {
        let ids = s["identifier-field-ids"].as_array().map_or(0, Vec::len);
        assert_eq!(ids, 0, "keyless table with identifier fields: {s}");
    }
}

/// No equality delete file was ever written to the table (in a multiset, one would remove every
/// duplicate of a row).
pub fn assert_no_equality_deletes(table_dir: &Path) {
    let eq = std::fs::read_dir(table_dir.join("data"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("eq-deletes"))
        .count();
    assert_eq!(eq, 0, "equality delete files in a multiset table");
}
