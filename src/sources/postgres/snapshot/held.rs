//! Snapshots held open by a plain connection, for the length of a copy.
//!
//! Why: a copy is planned (columns, types, key samples) and copied at one snapshot, so the
//! columns it reads are the columns its rows have. An exported snapshot can be imported only
//! while its exporting transaction is open (Postgres docs, "SET TRANSACTION"), and a slot's
//! exported snapshot lives only until the next command on its replication connection, which
//! cannot run the planner's queries. A [`SnapshotReader`] imports such a snapshot into a plain
//! `REPEATABLE READ` transaction, where the planner's catalog reads see the catalog as of the
//! snapshot. A [`NewSnapshot`] exports a snapshot of its own (when the slot exists already).

use tokio_postgres::Client;

use crate::changelog::Lsn;
use crate::config::PostgresConfig;
use crate::sources::postgres::setup;
use crate::sources::SourceError;

use super::quote_literal;

fn server(context: &str) -> impl FnOnce(tokio_postgres::Error) -> SourceError {
    let context = context.to_owned();
    move |e| SourceError::Server {
        context,
        detail: e.to_string(),
    }
}

/// A read-only transaction at an exported snapshot, for the queries that plan a copy.
pub struct SnapshotReader {
    client: Client,
}

impl SnapshotReader {
    /// Imports the snapshot `name` (its exporter must still hold it).
    pub async fn import(cfg: &PostgresConfig, name: &str) -> Result<Self, SourceError> {
        let client = setup::connect(cfg).await?;
        let begin = format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            quote_literal(name)
        );
        client
            .batch_execute(&begin)
            .await
            .map_err(server("importing the copy's snapshot to plan it"))?;
        Ok(SnapshotReader { client })
    }

    /// The connection whose queries see the snapshot.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub async fn close(self) {
        // The transaction only read.
        let _ = self.client.batch_execute("COMMIT").await;
    }
}

/// A snapshot exported by a plain transaction (when the slot exists already), and the WAL
/// position read after it was taken: every transaction it sees ends at or below `lsn`. Keep it
/// until the copy ends. It runs nothing else: a lock it took would last the whole copy.
pub struct NewSnapshot {
    client: Client,
    pub name: String,
    pub lsn: Lsn,
}

impl NewSnapshot {
    pub async fn export(cfg: &PostgresConfig) -> Result<Self, SourceError> {
        let client = setup::connect(cfg).await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(server("opening the snapshot transaction"))?;
        // The first query takes the transaction's snapshot; the LSN is read after it. The insert
        // position, not the write position: with synchronous_commit = off a commit is visible
        // before its WAL is written.
        let name: String = client
            .query_one("SELECT pg_export_snapshot()", &[])
            .await
            .map_err(server("exporting a snapshot"))?
            .get(0);
        let lsn: String = client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(server("reading the WAL position"))?
            .get(0);
        let lsn = lsn.parse::<Lsn>().map_err(|e| SourceError::Server {
            context: "reading the WAL position".into(),
            detail: e.to_string(),
        })?;
        Ok(NewSnapshot { client, name, lsn })
    }

    pub async fn close(self) {
        // The copy is done; the transaction only held the snapshot.
        let _ = self.client.batch_execute("COMMIT").await;
    }
}
