//! The Iceberg REST catalog (Iceberg REST catalog OpenAPI spec): Polaris, Lakekeeper, Nessie,
//! Gravitino, Unity, rustberg. The server owns the table's metadata file; cdcd writes data,
//! manifests and manifest lists as always, and commits by sending the changes from its base
//! metadata to the metadata it built (`rest/updates.rs`) with requirements the server checks
//! atomically.
//!
//! The protocol (docs/catalogs.md argues it):
//! - **Load**: `GET …/namespaces/{ns}/tables/{t}`; 404 is "no such table".
//! - **Create**: the namespace (`POST …/namespaces`, 409 = exists), then `POST …/tables` with
//!   cdcd's schema, properties (`format-version` among them) and location
//!   `<warehouse>/<ns>/<table>`; 409 means another writer created it (`CommitConflict`: the sink
//!   loads theirs). A table directory that already holds metadata (written under the filesystem
//!   catalog) is registered as it is (`POST …/register`), so switching keeps tables and
//!   checkpoints.
//! - **Commit**: `POST …/tables/{t}` with requirements (table UUID, `main`'s snapshot id, and
//!   for schema changes the current schema id and last assigned field id) and updates, and an
//!   `Idempotency-Key` that stays the same when the request is sent again. 200: committed; the
//!   answer's metadata is the table's new state. 409: another writer's commit is current, nothing
//!   of ours is referenced (`CommitConflict`, or `Fenced` when the winner holds a newer lease).
//! - **Unknown outcome** (5xx, timeout, lost connection): the table is loaded again before
//!   anything else. It shows our commit ([`updates::landed`]): committed. It is still at our
//!   base: the same request is sent again (at most [`ATTEMPTS`]). Anything else: another writer
//!   won. If the table cannot be loaded either, the error says the outcome is unknown and the
//!   caller reloads before its next attempt. No file is deleted on an unknown outcome.
//! - **Multi-table commits** ([`RestCatalog::commit_many`]): when `GET /v1/config` lists
//!   `POST /v1/{prefix}/transactions/commit`, the tables of one flush go in one request, all or
//!   nothing (`iceberg/transaction.rs`).

use std::collections::HashMap;

use iceberg::spec::{FormatVersion, TableMetadata};
use reqwest::{Method, StatusCode};

use super::config::RestConfig;
use super::TableRef;
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::files::metadata::{version_of_file, Loaded};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

pub(crate) mod http;
pub(crate) mod updates;
pub(crate) mod wire;

use http::{encode, parse, Client, HttpError, Reply};
use wire::{CommitTable, LoadTable, TableIdentifier};

/// Times a commit whose answer was lost is sent again after the table still showed our base.
const ATTEMPTS: usize = 3;

/// A table of the catalog: namespace and name.
pub(crate) struct ListedTable {
    pub namespace: String,
    pub name: String,
}

/// An Iceberg REST catalog (see the module doc).
pub(crate) struct RestCatalog {
    config: RestConfig,
    client: Result<Client, String>,
}

impl RestCatalog {
    pub fn new(config: &RestConfig) -> RestCatalog {
        RestCatalog {
            config: config.clone(),
            client: Client::new(config).map_err(|e| e.to_string()),
        }
    }

    /// The catalog's URI as configured (tokens travel in headers; a password in the URI is
    /// hidden).
    pub fn uri(&self) -> String {
        if self.config.uri.contains('@') {
            crate::config::redact_url(&self.config.uri)
        } else {
            self.config.uri.clone()
        }
    }

    /// How cdcd signs in, for `cdcd check`.
    pub fn auth_summary(&self) -> String {
        self.config.auth.summary()
    }

    /// How to fix a catalog that cannot be reached or refuses cdcd, for `cdcd check`.
    pub fn fix(&self) -> String {
        "check sink.catalog.uri (the base URI, without /v1), sink.catalog.warehouse, and token or credential; the principal needs to list, create and update namespaces and tables".to_owned()
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> SinkError {
        SinkError::Catalog {
            uri: self.uri(),
            detail: format!("{what}: {e}"),
        }
    }

    fn client(&self) -> Result<&Client, SinkError> {
        self.client
            .as_ref()
            .map_err(|e| self.error("starting the HTTP client", e))
    }

    /// Whether the server offers multi-table commits (`GET /v1/config`).
    pub async fn offers_transactions(&self) -> Result<bool, SinkError> {
        let server = self
            .client()?
            .server()
            .await
            .map_err(|e| self.error("reading the catalog's configuration", e))?;
        Ok(server.transactions)
    }

    fn table_path(namespace: &str, name: &str) -> String {
        format!("namespaces/{}/tables/{}", encode(namespace), encode(name))
    }

    /// The table's current metadata as the catalog answers it (`None`: 404).
    async fn load_table(&self, namespace: &str, name: &str) -> Result<Option<Loaded>, SinkError> {
        let what = format!("loading {namespace}.{name}");
        let reply = self
            .client()?
            .send::<()>(Method::GET, &Self::table_path(namespace, name), None, None)
            .await
            .map_err(|e| self.error(&what, e))?;
        match reply {
            Reply::Ok(body) => {
                let loaded: LoadTable = parse(&body, &what).map_err(|e| self.error(&what, e))?;
                self.loaded(loaded, &what).map(Some)
            }
            Reply::Refused(StatusCode::NOT_FOUND, _) => Ok(None),
            Reply::Refused(status, message) => {
                Err(self.error(&what, format!("{status}: {message}")))
            }
        }
    }

    fn loaded(&self, answer: LoadTable, what: &str) -> Result<Loaded, SinkError> {
        let Some(file) = answer.metadata_location else {
            return Err(self.error(what, "the answer names no metadata-location"));
        };
        let version = version_of_file(&file)
            .unwrap_or_else(|| answer.metadata.metadata_log().len() as u64 + 1);
        Ok(Loaded {
            version,
            metadata: answer.metadata,
            file,
        })
    }

    /// The table's current metadata (`None`: no such table).
    pub async fn load(&self, t: &TableRef<'_>) -> Result<Option<Loaded>, SinkError> {
        self.load_table(t.namespace, t.name).await
    }

    /// Creates the namespace when absent.
    pub async fn create_namespace(&self, namespace: &str) -> Result<(), SinkError> {
        let what = format!("creating namespace {namespace}");
        let body = wire::CreateNamespace {
            namespace: [namespace],
            properties: HashMap::new(),
        };
        let reply = self
            .client()?
            .send(Method::POST, "namespaces", Some(&body), None)
            .await;
        match reply {
            Ok(Reply::Ok(_)) | Ok(Reply::Refused(StatusCode::CONFLICT, _)) => Ok(()),
            Ok(Reply::Refused(status, message)) => {
                Err(self.error(&what, format!("{status}: {message}")))
            }
            // A lost answer: the namespace may exist now; the table's create tells.
            Err(HttpError::Unknown(e)) => {
                tracing::warn!(namespace, error = %e, "creating the namespace: answer lost; going on");
                Ok(())
            }
            Err(e) => Err(self.error(&what, e)),
        }
    }

    /// Registers a new table (see the module doc); `CommitConflict` when it exists already.
    pub async fn create(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        metadata: TableMetadata,
    ) -> Result<Loaded, SinkError> {
        self.create_namespace(t.namespace).await?;
        if let Some(existing) = super::filesystem::load(warehouse, t.location).await? {
            return self.register(t, &existing).await;
        }
        let what = format!("creating {}.{}", t.namespace, t.name);
        let mut properties = metadata.properties().clone();
        let format = match metadata.format_version() {
            FormatVersion::V1 => "1",
            FormatVersion::V2 => "2",
            FormatVersion::V3 => "3",
        };
        properties.insert("format-version".to_owned(), format.to_owned());
        let schema = metadata.current_schema();
        let body = wire::CreateTable {
            name: t.name,
            location: t.location,
            schema: schema.as_ref(),
            partition_spec: metadata.default_partition_spec().as_ref().clone().into(),
            write_order: metadata.default_sort_order().as_ref(),
            stage_create: false,
            properties,
        };
        let path = format!("namespaces/{}/tables", encode(t.namespace));
        let reply = self
            .client()?
            .send(Method::POST, &path, Some(&body), None)
            .await;
        let created = match reply {
            Ok(Reply::Ok(body)) => {
                let answer: LoadTable = parse(&body, &what).map_err(|e| self.error(&what, e))?;
                self.loaded(answer, &what)?
            }
            Ok(Reply::Refused(StatusCode::CONFLICT, _)) => {
                return Err(SinkError::CommitConflict {
                    table: t.id.clone(),
                    version: 1,
                })
            }
            Ok(Reply::Refused(status, message)) => {
                return Err(self.error(&what, format!("{status}: {message}")))
            }
            // Whoever created it, the sink loads it next.
            Err(HttpError::Unknown(e)) => {
                tracing::warn!(table = %t.id, error = %e, "creating the table: answer lost; loading it");
                return Err(SinkError::CommitConflict {
                    table: t.id.clone(),
                    version: 1,
                });
            }
            Err(e) => return Err(self.error(&what, e)),
        };
        same_schema(&metadata, &created.metadata)
            .map_err(|e| self.error(&what, format!("the catalog changed the schema: {e}")))?;
        Ok(created)
    }

    /// Registers a table directory's existing metadata under the table's name.
    async fn register(&self, t: &TableRef<'_>, existing: &Loaded) -> Result<Loaded, SinkError> {
        tracing::info!(table = %t.id, file = %existing.file, "registering the table's existing metadata in the catalog");
        let what = format!("registering {}.{}", t.namespace, t.name);
        let body = wire::RegisterTable {
            name: t.name,
            metadata_location: &existing.file,
        };
        let path = format!("namespaces/{}/register", encode(t.namespace));
        match self
            .client()?
            .send(Method::POST, &path, Some(&body), None)
            .await
        {
            Ok(Reply::Ok(body)) => {
                let answer: LoadTable = parse(&body, &what).map_err(|e| self.error(&what, e))?;
                self.loaded(answer, &what)
            }
            Ok(Reply::Refused(StatusCode::CONFLICT, _)) | Err(HttpError::Unknown(_)) => {
                Err(SinkError::CommitConflict {
                    table: t.id.clone(),
                    version: existing.version,
                })
            }
            Ok(Reply::Refused(status, message)) => {
                Err(self.error(&what, format!("{status}: {message}")))
            }
            Err(e) => Err(self.error(&what, e)),
        }
    }

    /// Publishes `next` on top of `base` (see the module doc for the protocol).
    pub async fn commit(
        &self,
        warehouse: &Warehouse,
        t: &TableRef<'_>,
        base: &Loaded,
        next: TableMetadata,
    ) -> Result<Loaded, SinkError> {
        let what = format!("committing {}", t.id);
        let changes = updates::between(&base.metadata, &next).map_err(|e| self.error(&what, e))?;
        let request = CommitTable {
            identifier: TableIdentifier {
                namespace: vec![t.namespace.to_owned()],
                name: t.name.to_owned(),
            },
            requirements: changes.requirements,
            updates: changes.updates,
        };
        let key = uuid::Uuid::new_v4().to_string();
        let path = Self::table_path(t.namespace, t.name);
        for attempt in 1..=ATTEMPTS {
            // The lease's fence guards every file write; the commit is checked the same way.
            if let Some(fence) = warehouse.fence() {
                fence.check()?;
            }
            let reply = self
                .client()?
                .send(Method::POST, &path, Some(&request), Some(&key))
                .await;
            match reply {
                Ok(Reply::Ok(body)) => {
                    let answer: LoadTable =
                        parse(&body, &what).map_err(|e| self.error(&what, e))?;
                    let landed = self.loaded(answer, &what)?;
                    // A server that applied the updates otherwise (another schema id, fields
                    // renumbered, another head) leaves a table cdcd's files do not match: stop.
                    if head(&landed.metadata) != head(&next) {
                        return Err(self.error(
                            &what,
                            "committed, but main's head is not the snapshot cdcd sent; stopping",
                        ));
                    }
                    same_schema(&next, &landed.metadata).map_err(|e| {
                        self.error(&what, format!("committed, but the catalog's current schema is not the one cdcd sent ({e}); stopping"))
                    })?;
                    return Ok(landed);
                }
                Ok(Reply::Refused(StatusCode::CONFLICT, message)) => {
                    tracing::info!(table = %t.id, detail = %message, "the catalog refused the commit: another writer committed first");
                    return Err(self.lost(warehouse, t, base).await);
                }
                Ok(Reply::Refused(StatusCode::NOT_FOUND, message)) => {
                    return Err(self.error(
                        &what,
                        format!("the table is gone (another writer dropped it?): {message}"),
                    ))
                }
                Ok(Reply::Refused(status, message)) => {
                    return Err(self.error(&what, format!("{status}: {message}")))
                }
                Err(HttpError::Failed(e)) => return Err(self.error(&what, e)),
                Err(HttpError::Unknown(e)) => {
                    tracing::warn!(table = %t.id, error = %e, attempt, "the commit's answer was lost; loading the table to learn its outcome");
                    let now = self.load_after_lost_answer(t, &e).await?;
                    let Some(now) = now else {
                        return Err(
                            self.error(&what, "the table is gone (another writer dropped it?)")
                        );
                    };
                    if updates::landed(&base.metadata, &next, &now.metadata) {
                        tracing::info!(table = %t.id, file = %now.file, "commit landed on an earlier attempt");
                        return Ok(now);
                    }
                    if head(&now.metadata) != head(&base.metadata) {
                        return Err(
                            publish::lost_to(warehouse, t.id, base.version + 1, &now.file).await,
                        );
                    }
                    if attempt == ATTEMPTS {
                        return Err(self.error(&what, e));
                    }
                }
            }
        }
        Err(self.error(&what, "no attempt left"))
    }

    /// Publishes several tables' `next` on top of their `base` in one catalog transaction
    /// (`POST …/transactions/commit`: all or nothing); the tables' new metadata, in `items`'
    /// order. The same outcome rules as [`RestCatalog::commit`], over all tables: a 409 is a
    /// conflict; a lost answer is settled by loading every table: all show their commit
    /// (committed), none does and every `main` is where it was (sent again), none does and some
    /// `main` moved (lost to another writer).
    pub async fn commit_many(
        &self,
        warehouse: &Warehouse,
        items: &[(TableRef<'_>, &Loaded, &TableMetadata)],
    ) -> Result<Vec<Loaded>, SinkError> {
        let what = format!("committing {} tables in one transaction", items.len());
        let mut changes = Vec::with_capacity(items.len());
        for (t, base, next) in items {
            let c = updates::between(&base.metadata, next)
                .map_err(|e| self.error(&format!("committing {}", t.id), e))?;
            changes.push(CommitTable {
                identifier: TableIdentifier {
                    namespace: vec![t.namespace.to_owned()],
                    name: t.name.to_owned(),
                },
                requirements: c.requirements,
                updates: c.updates,
            });
        }
        let request = wire::CommitTransaction {
            table_changes: &changes,
        };
        let key = uuid::Uuid::new_v4().to_string();
        for attempt in 1..=ATTEMPTS {
            if let Some(fence) = warehouse.fence() {
                fence.check()?;
            }
            let reply = self
                .client()?
                .send(
                    Method::POST,
                    "transactions/commit",
                    Some(&request),
                    Some(&key),
                )
                .await;
            let lost = match reply {
                Ok(Reply::Ok(_)) => return self.committed_many(items, &what).await,
                Ok(Reply::Refused(StatusCode::CONFLICT, message)) => {
                    tracing::info!(tables = items.len(), detail = %message, "the catalog refused the transaction: another writer committed first");
                    return Err(self.lost_many(warehouse, items).await);
                }
                Ok(Reply::Refused(status, message)) => {
                    return Err(self.error(&what, format!("{status}: {message}")))
                }
                Err(HttpError::Failed(e)) => return Err(self.error(&what, e)),
                Err(HttpError::Unknown(e)) => e,
            };
            tracing::warn!(tables = items.len(), error = %lost, attempt, "the transaction's answer was lost; loading the tables to learn its outcome");
            let mut landed = 0;
            let mut moved = false;
            for (t, base, next) in items {
                let Some(now) = self.load_after_lost_answer(t, &lost).await? else {
                    return Err(self.error(
                        &what,
                        format!("{} is gone (another writer dropped it?)", t.id),
                    ));
                };
                if updates::landed(&base.metadata, next, &now.metadata) {
                    landed += 1;
                } else if head(&now.metadata) != head(&base.metadata) {
                    moved = true;
                }
            }
            if landed == items.len() {
                tracing::info!(
                    tables = items.len(),
                    "the transaction landed on an earlier attempt"
                );
                return self.committed_many(items, &what).await;
            }
            if landed > 0 {
                return Err(self.error(&what, format!("the catalog applied {landed} of {} tables of one transaction; it is not atomic", items.len())));
            }
            if moved {
                return Err(self.lost_many(warehouse, items).await);
            }
            if attempt == ATTEMPTS {
                return Err(self.error(&what, lost));
            }
        }
        Err(self.error(&what, "no attempt left"))
    }

    /// The tables' metadata after their transaction landed (its answer carries none).
    async fn committed_many(
        &self,
        items: &[(TableRef<'_>, &Loaded, &TableMetadata)],
        what: &str,
    ) -> Result<Vec<Loaded>, SinkError> {
        let mut out = Vec::with_capacity(items.len());
        for (t, base, next) in items {
            let now = self.load(t).await?.ok_or_else(|| {
                self.error(what, format!("{} is gone right after the commit", t.id))
            })?;
            if !updates::landed(&base.metadata, next, &now.metadata) {
                return Err(self.error(
                    what,
                    format!(
                        "the catalog answered success but {} does not show the commit",
                        t.id
                    ),
                ));
            }
            same_schema(next, &now.metadata).map_err(|e| {
                self.error(
                    what,
                    format!("committed, but the current schema of {} is not the one cdcd sent ({e}); stopping", t.id),
                )
            })?;
            out.push(now);
        }
        Ok(out)
    }

    /// The error for a transaction another writer beat: the first table whose `main` moved.
    async fn lost_many(
        &self,
        warehouse: &Warehouse,
        items: &[(TableRef<'_>, &Loaded, &TableMetadata)],
    ) -> SinkError {
        for (t, base, _) in items {
            if let Ok(Some(now)) = self.load(t).await {
                if let Some(other) = self.another_table(t, base, &now) {
                    return other;
                }
                if head(&now.metadata) != head(&base.metadata) {
                    return publish::lost_to(warehouse, t.id, base.version + 1, &now.file).await;
                }
            }
        }
        match items.first() {
            Some((t, base, _)) => SinkError::CommitConflict {
                table: t.id.clone(),
                version: base.version + 1,
            },
            None => self.error("committing", "no table"),
        }
    }

    /// The error for a commit the catalog refused with 409: `Fenced` when the table's current
    /// metadata was committed under a newer lease, else `CommitConflict`.
    async fn lost(&self, warehouse: &Warehouse, t: &TableRef<'_>, base: &Loaded) -> SinkError {
        match self.load(t).await {
            Ok(Some(now)) => match self.another_table(t, base, &now) {
                Some(other) => other,
                None => publish::lost_to(warehouse, t.id, base.version + 1, &now.file).await,
            },
            _ => SinkError::CommitConflict {
                table: t.id.clone(),
                version: base.version + 1,
            },
        }
    }

    /// The error for a refused commit whose base is not the catalog's table at all
    /// (`assert-table-uuid` failed: dropped and created again by another engine, or the commit
    /// was built on another table): no writer beat cdcd to a version of it, and planning again
    /// would not help.
    fn another_table(&self, t: &TableRef<'_>, base: &Loaded, now: &Loaded) -> Option<SinkError> {
        let (ours, theirs) = (base.metadata.uuid(), now.metadata.uuid());
        (ours != theirs).then(|| {
            self.error(
                &format!("committing {}", t.id),
                format!("the catalog's table (uuid {theirs}, at {}) is not the one the commit was built on (uuid {ours}, at {}): dropped and created again by another engine? Stopping", now.metadata.location(), base.metadata.location()),
            )
        })
    }

    /// The table after a commit whose answer was lost: loaded a few times; if it cannot be, the
    /// outcome stays unknown and the error says so.
    async fn load_after_lost_answer(
        &self,
        t: &TableRef<'_>,
        lost: &str,
    ) -> Result<Option<Loaded>, SinkError> {
        let reread = match super::read_after_lost_answer(&[200, 1000, 3000], || self.load(t)).await
        {
            Ok(now) => return Ok(now),
            Err(e) => e,
        };
        Err(self.error(
            &format!("outcome of the commit of {} unknown", t.id),
            format!("{lost}; loading the table failed too ({reread}); the next attempt reloads it"),
        ))
    }

    /// Every table of every namespace (one level: cdcd's namespaces are one level).
    pub async fn tables(&self) -> Result<Vec<ListedTable>, SinkError> {
        let mut namespaces = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let path = match &page {
                Some(token) => format!("namespaces?pageToken={}", encode(token)),
                None => "namespaces".to_owned(),
            };
            let body = self.get(&path, "listing namespaces").await?;
            let listed: wire::ListNamespaces = parse(&body, "listing namespaces")
                .map_err(|e| self.error("listing namespaces", e))?;
            namespaces.extend(listed.namespaces.into_iter().map(|n| n.join(".")));
            page = listed.next_page_token.filter(|t| !t.is_empty());
            if page.is_none() {
                break;
            }
        }
        let mut tables = Vec::new();
        for ns in namespaces {
            let what = format!("listing the tables of {ns}");
            let mut page: Option<String> = None;
            loop {
                let mut path = format!("namespaces/{}/tables", encode(&ns));
                if let Some(token) = &page {
                    path.push_str(&format!("?pageToken={}", encode(token)));
                }
                let body = self.get(&path, &what).await?;
                let listed: wire::ListTables =
                    parse(&body, &what).map_err(|e| self.error(&what, e))?;
                tables.extend(listed.identifiers.into_iter().map(|t| ListedTable {
                    namespace: t.namespace.join("."),
                    name: t.name,
                }));
                page = listed.next_page_token.filter(|t| !t.is_empty());
                if page.is_none() {
                    break;
                }
            }
        }
        Ok(tables)
    }

    /// The table `namespace.name`'s current metadata, for `cdcd cleanup`.
    pub async fn load_listed(&self, t: &ListedTable) -> Result<Option<Loaded>, SinkError> {
        self.load_table(&t.namespace, &t.name).await
    }

    async fn get(&self, path: &str, what: &str) -> Result<bytes::Bytes, SinkError> {
        match self
            .client()?
            .send::<()>(Method::GET, path, None, None)
            .await
            .map_err(|e| self.error(what, e))?
        {
            Reply::Ok(body) => Ok(body),
            Reply::Refused(status, message) => {
                Err(self.error(what, format!("{status}: {message}")))
            }
        }
    }
}

/// The snapshot `main` points at.
fn head(meta: &TableMetadata) -> Option<i64> {
    meta.snapshot_for_ref(updates::MAIN)
        .map(|s| s.snapshot_id())
}

/// Checks that the catalog kept the schema cdcd asked for: field ids, names and types (a server
/// may renumber fields on create; cdcd's data files carry its own ids).
fn same_schema(asked: &TableMetadata, got: &TableMetadata) -> Result<(), String> {
    let ids = |m: &TableMetadata| {
        let schema = m.current_schema();
        let mut fields: Vec<(i32, String, String)> = schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| (f.id, f.name.clone(), f.field_type.to_string()))
            .collect();
        fields.sort();
        let mut keys: Vec<i32> = schema.identifier_field_ids().collect();
        keys.sort_unstable();
        (fields, keys)
    };
    let (a, g) = (ids(asked), ids(got));
    if a != g {
        return Err(format!("asked for {a:?}, got {g:?}"));
    }
    Ok(())
}
