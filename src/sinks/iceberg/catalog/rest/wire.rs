//! The REST catalog's request and response bodies that cdcd sends and reads (Iceberg REST
//! catalog OpenAPI spec, `rest-catalog-open-api.yaml`). The table parts are the `iceberg`
//! crate's own serde types (`TableMetadata`, `Schema`, `TableRequirement`, `TableUpdate`), so
//! what goes on the wire is what iceberg-rust's catalogs send; only the envelopes are declared
//! here, because the `iceberg-catalog-rest` crate keeps its envelopes private to its client.

use std::collections::HashMap;

use iceberg::spec::{Schema, SortOrder, TableMetadata, UnboundPartitionSpec};
use iceberg::{TableRequirement, TableUpdate};
use serde::{Deserialize, Serialize};

/// `GET /v1/config`: `CatalogConfig`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ConfigResponse {
    #[serde(default)]
    pub defaults: HashMap<String, String>,
    #[serde(default)]
    pub overrides: HashMap<String, String>,
    /// The endpoints the server supports (`"POST /v1/{prefix}/transactions/commit"`); absent
    /// from older servers, which then support the spec's original set.
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
}

/// The OAuth2 token endpoint's answer (RFC 6749 §5.1).
#[derive(Debug, Deserialize)]
pub(crate) struct TokenResponse {
    pub access_token: String,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

/// `CreateNamespaceRequest`.
#[derive(Debug, Serialize)]
pub(crate) struct CreateNamespace<'a> {
    pub namespace: [&'a str; 1],
    pub properties: HashMap<String, String>,
}

/// `CreateTableRequest`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CreateTable<'a> {
    pub name: &'a str,
    pub location: &'a str,
    pub schema: &'a Schema,
    pub partition_spec: UnboundPartitionSpec,
    pub write_order: &'a SortOrder,
    pub stage_create: bool,
    pub properties: HashMap<String, String>,
}

/// `RegisterTableRequest`: a table whose metadata file exists already.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct RegisterTable<'a> {
    pub name: &'a str,
    pub metadata_location: &'a str,
}

/// `TableIdentifier`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TableIdentifier {
    pub namespace: Vec<String>,
    pub name: String,
}

/// `CommitTableRequest`, also one element of `CommitTransactionRequest.table-changes`.
#[derive(Debug, Serialize)]
pub(crate) struct CommitTable {
    pub identifier: TableIdentifier,
    pub requirements: Vec<TableRequirement>,
    pub updates: Vec<TableUpdate>,
}

/// `CommitTransactionRequest`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct CommitTransaction<'a> {
    pub table_changes: &'a [CommitTable],
}

/// `LoadTableResult` and `CommitTableResponse` (the latter is its first two fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct LoadTable {
    pub metadata_location: Option<String>,
    pub metadata: TableMetadata,
}

/// `ListNamespacesResponse`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct ListNamespaces {
    pub namespaces: Vec<Vec<String>>,
    #[serde(default)]
    pub next_page_token: Option<String>,
}

/// `ListTablesResponse`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct ListTables {
    pub identifiers: Vec<ListedTable>,
    #[serde(default)]
    pub next_page_token: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListedTable {
    pub namespace: Vec<String>,
    pub name: String,
}

/// `IcebergErrorResponse`: `{"error": {"message", "type", "code"}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorResponse {
    pub error: ErrorModel,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorModel {
    #[serde(default)]
    pub message: String,
    #[serde(default, rename = "type")]
    pub kind: String,
}
