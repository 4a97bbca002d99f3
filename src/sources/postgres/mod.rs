//! Postgres source: logical replication with the pgoutput plugin.
//!
//! - `decoder.rs`: pgoutput messages from bytes (pure; protocol v1–v4).
//! - `types.rs`: Postgres types to Arrow, and text values into Arrow builders (pure).
//! - `replication.rs`: the replication connection (pgwire-replication's framing and auth).
//! - `setup.rs`: publication, slot and server checks over a regular connection.
//! - `stream.rs`: decoded messages to changelog transactions (streamed transactions, spill).
//! - `snapshot.rs`: the initial copy of existing rows.

pub mod decoder;
pub mod relation;
pub mod replication;
pub mod setup;
pub mod snapshot;
pub mod stream;
pub mod types;
