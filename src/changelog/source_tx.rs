//! Which source transaction a change belongs to: its position, commit time and id, for the sinks
//! that write them next to the rows (the Iceberg changelog table's `_cdc_position`,
//! `_cdc_commit_ts` and `_cdc_tx`; row metadata).
//!
//! Kept once per run of changes ([`TableChanges::source_tx`](super::TableChanges)), shared by
//! every run of the transaction through an `Arc`: a run never spans two transactions (the
//! assemblers cut runs per transaction, and the pipeline buffers runs as they come, never merging
//! them), so every change of a run has its run's transaction. Nothing per row.

use std::fmt;

use super::gtid::{BinlogFile, MariaGtid};
use super::position::Position;

/// The source transaction of a run of changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTx {
    /// The position the transaction is complete at, as `cdcd.position` writes it (Postgres: the
    /// commit's end LSN; MySQL: the GTID set including the transaction, or `file:pos` after it;
    /// MariaDB: the GTID list including it). A table whose checkpoint covers it holds the change.
    pub position: Position,
    /// Commit time at the source, microseconds since the Unix epoch (MySQL and MariaDB: whole
    /// seconds, as the binlog has them).
    pub commit_micros: i64,
    pub id: TxId,
}

/// A source transaction's own identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxId {
    /// Postgres: the xid of Begin (or of a streamed transaction).
    Xid(u32),
    /// MySQL with GTIDs: `uuid:gno` (`uuid:tag:gno` for a tagged GTID).
    MySqlGtid { sid: String, gno: u64 },
    /// MariaDB with GTIDs: `domain-server-seq`.
    MariaDbGtid(MariaGtid),
    /// MySQL or MariaDB without GTIDs: where the transaction's first event starts in the binlog.
    File(BinlogFile),
}

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxId::Xid(xid) => write!(f, "{xid}"),
            TxId::MySqlGtid { sid, gno } => write!(f, "{sid}:{gno}"),
            TxId::MariaDbGtid(g) => write!(f, "{}-{}-{}", g.domain, g.server, g.seq),
            TxId::File(file) => file.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_as_their_source_writes_them() {
        let ids = [
            (TxId::Xid(742), "742"),
            (
                TxId::MySqlGtid {
                    sid: "3e11fa47-71ca-11e1-9e33-c80aa9429562".into(),
                    gno: 23,
                },
                "3e11fa47-71ca-11e1-9e33-c80aa9429562:23",
            ),
            (
                TxId::MariaDbGtid(MariaGtid {
                    domain: 0,
                    server: 1,
                    seq: 42,
                }),
                "0-1-42",
            ),
            (
                TxId::File(BinlogFile {
                    file: "binlog.000003".into(),
                    pos: 4711,
                }),
                "binlog.000003:4711",
            ),
        ];
        for (id, text) in ids {
            assert_eq!(id.to_string(), text);
        }
    }
}
