//! `[sink.tables.*]`: every error names the file, the key and (where one is known) the table;
//! precedence between sections.

use iceberg::spec::{NullOrder, SortDirection, Transform};

use super::{PartitionField, SortField};
use crate::changelog::TableId;
use crate::config::tests::MINIMAL;
use crate::config::{Config, SinkConfig, TablesConfig};

fn with_sections(sections: &str) -> String {
    format!("{MINIMAL}{sections}")
}

fn lsm_with_sections(sections: &str) -> String {
    format!(
        "{}{sections}",
        MINIMAL.replace("[sink]", "[sink]\nkind = \"lsm\"")
    )
}

fn tables(text: &str) -> TablesConfig {
    match Config::from_toml(text, "p.toml") {
        Ok(c) => match c.sink {
            SinkConfig::Iceberg(ice) => ice.tables,
            SinkConfig::Lsm(lsm) => lsm.tables,
        },
        Err(e) => panic!("refused: {e}\n{text}"),
    }
}

fn error(text: &str) -> String {
    match Config::from_toml(text, "p.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn orders() -> TableId {
    TableId::new("public", "orders")
}

#[test]
fn partition_and_sort_expressions_are_parsed() {
    let t = tables(&with_sections(
        r#"
[sink.tables."public.orders"]
partition_by = ["day(created_at)", "bucket(16, customer_id)", "truncate(name, 4)", "region", "hours(ts)", "void(x)", "identity(y)"]
sort_by = ["customer_id", "id desc", "day(created_at) asc nulls last", "name nulls last", "bucket(4, id) desc nulls first"]
properties = { "write.target-file-size-bytes" = "268435456" }
"#,
    ));
    let s = t.resolve(&orders()).unwrap();
    let p = s.partition_by.unwrap();
    assert_eq!(
        p.origin.to_string(),
        "p.toml: key `sink.tables.\"public.orders\".partition_by`"
    );
    let field = |column: &str, transform| PartitionField {
        column: column.into(),
        transform,
    };
    assert_eq!(
        p.value,
        vec![
            field("created_at", Transform::Day),
            field("customer_id", Transform::Bucket(16)),
            field("name", Transform::Truncate(4)),
            field("region", Transform::Identity),
            field("ts", Transform::Hour),
            field("x", Transform::Void),
            field("y", Transform::Identity),
        ]
    );
    let shown: Vec<String> = p.value.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "day(created_at)",
            "bucket(16, customer_id)",
            "truncate(4, name)",
            "region",
            "hour(ts)",
            "void(x)",
            "y"
        ]
    );
    let sort = |column: &str, transform, direction, null_order| SortField {
        column: column.into(),
        transform,
        direction,
        null_order,
    };
    use NullOrder::{First, Last};
    use SortDirection::{Ascending, Descending};
    assert_eq!(
        s.sort_by.unwrap().value,
        vec![
            sort("customer_id", Transform::Identity, Ascending, First),
            sort("id", Transform::Identity, Descending, Last),
            sort("created_at", Transform::Day, Ascending, Last),
            sort("name", Transform::Identity, Ascending, Last),
            sort("id", Transform::Bucket(4), Descending, First),
        ]
    );
    assert_eq!(
        s.properties
            .get("write.target-file-size-bytes")
            .map(String::as_str),
        Some("268435456")
    );
    // Empty lists are settings too (unpartitioned, unsorted); absent ones are not.
    let t = tables(&with_sections(
        "[sink.tables.\"public.orders\"]\npartition_by = []\n",
    ));
    let s = t.resolve(&orders()).unwrap();
    assert_eq!(s.partition_by.map(|p| p.value), Some(vec![]));
    assert_eq!(s.sort_by, None);
    assert_eq!(s.buckets, None);
}

#[test]
fn bad_expressions_name_the_file_the_key_and_the_entry() {
    for (entry, says) in [
        ("day(created_at", "is missing or misplaced"),
        ("days(created_at) x", "is missing or misplaced"),
        ("week(created_at)", "\"week\" is not a transform"),
        ("bucket(id)", "write bucket(N, column)"),
        ("bucket(a, b)", "write bucket(N, column)"),
        ("bucket(0, id)", "the N must be at least 1"),
        ("truncate(0, name)", "the W must be at least 1"),
        ("day(a, b)", "day takes one column"),
        ("created at", "is not a column name"),
        ("", "is not a column name"),
    ] {
        let e = error(&with_sections(&format!(
            "[sink.tables.\"public.orders\"]\npartition_by = [{entry:?}]\n"
        )));
        assert!(
            e.starts_with("p.toml: key `sink.tables.\"public.orders\".partition_by`: ")
                && e.contains(&format!("{entry:?}"))
                && e.contains(says),
            "{entry}: {e}"
        );
    }
    for (entry, says) in [
        (
            "id descending",
            "write asc or desc, then nulls first or nulls last",
        ),
        ("id desc nulls", "write asc or desc"),
        ("id nulls middle", "write nulls first or nulls last"),
        ("id desc nulls last extra", "write asc or desc"),
        ("month(ts", "is missing or misplaced"),
    ] {
        let e = error(&with_sections(&format!(
            "[sink.tables.\"public.*\"]\nsort_by = [{entry:?}]\n"
        )));
        assert!(
            e.starts_with("p.toml: key `sink.tables.\"public.*\".sort_by`: ") && e.contains(says),
            "{entry}: {e}"
        );
    }
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\npartition_by = [\"day(ts)\", \"days(ts)\"]\n",
    ));
    assert!(e.contains("\"days(ts)\" is listed twice"), "{e}");
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\nsort_by = [\"id\", \"id desc\"]\n",
    ));
    assert!(
        e.contains("\"id desc\" sorts by a field listed before"),
        "{e}"
    );
}

#[test]
fn section_keys_and_unknown_keys_are_refused() {
    for key in ["orders", "a.b.c", ".x", "*"] {
        let e = error(&with_sections(&format!(
            "[sink.tables.{key:?}]\nsort_by = [\"id\"]\n"
        )));
        assert!(
            e.starts_with(&format!(
                "p.toml: key `sink.tables.{key:?}`: is not a table name"
            )),
            "{key}: {e}"
        );
    }
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\ngeometry = \"wkb\"\n",
    ));
    assert!(
        e.contains("unknown key") && e.contains("`partition_by`") && e.contains("public.orders"),
        "{e}"
    );
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\ndeletes = \"sometimes\"\n",
    ));
    assert!(
        e.contains("deletes") && e.contains("use \"hard\" or \"soft\""),
        "{e}"
    );
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\npartition_by = \"day(ts)\"\n",
    ));
    assert!(
        e.contains("partition_by") && e.contains("invalid type"),
        "{e}"
    );
}

#[test]
fn keys_of_the_other_kind_are_refused_with_the_reason() {
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\nbuckets = 8\n",
    ));
    assert!(
        e.starts_with(
            "p.toml: key `sink.tables.\"public.orders\".buckets`: applies to lsm sinks only"
        ) && e.contains("bucket(16, id)"),
        "{e}"
    );
    let e = error(&lsm_with_sections(
        "[sink.tables.\"public.orders\"]\nsort_by = [\"id\"]\n",
    ));
    assert!(
        e.starts_with(
            "p.toml: key `sink.tables.\"public.orders\".sort_by`: applies to iceberg sinks only"
        ),
        "{e}"
    );
    let e = error(&lsm_with_sections(
        "[sink.tables.\"public.orders\"]\nproperties = { a = \"b\" }\n",
    ));
    assert!(
        e.contains(".properties`: applies to iceberg sinks only"),
        "{e}"
    );
    let e = error(&lsm_with_sections(
        "[sink.tables.\"public.orders\"]\npartition_by = [\"day(created_at)\"]\n",
    ));
    assert!(
        e.starts_with(
            "p.toml: key `sink.tables.\"public.orders\".partition_by`: \"day(created_at)\": Paimon"
        ) && e.contains("no partition transforms"),
        "{e}"
    );
    for bad in ["0", "1025"] {
        let e = error(&lsm_with_sections(&format!(
            "[sink.tables.\"public.orders\"]\nbuckets = {bad}\n"
        )));
        assert!(
            e == format!(
                "p.toml: key `sink.tables.\"public.orders\".buckets`: {bad}: use 1 to 1024"
            ),
            "{e}"
        );
    }
    // LSM: columns and buckets are taken; the sink refuses partition_by at start.
    let t = tables(&lsm_with_sections(
        "[sink.tables.\"public.orders\"]\npartition_by = [\"region\"]\nbuckets = 8\n",
    ));
    let s = t.resolve(&orders()).unwrap();
    assert_eq!(s.buckets, Some(8));
    assert_eq!(s.partition_by.map(|p| p.value.len()), Some(1));
}

#[test]
fn table_properties_are_checked_per_section() {
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\nproperties = { \"history.expire.min-snapshots-to-keep\" = \"many\" }\n",
    ));
    assert!(
        e.starts_with("p.toml: key `sink.tables.\"public.orders\".properties`: ")
            && e.contains("many"),
        "{e}"
    );
}

#[test]
fn the_most_specific_section_sets_each_key() {
    let t = tables(&with_sections(
        r#"
[sink.tables."public.*"]
sort_by = ["id"]
properties = { a = "glob", b = "glob" }
[sink.tables."public.ord*"]
partition_by = ["day(created_at)"]
properties = { b = "ord" }
[sink.tables."public.orders"]
partition_by = ["region"]
properties = { c = "exact" }
"#,
    ));
    let s = t.resolve(&orders()).unwrap();
    let p = s.partition_by.unwrap();
    assert_eq!(p.value[0].column, "region");
    assert_eq!(p.origin.key, "sink.tables.\"public.orders\".partition_by");
    let sort = s.sort_by.unwrap();
    assert_eq!(sort.origin.key, "sink.tables.\"public.*\".sort_by");
    let props: Vec<(&str, &str)> = s
        .properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(props, [("a", "glob"), ("b", "ord"), ("c", "exact")]);
    let s = t.resolve(&TableId::new("public", "ordinals")).unwrap();
    assert_eq!(s.partition_by.unwrap().value[0].transform, Transform::Day);
    let s = t.resolve(&TableId::new("other", "orders")).unwrap();
    assert_eq!(s.partition_by, None);
    assert_eq!(s.sort_by, None);
    assert!(s.properties.is_empty());
}

#[test]
fn equally_specific_globs_over_one_table_are_refused_naming_both() {
    let t = tables(&with_sections(
        "[sink.tables.\"public.audit*\"]\nsort_by = [\"id\"]\n[sink.tables.\"public.*t_log\"]\nsort_by = [\"ts\"]\n",
    ));
    let e = t
        .resolve(&TableId::new("public", "audit_log"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("p.toml: key `sink.tables`: public.audit_log matches both")
            && e.contains("\"public.audit*\"")
            && e.contains("\"public.*t_log\"")
            && e.contains("equally specific globs that both set sort_by: add a section [sink.tables.\"public.audit_log\"] or make one glob name more of the table"),
        "{e}"
    );
    // Only where both match, and only for the keys both set.
    assert!(t.resolve(&TableId::new("public", "audit_x")).is_ok());
    let t = tables(&with_sections(
        "[sink.tables.\"public.audit*\"]\nsort_by = [\"id\"]\n[sink.tables.\"public.*t_log\"]\npartition_by = [\"ts\"]\n",
    ));
    assert!(t.resolve(&TableId::new("public", "audit_log")).is_ok());
    // An exact section settles it.
    let t = tables(&with_sections(
        "[sink.tables.\"public.audit*\"]\nsort_by = [\"id\"]\n[sink.tables.\"public.*t_log\"]\nsort_by = [\"ts\"]\n[sink.tables.\"public.audit_log\"]\nsort_by = []\n",
    ));
    assert!(t.resolve(&TableId::new("public", "audit_log")).is_ok());
}

#[test]
fn changelog_deletes_and_row_metadata_default_off_and_resolve_per_section() {
    let t = tables(&with_sections(
        r#"
[sink.tables."public.*"]
changelog = false
deletes = "hard"
row_metadata = false
"#,
    ));
    let s = t.resolve(&orders()).unwrap();
    assert!(!s.changelog && !s.row_metadata);
    assert_eq!(s.deletes, super::Deletes::Hard);
    let s = tables(MINIMAL).resolve(&orders()).unwrap();
    assert!(!s.changelog && !s.row_metadata);
    assert_eq!(s.deletes.to_string(), "hard");
}

#[test]
fn soft_deletes_and_row_metadata_are_taken_by_both_sinks() {
    let sections = "[sink.tables.\"public.orders\"]\ndeletes = \"soft\"\nrow_metadata = true\n";
    let s = tables(&with_sections(sections)).resolve(&orders()).unwrap();
    assert_eq!(s.deletes, super::Deletes::Soft);
    assert!(s.row_metadata);
    let s = tables(&lsm_with_sections(sections))
        .resolve(&orders())
        .unwrap();
    assert_eq!(s.deletes, super::Deletes::Soft);
    let row_metadata = "[sink.tables.\"public.orders\"]\nrow_metadata = true\n";
    let s = tables(&lsm_with_sections(row_metadata))
        .resolve(&orders())
        .unwrap();
    assert!(s.row_metadata);
}

#[test]
fn json_columns_narrow_json_variant_to_the_columns_they_name() {
    use crate::config::JsonAs;
    let t = tables(&with_sections(
        r#"
[sink.tables."public.*"]
json = "variant"

[sink.tables."public.orders"]
json = "variant"
json_columns = ["payload"]
"#,
    ));
    let s = t.resolve(&orders()).unwrap();
    assert_eq!(s.json_for("payload"), JsonAs::Variant);
    assert_eq!(s.json_for("attrs"), JsonAs::String);
    let all = t.resolve(&TableId::new("public", "events")).unwrap();
    assert_eq!(all.json_columns, None);
    assert_eq!(all.json_for("attrs"), JsonAs::Variant);

    for (section, says) in [
        (r#"json_columns = ["payload"]"#, r#"set json = "variant""#),
        (
            r#"json = "string"
json_columns = ["payload"]"#,
            r#"set json = "variant""#,
        ),
        (
            r#"json = "variant"
json_columns = []"#,
            "names no column",
        ),
        (
            r#"json = "variant"
json_columns = ["a", "a"]"#,
            r#""a" is named twice"#,
        ),
    ] {
        let e = error(&with_sections(&format!(
            "[sink.tables.\"public.orders\"]\n{section}\n"
        )));
        assert!(
            e.contains("sink.tables.\"public.orders\".json_columns") && e.contains(says),
            "{section}: {e}"
        );
    }
}

#[test]
fn json_as_variant_resolves_per_section_and_needs_format_v3() {
    let t = tables(&with_sections(
        r#"
[sink.tables."public.*"]
json = "variant"

[sink.tables."public.orders"]
json = "string"
"#,
    ));
    use crate::config::JsonAs;
    assert_eq!(t.resolve(&orders()).unwrap().json, JsonAs::String);
    let other = TableId::new("public", "events");
    assert_eq!(t.resolve(&other).unwrap().json, JsonAs::Variant);
    let unset = tables(&with_sections(
        "[sink.tables.\"public.orders\"]\nsort_by = [\"id\"]\n",
    ));
    assert_eq!(unset.resolve(&orders()).unwrap().json, JsonAs::String);

    let v2 = MINIMAL.replace("[sink]", "[sink]\ndelete_mode = \"equality\"");
    let e = error(&format!(
        "{v2}[sink.tables.\"public.orders\"]\njson = \"variant\"\n"
    ));
    assert!(
        e.contains("sink.tables.\"public.orders\".json") && e.contains("format v2"),
        "{e}"
    );
    // json = "string" is what a v2 table stores anyway.
    tables(&format!(
        "{v2}[sink.tables.\"public.orders\"]\njson = \"string\"\n"
    ));
    // The LSM sink writes Paimon VARIANT.
    tables(&lsm_with_sections(
        "[sink.tables.\"public.orders\"]\njson = \"variant\"\n",
    ));
    let e = error(&with_sections(
        "[sink.tables.\"public.orders\"]\njson = \"text\"\n",
    ));
    assert!(e.contains("json"), "{e}");
}

#[test]
fn spatial_as_geometry_resolves_per_section_and_is_refused_on_v2_and_lsm() {
    use crate::config::SpatialAs;
    let t = tables(&with_sections(
        "[sink.tables.\"public.*\"]\nspatial = \"geometry\"\n",
    ));
    assert_eq!(t.resolve(&orders()).unwrap().spatial, SpatialAs::Geometry);
    let unset = tables(&with_sections(
        "[sink.tables.\"public.orders\"]\nsort_by = [\"id\"]\n",
    ));
    assert_eq!(unset.resolve(&orders()).unwrap().spatial, SpatialAs::Plain);
    let v2 = MINIMAL.replace("[sink]", "[sink]\ndelete_mode = \"equality\"");
    let e = error(&format!(
        "{v2}[sink.tables.\"public.orders\"]\nspatial = \"geometry\"\n"
    ));
    assert!(
        e.contains("sink.tables.\"public.orders\".spatial") && e.contains("format v2"),
        "{e}"
    );
    let e = error(&lsm_with_sections(
        "[sink.tables.\"public.orders\"]\nspatial = \"geometry\"\n",
    ));
    assert!(
        e.contains("iceberg sinks only") && e.contains("Paimon"),
        "{e}"
    );
}

#[test]
fn changelog_retention_takes_days_or_hours_on_iceberg_only() {
    let section =
        |v: &str| format!("[sink.tables.\"public.orders\"]\nchangelog_retention = {v:?}\n");
    for (text, secs) in [("30d", 30 * 86_400), ("36h", 36 * 3_600)] {
        let s = tables(&with_sections(&section(text)))
            .resolve(&orders())
            .unwrap();
        let want = Some(std::time::Duration::from_secs(secs));
        assert_eq!(s.changelog_retention, want, "{text}");
    }
    assert_eq!(
        tables(MINIMAL)
            .resolve(&orders())
            .unwrap()
            .changelog_retention,
        None
    );
    for bad in ["30", "d", "-1d", "1.5d", "30m"] {
        let e = error(&with_sections(&section(bad)));
        assert!(
            e.contains("changelog_retention") && e.contains("30d"),
            "{bad}: {e}"
        );
    }
    let e = error(&lsm_with_sections(&section("30d")));
    assert!(e.contains("applies to iceberg sinks only"), "{e}");
}
