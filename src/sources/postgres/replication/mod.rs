//! The replication connection: a walsender session (`replication=database`) driven with
//! pgwire-replication's framing, auth and CopyData parsing.
//!
//! Where it sits: `mod.rs` opens one of these per run, creates the slot (with an exported snapshot
//! for the initial copy), starts logical replication and then feeds every `XLogData` payload to
//! `assembler/mod.rs`; acknowledged positions go back through [`ReplicationConnection::send_status`].
//!
//! Why not pgwire-replication's `ReplicationClient`: it hardcodes `proto_version '1'`, so it cannot
//! ask for streamed in-progress transactions (protocol 2+) and runs its own feedback policy. cdcd
//! needs both under its control (ack only what is durable, STYLE rule 6), so it speaks the protocol
//! itself with the crate's public building blocks.
//!
//! Connecting and authenticating is `startup.rs`'s (TLS per `sslmode`; trust, cleartext, md5 or
//! SCRAM-SHA-256).

use std::time::Duration;

use bytes::Bytes;
use pgwire_replication::protocol::framing::{
    write_copy_data, write_copy_done, write_query, MessageReader,
};
use pgwire_replication::protocol::messages::ErrorFields;
use pgwire_replication::protocol::replication::{
    parse_copy_data, ReplicationCopyData, PG_EPOCH_MICROS,
};
use pgwire_replication::PgWireError;
use tokio::io::{AsyncWriteExt, BufReader};

use super::startup::{self, SessionKind};
use super::types::TEXT_FORMAT_SETTINGS;
use crate::changelog::Lsn;
use crate::config::PostgresConfig;
use crate::sources::SourceError;
use crate::tls::postgres::stream::PgStream;

pub(super) mod wire;
pub use wire::{create_slot_sql, encode_status, quote_ident, start_replication_sql};
use wire::{
    describe, first_word, now_pg_micros, parse_data_row, parse_lsn, server_error, text_column,
    with_context,
};

/// The startup `options` (`-c name=value …`) that fix the text form of values: the walsender
/// formats tuple values with these GUCs, and `types.rs` parses exactly these forms
/// ([`TEXT_FORMAT_SETTINGS`]: ISO dates, ISO 8601 intervals, UTC, exact floats, hex bytea).
pub fn session_options() -> String {
    TEXT_FORMAT_SETTINGS
        .iter()
        .map(|(k, v)| format!("-c {k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `IDENTIFY_SYSTEM` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemId {
    pub timeline: u32,
    pub xlogpos: Lsn,
    pub dbname: Option<String>,
}

/// Options of `START_REPLICATION … LOGICAL` for pgoutput.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartOptions {
    /// pgoutput `proto_version` (1–4; see `setup::proto_version`).
    pub proto_version: u32,
    /// `publication_names`, in order.
    pub publications: Vec<String>,
    /// Ask for in-progress transactions to be streamed (`streaming 'on'`, protocol ≥ 2).
    pub streaming: bool,
    /// Ask for logical decoding messages (`pg_logical_emit_message`).
    pub messages: bool,
}

/// One message of the CopyBoth stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// A pgoutput message. `wal_end` may be 0 for messages inside a transaction.
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        /// Server clock, microseconds since the Unix epoch.
        server_time: i64,
        data: Bytes,
    },
    /// The server's heartbeat: everything up to `wal_end` has been sent.
    KeepAlive {
        wal_end: Lsn,
        /// Server clock, microseconds since the Unix epoch.
        server_time: i64,
        /// The server wants a status update now (else it drops us at `wal_sender_timeout`).
        reply_requested: bool,
    },
}

/// A walsender session.
pub struct ReplicationConnection {
    /// Buffered so that many small CopyData frames cost one syscall; `BufReader` passes writes
    /// straight through.
    stream: BufReader<PgStream>,
    /// Keeps a partial frame across cancelled `recv` calls (cancel safety).
    reader: MessageReader,
    target: String,
    streaming: bool,
    /// Major version from the `server_version` ParameterStatus (0: not reported).
    server_major: u32,
}

impl ReplicationConnection {
    /// Connects and authenticates with the standard session options.
    pub async fn connect(cfg: &PostgresConfig) -> Result<Self, SourceError> {
        Self::connect_with_options(cfg, "").await
    }

    /// Like [`connect`](Self::connect), appending `extra_options` (`-c name=value …`) to the
    /// session options; tests use it to lower `logical_decoding_work_mem`.
    pub async fn connect_with_options(
        cfg: &PostgresConfig,
        extra_options: &str,
    ) -> Result<Self, SourceError> {
        let opened = startup::open(cfg, SessionKind::Walsender, extra_options).await?;
        Ok(ReplicationConnection {
            stream: opened.stream,
            reader: opened.reader,
            target: cfg.display_target(),
            streaming: false,
            server_major: opened.server_major,
        })
    }

    /// `IDENTIFY_SYSTEM` (protocol §55.4).
    pub async fn identify_system(&mut self) -> Result<SystemId, SourceError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows
            .first()
            .ok_or_else(|| SourceError::Protocol("IDENTIFY_SYSTEM returned no row".to_owned()))?;
        let timeline = text_column(row, 1, "IDENTIFY_SYSTEM timeline")?
            .parse::<u32>()
            .map_err(|e| SourceError::Protocol(format!("IDENTIFY_SYSTEM timeline: {e}")))?;
        let xlogpos = parse_lsn(text_column(row, 2, "IDENTIFY_SYSTEM xlogpos")?)?;
        let dbname = row
            .get(3)
            .and_then(|v| v.as_ref())
            .map(|b| String::from_utf8_lossy(b).into_owned());
        Ok(SystemId {
            timeline,
            xlogpos,
            dbname,
        })
    }

    /// `CREATE_REPLICATION_SLOT <slot> LOGICAL pgoutput (SNAPSHOT 'export')` (PG ≥ 15 syntax).
    /// Returns the consistent point and the exported snapshot name, which stays valid until the
    /// next command on this connection.
    pub async fn create_slot(&mut self, slot: &str) -> Result<(Lsn, String), SourceError> {
        let sql = create_slot_sql(slot, self.server_major, true);
        self.create_exporting(slot, &sql).await
    }

    /// `CREATE_REPLICATION_SLOT <slot> TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')`: a slot
    /// dropped when this connection ends, for its exported snapshot and consistent point only.
    pub async fn create_temporary_slot(
        &mut self,
        slot: &str,
    ) -> Result<(Lsn, String), SourceError> {
        let sql = create_slot_sql(slot, self.server_major, true).replacen(
            " LOGICAL ",
            " TEMPORARY LOGICAL ",
            1,
        );
        self.create_exporting(slot, &sql).await
    }

    /// `CREATE_REPLICATION_SLOT <slot> LOGICAL pgoutput (SNAPSHOT 'nothing')`: a slot for
    /// streaming only; returns its consistent point.
    pub async fn create_slot_without_snapshot(&mut self, slot: &str) -> Result<Lsn, SourceError> {
        let sql = create_slot_sql(slot, self.server_major, false);
        Ok(self.create(slot, &sql).await?.0)
    }

    /// [`Self::create`] of a slot that exports its snapshot: the consistent point and the
    /// snapshot's name.
    async fn create_exporting(
        &mut self,
        slot: &str,
        sql: &str,
    ) -> Result<(Lsn, String), SourceError> {
        let (lsn, snapshot) = self.create(slot, sql).await?;
        let snapshot = snapshot.ok_or_else(|| SourceError::Server {
            context: format!("creating replication slot {slot}"),
            detail: "the server exported no snapshot".to_owned(),
        })?;
        Ok((lsn, snapshot))
    }

    async fn create(
        &mut self,
        slot: &str,
        sql: &str,
    ) -> Result<(Lsn, Option<String>), SourceError> {
        let context = || format!("creating replication slot {slot}");
        let rows = self
            .simple_query(sql)
            .await
            .map_err(|e| with_context(e, &context()))?;
        let row = rows.first().ok_or_else(|| SourceError::Server {
            context: context(),
            detail: "CREATE_REPLICATION_SLOT returned no row".to_owned(),
        })?;
        let lsn = parse_lsn(text_column(row, 1, "consistent_point")?)?;
        let snapshot = row
            .get(2)
            .and_then(|v| v.as_ref())
            .map(|b| String::from_utf8_lossy(b).into_owned());
        Ok((lsn, snapshot))
    }

    /// `DROP_REPLICATION_SLOT <slot> WAIT` (waits if another session still holds it).
    pub async fn drop_slot(&mut self, slot: &str) -> Result<(), SourceError> {
        let sql = format!("DROP_REPLICATION_SLOT {} WAIT", quote_ident(slot));
        self.simple_query(&sql)
            .await
            .map_err(|e| with_context(e, &format!("dropping replication slot {slot}")))?;
        Ok(())
    }

    /// `START_REPLICATION SLOT … LOGICAL <start> (…)`; on success the session is in CopyBoth mode.
    /// `start` 0/0 means "where the slot stands" (Postgres starts at the later of the two).
    pub async fn start(
        &mut self,
        slot: &str,
        start: Lsn,
        opts: &StartOptions,
    ) -> Result<(), SourceError> {
        let sql = start_replication_sql(slot, start, opts);
        let context = format!("starting replication on slot {slot} at {start}");
        write_query(&mut self.stream, &sql)
            .await
            .map_err(|e| self.lost(e))?;
        loop {
            let msg = self.read().await?;
            match msg.tag {
                b'W' => {
                    self.streaming = true;
                    return Ok(());
                }
                b'E' => {
                    let detail = server_error(&msg.payload);
                    // Leave the session usable (ReadyForQuery follows the error).
                    self.drain_to_ready().await?;
                    return Err(SourceError::Server { context, detail });
                }
                _ => {}
            }
        }
    }

    /// The next CopyData message. Cancel-safe: a partial frame stays in `self` when the future
    /// is dropped, so this can sit in a `tokio::select!`.
    pub async fn recv(&mut self) -> Result<ReplicationMessage, SourceError> {
        loop {
            let msg = self.read().await?;
            match msg.tag {
                b'd' => {
                    let parsed = parse_copy_data(msg.payload)
                        .map_err(|e| SourceError::Protocol(describe(&e)))?;
                    return Ok(match parsed {
                        ReplicationCopyData::XLogData {
                            wal_start,
                            wal_end,
                            server_time_micros,
                            data,
                        } => ReplicationMessage::XLogData {
                            wal_start: Lsn(wal_start.0),
                            wal_end: Lsn(wal_end.0),
                            server_time: server_time_micros.saturating_add(PG_EPOCH_MICROS),
                            data,
                        },
                        ReplicationCopyData::KeepAlive {
                            wal_end,
                            server_time_micros,
                            reply_requested,
                        } => ReplicationMessage::KeepAlive {
                            wal_end: Lsn(wal_end.0),
                            server_time: server_time_micros.saturating_add(PG_EPOCH_MICROS),
                            reply_requested,
                        },
                    });
                }
                b'E' => {
                    return Err(SourceError::Server {
                        context: "replication stream".to_owned(),
                        detail: server_error(&msg.payload),
                    })
                }
                b'c' => {
                    self.streaming = false;
                    return Err(SourceError::Protocol(
                        "the server ended the replication stream (CopyDone)".to_owned(),
                    ));
                }
                b'N' => {
                    tracing::info!(
                        notice = %ErrorFields::parse(&msg.payload).to_error_string(),
                        "replication notice"
                    );
                }
                _ => {}
            }
        }
    }

    /// Standby status update (protocol §55.4, "Standby status update (F)"): `write`, `flush` and
    /// `apply` positions; the server may discard WAL before `flush`.
    pub async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply_requested: bool,
    ) -> Result<(), SourceError> {
        let payload = encode_status(write, flush, apply, now_pg_micros(), reply_requested);
        write_copy_data(&mut self.stream, &payload)
            .await
            .map_err(|e| self.lost(e))
    }

    /// Ends streaming with CopyDone, waits briefly for the server to close its side, and
    /// terminates the session.
    pub async fn finish(mut self) -> Result<(), SourceError> {
        if self.streaming {
            write_copy_done(&mut self.stream)
                .await
                .map_err(|e| self.lost(e))?;
            // The server answers with its own CopyDone, CommandComplete and ReadyForQuery; a few
            // more CopyData frames may come first. Bounded wait: shutdown must not hang.
            let wait = async {
                loop {
                    match self.read().await {
                        Ok(msg) if msg.tag == b'Z' => return Ok(()),
                        Ok(_) => {}
                        Err(e) => return Err(e),
                    }
                }
            };
            match tokio::time::timeout(Duration::from_secs(5), wait).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "closing replication stream"),
                Err(_) => tracing::debug!("no ReadyForQuery within 5 s after CopyDone"),
            }
        }
        // Terminate ('X'); errors here only mean the server has already gone.
        let _ = self.stream.write_all(&[b'X', 0, 0, 0, 4]).await;
        let _ = self.stream.shutdown().await;
        Ok(())
    }

    /// Runs a replication command with the simple query protocol and returns its rows (text).
    async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<Bytes>>>, SourceError> {
        write_query(&mut self.stream, sql)
            .await
            .map_err(|e| self.lost(e))?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let msg = self.read().await?;
            match msg.tag {
                b'D' => rows.push(parse_data_row(msg.payload)?),
                b'E' => error = Some(server_error(&msg.payload)),
                b'Z' => {
                    return match error {
                        None => Ok(rows),
                        Some(detail) => Err(SourceError::Server {
                            context: first_word(sql).to_owned(),
                            detail,
                        }),
                    }
                }
                _ => {}
            }
        }
    }

    async fn drain_to_ready(&mut self) -> Result<(), SourceError> {
        loop {
            if self.read().await?.tag == b'Z' {
                return Ok(());
            }
        }
    }

    async fn read(&mut self) -> Result<pgwire_replication::protocol::BackendMessage, SourceError> {
        match self.reader.read(&mut self.stream).await {
            Ok(m) => Ok(m),
            Err(e) => Err(self.lost(e)),
        }
    }

    fn lost(&self, e: PgWireError) -> SourceError {
        match e {
            PgWireError::Protocol(p) => SourceError::Protocol(p),
            PgWireError::Server(s) => SourceError::Server {
                context: format!("replication connection to {}", self.target),
                detail: s,
            },
            other => SourceError::Connect {
                target: self.target.clone(),
                detail: format!("replication connection lost: {}", describe(&other)),
            },
        }
    }
}

#[cfg(test)]
mod tests;
