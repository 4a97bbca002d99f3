//! Iceberg catalogs end to end: a Postgres-source pipeline whose Iceberg sink publishes through
//! `[sink.catalog] kind = "sql"`, on SQLite (a file in the test's temp dir) and on the test bed's
//! Postgres (a database of its own per test), read back through pyiceberg's `SqlCatalog`
//! (`lakecheck.py --sql-catalog`), and through `kind = "rest"` against a real REST catalog server
//! (rustberg), read back by pyiceberg's `RestCatalog` and DuckDB. Also: another writer's commit
//! makes cdcd's next one conflict (it plans again on top, never overwrites), a crash between the
//! metadata file and the row update leaves only an orphan, lost commit answers, expiring tokens.
//! And the default filesystem catalog shared with another engine that deletes old metadata
//! files: cdcd never commits beside its newer versions.

mod filesystem;
mod rest;
mod sql;

/// A keyed table with 300 rows.
pub(super) fn create_table(t: &str) -> String {
    format!(
        "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n int4);
         INSERT INTO {t} SELECT g, 'seed ' || g, g FROM generate_series(1, 300) g;"
    )
}

/// Round `round` of changes: inserts, updates, deletes, and a transaction that updates, deletes and
/// re-inserts one key.
pub(super) fn changes(t: &str, round: u32) -> String {
    let base = 1000 * round;
    format!(
        "INSERT INTO {t} SELECT {base} + g, 'new ' || g, g FROM generate_series(1, 200) g;
         UPDATE {t} SET v = 'upd {round}', n = n + 1 WHERE id % 7 = 0;
         DELETE FROM {t} WHERE id % 11 = 0;
         BEGIN; UPDATE {t} SET v = NULL WHERE id = 5; DELETE FROM {t} WHERE id = 6; INSERT INTO {t} VALUES (6, 'again', 6); COMMIT;"
    )
}
