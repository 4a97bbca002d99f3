//! Binlog events to changelog transactions (no I/O): the assembler between the binlog connection
//! (`mod.rs`) and the pipeline.
//!
//! A transaction (an "event group") starts at a GTID event (MySQL `GTID_LOG_EVENT`, MariaDB 0xa2)
//! or a `BEGIN` query, holds TABLE_MAP + rows events, and ends at an XID event, a `COMMIT` query,
//! or, for a DDL statement (MariaDB `FL_STANDALONE`, MySQL's implicit commit), right after its
//! QUERY event. The position of a transaction is the server state *after* it: the GTID set or
//! list including its GTID, or `file:end_of_event` of its last event. That is a transaction
//! boundary, so a restart from a committed position never replays part of a transaction.
//!
//! Row images: each rows event carries a column bitmap per image; a column outside the after image
//! (MINIMAL, NOBLOB) is *absent*, except primary-key columns of an update, which are taken from the
//! before image so the sink can find the row. PARTIAL_JSON updates (MySQL 8,
//! `binlog_row_value_options=PARTIAL_JSON`) stop the pipeline with an error naming the setting:
//! applying JSON diffs needs the current document, which only the sink has.

use std::collections::HashMap;
use std::sync::Arc;

use mysql_common::binlog::events::{Event, EventData, RowsEventData, TableMapEvent};
use mysql_common::binlog::row::BinlogRow;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::value::Value;

use crate::changelog::{
    BinlogFile, MariaGtid, Op, Position, TableChanges, TableChangesBuilder, TableId, Transaction,
    TxId,
};
use crate::config::ZeroDate;

use super::ddl;
use super::decoder::{self, DdlVerb, Statement};
use super::image::{Cell, ImagePlan, Scratch};
use super::schema::{build_entry, matches_patterns, TableEntry};
use fallback::RowImages;

/// Rows a table's builder is sized for.
const BUILDER_CAPACITY: usize = 64;

/// What one event produced.
#[derive(Debug)]
pub enum Step {
    Nothing,
    /// A transaction with captured changes is complete.
    Transaction(Transaction),
    /// A transaction without captured changes, or a heartbeat outside a transaction: everything
    /// up to this position is delivered.
    Idle(Position),
    /// The event needs `table`'s schema: load it, [`Assembler::set_table`], and feed the event
    /// again.
    NeedTable(TableId),
}

/// An `ALTER TABLE` the assembler applied: `before` became `after` right after the DDL's
/// transaction, at `at`. The stream records it in the schema history (`history.rs`) before it
/// reads on.
#[derive(Debug, Clone)]
pub struct AppliedDdl {
    pub before: Arc<TableEntry>,
    pub after: Arc<TableEntry>,
    pub at: Position,
    pub statement: String,
}

/// An event could not be turned into changes.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{table}: {detail} (at {position})")]
    Table {
        table: TableId,
        detail: String,
        position: String,
    },
    #[error("DDL on captured table {table} cannot be applied: {reason}: {statement:?} (at {position}). Remove the table from source.tables, or recreate the replica after the change")]
    Ddl {
        table: TableId,
        reason: String,
        statement: String,
        position: String,
    },
    #[error("{detail} (at {position})")]
    Protocol { detail: String, position: String },
}

/// The open transaction.
#[derive(Default)]
struct Txn {
    changes: Vec<TableChanges>,
    current: Option<TableChangesBuilder>,
    maria: Option<MariaGtid>,
    mysql: Option<(String, u64)>,
    /// Opened by `BEGIN`, closed by XID/COMMIT; otherwise the next statement is the whole group.
    explicit: bool,
    standalone: bool,
}

/// Turns binlog events into transactions.
pub struct Assembler {
    patterns: Vec<String>,
    zero_date: ZeroDate,
    tables: HashMap<TableId, Arc<TableEntry>>,
    position: Position,
    file: String,
    /// Where in `file` the open transaction's first event starts (its id without GTIDs); while
    /// no transaction is open, where the event being fed starts.
    txn_start: u64,
    txn: Option<Txn>,
    /// Per rows event: column index → index in the before/after image (reused).
    before_slots: Vec<Option<usize>>,
    after_slots: Vec<Option<usize>>,
    /// The planned path ([`super::image`]): column layouts of the current rows event, each
    /// image's columns, where each value sits, and conversion buffers (all reused).
    plan: ImagePlan,
    before_present: Vec<usize>,
    after_present: Vec<usize>,
    before_cells: Vec<Cell>,
    after_cells: Vec<Cell>,
    scratch: Scratch,
    /// Whether rows events of fully planned tables take the planned path (always, except to
    /// compare the two paths: [`Assembler::general_rows_only`]).
    planned: bool,
    /// DDL applied since [`Assembler::take_applied_ddl`] was last called.
    applied_ddl: Vec<AppliedDdl>,
}

impl Assembler {
    /// `start` is the position streaming resumes from (the state before the first event).
    pub fn new(patterns: Vec<String>, zero_date: ZeroDate, start: Position) -> Self {
        let file = match &start {
            Position::MySqlFile(f) => f.file.clone(),
            _ => String::new(),
        };
        Assembler {
            patterns,
            zero_date,
            tables: HashMap::new(),
            position: start,
            file,
            txn_start: 0,
            txn: None,
            before_slots: Vec::new(),
            after_slots: Vec::new(),
            plan: ImagePlan::default(),
            before_present: Vec::new(),
            after_present: Vec::new(),
            before_cells: Vec::new(),
            after_cells: Vec::new(),
            scratch: Scratch::default(),
            planned: true,
            applied_ddl: Vec::new(),
        }
    }

    /// Decodes every rows event through `mysql_common`'s rows, never the planned path (for
    /// comparisons: `examples/mysql_decode_bench.rs` and the tests).
    pub fn general_rows_only(mut self) -> Self {
        self.planned = false;
        self
    }

    /// The position after the last complete transaction.
    pub fn position(&self) -> &Position {
        &self.position
    }

    pub fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    /// Drops a transaction cut off by a lost connection; the stream restarts at
    /// [`position`](Self::position), before it.
    pub fn reset(&mut self) {
        self.txn = None;
    }

    pub fn set_table(&mut self, entry: TableEntry) {
        self.tables.insert(entry.schema.id.clone(), Arc::new(entry));
    }

    /// The `ALTER TABLE`s applied since the last call, oldest first.
    pub fn take_applied_ddl(&mut self) -> Vec<AppliedDdl> {
        std::mem::take(&mut self.applied_ddl)
    }

    pub fn table(&self, id: &TableId) -> Option<&TableEntry> {
        self.tables.get(id).map(|e| e.as_ref())
    }

    /// Feeds one event; `tme` is the TABLE_MAP of a rows event's table id.
    pub fn on_event(
        &mut self,
        event: &Event,
        tme: Option<&TableMapEvent<'_>>,
    ) -> Result<Step, StreamError> {
        let header = event.header();
        let raw_type = header.event_type_raw();
        if self.txn.is_none() {
            // `log_pos` is where the event ends.
            self.txn_start = u64::from(header.log_pos().saturating_sub(header.event_size()));
        }
        match raw_type {
            decoder::MARIADB_GTID => {
                let ev = decoder::mariadb_gtid(event.data(), header.server_id())
                    .map_err(|e| self.protocol(e.to_string()))?;
                self.txn = Some(Txn {
                    maria: Some(ev.gtid),
                    standalone: ev.standalone,
                    ..Txn::default()
                });
                return Ok(Step::Nothing);
            }
            decoder::MARIADB_GTID_LIST => {
                let list = decoder::mariadb_gtid_list(event.data())
                    .map_err(|e| self.protocol(e.to_string()))?;
                if let Position::MariaDbGtid(current) = &mut self.position {
                    for g in list.gtids {
                        if current.seq(g.domain) < g.seq && self.txn.is_none() {
                            current.apply(g);
                        }
                    }
                }
                return Ok(Step::Nothing);
            }
            _ => {}
        }
        let data = match event.read_data() {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Step::Nothing),
            Err(e) => return Err(self.protocol(format!("event type {raw_type}: {e}"))),
        };
        match data {
            EventData::RotateEvent(r) => {
                self.file = r.name().into_owned();
                if let Position::MySqlFile(f) = &mut self.position {
                    if self.txn.is_none() {
                        *f = BinlogFile {
                            file: self.file.clone(),
                            pos: r.position(),
                        };
                    }
                }
                Ok(Step::Nothing)
            }
            EventData::GtidEvent(g) => {
                // Tagged GTIDs (MySQL 8.3+, GTID_TAGGED_LOG_EVENT) count under `uuid:tag`.
                let mut sid = uuid::Uuid::from_bytes(g.sid()).to_string();
                if let Some(tag) = g.tag() {
                    sid.push(':');
                    sid.push_str(&tag.as_str().to_ascii_lowercase());
                }
                self.txn = Some(Txn {
                    mysql: Some((sid, g.gno())),
                    ..Txn::default()
                });
                Ok(Step::Nothing)
            }
            EventData::QueryEvent(q) => {
                let sql = q.query();
                let schema = q.schema();
                match decoder::classify(&sql, &schema) {
                    Statement::Begin => {
                        let txn = self.txn.get_or_insert_with(Txn::default);
                        txn.explicit = true;
                        Ok(Step::Nothing)
                    }
                    Statement::Commit | Statement::Rollback => {
                        self.finish(u64::from(header.log_pos()), header.timestamp())
                    }
                    Statement::Ddl { verb, tables } => {
                        self.on_ddl(verb, tables, &sql, header.log_pos(), header.timestamp())
                    }
                    Statement::Other => self.after_statement(header.log_pos(), header.timestamp()),
                }
            }
            EventData::XidEvent(_) => self.finish(u64::from(header.log_pos()), header.timestamp()),
            EventData::HeartbeatEvent => Ok(match self.txn {
                None => Step::Idle(self.position.clone()),
                Some(_) => Step::Nothing,
            }),
            EventData::RowsEvent(rows) => self.on_rows(&rows, tme),
            EventData::TransactionPayloadEvent(_) => Err(self.protocol(
                "TRANSACTION_PAYLOAD event reached the assembler (mysql_async decompresses them)"
                    .into(),
            )),
            _ => Ok(Step::Nothing),
        }
    }

    /// DDL on the captured tables among `tables`: a CREATE forgets the cached shape, a TRUNCATE
    /// is a change of the transaction, an ALTER is applied (`ddl.rs`), a DROP or RENAME stops.
    fn on_ddl(
        &mut self,
        verb: DdlVerb,
        tables: Vec<(String, String)>,
        sql: &str,
        log_pos: u32,
        timestamp: u32,
    ) -> Result<Step, StreamError> {
        let mut altered = Vec::new();
        for (db, name) in tables {
            let id = TableId::new(db, name);
            if !matches_patterns(&self.patterns, &id) {
                continue;
            }
            match verb {
                DdlVerb::Create => {
                    self.tables.remove(&id);
                }
                DdlVerb::Truncate => {
                    let Some(entry) = self.tables.get(&id) else {
                        return Ok(Step::NeedTable(id));
                    };
                    let schema = entry.schema.clone();
                    let position = self.position.to_string();
                    let err = |e: arrow_schema::ArrowError| StreamError::Table {
                        table: id.clone(),
                        detail: e.to_string(),
                        position: position.clone(),
                    };
                    let b = self.builder_for(&schema)?;
                    b.begin(Op::Truncate);
                    for i in 0..schema.columns.len() {
                        b.absent(i).map_err(err)?;
                    }
                    b.no_old_key().map_err(err)?;
                }
                DdlVerb::Alter => {
                    if let Some(change) = self.alter(&id, sql)? {
                        altered.push(change);
                    }
                }
                DdlVerb::Drop | DdlVerb::Rename => {
                    return Err(StreamError::Ddl {
                        table: id,
                        reason: "the table is dropped or renamed".into(),
                        statement: sql.chars().take(300).collect(),
                        position: self.position.to_string(),
                    });
                }
            }
        }
        let step = self.after_statement(log_pos, timestamp)?;
        // The new shape holds from the position after the DDL's transaction.
        for (before, after) in altered {
            self.applied_ddl.push(AppliedDdl {
                before,
                after,
                at: self.position.clone(),
                statement: sql.chars().take(300).collect(),
            });
        }
        Ok(step)
    }

    /// A statement outside BEGIN…COMMIT is its own group (DDL's implicit commit, MariaDB
    /// standalone groups).
    /// Applies `ALTER TABLE` `sql` to `id` (`ddl.rs`): the rows events after it are decoded with
    /// the new columns. Only changes the lake can follow pass ([`TableSchema::evolves_to`]: the
    /// pipeline evolves the sink's table when the first change under the new schema arrives);
    /// anything else stops here, naming the statement. A table not loaded yet is left alone: it is
    /// read from `information_schema` when its first rows arrive, as after a CREATE.
    ///
    /// [`TableSchema::evolves_to`]: crate::changelog::TableSchema::evolves_to
    #[allow(clippy::type_complexity)]
    fn alter(
        &mut self,
        id: &TableId,
        sql: &str,
    ) -> Result<Option<(Arc<TableEntry>, Arc<TableEntry>)>, StreamError> {
        let Some(before) = self.tables.get(id).cloned() else {
            return Ok(None);
        };
        let stop = |reason: String| StreamError::Ddl {
            table: id.clone(),
            reason,
            statement: sql.chars().take(300).collect(),
            position: self.position.to_string(),
        };
        let mut columns =
            ddl::apply_alter(sql, &before.columns, &before.charset).map_err(|e| stop(e.0))?;
        let key: Vec<String> = before
            .schema
            .key_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        for name in &key {
            let Some(c) = columns.iter_mut().find(|c| &c.name == name) else {
                return Err(stop(format!(
                    "key column {name} is renamed or dropped: the key changes"
                )));
            };
            // MySQL keeps PRIMARY KEY columns NOT NULL whatever MODIFY says; a key of
            // source.key_columns must stay NOT NULL to identify rows.
            if c.nullable && before.key_origin == crate::changelog::KeyOrigin::Override {
                return Err(stop(format!(
                    "key column {name} (source.key_columns) becomes nullable"
                )));
            }
            c.nullable = false;
        }
        let mut after = build_entry(id.clone(), &columns, &key).map_err(|e| stop(e.to_string()))?;
        // Each column before, among the columns after (by name or renamed; `None`: dropped).
        let kept = after
            .schema
            .columns_in(before.schema.columns.iter().map(|c| c.name.as_str()))
            .map_err(&stop)?;
        after.dropped = before.dropped.clone();
        for (column, at) in before.schema.columns.iter().zip(&kept) {
            if at.is_none() && !after.dropped.contains(&column.name) {
                after.dropped.push(column.name.clone());
            }
        }
        // Columns keep the initial default they were added with; an added one takes its DEFAULT.
        // A column under a dropped column's name (added, or renamed to it) would reach a lake
        // that may still hold the dropped one as that same column: refused.
        let before_columns = &before.schema.columns;
        for (j, column) in after.schema_mut().columns.iter_mut().enumerate() {
            let old = kept.iter().position(|at| *at == Some(j));
            let renamed =
                old.is_some_and(|i| before_columns.get(i).is_some_and(|c| c.name != column.name));
            if (old.is_none() || renamed) && before.dropped.contains(&column.name) {
                return Err(stop(format!(
                    "column {} takes the name of a column dropped earlier, which the lake cannot tell apart from it",
                    column.name
                )));
            }
            column.initial_default = match old.and_then(|i| before_columns.get(i)) {
                Some(kept) => kept.initial_default.clone(),
                None => columns
                    .get(j)
                    .map(ddl::added_default)
                    .transpose()
                    .map_err(|e| stop(e.0))?
                    .flatten(),
            };
        }
        after.key_origin = before.key_origin.clone();
        after.charset = before.charset.clone();
        if !before.schema.evolves_to(&after.schema) {
            return Err(stop(format!(
                "the lake cannot follow this change from ({}) to ({}): only columns added at the end (nullable, or with a constant default), renamed or dropped columns, widened types and relaxed nullability are applied",
                before.schema.describe_columns(),
                after.schema.describe_columns()
            )));
        }
        let after = Arc::new(after);
        self.tables.insert(id.clone(), Arc::clone(&after));
        Ok(Some((before, after)))
    }

    fn after_statement(&mut self, log_pos: u32, timestamp: u32) -> Result<Step, StreamError> {
        match &self.txn {
            Some(t) if t.explicit && !t.standalone => Ok(Step::Nothing),
            _ => self.finish(u64::from(log_pos), timestamp),
        }
    }

    fn finish(&mut self, log_pos: u64, timestamp: u32) -> Result<Step, StreamError> {
        let Some(mut txn) = self.txn.take() else {
            return Ok(Step::Nothing);
        };
        if let Some(b) = txn.current.take() {
            let id = b.schema().id.clone();
            txn.changes
                .push(b.finish().map_err(|e| self.table_err(&id, e))?);
        }
        let tx_id = match (&txn.maria, &txn.mysql) {
            (Some(g), _) => TxId::MariaDbGtid(*g),
            (None, Some((sid, gno))) => TxId::MySqlGtid {
                sid: sid.clone(),
                gno: *gno,
            },
            (None, None) => TxId::File(BinlogFile {
                file: self.file.clone(),
                pos: self.txn_start,
            }),
        };
        match &mut self.position {
            Position::MariaDbGtid(list) => {
                if let Some(g) = txn.maria {
                    list.apply(g);
                }
            }
            Position::MySqlGtid(set) => {
                if let Some((sid, gno)) = &txn.mysql {
                    set.add(sid, *gno);
                }
            }
            Position::MySqlFile(f) => {
                *f = BinlogFile {
                    file: self.file.clone(),
                    pos: log_pos,
                };
            }
            Position::Postgres(_) => {}
        }
        if txn.changes.is_empty() {
            return Ok(Step::Idle(self.position.clone()));
        }
        Ok(Step::Transaction(Transaction::new(
            self.position.clone(),
            i64::from(timestamp) * 1_000_000,
            tx_id,
            txn.changes,
        )))
    }

    fn builder_for(
        &mut self,
        schema: &std::sync::Arc<crate::changelog::TableSchema>,
    ) -> Result<&mut TableChangesBuilder, StreamError> {
        let position = self.position.to_string();
        let txn = self.txn.get_or_insert_with(Txn::default);
        if txn
            .current
            .as_ref()
            .is_some_and(|b| b.schema().id != schema.id)
        {
            if let Some(b) = txn.current.take() {
                let id = b.schema().id.clone();
                txn.changes.push(b.finish().map_err(|e| StreamError::Table {
                    table: id,
                    detail: e.to_string(),
                    position: position.clone(),
                })?);
            }
        }
        Ok(txn
            .current
            .get_or_insert_with(|| TableChangesBuilder::new(schema.clone(), BUILDER_CAPACITY)))
    }

    fn on_rows(
        &mut self,
        rows: &RowsEventData<'_>,
        tme: Option<&TableMapEvent<'_>>,
    ) -> Result<Step, StreamError> {
        let Some(tme) = tme else {
            return Err(self.protocol(format!(
                "rows event for table id {} without a TABLE_MAP",
                rows.table_id()
            )));
        };
        let id = TableId::new(tme.database_name(), tme.table_name());
        if !matches_patterns(&self.patterns, &id) {
            return Ok(Step::Nothing);
        }
        let Some(entry) = self.tables.get(&id) else {
            return Ok(Step::NeedTable(id));
        };
        let ncols = entry.schema.columns.len();
        if tme.columns_count() != ncols as u64 {
            // The catalog is newer or older than this event: reload once; a second mismatch
            // means the table changed under cdcd without DDL it understood.
            let detail = format!(
                "the binlog has {} columns but the table has {ncols}; the table changed without DDL cdcd saw",
                tme.columns_count()
            );
            self.tables.remove(&id);
            return Err(StreamError::Table {
                table: id,
                detail,
                position: self.position.to_string(),
            });
        }
        let op = self.op_of(rows, &id)?;
        // A keyless table is a multiset: an update or delete is applied to one row equal to its
        // whole before image (`assembler/multiset.rs`), which only the FULL row image carries.
        if op != Op::Insert && entry.schema.primary_key.is_empty() {
            let entry = entry.clone();
            return self.on_keyless_rows(rows, tme, op, &entry);
        }
        self.check_before_image(rows, op, &id, entry)?;
        if self.planned && self.plan.plan(tme, &entry.kinds) {
            let entry = entry.clone();
            return self.on_rows_planned(rows, op, &entry);
        }
        fill_slots(
            &mut self.before_slots,
            rows.columns_before_image().map(|b| b.iter_ones()),
            ncols,
        );
        fill_slots(
            &mut self.after_slots,
            rows.columns_after_image().map(|b| b.iter_ones()),
            ncols,
        );
        let entry = entry.clone();
        let before_slots = std::mem::take(&mut self.before_slots);
        let after_slots = std::mem::take(&mut self.after_slots);
        let images = RowImages {
            entry: &entry,
            before_slots: &before_slots,
            after_slots: &after_slots,
            position: self.position.to_string(),
            zero_date: self.zero_date,
        };
        let result = self
            .builder_for(&entry.schema)
            .and_then(|b| images.append_all(b, rows, tme, op));
        self.before_slots = before_slots;
        self.after_slots = after_slots;
        result
    }

    /// The change a rows event makes.
    fn op_of(&self, rows: &RowsEventData<'_>, id: &TableId) -> Result<Op, StreamError> {
        Ok(match rows {
            RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => Op::Insert,
            RowsEventData::UpdateRowsEventV1(_) | RowsEventData::UpdateRowsEvent(_) => Op::Update,
            RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => Op::Delete,
            RowsEventData::PartialUpdateRowsEvent(_) => {
                return Err(StreamError::Table {
                    table: id.clone(),
                    detail: "PARTIAL_JSON update rows events are not supported: SET GLOBAL binlog_row_value_options = '' on the server".into(),
                    position: self.position.to_string(),
                })
            }
        })
    }

    /// Refuses an update or delete whose before image leaves out a key column.
    fn check_before_image(
        &self,
        rows: &RowsEventData<'_>,
        op: Op,
        id: &TableId,
        entry: &TableEntry,
    ) -> Result<(), StreamError> {
        // The before image locates the row; MINIMAL/NOBLOB images hold only the columns MySQL
        // identifies rows by, which a `source.key_columns` key need not be (`key.rs`).
        if let (true, Some(before)) = (op != Op::Insert, rows.columns_before_image()) {
            if let Some(&col) = entry
                .schema
                .primary_key
                .iter()
                .find(|&&col| !before.get(col).is_some_and(|bit| *bit))
            {
                let name = entry
                    .schema
                    .columns
                    .get(col)
                    .map_or("?", |c| c.name.as_str());
                return Err(StreamError::Table {
                    table: id.clone(),
                    detail: format!("the before image of an update or delete leaves out key column {name}, so the row cannot be found: SET GLOBAL binlog_row_image = 'FULL' on the server (writers must reconnect)"),
                    position: self.position.to_string(),
                });
            }
        }
        Ok(())
    }

    fn protocol(&self, detail: String) -> StreamError {
        StreamError::Protocol {
            detail,
            position: self.position.to_string(),
        }
    }

    fn table_err(&self, table: &TableId, e: impl std::fmt::Display) -> StreamError {
        StreamError::Table {
            table: table.clone(),
            detail: e.to_string(),
            position: self.position.to_string(),
        }
    }
}

fn column_err(entry: &TableEntry, col: usize, detail: String, position: &str) -> StreamError {
    let name = entry
        .schema
        .columns
        .get(col)
        .map_or("?", |c| c.name.as_str());
    StreamError::Table {
        table: entry.schema.id.clone(),
        detail: format!("column {name}: {detail}"),
        position: position.to_owned(),
    }
}

/// Column `i` is the `slots[i]`-th value of the image (`ones`: the image's column bitmap's set
/// bits), or absent from it.
fn fill_slots(
    slots: &mut Vec<Option<usize>>,
    ones: Option<impl Iterator<Item = usize>>,
    ncols: usize,
) {
    slots.clear();
    slots.resize(ncols, None);
    for (n, i) in ones
        .into_iter()
        .flatten()
        .filter(|&i| i < ncols)
        .enumerate()
    {
        if let Some(s) = slots.get_mut(i) {
            *s = Some(n);
        }
    }
}

fn value_of(image: &BinlogRow, slot: usize) -> Result<Value, String> {
    match image.as_ref(slot) {
        Some(BinlogValue::Value(v)) => Ok(v.clone()),
        Some(BinlogValue::Jsonb(j)) => {
            let json =
                serde_json::Value::try_from(j.clone()).map_err(|e| format!("binary JSON: {e}"))?;
            Ok(Value::Bytes(json.to_string().into_bytes()))
        }
        Some(BinlogValue::JsonDiff(_)) => {
            Err("partial JSON diff (PARTIAL_JSON) is not supported".into())
        }
        None => Err(format!("image has no value {slot}")),
    }
}

mod fallback;
mod multiset;
mod planned;

#[cfg(test)]
mod tests;
