//! Iceberg sink (in progress).
pub mod plan;
pub(crate) mod schema;
