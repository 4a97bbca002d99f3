//! pgoutput messages to changelog transactions: the assembler fed every XLogData payload in
//! order, producing one [`Transaction`] per committed transaction with captured changes.
//!
//! Where it sits: `mod.rs` receives frames from `replication.rs` and calls [`Assembler::feed`];
//! what comes out goes to the pipeline as `SourceEvent::Transaction` (or, for a transaction that
//! touched no captured table, as a position the source may report in a heartbeat). Values are
//! appended straight into Arrow builders through `types.rs` (no per-row allocation); decoding is
//! `decoder.rs`. The only I/O is the spill file of large streamed transactions (`assembler/spill.rs`).
//!
//! Protocol facts relied on (Postgres docs, "Logical Streaming Replication Protocol" and "Logical
//! Replication Message Formats"):
//! - A Relation message precedes the first change of a relation in a session and follows any
//!   change of its layout; it may arrive with WAL position 0, so no position is taken from it.
//! - Between Stream Start and Stream Stop, data messages carry the xid of the (sub)transaction
//!   that made them; Stream Commit / Stream Abort end a top-level xid (Abort with `subxid != xid`
//!   ends only a subtransaction). Non-streamed transactions never interleave with a stream block.
//! - Key columns are flagged in Relation messages only as the replica identity says, so each
//!   captured table's key comes from `key.rs` (primary key, identity index or
//!   `source.key_columns`), resolved before streaming.

mod multiset;
mod spill;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use super::ddl::DdlMessage;
use super::decoder::{
    decode, pg_time_to_unix_micros, ColumnValue, DecodeOptions, OldTuple, PgOutputMessage,
    Relation, TupleData,
};
use super::relation::{build_schema, unresolved_types, ColumnDef};
use super::types::{ColumnType, TypeInfo};
use crate::changelog::{
    append_null, Lsn, Op, Position, TableChanges, TableChangesBuilder, TableId, TableSchema,
    Transaction, TxId,
};
use crate::sources::SourceError;
use spill::StreamBuffers;

/// What the assembler needs to know about the stream and its limits.
#[derive(Debug, Clone)]
pub struct AssemblerConfig {
    /// The `proto_version` replication was started with.
    pub proto_version: u32,
    /// Payload bytes of streamed in-progress transactions held in memory before spilling.
    pub stream_memory_bytes: usize,
    pub spill_dir: PathBuf,
}

/// What the event trigger's messages told about the captured tables (`ddl.rs`), kept across
/// restarts by the source (`state.rs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableDdl {
    /// Per table, the former names of its columns by current name.
    pub former: HashMap<TableId, HashMap<String, Vec<String>>>,
    /// Per table, the dropped columns and the LSN of the message that said so.
    pub dropped: HashMap<TableId, Vec<(String, Lsn)>>,
}

/// What one payload completed.
#[derive(Debug)]
pub enum Assembled {
    /// A committed transaction with captured changes.
    Transaction(Transaction),
    /// A transaction committed at this end LSN without any captured change: everything before it
    /// has been delivered.
    Skipped(Lsn),
}

/// The transaction a payload belongs to ([`Assembler::open_xid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenXid {
    /// A transaction sent at its commit: it has committed (though a new snapshot may not see it
    /// for a moment yet: `catalog::column_attnums_seen`).
    Committed(u32),
    /// A transaction streamed while still open (pgoutput v2): it may commit later, or abort.
    Streamed(u32),
}

/// A streamed transaction's end ([`Assembler::stream_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    Committed(u32),
    Aborted(u32),
}

/// Turns pgoutput payloads into transactions. See the module doc.
pub struct Assembler {
    proto_version: u32,
    catalog: Catalog,
    /// The open non-streamed transaction (after Begin).
    open: Option<OpenTxn>,
    changes: Changes,
    /// The xid of the stream block being received (between Stream Start and Stream Stop).
    stream_xid: Option<u32>,
    streams: StreamBuffers,
}

struct OpenTxn {
    final_lsn: Lsn,
    xid: u32,
}

/// Relations, their schemas and the type information they were built with.
struct Catalog {
    captured: HashSet<TableId>,
    /// The captured tables' `pg_class` oids when the stream started (empty: not known). A
    /// Relation message of one of them under another name is a `RENAME TO`, and a captured name
    /// under another oid is a table dropped and created again: pgoutput sends neither as such,
    /// and both would otherwise go unnoticed (changes skipped, or mixed into the old table's).
    oids: HashMap<u32, TableId>,
    /// Relations named like a captured table that are an older table of that name, dropped
    /// before the captured one was created (a replay from before it): their changes are not
    /// the captured table's (`Assembler::foreign_relation`).
    stale: HashSet<u32>,
    /// Key column names per captured table, in key order (`key.rs`).
    keys: HashMap<TableId, Vec<String>>,
    /// Non-builtin types by OID; `None`: looked up and not found.
    types: HashMap<u32, Option<TypeInfo>>,
    /// Relations as last described by Relation messages; `None`: not captured (changes skipped).
    relations: HashMap<u32, Option<CapturedRel>>,
    /// Per relation, the values rows that predate an added column read (from the catalog,
    /// `catalog::added_columns`), for the next Relation message of that relation.
    added_defaults: HashMap<u32, HashMap<String, String>>,
    /// Per captured table, the former names of its columns by current name
    /// (`Column::former_names`), from the renames the optional event trigger reported (`ddl.rs`),
    /// kept across restarts by the source (`state.rs`): cumulative, so a Relation message after
    /// any number of renames carries every name a sink may still hold.
    former: HashMap<TableId, HashMap<String, Vec<String>>>,
    /// Per captured table, the columns the event trigger reported dropped, with the LSN of its
    /// message: a Relation message of a later transaction showing a column under such a name is
    /// a new column the lake cannot tell from the dropped one (a replay of a transaction from
    /// before the drop still shows the old column, legitimately).
    dropped: HashMap<TableId, Vec<(String, Lsn)>>,
    /// `former` or `dropped` changed since the source last saved them.
    former_changed: bool,
    /// Tables copied anew in this run (`Resume::copy`): their lake table is created from their
    /// current shape, so a column under a dropped column's name is no reason to stop.
    copied_now: HashSet<TableId>,
}

struct CapturedRel {
    schema: Arc<TableSchema>,
    types: Vec<ColumnType>,
}

/// Changes of one transaction being assembled: finished runs plus the open run.
#[derive(Default)]
struct Changes {
    done: Vec<TableChanges>,
    open: Option<TableChangesBuilder>,
}

impl Assembler {
    /// `captured`: the tables whose changes are kept; `keys`: their key column names
    /// (from `key::resolve`). A captured table missing from `keys` falls back to the key
    /// flags of its Relation message.
    pub fn new(
        cfg: AssemblerConfig,
        captured: impl IntoIterator<Item = TableId>,
        keys: HashMap<TableId, Vec<String>>,
    ) -> Self {
        Assembler {
            proto_version: cfg.proto_version,
            catalog: Catalog {
                captured: captured.into_iter().collect(),
                oids: HashMap::new(),
                stale: HashSet::new(),
                keys,
                types: HashMap::new(),
                relations: HashMap::new(),
                added_defaults: HashMap::new(),
                former: HashMap::new(),
                dropped: HashMap::new(),
                former_changed: false,
                copied_now: HashSet::new(),
            },
            open: None,
            changes: Changes::default(),
            stream_xid: None,
            streams: StreamBuffers::new(cfg.stream_memory_bytes, cfg.spill_dir),
        }
    }

    /// The captured tables' oids as the catalog showed them when the stream started.
    pub fn set_table_oids(&mut self, oids: HashMap<u32, TableId>) {
        self.catalog.oids = oids;
    }

    /// A Relation message in `payload` naming a captured table under an oid other than the one
    /// the table had when the stream started: `(its oid, the captured oid)`. The caller asks the
    /// catalog whether the captured oid still has that name: then the message is of an older
    /// table of that name ([`Self::mark_stale`]); if not, the captured table was dropped (or
    /// renamed away) and another one took its name since the stream started, which stops cdcd
    /// when the message is applied, never skips the other table's changes.
    pub fn foreign_relation(&self, payload: &[u8]) -> Option<(u32, u32)> {
        if payload.first() != Some(&b'R') {
            return None;
        }
        let Ok(PgOutputMessage::Relation(rel)) = decode(payload, self.decode_options()) else {
            return None;
        };
        if self.catalog.oids.contains_key(&rel.oid) || self.catalog.stale.contains(&rel.oid) {
            return None;
        }
        let table = TableId::new(rel.namespace.clone(), rel.name.clone());
        self.catalog
            .oids
            .iter()
            .find(|(_, t)| **t == table)
            .map(|(&captured, _)| (rel.oid, captured))
    }

    /// The tables copied anew in this run (`Resume::copy`).
    pub fn copied_now(&mut self, tables: HashSet<TableId>) {
        self.catalog.copied_now = tables;
    }

    /// The captured tables' former column names and dropped columns as the source saved them
    /// (`state.rs`).
    pub fn seed_ddl(&mut self, ddl: TableDdl) {
        self.catalog.former = ddl.former;
        self.catalog.dropped = ddl.dropped;
    }

    /// The former column names and dropped columns, when a DDL message changed them since the
    /// last call: the source saves them before anything after the message is delivered (so
    /// before the slot can move past it).
    pub fn ddl_changed(&mut self) -> Option<TableDdl> {
        if !std::mem::take(&mut self.catalog.former_changed) {
            return None;
        }
        Some(TableDdl {
            former: self.catalog.former.clone(),
            dropped: self.catalog.dropped.clone(),
        })
    }

    /// The captured table whose oid was `oid` when the stream started.
    pub fn captured_table(&self, oid: u32) -> Option<&TableId> {
        self.catalog.oids.get(&oid)
    }

    /// Marks `oid` as an older table named like a captured one: its changes are skipped.
    pub fn mark_stale(&mut self, oid: u32) {
        self.catalog.stale.insert(oid);
    }

    /// Where the next payload belongs: the xid of the open transaction, or of the stream block
    /// being received (top-level, `Streamed`: that transaction has not committed yet).
    pub fn open_xid(&self) -> Option<OpenXid> {
        match (&self.open, self.stream_xid) {
            (_, Some(top)) => Some(OpenXid::Streamed(top)),
            (Some(open), None) => Some(OpenXid::Committed(open.xid)),
            (None, None) => None,
        }
    }

    /// The streamed transaction `payload` ends, if it is a Stream Commit or the Stream Abort of
    /// a whole (top-level) transaction.
    pub fn stream_end(&self, payload: &[u8]) -> Option<StreamEnd> {
        if !matches!(payload.first(), Some(b'c') | Some(b'A')) {
            return None;
        }
        match decode(payload, self.decode_options()).ok()? {
            PgOutputMessage::StreamCommit { xid, .. } => Some(StreamEnd::Committed(xid)),
            PgOutputMessage::StreamAbort { xid, subxid, .. } if xid == subxid => {
                Some(StreamEnd::Aborted(xid))
            }
            _ => None,
        }
    }

    /// Whether a heartbeat position may be reported now: no transaction or stream block open.
    /// (In-progress streamed transactions are fine: they commit after any position seen now.)
    pub fn is_idle(&self) -> bool {
        self.open.is_none() && self.stream_xid.is_none()
    }

    /// Payload bytes of streamed transactions held in memory.
    pub fn stream_memory_bytes(&self) -> usize {
        self.streams.memory_bytes()
    }

    /// Type OIDs a Relation message in `payload` uses that the assembler cannot resolve without
    /// `pg_type` rows; fetch them (`catalog::lookup_types`) and pass them to
    /// [`add_types`](Self::add_types) before [`feed`](Self::feed). Empty for anything else.
    pub fn missing_types(&self, payload: &[u8]) -> Result<Vec<u32>, SourceError> {
        if payload.first() != Some(&b'R') {
            return Ok(Vec::new());
        }
        let Ok(PgOutputMessage::Relation(rel)) = decode(payload, self.decode_options()) else {
            // Decode errors surface from `feed`.
            return Ok(Vec::new());
        };
        let defs = column_defs(&rel);
        Ok(unresolved_types(&defs, &|oid| {
            self.catalog.types.get(&oid).cloned()
        }))
    }

    /// The columns a Relation message in `payload` adds to a captured table whose earlier
    /// Relation this assembler holds (`relation oid`, table, names); `None` for anything else.
    /// A column added with a DEFAULT gives existing rows the default in the source, which a
    /// Relation message does not say: the caller asks the catalog (`catalog::added_columns`)
    /// before the change reaches a sink that would read those rows as NULL.
    pub fn added_columns(&self, payload: &[u8]) -> Option<(u32, TableId, Vec<String>)> {
        if payload.first() != Some(&b'R') {
            return None;
        }
        let Ok(PgOutputMessage::Relation(rel)) = decode(payload, self.decode_options()) else {
            return None;
        };
        let Some(Some(old)) = self.catalog.relations.get(&rel.oid) else {
            return None;
        };
        let added: Vec<String> = rel
            .columns
            .iter()
            .map(|c| c.name.clone())
            .filter(|name| old.schema.column_index(name).is_none())
            .collect();
        (!added.is_empty()).then(|| (rel.oid, old.schema.id.clone(), added))
    }

    /// A Relation message in `payload` of a captured table: its oid, the table, and whether it
    /// is the first this assembler sees of it (after a start: no earlier shape to tell added
    /// columns by). On each, the caller reads the catalog: the columns' numbers
    /// (`state.rs`: a column dropped and added again), and on the first the stored defaults of
    /// all columns (`catalog::stored_defaults`: a column added with a constant default while
    /// cdcd was stopped is in the lake only from now on, and its older rows must read the
    /// default there).
    pub fn captured_relation(&self, payload: &[u8]) -> Option<(u32, TableId, bool)> {
        if payload.first() != Some(&b'R') {
            return None;
        }
        let Ok(PgOutputMessage::Relation(rel)) = decode(payload, self.decode_options()) else {
            return None;
        };
        let table = TableId::new(rel.namespace.clone(), rel.name.clone());
        let first = !self.catalog.relations.contains_key(&rel.oid);
        self.catalog
            .captured
            .contains(&table)
            .then_some((rel.oid, table, first))
    }

    /// The values rows that predate the columns the next Relation of `oid` adds read, by column
    /// name (the caller read them from the catalog: [`Self::added_columns`]).
    pub fn set_added_defaults(&mut self, oid: u32, defaults: HashMap<String, String>) {
        self.catalog.added_defaults.insert(oid, defaults);
    }

    /// Records `pg_type` rows for `requested` OIDs; those absent from `found` are remembered as
    /// unknown so they are not asked for again.
    pub fn add_types(&mut self, requested: &[u32], found: HashMap<u32, TypeInfo>) {
        for oid in requested {
            self.catalog.types.entry(*oid).or_insert(None);
        }
        for (oid, info) in found {
            self.catalog.types.insert(oid, Some(info));
        }
    }

    fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            proto_version: self.proto_version,
            in_stream: self.stream_xid.is_some(),
        }
    }

    /// Feeds one XLogData payload (`wal_start` is used only in messages).
    pub fn feed(&mut self, wal_start: Lsn, data: Bytes) -> Result<Option<Assembled>, SourceError> {
        let msg = decode(&data, self.decode_options())
            .map_err(|e| SourceError::Protocol(format!("{e} (XLogData at {wal_start})")))?;
        if let Some(top) = self.stream_xid {
            // Buffered until the stream's commit or abort; Stream Stop ends the block.
            if let Some(xid) = self.in_stream_block(top, &msg, wal_start)? {
                self.streams.push(top, xid, data)?;
            }
            return Ok(None);
        }
        match msg {
            PgOutputMessage::Begin { final_lsn, xid, .. } => {
                if self.open.is_some() {
                    return Err(SourceError::Protocol(format!(
                        "Begin of xid {xid} inside an open transaction (XLogData at {wal_start})"
                    )));
                }
                self.open = Some(OpenTxn { final_lsn, xid });
                Ok(None)
            }
            PgOutputMessage::Commit {
                end_lsn,
                commit_time,
                ..
            } => {
                let Some(open) = self.open.take() else {
                    return Err(SourceError::Protocol(format!(
                        "Commit at {end_lsn} without Begin"
                    )));
                };
                let changes = std::mem::take(&mut self.changes).finish()?;
                Ok(Some(complete(changes, open.xid, end_lsn, commit_time)))
            }
            PgOutputMessage::Relation(rel) => {
                let at = self.open.as_ref().map(|o| o.final_lsn);
                self.catalog.apply_relation(&rel, at)?;
                Ok(None)
            }
            PgOutputMessage::Insert { .. }
            | PgOutputMessage::Update { .. }
            | PgOutputMessage::Delete { .. }
            | PgOutputMessage::Truncate { .. } => {
                let Some(open) = &self.open else {
                    return Err(SourceError::Protocol(format!(
                        "{} outside a transaction (XLogData at {wal_start})",
                        name(&msg)
                    )));
                };
                self.catalog
                    .apply_change(&mut self.changes, &msg, open.final_lsn)?;
                Ok(None)
            }
            PgOutputMessage::StreamStart { xid, .. } => {
                if self.open.is_some() {
                    return Err(SourceError::Protocol(format!(
                        "Stream Start of xid {xid} inside an open transaction"
                    )));
                }
                self.stream_xid = Some(xid);
                Ok(None)
            }
            PgOutputMessage::StreamCommit {
                xid,
                end_lsn,
                commit_time,
                ..
            } => self.stream_commit(xid, end_lsn, commit_time),
            PgOutputMessage::StreamAbort { xid, subxid, .. } => {
                self.streams.abort(xid, subxid);
                Ok(None)
            }
            PgOutputMessage::Message {
                prefix,
                content,
                lsn,
                ..
            } => {
                self.catalog.apply_message(prefix, content, lsn)?;
                Ok(None)
            }
            PgOutputMessage::Type { .. } | PgOutputMessage::Origin { .. } => Ok(None),
            PgOutputMessage::StreamStop => Err(SourceError::Protocol(format!(
                "Stream Stop without Stream Start (XLogData at {wal_start})"
            ))),
            other => Err(SourceError::Protocol(format!(
                "unexpected {} (two-phase decoding was not requested; XLogData at {wal_start})",
                name(&other)
            ))),
        }
    }

    /// A message inside a stream block (Stream Start … Stream Stop) of the top transaction
    /// `top`: the (sub)transaction whose buffer takes it, or `None` when it is the Stream Stop.
    fn in_stream_block(
        &mut self,
        top: u32,
        msg: &PgOutputMessage<'_>,
        wal_start: Lsn,
    ) -> Result<Option<u32>, SourceError> {
        let subxid = match msg {
            PgOutputMessage::StreamStop => {
                self.stream_xid = None;
                return Ok(None);
            }
            PgOutputMessage::Relation(rel) => {
                // Applied now as well as on replay, so no later change finds it missing.
                self.catalog.apply_relation(rel, None)?;
                rel.xid
            }
            PgOutputMessage::Insert { xid, .. }
            | PgOutputMessage::Update { xid, .. }
            | PgOutputMessage::Delete { xid, .. }
            | PgOutputMessage::Truncate { xid, .. }
            | PgOutputMessage::Type { xid, .. }
            | PgOutputMessage::Message { xid, .. } => *xid,
            other => {
                return Err(SourceError::Protocol(format!(
                    "unexpected {} inside the stream block of xid {top} (XLogData at {wal_start})",
                    name(other)
                )))
            }
        };
        Ok(Some(subxid.unwrap_or(top)))
    }

    /// A streamed transaction's commit: its buffered messages replayed in order (`spill.rs`)
    /// into one transaction.
    fn stream_commit(
        &mut self,
        xid: u32,
        end_lsn: Lsn,
        commit_time: i64,
    ) -> Result<Option<Assembled>, SourceError> {
        let mut changes = Changes::default();
        if let Some(buffered) = self.streams.take(xid) {
            let opts = DecodeOptions {
                proto_version: self.proto_version,
                in_stream: true,
            };
            let catalog = &mut self.catalog;
            buffered.replay(|payload| {
                let msg = decode(payload, opts).map_err(|e| {
                    SourceError::Protocol(format!(
                        "{e} (streamed transaction {xid}, commit at {end_lsn})"
                    ))
                })?;
                match &msg {
                    // The values older rows read in added columns (read from the
                    // catalog at this commit, `stream.rs`) serve every Relation of the
                    // table in the transaction, not only the first.
                    PgOutputMessage::Relation(rel) => {
                        let defaults = catalog.added_defaults.get(&rel.oid).cloned();
                        catalog.apply_relation(rel, Some(end_lsn))?;
                        if let Some(defaults) = defaults {
                            catalog.added_defaults.insert(rel.oid, defaults);
                        }
                        Ok(())
                    }
                    PgOutputMessage::Message {
                        prefix,
                        content,
                        lsn,
                        ..
                    } => catalog.apply_message(prefix, content, *lsn),
                    PgOutputMessage::Insert { .. }
                    | PgOutputMessage::Update { .. }
                    | PgOutputMessage::Delete { .. }
                    | PgOutputMessage::Truncate { .. } => {
                        catalog.apply_change(&mut changes, &msg, end_lsn)
                    }
                    _ => Ok(()),
                }
            })?;
            self.catalog.added_defaults.clear();
        }
        Ok(Some(complete(changes.finish()?, xid, end_lsn, commit_time)))
    }
}

/// The columns of a Relation message as [`ColumnDef`]s.
pub fn column_defs(rel: &Relation) -> Vec<ColumnDef> {
    rel.columns
        .iter()
        .map(|c| ColumnDef {
            name: c.name.clone(),
            type_oid: c.type_oid,
            type_modifier: c.type_modifier,
            key_flag: c.is_key(),
        })
        .collect()
}

fn complete(changes: Vec<TableChanges>, xid: u32, end_lsn: Lsn, commit_time: i64) -> Assembled {
    if changes.is_empty() {
        return Assembled::Skipped(end_lsn);
    }
    Assembled::Transaction(Transaction::new(
        Position::Postgres(end_lsn),
        pg_time_to_unix_micros(commit_time),
        TxId::Xid(xid),
        changes,
    ))
}

impl Changes {
    /// The builder for `schema`, finishing the open run if it is of another table or layout.
    fn builder(
        &mut self,
        schema: &Arc<TableSchema>,
    ) -> Result<&mut TableChangesBuilder, SourceError> {
        let same = self
            .open
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(b.schema(), schema));
        if !same {
            if let Some(done) = self.open.take() {
                self.done.push(finish_run(done)?);
            }
        }
        Ok(self
            .open
            .get_or_insert_with(|| TableChangesBuilder::new(schema.clone(), 16)))
    }

    fn finish(mut self) -> Result<Vec<TableChanges>, SourceError> {
        if let Some(open) = self.open.take() {
            self.done.push(finish_run(open)?);
        }
        Ok(self.done)
    }
}

fn finish_run(b: TableChangesBuilder) -> Result<TableChanges, SourceError> {
    let table = b.schema().id.clone();
    b.finish().map_err(|e| SourceError::Table {
        table,
        detail: format!("assembling changes: {e}"),
    })
}

impl Catalog {
    fn lookup(&self, oid: u32) -> Option<TypeInfo> {
        self.types.get(&oid).cloned().flatten()
    }

    /// Caches a Relation message. A captured relation whose layout did not change keeps its
    /// schema `Arc`, so consecutive changes still share one run.
    /// `at`: the LSN of the transaction the message belongs to, when known (not for a streamed
    /// transaction's block, which is applied again at its commit).
    fn apply_relation(&mut self, rel: &Relation, at: Option<Lsn>) -> Result<(), SourceError> {
        let table = TableId::new(rel.namespace.clone(), rel.name.clone());
        match self.oids.get(&rel.oid) {
            Some(captured) if *captured != table => {
                return Err(SourceError::Table {
                    table: captured.clone(),
                    detail: format!(
                        "the table was renamed to {table} (ALTER TABLE … RENAME TO); cdcd stops rather than lose its changes or mix two tables: rename it back, or capture {table} as a new table (add it to source.tables; it is copied) and drop the lake table of {captured}"
                    ),
                });
            }
            None if self.stale.contains(&rel.oid) => {
                // An older table of this name (`Assembler::foreign_relation`).
                self.relations.insert(rel.oid, None);
                return Ok(());
            }
            None if self.captured.contains(&table) && self.oids.values().any(|t| *t == table) => {
                return Err(SourceError::Table {
                    table: table.clone(),
                    detail: format!(
                        "the table was dropped and created again, or renamed away and another created under its name (its oid is now {}); its lake table still holds the old table's rows: copy it anew with `cdcd resync --table {table}` (or drop its lake table and restart cdcd)",
                        rel.oid
                    ),
                });
            }
            _ => {}
        }
        if !self.captured.contains(&table) {
            self.relations.insert(rel.oid, None);
            return Ok(());
        }
        let defs = column_defs(rel);
        let lookup = |oid: u32| self.lookup(oid);
        let (mut schema, types) = build_schema(
            table.clone(),
            &defs,
            self.keys.get(&table).map(Vec::as_slice),
            &lookup,
        )?;
        // An added column's initial default, from the catalog; kept by the Relations after it
        // (a streamed transaction's Relation is applied again when it is replayed at commit).
        let defaults = self.added_defaults.remove(&rel.oid);
        let earlier = match self.relations.get(&rel.oid) {
            Some(Some(old)) => Some(Arc::clone(&old.schema)),
            _ => None,
        };
        for column in &mut schema.columns {
            column.initial_default = defaults
                .as_ref()
                .and_then(|d| d.get(&column.name).cloned())
                .or_else(|| {
                    let old = earlier.as_ref()?;
                    let i = old.column_index(&column.name)?;
                    old.columns.get(i)?.initial_default.clone()
                });
        }
        let dropped = self
            .dropped
            .get(&table)
            .filter(|_| !self.copied_now.contains(&table));
        if let (Some(at), Some(dropped)) = (at, dropped) {
            if let Some((name, _)) = dropped
                .iter()
                .find(|(name, lsn)| *lsn < at && rel.columns.iter().any(|c| c.name == *name))
            {
                return Err(SourceError::Table {
                    table: table.clone(),
                    detail: format!(
                        "column {name} takes the name of a column dropped earlier, which the lake cannot tell apart from it: copy the table again with `cdcd resync --table {table}` (or drop its lake table and restart cdcd)"
                    ),
                });
            }
        }
        // Without the event trigger's renames a rename looks like a drop plus an add, which
        // stops later (`TableSchema::evolves_to`).
        if let Some(former) = self.former.get(&table) {
            for column in &mut schema.columns {
                column.former_names = former.get(&column.name).cloned().unwrap_or_default();
            }
        }
        let schema = match self.relations.get(&rel.oid) {
            Some(Some(old)) if *old.schema == schema => old.schema.clone(),
            _ => Arc::new(schema),
        };
        self.relations
            .insert(rel.oid, Some(CapturedRel { schema, types }));
        Ok(())
    }

    /// Applies a `cdcd.ddl` message (`ddl.rs`) of a captured table: a rename joins the column's
    /// former names. Other logical decoding messages are someone else's and ignored. A message
    /// that does not parse is an error: it can only come from a trigger that is not cdcd's. A
    /// replayed message (after a restart) changes nothing.
    fn apply_message(&mut self, prefix: &str, content: &[u8], lsn: Lsn) -> Result<(), SourceError> {
        if prefix != super::ddl::PREFIX {
            return Ok(());
        }
        let message = DdlMessage::parse(content).map_err(SourceError::Protocol)?;
        let Some(table) = self.oids.get(&message.relid) else {
            return Ok(());
        };
        for name in message.dropped_columns(table) {
            let dropped = self.dropped.entry(table.clone()).or_default();
            if !dropped.contains(&(name.clone(), lsn)) {
                dropped.push((name, lsn));
                self.former_changed = true;
            }
        }
        let Some((old, new)) = message.rename(table) else {
            return Ok(());
        };
        let former = self.former.entry(table.clone()).or_default();
        let mut names = former.remove(&old).unwrap_or_default();
        names.retain(|n| *n != new && *n != old);
        names.push(old);
        if former.get(&new) != Some(&names) {
            former.insert(new, names);
            self.former_changed = true;
        }
        Ok(())
    }

    /// Appends one Insert/Update/Delete/Truncate to `changes`. `at` names the transaction in
    /// errors (its final or commit LSN).
    fn apply_change(
        &self,
        changes: &mut Changes,
        msg: &PgOutputMessage<'_>,
        at: Lsn,
    ) -> Result<(), SourceError> {
        match msg {
            PgOutputMessage::Insert { relation, new, .. } => {
                if let Some(rel) = self.captured(*relation, at)? {
                    let b = changes.builder(&rel.schema)?;
                    b.begin(Op::Insert);
                    put_tuple(b, rel, new, at)?;
                    no_old_key(b, rel)?;
                }
            }
            PgOutputMessage::Update {
                relation, old, new, ..
            } => {
                if let Some(rel) = self.captured(*relation, at)? {
                    if let (true, Some(OldTuple::Full(old))) =
                        (rel.schema.primary_key.is_empty(), old)
                    {
                        let b = changes.builder(&rel.schema)?;
                        return multiset::put_update(b, rel, old, new, at);
                    }
                    keyed(rel, "UPDATE", at)?;
                    let b = changes.builder(&rel.schema)?;
                    b.begin(Op::Update);
                    put_tuple(b, rel, new, at)?;
                    match old {
                        Some(old) if key_changed(old.tuple(), new, &rel.schema.primary_key) => {
                            put_old_key(b, rel, old.tuple(), at)?
                        }
                        _ => no_old_key(b, rel)?,
                    }
                }
            }
            PgOutputMessage::Delete { relation, old, .. } => {
                if let Some(rel) = self.captured(*relation, at)? {
                    if let (true, OldTuple::Full(old)) = (rel.schema.primary_key.is_empty(), old) {
                        let b = changes.builder(&rel.schema)?;
                        return multiset::put_delete(b, rel, old, at);
                    }
                    keyed(rel, "DELETE", at)?;
                    let b = changes.builder(&rel.schema)?;
                    b.begin(Op::Delete);
                    put_deleted(b, rel, old, at)?;
                    no_old_key(b, rel)?;
                }
            }
            PgOutputMessage::Truncate { relations, .. } => {
                for oid in relations {
                    if let Some(rel) = self.captured(*oid, at)? {
                        let b = changes.builder(&rel.schema)?;
                        b.begin(Op::Truncate);
                        for i in 0..rel.schema.columns.len() {
                            b.absent(i).map_err(|e| arrow_error(rel, e))?;
                        }
                        no_old_key(b, rel)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The captured relation `oid`, `None` if it is not captured; an error if no Relation message
    /// described it.
    fn captured(&self, oid: u32, at: Lsn) -> Result<Option<&CapturedRel>, SourceError> {
        match self.relations.get(&oid) {
            Some(rel) => Ok(rel.as_ref()),
            None => Err(SourceError::Protocol(format!(
                "change of relation {oid} before its Relation message (transaction at {at})"
            ))),
        }
    }
}

/// A keyless table is published for inserts and truncates only (`publication.rs`) unless it is
/// under REPLICA IDENTITY FULL, whose changes carry the whole old row (`assembler/multiset.rs`).
/// An UPDATE or DELETE of one without that old row means the publications or the identity were
/// changed under cdcd: nothing says which replica row it meant, so the source stops rather than
/// guess or skip it.
fn keyed(rel: &CapturedRel, op: &str, at: Lsn) -> Result<(), SourceError> {
    if rel.schema.primary_key.is_empty() {
        let table = &rel.schema.id;
        return Err(SourceError::Table {
            table: table.clone(),
            detail: format!(
                "an {op} arrived (transaction at {at}), but the table has no key, so cdcd replicates it insert-only and cannot tell which row it changes; give it a key (add a PRIMARY KEY, or name unique NOT NULL columns in source.key_columns), or run ALTER TABLE {} REPLICA IDENTITY FULL and restart cdcd with the table copied anew (updates and deletes then apply to one equal row), or remove it from source.tables",
                super::catalog::qualified(table),
            ),
        });
    }
    Ok(())
}

/// Appends a new row image: `'u'` (unchanged TOAST) becomes absent.
fn put_tuple(
    b: &mut TableChangesBuilder,
    rel: &CapturedRel,
    tuple: &TupleData<'_>,
    at: Lsn,
) -> Result<(), SourceError> {
    check_width(rel, tuple, at)?;
    for (i, v) in tuple.iter().enumerate() {
        put_value(b, rel, i, v, at)?;
    }
    Ok(())
}

/// Appends a deleted row: key columns always, other columns only from a full old row ('O').
fn put_deleted(
    b: &mut TableChangesBuilder,
    rel: &CapturedRel,
    old: &OldTuple<'_>,
    at: Lsn,
) -> Result<(), SourceError> {
    let full = matches!(old, OldTuple::Full(_));
    let tuple = old.tuple();
    check_width(rel, tuple, at)?;
    for (i, v) in tuple.iter().enumerate() {
        let is_key = rel.schema.primary_key.contains(&i);
        if is_key && matches!(v, ColumnValue::Null | ColumnValue::UnchangedToast) {
            return Err(value_error(
                rel,
                i,
                at,
                "a delete without its primary key value: the table's REPLICA IDENTITY must be DEFAULT (primary key) or FULL",
            ));
        }
        if is_key || full {
            put_value(b, rel, i, v, at)?;
        } else {
            b.absent(i).map_err(|e| arrow_error(rel, e))?;
        }
    }
    Ok(())
}

fn put_value(
    b: &mut TableChangesBuilder,
    rel: &CapturedRel,
    i: usize,
    v: ColumnValue<'_>,
    at: Lsn,
) -> Result<(), SourceError> {
    match v {
        ColumnValue::UnchangedToast => b.absent(i).map_err(|e| arrow_error(rel, e)),
        ColumnValue::Null => {
            let col = b
                .value(i)
                .ok_or_else(|| value_error(rel, i, at, "no such column"))?;
            append_null(col).map_err(|e| arrow_error(rel, e))
        }
        ColumnValue::Text(text) => {
            let (Some(col), Some(ty)) = (b.value(i), rel.types.get(i)) else {
                return Err(value_error(rel, i, at, "no such column"));
            };
            ty.append_text(col, text)
                .map_err(|e| value_error(rel, i, at, &e.to_string()))
        }
        ColumnValue::Binary(_) => Err(value_error(
            rel,
            i,
            at,
            "binary value, but the stream was started in text mode",
        )),
    }
}

/// Whether the old image's key differs from the new row's. A key column the old image lacks
/// (NULL in a 'K' image of another replica identity index) or that is unchanged TOAST counts as
/// unchanged.
fn key_changed(old: &TupleData<'_>, new: &TupleData<'_>, key: &[usize]) -> bool {
    key.iter()
        .any(|&i| match (old.iter().nth(i), new.iter().nth(i)) {
            (Some(ColumnValue::Text(a)), Some(ColumnValue::Text(b))) => a != b,
            (Some(ColumnValue::Binary(a)), Some(ColumnValue::Binary(b))) => a != b,
            _ => false,
        })
}

fn put_old_key(
    b: &mut TableChangesBuilder,
    rel: &CapturedRel,
    old: &TupleData<'_>,
    at: Lsn,
) -> Result<(), SourceError> {
    for (k, &col) in rel.schema.primary_key.iter().enumerate() {
        let value = old.iter().nth(col);
        let (Some(builder), Some(ty)) = (b.old_key(k), rel.types.get(col)) else {
            return Err(value_error(rel, col, at, "no such key column"));
        };
        match value {
            Some(ColumnValue::Text(text)) => ty
                .append_text(builder, text)
                .map_err(|e| value_error(rel, col, at, &e.to_string()))?,
            _ => append_null(builder).map_err(|e| arrow_error(rel, e))?,
        }
    }
    Ok(())
}

fn no_old_key(b: &mut TableChangesBuilder, rel: &CapturedRel) -> Result<(), SourceError> {
    b.no_old_key().map_err(|e| arrow_error(rel, e))
}

fn check_width(rel: &CapturedRel, tuple: &TupleData<'_>, at: Lsn) -> Result<(), SourceError> {
    if tuple.len() == rel.schema.columns.len() {
        return Ok(());
    }
    Err(SourceError::Table {
        table: rel.schema.id.clone(),
        detail: format!(
            "a row with {} columns, but the relation has {} (transaction at {at})",
            tuple.len(),
            rel.schema.columns.len()
        ),
    })
}

fn value_error(rel: &CapturedRel, i: usize, at: Lsn, detail: &str) -> SourceError {
    let column = rel
        .schema
        .columns
        .get(i)
        .map(|c| c.name.as_str())
        .unwrap_or("?");
    SourceError::Table {
        table: rel.schema.id.clone(),
        detail: format!("column {column} (transaction at {at}): {detail}"),
    }
}

fn arrow_error(rel: &CapturedRel, e: arrow_schema::ArrowError) -> SourceError {
    SourceError::Table {
        table: rel.schema.id.clone(),
        detail: format!("assembling changes: {e}"),
    }
}

fn name(msg: &PgOutputMessage<'_>) -> &'static str {
    match msg {
        PgOutputMessage::Begin { .. } => "Begin",
        PgOutputMessage::Commit { .. } => "Commit",
        PgOutputMessage::Origin { .. } => "Origin",
        PgOutputMessage::Relation(_) => "Relation",
        PgOutputMessage::Type { .. } => "Type",
        PgOutputMessage::Insert { .. } => "Insert",
        PgOutputMessage::Update { .. } => "Update",
        PgOutputMessage::Delete { .. } => "Delete",
        PgOutputMessage::Truncate { .. } => "Truncate",
        PgOutputMessage::Message { .. } => "Message",
        PgOutputMessage::StreamStart { .. } => "Stream Start",
        PgOutputMessage::StreamStop => "Stream Stop",
        PgOutputMessage::StreamCommit { .. } => "Stream Commit",
        PgOutputMessage::StreamAbort { .. } => "Stream Abort",
        PgOutputMessage::BeginPrepare { .. } => "Begin Prepare",
        PgOutputMessage::Prepare { .. } => "Prepare",
        PgOutputMessage::CommitPrepared { .. } => "Commit Prepared",
        PgOutputMessage::RollbackPrepared { .. } => "Rollback Prepared",
        PgOutputMessage::StreamPrepare { .. } => "Stream Prepare",
    }
}
