//! The SQL catalog: Iceberg-Java's `JdbcCatalog` layout, which pyiceberg's `SqlCatalog` shares,
//! on Postgres or SQLite (`sql/driver.rs`). A table is a row of `iceberg_tables` naming its
//! current metadata file; a namespace is a row of `iceberg_namespace_properties` (`exists` =
//! `true`, the property pyiceberg writes for a namespace created without properties).
//!
//! The protocol (docs/catalogs.md argues it):
//! - cdcd writes the metadata file as before, create-if-absent, at the first free
//!   `v<K>.metadata.json` from the base's version + 1 (a taken name is an earlier attempt's
//!   orphan: with this catalog a file is not a commit until a row names it).
//! - **The commit point is the row update**: `UPDATE … SET metadata_location = new,
//!   previous_metadata_location = old WHERE … AND metadata_location = old`. One row: committed.
//!   No row: another writer committed first (`CommitConflict`, or `Fenced` when the winner holds
//!   a newer lease); the file is an orphan nothing names.
//! - An update whose answer is lost (connection dropped, timeout) has an unknown outcome: the row
//!   is read again before anything else. It names our file: committed. It still names the base:
//!   the update is sent again (the same swap; at most [`ATTEMPTS`]). Anything else: lost to
//!   another writer. If the row cannot be read either, the error says the outcome is unknown and
//!   the caller reloads (through this catalog) before its next attempt. No file is ever deleted
//!   here: a file of a commit whose outcome is unknown may be the table's current metadata.
//! - Create is an `INSERT … ON CONFLICT DO NOTHING` of the v1 row: no row inserted means the
//!   table exists (`CommitConflict`; the sink then loads it). A table directory with metadata
//!   but no row (written under the filesystem catalog) is registered as it is.
//! - `version-hint.text` is still written after a committed update, for path-based readers
//!   (DuckDB's `iceberg_scan` on the table directory); it is a hint, the row is the truth.

use iceberg::spec::TableMetadata;

use super::config::SqlUri;
use super::TableRef;
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::files::metadata::{
    metadata_location, read_metadata, version_of_file, Loaded,
};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

pub(crate) mod driver;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

use driver::{DbError, Driver, Postgres};

/// Times an update with a lost answer is sent again after its row still named the base.
const ATTEMPTS: usize = 3;

/// Metadata file names tried past taken ones (orphans of failed attempts) before giving up.
const MAX_PROBE: u64 = 1000;

/// Iceberg-Java `JdbcCatalog`'s tables (its "V1" schema, with `iceberg_type`; pyiceberg reads
/// both V0 and V1, and cdcd's statements never name `iceberg_type`, so a V0 catalog created by
/// another tool works too: NULL means a table for both).
const CREATE_TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS iceberg_tables (\
     catalog_name VARCHAR(255) NOT NULL, \
     table_namespace VARCHAR(255) NOT NULL, \
     table_name VARCHAR(255) NOT NULL, \
     metadata_location VARCHAR(1000), \
     previous_metadata_location VARCHAR(1000), \
     iceberg_type VARCHAR(5), \
     PRIMARY KEY (catalog_name, table_namespace, table_name))",
    "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (\
     catalog_name VARCHAR(255) NOT NULL, \
     namespace VARCHAR(255) NOT NULL, \
     property_key VARCHAR(255) NOT NULL, \
     property_value VARCHAR(1000) NOT NULL, \
     PRIMARY KEY (catalog_name, namespace, property_key))",
];

const SELECT_TABLE: &str = "SELECT metadata_location FROM iceberg_tables \
     WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3";

const LIST_TABLES: &str = "SELECT table_namespace, table_name, metadata_location \
     FROM iceberg_tables WHERE catalog_name = $1 ORDER BY table_namespace, table_name";

const INSERT_NAMESPACE: &str = "INSERT INTO iceberg_namespace_properties \
     (catalog_name, namespace, property_key, property_value) VALUES ($1, $2, 'exists', 'true') \
     ON CONFLICT DO NOTHING";

const INSERT_TABLE: &str = "INSERT INTO iceberg_tables \
     (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location) \
     VALUES ($1, $2, $3, $4, NULL) ON CONFLICT DO NOTHING";

/// The commit point: swaps the row from the base's file (`$5`) to the new one (`$4`).
const SWAP: &str = "UPDATE iceberg_tables \
     SET metadata_location = $4, previous_metadata_location = $5 \
     WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3 \
     AND metadata_location = $5";

/// A table row of the catalog: namespace, name, metadata location.
pub(crate) struct TableRow {
    pub namespace: String,
    pub name: String,
    pub metadata_location: String,
}

/// An Iceberg SQL catalog (see the module doc).
pub(crate) struct SqlCatalog {
    uri: SqlUri,
    name: String,
    driver: Driver,
    /// Set once the catalog's tables are known to exist.
    schema_ready: tokio::sync::OnceCell<()>,
}

impl SqlCatalog {
    pub fn new(uri: &SqlUri, name: &str) -> SqlCatalog {
        let driver = match uri {
            SqlUri::Sqlite(path) => Driver::Sqlite(path.clone()),
            SqlUri::Postgres(pg) => Driver::Postgres(Postgres::new(pg.clone())),
        };
        SqlCatalog {
            uri: uri.clone(),
            name: name.to_owned(),
            driver,
            schema_ready: tokio::sync::OnceCell::new(),
        }
    }

    /// The URI without its password.
    pub fn uri(&self) -> String {
        self.uri.to_string()
    }

    /// The TLS settings of a Postgres catalog, in libpq's words (`None` for SQLite).
    pub fn tls_summary(&self) -> Option<String> {
        match &self.uri {
            SqlUri::Sqlite(_) => None,
            SqlUri::Postgres(pg) => Some(pg.tls.summary()),
        }
    }

    /// How to fix a catalog that cannot be reached or prepared, for `cdcd check`.
    pub fn fix(&self) -> String {
        match &self.uri {
            SqlUri::Sqlite(path) => format!(
                "check sink.catalog.uri: the directory of {} must exist and be writable by cdcd",
                path.display()
            ),
            SqlUri::Postgres(_) => "check sink.catalog.uri (host, port, database, user, password, and TLS: sslmode, sslrootcert) and that this user may CREATE TABLE, SELECT, INSERT and UPDATE in that database".to_owned(),
        }
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> SinkError {
        SinkError::Catalog {
            uri: self.uri(),
            detail: format!("{what}: {e}"),
        }
    }

    /// Creates the catalog's tables when absent (once per process).
    pub async fn ready(&self) -> Result<(), SinkError> {
        self.schema_ready
            .get_or_try_init(|| async {
                for sql in CREATE_TABLES {
                    self.driver
                        .execute(sql, &[])
                        .await
                        .map_err(|e| self.error("creating the catalog tables", e))?;
                }
                Ok::<(), SinkError>(())
            })
            .await
            .map(|_| ())
    }

    /// The metadata location the catalog names for `namespace.table`.
    pub async fn current(&self, namespace: &str, table: &str) -> Result<Option<String>, SinkError> {
        self.ready().await?;
        let rows = self
            .driver
            .query(SELECT_TABLE, &[&self.name, namespace, table])
            .await
            .map_err(|e| self.error(&format!("reading the row of {namespace}.{table}"), e))?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        match row.into_iter().next().flatten() {
            Some(location) => Ok(Some(location)),
            None => Err(self.error(
                &format!("the row of {namespace}.{table}"),
                "metadata_location is NULL (not an Iceberg table cdcd can load)",
            )),
        }
    }

    /// Every table row of this catalog name.
    pub async fn tables(&self) -> Result<Vec<TableRow>, SinkError> {
        self.ready().await?;
        let rows = self
            .driver
            .query(LIST_TABLES, &[&self.name])
            .await
            .map_err(|e| self.error("listing the tables", e))?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                let mut cols = row.into_iter();
                Some(TableRow {
                    namespace: cols.next().flatten()?,
                    name: cols.next().flatten()?,
                    metadata_location: cols.next().flatten()?,
                })
            })
            .collect())
    }

    /// The table's current metadata, read from the file its row names.
    pub async fn load(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
    ) -> Result<Option<Loaded>, SinkError> {
        let Some(file) = self.current(t.namespace, t.name).await? else {
            return Ok(None);
        };
        let metadata = read_metadata(warehouse, &file).await?;
        let version =
            version_of_file(&file).unwrap_or_else(|| metadata.metadata_log().len() as u64 + 1);
        Ok(Some(Loaded {
            version,
            metadata,
            file,
        }))
    }

    /// Registers a new table: the namespace row, the v1 file, then its row (`CommitConflict`
    /// when the table's row exists already). A table directory that already holds metadata (a
    /// table cdcd wrote with the filesystem catalog, or a create that crashed before its row) is
    /// registered as it is, so switching a pipeline to this catalog keeps its tables and
    /// checkpoints.
    pub async fn create(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        metadata: TableMetadata,
    ) -> Result<Loaded, SinkError> {
        self.ready().await?;
        self.driver
            .execute(INSERT_NAMESPACE, &[&self.name, t.namespace])
            .await
            .map_err(|e| self.error(&format!("creating namespace {}", t.namespace), e))?;
        let (loaded, new) = match super::filesystem::load(warehouse, t.location).await? {
            Some(existing) => {
                tracing::info!(table = %t.id, file = %existing.file, "registering the table's existing metadata in the catalog");
                (existing, false)
            }
            None => {
                let (version, file) = self.write_file(warehouse, t, 1, &metadata).await?;
                let loaded = Loaded {
                    version,
                    metadata,
                    file,
                };
                (loaded, true)
            }
        };
        let inserted = self
            .driver
            .execute(
                INSERT_TABLE,
                &[&self.name, t.namespace, t.name, &loaded.file],
            )
            .await;
        let exists = || SinkError::CommitConflict {
            table: t.id.clone(),
            version: loaded.version,
        };
        match inserted {
            Ok(1) => {}
            Ok(_) => return Err(exists()),
            // Unknown outcome: the row tells.
            Err(e) => match self.current_after_lost_answer(t, &e).await? {
                Some(now) if now == loaded.file => {}
                Some(_) => return Err(exists()),
                None => {
                    return Err(self.error(&format!("registering {}.{}", t.namespace, t.name), e))
                }
            },
        }
        if new {
            publish::write_hint(warehouse, t.id, loaded.metadata.location(), loaded.version).await;
        }
        Ok(loaded)
    }

    /// Publishes `next` on top of `base` (see the module doc for the protocol).
    pub async fn commit(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        base: &Loaded,
        next: TableMetadata,
    ) -> Result<Loaded, SinkError> {
        let (version, file) = self
            .write_file(warehouse, t, base.version + 1, &next)
            .await?;
        let landed = Loaded {
            version,
            metadata: next,
            file,
        };
        for attempt in 1..=ATTEMPTS {
            // The lease's fence guards every file write; the update is checked the same way, so a
            // daemon that lost its lease never swaps the row.
            if let Some(fence) = warehouse.fence() {
                fence.check()?;
            }
            let swapped = self
                .driver
                .execute(
                    SWAP,
                    &[&self.name, t.namespace, t.name, &landed.file, &base.file],
                )
                .await;
            let now = match swapped {
                Ok(1) => return self.committed(warehouse, t, landed).await,
                Ok(_) => self.current(t.namespace, t.name).await?,
                Err(e) => {
                    tracing::warn!(table = %t.id, error = %e, attempt, "the catalog update's answer was lost; reading the row to learn its outcome");
                    let now = self.current_after_lost_answer(t, &e).await?;
                    if now.as_deref() == Some(base.file.as_str()) && attempt < ATTEMPTS {
                        continue;
                    }
                    if now.as_deref() == Some(base.file.as_str()) {
                        return Err(self.error(&format!("committing {}", t.id), e));
                    }
                    now
                }
            };
            return match now {
                Some(f) if f == landed.file => {
                    tracing::info!(table = %t.id, file = %f, "commit landed on an earlier attempt");
                    self.committed(warehouse, t, landed).await
                }
                Some(winner) => {
                    Err(publish::lost_to(warehouse, t.id, landed.version, &winner).await)
                }
                None => Err(self.error(
                    &format!("committing {}", t.id),
                    "its row is gone (another writer dropped the table)",
                )),
            };
        }
        Err(self.error(&format!("committing {}", t.id), "no attempt left"))
    }

    /// After the row names `landed`: the hint, for path-based readers.
    async fn committed(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        landed: Loaded,
    ) -> Result<Loaded, SinkError> {
        publish::write_hint(warehouse, t.id, landed.metadata.location(), landed.version).await;
        Ok(landed)
    }

    /// The row's metadata location after a statement whose answer was lost: read again a few
    /// times (the driver reconnects); if it cannot be read, the outcome stays unknown and the
    /// error says so.
    async fn current_after_lost_answer(
        &self,
        t: &TableRef<'_>,
        lost: &DbError,
    ) -> Result<Option<String>, SinkError> {
        let current = || self.current(t.namespace, t.name);
        let reread = match super::read_after_lost_answer(&[0, 500, 2000], current).await {
            Ok(now) => return Ok(now),
            Err(e) => e,
        };
        Err(self.error(
            &format!("outcome of the catalog update of {} unknown", t.id),
            format!("{lost}; reading the row again failed too ({reread}); the next attempt reloads the table through the catalog"),
        ))
    }

    /// Writes `metadata` at the first free `v<K>.metadata.json`, K ≥ `from`.
    async fn write_file(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        from: u64,
        metadata: &TableMetadata,
    ) -> Result<(u64, String), SinkError> {
        for version in from..from.saturating_add(MAX_PROBE) {
            let file = metadata_location(metadata.location(), version);
            if publish::create_metadata_file(warehouse, t.id, &file, metadata).await? {
                return Ok((version, file));
            }
            tracing::info!(table = %t.id, file = %file, "metadata file name taken by a file the catalog does not name (an unfinished commit's); trying the next");
        }
        Err(self.error(
            &format!("writing the metadata of {}", t.id),
            format!(
                "v{from} to v{} are all taken",
                from.saturating_add(MAX_PROBE - 1)
            ),
        ))
    }
}
