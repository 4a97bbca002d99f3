//! Iceberg catalogs end to end: a Postgres-source pipeline whose Iceberg sink publishes through
//! `[sink.catalog] kind = "sql"`, on SQLite (a file in the test's temp dir) and on the test bed's
//! Postgres (a database of its own per test), read back through pyiceberg's `SqlCatalog`
//! (`lakecheck.py --sql-catalog`), and through `kind = "rest"` against a real REST catalog server
//! (rustberg), read back by pyiceberg's `RestCatalog` and DuckDB. Also: another writer's commit
//! makes cdcd's next one conflict (it plans again on top, never overwrites), a crash between the
//! metadata file and the row update leaves only an orphan, lost commit answers, expiring tokens.

mod rest;
mod sql;
