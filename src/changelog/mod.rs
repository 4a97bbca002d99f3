//! The changelog: the one normalized model every source produces and every sink consumes.
//!
//! A source yields [`Transaction`]s; each holds [`TableChanges`] (Arrow batches with per-column
//! presence, so an *absent* column is never confused with NULL) and the [`Position`] at which the
//! transaction is complete.

use std::sync::Arc;

mod change;
mod gtid;
mod key;
mod position;
mod schema;
mod source_tx;

pub use change::{append_null, Op, TableChanges, TableChangesBuilder};
pub use gtid::{BinlogFile, GtidList, GtidSet, MariaGtid};
pub use key::{KeyOrigin, TableKey};
pub use position::{Lsn, ParsePositionError, Position};
pub use schema::{widens, Column, TableId, TableSchema};
pub use source_tx::{SourceTx, TxId};

/// One committed source transaction, in source order.
#[derive(Debug, Clone)]
pub struct Transaction {
    /// The position at which this transaction is entirely applied (Postgres: the commit's end LSN).
    pub position: Position,
    /// Commit time at the source, microseconds since the Unix epoch.
    pub commit_time_micros: i64,
    /// The changes, in order; consecutive changes to one table share one `TableChanges`.
    pub changes: Vec<TableChanges>,
}

impl Transaction {
    /// The transaction `id`, complete at `position`, committed at `commit_time_micros`: each
    /// run of `changes` carries it ([`TableChanges::source_tx`]).
    pub fn new(
        position: Position,
        commit_time_micros: i64,
        id: TxId,
        mut changes: Vec<TableChanges>,
    ) -> Self {
        let tx = Arc::new(SourceTx {
            position: position.clone(),
            commit_micros: commit_time_micros,
            id,
        });
        for run in &mut changes {
            run.source_tx = Some(Arc::clone(&tx));
        }
        Transaction {
            position,
            commit_time_micros,
            changes,
        }
    }

    /// Number of row changes in the transaction.
    pub fn change_count(&self) -> usize {
        self.changes.iter().map(TableChanges::len).sum()
    }
}
