//! Where the Iceberg sink finds its tables and publishes their commits: the catalog seam.
//!
//! cdcd builds every snapshot and writes every metadata file itself (`commit/`); a catalog only
//! says which metadata file is a table's current one, and makes a new one current atomically.
//! Three operations:
//! - [`Catalog::load`]: the table's current metadata, or `None` when the table does not exist.
//! - [`Catalog::create`]: register a new table's v1 metadata; `CommitConflict` when the table
//!   exists already (the caller loads it).
//! - [`Catalog::commit`]: make `next` current in place of `base`, atomically. `Ok`: durable and
//!   visible. `CommitConflict` (or `Fenced`): another writer's commit is current; nothing of this
//!   one is referenced. Any other error: the outcome may be unknown; the caller forgets what it
//!   cached and loads again through the catalog before its next attempt, and deletes nothing the
//!   commit wrote.
//!
//! Kinds (`[sink.catalog]`): `filesystem.rs`, the default (the metadata file's create-if-absent
//! is the commit point, when no newer version is listed before and after it), `sql.rs` (an Iceberg JDBC/SQL catalog row; its update is the commit
//! point) and `rest.rs` (an Iceberg REST catalog; the server applies cdcd's changes and writes
//! the metadata file). An enum rather than a trait object: three kinds, all in this crate, and
//! async methods.

use iceberg::spec::TableMetadata;

use crate::changelog::TableId;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

pub mod config;
pub(crate) mod filesystem;
pub(crate) mod rest;
pub(crate) mod sql;

pub use config::CatalogConfig;

/// A table as a catalog names it.
pub(crate) struct TableRef<'a> {
    /// The source table (messages, errors).
    pub id: &'a TableId,
    /// The Iceberg namespace: `sink.namespace`, else the source schema.
    pub namespace: &'a str,
    pub name: &'a str,
    /// `<warehouse>/<namespace>/<table>`.
    pub location: &'a str,
}

/// The configured catalog.
pub(crate) enum Catalog {
    Filesystem,
    /// Boxed: its URI and TLS settings are held twice (for messages and for the driver).
    Sql(Box<sql::SqlCatalog>),
    Rest(Box<rest::RestCatalog>),
}

impl Catalog {
    pub fn new(config: &CatalogConfig) -> Catalog {
        match config {
            CatalogConfig::Filesystem => Catalog::Filesystem,
            CatalogConfig::Sql { uri, name } => {
                Catalog::Sql(Box::new(sql::SqlCatalog::new(uri, name)))
            }
            CatalogConfig::Rest(rest) => Catalog::Rest(Box::new(rest::RestCatalog::new(rest))),
        }
    }

    /// The table's current metadata (`None`: no such table).
    pub async fn load(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
    ) -> Result<Option<Loaded>, SinkError> {
        match self {
            Catalog::Filesystem => filesystem::load(warehouse, t.location).await,
            Catalog::Sql(sql) => sql.load(warehouse, t).await,
            Catalog::Rest(rest) => rest.load(t).await,
        }
    }

    /// Registers a new table whose metadata is `metadata`.
    pub async fn create(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        metadata: TableMetadata,
    ) -> Result<Loaded, SinkError> {
        match self {
            Catalog::Filesystem => filesystem::commit_version(warehouse, t.id, 1, metadata).await,
            Catalog::Sql(sql) => sql.create(warehouse, t, metadata).await,
            Catalog::Rest(rest) => rest.create(warehouse, t, metadata).await,
        }
    }

    /// Makes `next` the table's current metadata in place of `base`.
    pub async fn commit(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        base: &Loaded,
        next: TableMetadata,
    ) -> Result<Loaded, SinkError> {
        match self {
            Catalog::Filesystem => {
                filesystem::commit_version(warehouse, t.id, base.version + 1, next).await
            }
            Catalog::Sql(sql) => sql.commit(warehouse, t, base, next).await,
            Catalog::Rest(rest) => rest.commit(warehouse, t, base, next).await,
        }
    }

    /// Whether the previous metadata file must outlive the metadata log's trimming: the SQL
    /// catalog's row names it (`previous_metadata_location`), so a reader may still open it.
    pub fn names_previous(&self) -> bool {
        matches!(self, Catalog::Sql(_))
    }
}

/// Reads again after a request whose answer was lost, pausing `pauses_ms` before each try: the
/// first answer, or the last error's text once every try failed.
async fn read_after_lost_answer<T, E: std::fmt::Display, F>(
    pauses_ms: &[u64],
    mut read: impl FnMut() -> F,
) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut last = None;
    for &pause_ms in pauses_ms {
        tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
        match read().await {
            Ok(now) => return Ok(now),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map(|e| e.to_string()).unwrap_or_default())
}
