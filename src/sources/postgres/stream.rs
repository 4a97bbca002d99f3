//! The streaming phase of the Postgres source (I/O): frames from the walsender go through the
//! assembler (`assembler/mod.rs`, pure) to the pipeline as transactions or heartbeats, and standby
//! status updates go back carrying only acknowledged (committed) positions (STYLE rule 6).
//!
//! Where it sits: [`super::PostgresSource::run`] opens the replication connection, copies what
//! must be copied, then hands the connection to [`Streaming::run`] until shutdown or failure.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::assembler::{Assembled, Assembler, OpenXid, StreamEnd};
use super::catalog::{self, AddedColumn};
use super::replication::{ReplicationConnection, ReplicationMessage};
use super::state::{self, PgSourceState};
use super::{SKIPPED_HEARTBEAT_INTERVAL, STATUS_INTERVAL};
use crate::changelog::{Lsn, Position, TableId};
use crate::sources::{SourceError, SourceEvent, SourceStateStore};

/// The streaming phase's state.
pub(super) struct Streaming<'a> {
    pub(super) conn: ReplicationConnection,
    pub(super) client: &'a Client,
    pub(super) assembler: Assembler,
    pub(super) events: mpsc::Sender<SourceEvent>,
    pub(super) acks: watch::Receiver<Option<Position>>,
    /// The newest acknowledged position, the only one ever reported as flushed.
    pub(super) acked: Lsn,
    /// Everything before this has been delivered (transactions or heartbeats).
    pub(super) delivered: Lsn,
    /// When the last heartbeat for a skipped transaction went out.
    pub(super) last_skipped_beat: Option<Instant>,
    /// Where the source's state is kept, and what it holds (`state.rs`): renames are saved
    /// there before anything after them is delivered.
    pub(super) saved: Option<(Arc<dyn SourceStateStore>, PgSourceState)>,
    /// The catalog reads asked for by Relation messages that came inside a streamed
    /// transaction, by its xid: done at its Stream Commit ([`CatalogRead`]).
    pub(super) streamed_reads: Vec<(u32, CatalogRead)>,
}

/// What a captured table's Relation message makes cdcd read from the catalog
/// ([`Streaming::read_catalog`]): its columns' numbers (a column dropped and added again,
/// `state.rs`); on the first of the table in this session, the values older rows read in columns
/// added with a constant default while cdcd was away (`catalog::stored_defaults`); and the same
/// for the columns it adds (`catalog::added_columns`).
///
/// The reads must see the transaction the message belongs to, which may hold the DDL. A
/// transaction sent at its commit has committed, and the reads wait until a snapshot sees it
/// (`catalog::await_visible`). A streamed one (pgoutput v2) is sent while still open, when the
/// catalog shows none of its DDL: its reads wait for its Stream Commit, and are made before
/// anything of it is delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CatalogRead {
    oid: u32,
    table: TableId,
    first: bool,
    added: Vec<String>,
}

impl Streaming<'_> {
    pub(super) async fn run(&mut self, shutdown: &CancellationToken) -> Result<(), SourceError> {
        let mut status_timer = tokio::time::interval(STATUS_INTERVAL);
        status_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut acks_open = true;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                changed = self.acks.changed(), if acks_open => {
                    if changed.is_err() {
                        acks_open = false;
                        continue;
                    }
                    if self.take_ack() {
                        self.send_status(false).await?;
                        status_timer.reset();
                    }
                }
                _ = status_timer.tick() => self.send_status(false).await?,
                msg = self.conn.recv() => {
                    let Some(event) = self.handle(msg?).await? else {
                        continue;
                    };
                    if !self.deliver(event, &mut status_timer, shutdown).await? {
                        break;
                    }
                }
            }
        }
        self.take_ack();
        self.send_status(false).await
    }

    /// Hands `event` to the pipeline; false when shutdown interrupted it. While the pipeline is
    /// full (a slow commit: a large compaction's index move held one for 70 s) the status
    /// updates go on: the walsender ends a connection that sent none for `wal_sender_timeout`
    /// (60 s by default; Postgres docs, "Replication" settings), and cdcd stopped with
    /// "connection reset by peer".
    async fn deliver(
        &mut self,
        event: SourceEvent,
        status_timer: &mut tokio::time::Interval,
        shutdown: &CancellationToken,
    ) -> Result<bool, SourceError> {
        let events = self.events.clone();
        let send = events.send(event);
        tokio::pin!(send);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(false),
                sent = &mut send => return sent.map(|_| true).map_err(|_| SourceError::Closed),
                _ = status_timer.tick() => {
                    self.take_ack();
                    self.send_status(false).await?;
                }
            }
        }
    }

    /// Makes `reads` (of one transaction, which every snapshot now sees): stops on a column
    /// dropped and added again, and hands the assembler the values older rows read in added
    /// columns, for the next Relation message of each table (merged, since a streamed
    /// transaction's Relation messages are applied together at its commit).
    async fn read_catalog(&mut self, reads: Vec<CatalogRead>) -> Result<(), SourceError> {
        let mut defaults: HashMap<u32, HashMap<String, String>> = HashMap::new();
        for read in reads {
            self.check_attnums(read.oid, &read.table).await?;
            if read.first {
                let stored = catalog::stored_defaults(self.client, read.oid).await?;
                defaults.entry(read.oid).or_default().extend(stored);
            }
            if !read.added.is_empty() {
                let added = self.added_defaults(&read).await?;
                defaults.entry(read.oid).or_default().extend(added);
            }
        }
        for (oid, values) in defaults {
            if !values.is_empty() {
                self.assembler.set_added_defaults(oid, values);
            }
        }
        Ok(())
    }

    /// Keeps `read` for the Stream Commit of `xid`, merged with one of the same table there
    /// already (a streamed transaction sends a table's Relation again after each DDL).
    fn defer_read(&mut self, xid: u32, read: CatalogRead) {
        let same = self
            .streamed_reads
            .iter_mut()
            .find(|(x, r)| *x == xid && r.oid == read.oid);
        match same {
            Some((_, kept)) => {
                kept.first |= read.first;
                for column in read.added {
                    if !kept.added.contains(&column) {
                        kept.added.push(column);
                    }
                }
            }
            None => self.streamed_reads.push((xid, read)),
        }
    }

    /// The reads a streamed transaction's Relation messages asked for, once it has ended
    /// (`payload` is its Stream Commit or Stream Abort; any other payload: nothing).
    async fn read_catalog_for_stream(&mut self, payload: &[u8]) -> Result<(), SourceError> {
        let Some(end) = self.assembler.stream_end(payload) else {
            return Ok(());
        };
        let (StreamEnd::Committed(xid) | StreamEnd::Aborted(xid)) = end;
        let (ended, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.streamed_reads)
            .into_iter()
            .partition(|(x, _)| *x == xid);
        self.streamed_reads = open;
        if ended.is_empty() {
            return Ok(());
        }
        let reads = ended.into_iter().map(|(_, read)| read);
        match end {
            StreamEnd::Committed(xid) => {
                catalog::await_visible(self.client, xid).await?;
                self.read_catalog(reads.collect()).await
            }
            // Its Relation messages were applied when they came: a table's first one still
            // needs the stored defaults for the next. Its added columns never existed.
            StreamEnd::Aborted(_) => {
                let reads = reads
                    .map(|read| CatalogRead {
                        added: Vec::new(),
                        ..read
                    })
                    .collect();
                self.read_catalog(reads).await
            }
        }
    }

    /// A Relation message of relation `oid`, named like captured relation `captured` but not it.
    /// If the captured table still has its name, `oid` is an older table of that name (a replay
    /// from before it was created): its changes are skipped (`mark_stale`). Otherwise another
    /// table took the name: left unmarked, the assembler stops on it, never skips it.
    ///
    /// The catalog must be read as the message's transaction left it: once it is visible when
    /// it was sent committed. A streamed one may still be open, with the rename that freed the
    /// name not yet visible: the read would find the captured table under its name and skip the
    /// new table's rows. So a streamed transaction still in progress is not judged (the stop
    /// comes; a restart after it commits or aborts judges it then), and one that aborted is
    /// skipped whole (none of its changes is ever applied).
    async fn judge_foreign_relation(&mut self, oid: u32, captured: u32) -> Result<(), SourceError> {
        let Some(table) = self.assembler.captured_table(captured).cloned() else {
            return Ok(());
        };
        match self.assembler.open_xid() {
            Some(OpenXid::Committed(xid)) => catalog::await_visible(self.client, xid).await?,
            Some(OpenXid::Streamed(xid)) => match catalog::xact_status(self.client, xid).await? {
                catalog::XactStatus::Committed => catalog::await_visible(self.client, xid).await?,
                catalog::XactStatus::Aborted => {
                    self.assembler.mark_stale(oid);
                    return Ok(());
                }
                catalog::XactStatus::InProgress => return Ok(()),
            },
            None => {}
        }
        if catalog::oid_is_named(self.client, captured, &table).await? {
            self.assembler.mark_stale(oid);
        }
        Ok(())
    }

    /// Stops when a column of captured table `table` (relation `oid`) was dropped and added
    /// again since cdcd last read its column numbers (`state.rs`), then records them.
    async fn check_attnums(&mut self, oid: u32, table: &TableId) -> Result<(), SourceError> {
        let Some((store, state)) = &mut self.saved else {
            return Ok(());
        };
        let Some(now) = catalog::column_attnums(self.client, &[oid])
            .await?
            .remove(&oid)
        else {
            return Ok(());
        };
        if let Some(readded) = state.readded(table, &now).into_iter().next() {
            return Err(state::readded_column(table, &readded));
        }
        if state.set_attnums(table, now) {
            store.write(state.to_json()).await?;
        }
        Ok(())
    }

    /// What rows that predate the columns `read` adds hold in them: a constant default
    /// (Postgres keeps it in `attmissingval`), by column name; none; or unknowable (a volatile
    /// default rewrote the table: stop).
    async fn added_defaults(
        &self,
        read: &CatalogRead,
    ) -> Result<HashMap<String, String>, SourceError> {
        let found = catalog::added_columns(self.client, read.oid, &read.added).await?;
        let rewritten: Vec<&str> = found
            .iter()
            .filter(|(_, c)| *c == AddedColumn::Rewritten)
            .map(|(name, _)| name.as_str())
            .collect();
        if !rewritten.is_empty() {
            return Err(SourceError::Table {
                table: read.table.clone(),
                detail: format!(
                    "column(s) {} added with a volatile DEFAULT (or the table was rewritten since): each existing row got a value the replication stream does not carry, so the replica cannot know them; cdcd stopped before the change. Add the column without a default, or with a constant one, and fill it with UPDATE (which replicates), or recreate the replica",
                    rewritten.join(", ")
                ),
            });
        }
        Ok(found
            .into_iter()
            .filter_map(|(name, c)| match c {
                AddedColumn::Missing(Some(value)) => Some((name, value)),
                _ => None,
            })
            .collect())
    }

    /// Takes a newer acknowledged position; true if `acked` moved. Never backwards, never 0.
    fn take_ack(&mut self) -> bool {
        let ack = self.acks.borrow_and_update().clone();
        match ack {
            Some(Position::Postgres(lsn)) if !lsn.is_zero() && lsn > self.acked => {
                self.acked = lsn;
                true
            }
            _ => false,
        }
    }

    /// Reports `acked` as written, flushed and applied. Before the first ack this is 0/0, which
    /// Postgres ignores for the slot but counts as a sign of life.
    async fn send_status(&mut self, reply: bool) -> Result<(), SourceError> {
        let a = self.acked;
        self.conn.send_status(a, a, a, reply).await
    }

    /// Looks up the types `payload` (a Relation) names that the assembler does not know yet.
    async fn resolve_types(&mut self, payload: &[u8]) -> Result<(), SourceError> {
        loop {
            let missing = self.assembler.missing_types(payload)?;
            if missing.is_empty() {
                break;
            }
            // A type the transaction created is in the catalog once it is visible.
            if let Some(OpenXid::Committed(xid)) = self.assembler.open_xid() {
                catalog::await_visible(self.client, xid).await?;
            }
            let found = catalog::lookup_types(self.client, &missing).await?;
            self.assembler.add_types(&missing, found);
        }
        Ok(())
    }

    /// Reads the catalog for a captured table's Relation in `payload` (its added columns'
    /// defaults), now or, inside a streamed transaction, at its commit.
    async fn read_relation(&mut self, payload: &[u8]) -> Result<(), SourceError> {
        if let Some((oid, table, first)) = self.assembler.captured_relation(payload) {
            let added = self
                .assembler
                .added_columns(payload)
                .map(|(_, _, added)| added)
                .unwrap_or_default();
            let read = CatalogRead {
                oid,
                table,
                first,
                added,
            };
            match self.assembler.open_xid() {
                Some(OpenXid::Streamed(xid)) => {
                    // The defaults stored before this transaction serve the changes of
                    // others committed before it (which take this Relation as the
                    // table's shape); its own, if any, come at its commit.
                    if read.first {
                        let stored = catalog::stored_defaults(self.client, oid).await?;
                        if !stored.is_empty() {
                            self.assembler.set_added_defaults(oid, stored);
                        }
                    }
                    self.defer_read(xid, read);
                }
                Some(OpenXid::Committed(xid)) => {
                    catalog::await_visible(self.client, xid).await?;
                    self.read_catalog(vec![read]).await?;
                }
                None => self.read_catalog(vec![read]).await?,
            }
        }
        Ok(())
    }

    /// The event for what the assembler completed: a transaction, or a heartbeat for skipped
    /// ones (`None`: already covered, or throttled).
    fn event_of(&mut self, fed: Assembled) -> Option<SourceEvent> {
        let event = match fed {
            Assembled::Transaction(tx) => {
                if let Position::Postgres(end) = tx.position {
                    self.delivered = self.delivered.max(end);
                }
                SourceEvent::Transaction(tx)
            }
            Assembled::Skipped(end) => {
                let recent = self
                    .last_skipped_beat
                    .is_some_and(|t| t.elapsed() < SKIPPED_HEARTBEAT_INTERVAL);
                // A throttled one is covered by the next keepalive's heartbeat.
                if end <= self.delivered || recent {
                    return None;
                }
                self.last_skipped_beat = Some(Instant::now());
                self.delivered = end;
                SourceEvent::Heartbeat(Position::Postgres(end))
            }
        };
        Some(event)
    }

    /// One message from the server: the event it completes, if any.
    async fn handle(
        &mut self,
        msg: ReplicationMessage,
    ) -> Result<Option<SourceEvent>, SourceError> {
        match msg {
            ReplicationMessage::XLogData {
                wal_start, data, ..
            } => {
                self.resolve_types(&data).await?;
                if let Some((oid, captured)) = self.assembler.foreign_relation(&data) {
                    self.judge_foreign_relation(oid, captured).await?;
                }
                self.read_relation(&data).await?;
                self.read_catalog_for_stream(&data).await?;
                let fed = self.assembler.feed(wal_start, data)?;
                if let Some(ddl) = self.assembler.ddl_changed() {
                    if let Some((store, state)) = &mut self.saved {
                        state.set_ddl(&ddl);
                        store.write(state.to_json()).await?;
                    }
                }
                Ok(fed.and_then(|fed| self.event_of(fed)))
            }
            ReplicationMessage::KeepAlive {
                wal_end,
                reply_requested,
                ..
            } => {
                if reply_requested {
                    self.take_ack();
                    self.send_status(false).await?;
                }
                if self.assembler.is_idle() && !wal_end.is_zero() && wal_end > self.delivered {
                    self.delivered = wal_end;
                    return Ok(Some(SourceEvent::Heartbeat(Position::Postgres(wal_end))));
                }
                Ok(None)
            }
        }
    }
}
