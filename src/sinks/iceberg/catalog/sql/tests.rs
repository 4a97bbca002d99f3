//! The SQL catalog's statements and its commit protocol on SQLite (a temp file): create,
//! load, swap, a lost race, an orphan file from an update that never happened, a file another
//! writer named.

use std::collections::HashMap;

use iceberg::spec::{FormatVersion, TableMetadata};

use super::*;
use crate::changelog::TableId;
use crate::sinks::iceberg::catalog::TableRef;
use crate::sinks::iceberg::commit::publish;
use crate::test_fixtures::iceberg_id_schema;

struct Bed {
    _dir: tempfile::TempDir,
    db: std::path::PathBuf,
    warehouse: Warehouse,
    location: String,
    id: TableId,
    catalog: SqlCatalog,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("catalog.db");
        let warehouse =
            Warehouse::from_url(&format!("file://{}/wh", dir.path().display())).unwrap();
        let location = warehouse.location(&["shop", "orders"]);
        let catalog = SqlCatalog::new(&SqlUri::Sqlite(db.clone()), "cdcd");
        Bed {
            _dir: dir,
            db,
            warehouse,
            location,
            id: TableId::new("public", "orders"),
            catalog,
        }
    }

    fn table(&self) -> TableRef<'_> {
        TableRef {
            id: &self.id,
            namespace: "shop",
            name: "orders",
            location: &self.location,
        }
    }

    fn metadata(&self) -> TableMetadata {
        let schema = iceberg_id_schema();
        publish::new_table(
            &self.id,
            &self.location,
            schema,
            FormatVersion::V2,
            HashMap::new(),
        )
        .unwrap()
    }

    /// The next metadata on top of `base` (a property change stands for a snapshot).
    fn next(&self, base: &Loaded, n: usize) -> TableMetadata {
        let mut props = HashMap::new();
        props.insert("test.n".to_owned(), n.to_string());
        iceberg::spec::TableMetadataBuilder::new_from_metadata(
            base.metadata.clone(),
            Some(base.location()),
        )
        .set_properties(props)
        .unwrap()
        .build()
        .unwrap()
        .metadata
    }

    fn row(&self) -> (Option<String>, Option<String>) {
        let conn = rusqlite::Connection::open(&self.db).unwrap();
        conn.query_row(
            "SELECT metadata_location, previous_metadata_location FROM iceberg_tables \
             WHERE catalog_name = 'cdcd' AND table_namespace = 'shop' AND table_name = 'orders'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    }

    fn sql(&self, sql: &str) {
        rusqlite::Connection::open(&self.db)
            .unwrap()
            .execute(sql, [])
            .unwrap();
    }
}

fn file_exists(wh: &Warehouse, location: &str) -> bool {
    wh.local_file(location).unwrap().exists()
}

#[tokio::test]
async fn create_registers_the_table_and_its_namespace() {
    let b = Bed::new();
    assert!(b
        .catalog
        .load(&b.warehouse, &b.table())
        .await
        .unwrap()
        .is_none());
    let created = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    assert_eq!(created.version, 1);
    assert_eq!(
        created.file,
        format!("{}/metadata/v1.metadata.json", b.location)
    );
    assert_eq!(b.row(), (Some(created.file.clone()), None));
    let conn = rusqlite::Connection::open(&b.db).unwrap();
    let exists: String = conn
        .query_row(
            "SELECT property_value FROM iceberg_namespace_properties \
             WHERE catalog_name = 'cdcd' AND namespace = 'shop' AND property_key = 'exists'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(exists, "true");
    let loaded = b
        .catalog
        .load(&b.warehouse, &b.table())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((loaded.version, loaded.file), (1, created.file));
    // A second create finds the row: the table exists, and its v1 stays the current one.
    let again = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await;
    assert!(
        matches!(again, Err(SinkError::CommitConflict { .. })),
        "{again:?}"
    );
    assert_eq!(
        b.row().0.unwrap(),
        format!("{}/metadata/v1.metadata.json", b.location)
    );
}

#[tokio::test]
async fn commit_swaps_the_row_and_a_stale_base_conflicts() {
    let b = Bed::new();
    let v1 = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    let v2 = b
        .catalog
        .commit(&b.warehouse, &b.table(), &v1, b.next(&v1, 2))
        .await
        .unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(b.row(), (Some(v2.file.clone()), Some(v1.file.clone())));
    // A writer still on v1 loses: the row names v2, so the update matches nothing.
    let stale = b
        .catalog
        .commit(&b.warehouse, &b.table(), &v1, b.next(&v1, 3))
        .await;
    assert!(
        matches!(stale, Err(SinkError::CommitConflict { .. })),
        "{stale:?}"
    );
    assert_eq!(b.row(), (Some(v2.file.clone()), Some(v1.file.clone())));
    // Its file was written (v3) and is an orphan nothing names; the table loads as v2.
    assert!(file_exists(
        &b.warehouse,
        &format!("{}/metadata/v3.metadata.json", b.location)
    ));
    let loaded = b
        .catalog
        .load(&b.warehouse, &b.table())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(loaded.file, v2.file);
    assert_eq!(
        loaded
            .metadata
            .properties()
            .get("test.n")
            .map(String::as_str),
        Some("2")
    );
}

#[tokio::test]
async fn an_orphan_file_from_an_update_that_never_happened_is_skipped() {
    let b = Bed::new();
    let v1 = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    // A crash after the file, before the update: v2 exists, the row still names v1.
    let orphan = format!("{}/metadata/v2.metadata.json", b.location);
    assert!(
        publish::create_metadata_file(&b.warehouse, &b.id, &orphan, &b.next(&v1, 99))
            .await
            .unwrap()
    );
    let loaded = b
        .catalog
        .load(&b.warehouse, &b.table())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        loaded.file, v1.file,
        "the row, not the highest file, is the truth"
    );
    let next = b
        .catalog
        .commit(&b.warehouse, &b.table(), &loaded, b.next(&loaded, 2))
        .await
        .unwrap();
    assert_eq!(next.version, 3);
    assert_eq!(b.row(), (Some(next.file.clone()), Some(v1.file.clone())));
    assert!(
        file_exists(&b.warehouse, &orphan),
        "an orphan is never deleted by a commit"
    );
}

#[tokio::test]
async fn a_file_another_writer_named_is_loaded_and_committed_on() {
    let b = Bed::new();
    let v1 = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    // Another engine (Iceberg-Java naming) commits on top of v1.
    let theirs = format!("{}/metadata/00005-1f2e.metadata.json", b.location);
    assert!(
        publish::create_metadata_file(&b.warehouse, &b.id, &theirs, &b.next(&v1, 5))
            .await
            .unwrap()
    );
    b.sql(&format!(
        "UPDATE iceberg_tables SET metadata_location = '{theirs}', previous_metadata_location = '{}'",
        v1.file
    ));
    let ours = b
        .catalog
        .commit(&b.warehouse, &b.table(), &v1, b.next(&v1, 6))
        .await;
    assert!(
        matches!(ours, Err(SinkError::CommitConflict { .. })),
        "{ours:?}"
    );
    let loaded = b
        .catalog
        .load(&b.warehouse, &b.table())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((loaded.version, loaded.file.as_str()), (5, theirs.as_str()));
    let next = b
        .catalog
        .commit(&b.warehouse, &b.table(), &loaded, b.next(&loaded, 7))
        .await
        .unwrap();
    assert_eq!(b.row(), (Some(next.file.clone()), Some(theirs)));
    // v2 was this test's own lost attempt above: the next free name follows version 5.
    assert_eq!(next.version, 6);
}

#[tokio::test]
async fn tables_lists_this_catalog_name_only() {
    let b = Bed::new();
    b.catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    b.sql("INSERT INTO iceberg_tables VALUES ('other', 'shop', 'x', 'file:///x', NULL, NULL)");
    let rows = b.catalog.tables().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].namespace.as_str(), rows[0].name.as_str()),
        ("shop", "orders")
    );
}

#[tokio::test]
async fn an_unreachable_database_names_the_uri() {
    let dir = tempfile::tempdir().unwrap();
    let uri = SqlUri::Sqlite(dir.path().join("missing-dir").join("catalog.db"));
    let catalog = SqlCatalog::new(&uri, "cdcd");
    let e = catalog.tables().await.err().unwrap().to_string();
    assert!(e.contains("missing-dir/catalog.db"), "{e}");
}

#[tokio::test]
async fn a_filesystem_table_is_registered_as_it_is() {
    let b = Bed::new();
    let v1 = crate::sinks::iceberg::catalog::filesystem::commit_version(
        &b.warehouse,
        &b.id,
        1,
        b.metadata(),
    )
    .await
    .unwrap();
    let v2 = crate::sinks::iceberg::catalog::filesystem::commit_version(
        &b.warehouse,
        &b.id,
        2,
        b.next(&v1, 2),
    )
    .await
    .unwrap();
    let created = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    assert_eq!(
        (created.version, created.file.as_str()),
        (2, v2.file.as_str())
    );
    assert_eq!(b.row(), (Some(v2.file), None));
}

#[tokio::test]
async fn a_failed_update_is_checked_against_the_row_and_deletes_nothing() {
    let b = Bed::new();
    let v1 = b
        .catalog
        .create(&b.warehouse, &b.table(), b.metadata())
        .await
        .unwrap();
    // Every update of the row fails (as a statement whose answer never comes back would).
    b.sql(
        "CREATE TRIGGER refuse BEFORE UPDATE ON iceberg_tables \
         BEGIN SELECT RAISE(ABORT, 'connection lost'); END",
    );
    let failed = b
        .catalog
        .commit(&b.warehouse, &b.table(), &v1, b.next(&v1, 2))
        .await;
    let e = failed.err().unwrap().to_string();
    assert!(
        e.contains("connection lost") && e.contains("sqlite://"),
        "{e}"
    );
    // The row was read again and still names v1; the file written stays (never deleted).
    assert_eq!(b.row(), (Some(v1.file.clone()), None));
    let written = format!("{}/metadata/v2.metadata.json", b.location);
    assert!(file_exists(&b.warehouse, &written));
    b.sql("DROP TRIGGER refuse");
    let loaded = b
        .catalog
        .load(&b.warehouse, &b.table())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(loaded.file, v1.file);
    let next = b
        .catalog
        .commit(&b.warehouse, &b.table(), &loaded, b.next(&loaded, 3))
        .await
        .unwrap();
    assert_eq!(next.version, 3);
    assert_eq!(b.row(), (Some(next.file), Some(v1.file)));
}
