//! pgoutput messages from bytes: the pure decoder of Postgres's logical replication message format,
//! protocol versions 1–4.
//!
//! Data flow: `replication.rs` strips the CopyData/XLogData framing and hands each payload (the
//! bytes after the `'w'` header, exactly one pgoutput message) to [`decode`]; `assembler/mod.rs` turns the
//! decoded [`PgOutputMessage`]s into changelog transactions. The decoder does no I/O and keeps no
//! state: whether a payload sits inside a streamed block (between Stream Start and Stream Stop) is
//! state the caller tracks and passes in [`DecodeOptions`].
//!
//! Design: decoded messages borrow from the payload. Tuple values are `&[u8]` slices reached
//! through [`TupleData::iter`], so decoding a row allocates nothing; only the rare Relation and
//! Truncate messages own their data (the caller caches relations). Every length, tag and string is
//! checked while decoding, with the message type, field and byte offset in the [`DecodeError`], so
//! truncated or garbage input is an error, never a panic.
//!
//! Reference: "Logical Replication Message Formats" and "Logical Streaming Replication Protocol"
//! in the Postgres documentation (protocol-logicalrep-message-formats.html,
//! protocol-logical-replication.html). Integers are big-endian; strings are NUL-terminated.

use crate::changelog::Lsn;

mod reader;
mod tuple;

use reader::Reader;
pub use tuple::{ColumnValue, TupleData, TupleIter};

/// Microseconds from the Unix epoch to the Postgres epoch (2000-01-01 00:00:00 UTC), the origin
/// of every timestamp in pgoutput messages.
pub const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// A pgoutput timestamp (µs since 2000-01-01) as µs since the Unix epoch.
pub fn pg_time_to_unix_micros(pg_micros: i64) -> i64 {
    pg_micros.saturating_add(PG_EPOCH_UNIX_MICROS)
}

/// What the decoder must know that the bytes do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// The `proto_version` the stream was started with (1–4).
    pub proto_version: u32,
    /// Whether the payload sits between a Stream Start and a Stream Stop. From protocol 2 on,
    /// Relation, Type, Insert, Update, Delete, Truncate and Message then carry a leading xid:
    /// that of the *subtransaction* that made the change (seen on PG 15: after a savepoint the
    /// changes carry the subxact's xid while Stream Start carries the top-level one), which is
    /// what a Stream Abort's `subxid` refers to.
    pub in_stream: bool,
}

impl DecodeOptions {
    /// Options for a message outside any streamed block.
    pub fn new(proto_version: u32) -> Self {
        DecodeOptions {
            proto_version,
            in_stream: false,
        }
    }

    /// Whether data messages carry a leading xid (protocol ≥ 2, inside a stream block).
    fn xid_prefixed(self) -> bool {
        self.in_stream && self.proto_version >= 2
    }
}

/// One decoded pgoutput message, borrowing from the payload.
#[derive(Debug, Clone, PartialEq)]
pub enum PgOutputMessage<'a> {
    /// `'B'`: a (non-streamed) transaction starts. `final_lsn` is its commit record's LSN.
    Begin {
        final_lsn: Lsn,
        /// µs since 2000-01-01 (see [`pg_time_to_unix_micros`]).
        commit_time: i64,
        xid: u32,
    },
    /// `'C'`: the transaction begun by the last Begin commits. `end_lsn` is the position to
    /// resume after (and to acknowledge once durable).
    Commit {
        flags: u8,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: i64,
    },
    /// `'O'`: the transaction was replicated to this server from another origin.
    Origin { origin_lsn: Lsn, name: &'a str },
    /// `'R'`: the layout of a relation, sent before its first change (and again after it changes).
    Relation(Relation),
    /// `'Y'`: a non-builtin type used by a following Relation.
    Type {
        xid: Option<u32>,
        oid: u32,
        namespace: &'a str,
        name: &'a str,
    },
    /// `'I'`: a new row.
    Insert {
        xid: Option<u32>,
        relation: u32,
        new: TupleData<'a>,
    },
    /// `'U'`: a changed row; `old` is present when the key changed (`'K'`) or the relation has
    /// REPLICA IDENTITY FULL (`'O'`).
    Update {
        xid: Option<u32>,
        relation: u32,
        old: Option<OldTuple<'a>>,
        new: TupleData<'a>,
    },
    /// `'D'`: a removed row, identified by its key (`'K'`) or whole old row (`'O'`).
    Delete {
        xid: Option<u32>,
        relation: u32,
        old: OldTuple<'a>,
    },
    /// `'T'`: the relations were truncated. `options`: bit 1 CASCADE, bit 2 RESTART IDENTITY.
    Truncate {
        xid: Option<u32>,
        options: u8,
        relations: Vec<u32>,
    },
    /// `'M'`: a `pg_logical_emit_message` payload.
    Message {
        xid: Option<u32>,
        transactional: bool,
        lsn: Lsn,
        prefix: &'a str,
        content: &'a [u8],
    },
    /// `'S'`: a block of a streamed (in-progress) transaction starts (protocol ≥ 2).
    StreamStart { xid: u32, first_segment: bool },
    /// `'E'`: the current stream block ends.
    StreamStop,
    /// `'c'`: a streamed transaction commits.
    StreamCommit {
        xid: u32,
        flags: u8,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: i64,
    },
    /// `'A'`: a streamed transaction (`subxid == xid`) or one of its subtransactions aborts. The
    /// abort LSN and time are sent only with protocol ≥ 4 and `streaming = parallel`.
    StreamAbort {
        xid: u32,
        subxid: u32,
        abort_lsn: Option<Lsn>,
        abort_time: Option<i64>,
    },
    /// `'b'`: a prepared transaction starts (protocol ≥ 3, two-phase).
    BeginPrepare {
        prepare_lsn: Lsn,
        end_lsn: Lsn,
        prepare_time: i64,
        xid: u32,
        gid: &'a str,
    },
    /// `'P'`: the transaction begun by Begin Prepare is prepared.
    Prepare {
        flags: u8,
        prepare_lsn: Lsn,
        end_lsn: Lsn,
        prepare_time: i64,
        xid: u32,
        gid: &'a str,
    },
    /// `'K'`: a prepared transaction commits.
    CommitPrepared {
        flags: u8,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: i64,
        xid: u32,
        gid: &'a str,
    },
    /// `'r'`: a prepared transaction is rolled back.
    RollbackPrepared {
        flags: u8,
        prepare_end_lsn: Lsn,
        rollback_end_lsn: Lsn,
        prepare_time: i64,
        rollback_time: i64,
        xid: u32,
        gid: &'a str,
    },
    /// `'p'`: a streamed transaction is prepared.
    StreamPrepare {
        flags: u8,
        prepare_lsn: Lsn,
        end_lsn: Lsn,
        prepare_time: i64,
        xid: u32,
        gid: &'a str,
    },
}

/// A relation's layout (`'R'`), owned because the caller caches it by `oid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The xid of the streamed (sub)transaction that sent it (protocol ≥ 2, in a stream block).
    pub xid: Option<u32>,
    pub oid: u32,
    /// Schema name; pgoutput sends an empty string for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    pub replica_identity: ReplicaIdentity,
    pub columns: Vec<RelationColumn>,
}

/// `pg_class.relreplident`: what identifies old rows in Update and Delete messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIdentity {
    /// `'d'`: the primary key, if any.
    Default,
    /// `'n'`: nothing; updates and deletes carry no old row.
    Nothing,
    /// `'f'`: the whole old row.
    Full,
    /// `'i'`: the columns of a chosen unique index.
    Index,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Bit 1 ([`RelationColumn::KEY_FLAG`]): the column is part of the replica identity key.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod` (-1 when the type has none).
    pub type_modifier: i32,
}

impl RelationColumn {
    /// The flag bit marking a replica identity key column.
    pub const KEY_FLAG: u8 = 1;

    pub fn is_key(&self) -> bool {
        self.flags & Self::KEY_FLAG != 0
    }
}

/// The old row of an Update or Delete.
#[derive(Debug, Clone, PartialEq)]
pub enum OldTuple<'a> {
    /// `'K'`: only the replica identity columns are set; the others are sent as NULL.
    Key(TupleData<'a>),
    /// `'O'`: the whole old row (REPLICA IDENTITY FULL).
    Full(TupleData<'a>),
}

impl<'a> OldTuple<'a> {
    pub fn tuple(&self) -> &TupleData<'a> {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// The payload could not be decoded. Offsets are bytes from the start of the payload (the tag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty pgoutput message")]
    Empty,
    #[error("unknown pgoutput message type 0x{tag:02x}")]
    UnknownMessage { tag: u8 },
    #[error("pgoutput {message}: {field} truncated at byte {offset} (need {needed} bytes, {available} left)")]
    Truncated {
        message: &'static str,
        field: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },
    #[error("pgoutput {message}: invalid {field} at byte {offset}: {detail}")]
    Invalid {
        message: &'static str,
        field: &'static str,
        offset: usize,
        detail: String,
    },
    #[error("pgoutput {message}: column {column}: invalid {field} at byte {offset}: {detail}")]
    InvalidColumn {
        message: &'static str,
        column: u16,
        field: &'static str,
        offset: usize,
        detail: String,
    },
    #[error("pgoutput {message}: {extra} unexpected bytes after the message at byte {offset}")]
    TrailingBytes {
        message: &'static str,
        offset: usize,
        extra: usize,
    },
}

impl DecodeError {
    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        "pgoutput_decode"
    }
}

/// Decodes one pgoutput message (one XLogData payload).
///
/// The whole payload must be consumed: leftover bytes mean the options do not match the stream
/// (e.g. a missed Stream Start), and decoding on would misread rows.
pub fn decode(payload: &[u8], opts: DecodeOptions) -> Result<PgOutputMessage<'_>, DecodeError> {
    let (&tag, _) = payload.split_first().ok_or(DecodeError::Empty)?;
    let message = message_name(tag).ok_or(DecodeError::UnknownMessage { tag })?;
    let mut r = Reader::after_tag(payload, message);
    let xid = |r: &mut Reader<'_>| -> Result<Option<u32>, DecodeError> {
        if opts.xid_prefixed() {
            r.u32("xid").map(Some)
        } else {
            Ok(None)
        }
    };
    let decoded = match tag {
        b'B' => PgOutputMessage::Begin {
            final_lsn: r.lsn("final LSN")?,
            commit_time: r.i64("commit timestamp")?,
            xid: r.u32("xid")?,
        },
        b'C' => PgOutputMessage::Commit {
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit LSN")?,
            end_lsn: r.lsn("end LSN")?,
            commit_time: r.i64("commit timestamp")?,
        },
        b'O' => PgOutputMessage::Origin {
            origin_lsn: r.lsn("origin LSN")?,
            name: r.cstr("origin name")?,
        },
        b'R' => {
            let xid = xid(&mut r)?;
            PgOutputMessage::Relation(read_relation(&mut r, xid)?)
        }
        b'Y' => PgOutputMessage::Type {
            xid: xid(&mut r)?,
            oid: r.u32("type oid")?,
            namespace: r.cstr("namespace")?,
            name: r.cstr("type name")?,
        },
        b'I' => {
            let xid = xid(&mut r)?;
            let relation = r.u32("relation oid")?;
            r.expect_tag("new tuple marker", b'N')?;
            PgOutputMessage::Insert {
                xid,
                relation,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let xid = xid(&mut r)?;
            let relation = r.u32("relation oid")?;
            let old = match r.u8("tuple marker")? {
                b'N' => None,
                b'K' => {
                    let old = OldTuple::Key(r.tuple()?);
                    r.expect_tag("new tuple marker", b'N')?;
                    Some(old)
                }
                b'O' => {
                    let old = OldTuple::Full(r.tuple()?);
                    r.expect_tag("new tuple marker", b'N')?;
                    Some(old)
                }
                other => {
                    return Err(r.invalid_byte_before("tuple marker", other, "'N', 'K' or 'O'"))
                }
            };
            PgOutputMessage::Update {
                xid,
                relation,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let xid = xid(&mut r)?;
            let relation = r.u32("relation oid")?;
            let old = match r.u8("old tuple marker")? {
                b'K' => OldTuple::Key(r.tuple()?),
                b'O' => OldTuple::Full(r.tuple()?),
                other => {
                    return Err(r.invalid_byte_before("old tuple marker", other, "'K' or 'O'"))
                }
            };
            PgOutputMessage::Delete { xid, relation, old }
        }
        b'T' => {
            let xid = xid(&mut r)?;
            let count = r.count32("relation count", 4)?;
            let options = r.u8("options")?;
            // `count32` checked that `count` oids fit in what is left, so this is bounded.
            let mut relations = Vec::with_capacity(count);
            for _ in 0..count {
                relations.push(r.u32("relation oid")?);
            }
            PgOutputMessage::Truncate {
                xid,
                options,
                relations,
            }
        }
        b'M' => {
            let xid = xid(&mut r)?;
            let flags = r.u8("flags")?;
            let lsn = r.lsn("message LSN")?;
            let prefix = r.cstr("prefix")?;
            let len = r.count32("content length", 1)?;
            PgOutputMessage::Message {
                xid,
                // Flags bit 1: the message is transactional (the only flag defined).
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content: r.bytes("content", len)?,
            }
        }
        b'S' => PgOutputMessage::StreamStart {
            xid: r.u32("xid")?,
            first_segment: r.u8("first segment")? == 1,
        },
        b'E' => PgOutputMessage::StreamStop,
        b'c' => PgOutputMessage::StreamCommit {
            xid: r.u32("xid")?,
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit LSN")?,
            end_lsn: r.lsn("end LSN")?,
            commit_time: r.i64("commit timestamp")?,
        },
        b'A' => {
            let xid = r.u32("xid")?;
            let subxid = r.u32("subtransaction xid")?;
            // Protocol 4 adds the abort LSN and time only when streaming = parallel (docs fix
            // a0e7e9799c7, backpatched to 16); the payload is one whole message, so whether
            // they are present is told by what is left.
            let (abort_lsn, abort_time) = if opts.proto_version >= 4 && r.remaining() > 0 {
                (Some(r.lsn("abort LSN")?), Some(r.i64("abort timestamp")?))
            } else {
                (None, None)
            };
            PgOutputMessage::StreamAbort {
                xid,
                subxid,
                abort_lsn,
                abort_time,
            }
        }
        b'b' => PgOutputMessage::BeginPrepare {
            prepare_lsn: r.lsn("prepare LSN")?,
            end_lsn: r.lsn("end LSN")?,
            prepare_time: r.i64("prepare timestamp")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        },
        b'P' | b'p' => {
            let flags = r.u8("flags")?;
            let prepare_lsn = r.lsn("prepare LSN")?;
            let end_lsn = r.lsn("end LSN")?;
            let prepare_time = r.i64("prepare timestamp")?;
            let xid = r.u32("xid")?;
            let gid = r.cstr("gid")?;
            if tag == b'P' {
                PgOutputMessage::Prepare {
                    flags,
                    prepare_lsn,
                    end_lsn,
                    prepare_time,
                    xid,
                    gid,
                }
            } else {
                PgOutputMessage::StreamPrepare {
                    flags,
                    prepare_lsn,
                    end_lsn,
                    prepare_time,
                    xid,
                    gid,
                }
            }
        }
        b'K' => PgOutputMessage::CommitPrepared {
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit LSN")?,
            end_lsn: r.lsn("end LSN")?,
            commit_time: r.i64("commit timestamp")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        },
        b'r' => PgOutputMessage::RollbackPrepared {
            flags: r.u8("flags")?,
            prepare_end_lsn: r.lsn("prepare end LSN")?,
            rollback_end_lsn: r.lsn("rollback end LSN")?,
            prepare_time: r.i64("prepare timestamp")?,
            rollback_time: r.i64("rollback timestamp")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        },
        _ => return Err(DecodeError::UnknownMessage { tag }),
    };
    r.finish()?;
    Ok(decoded)
}

/// The documentation's name of a message type, or `None` for an unknown tag.
fn message_name(tag: u8) -> Option<&'static str> {
    Some(match tag {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        b'S' => "Stream Start",
        b'E' => "Stream Stop",
        b'c' => "Stream Commit",
        b'A' => "Stream Abort",
        b'b' => "Begin Prepare",
        b'P' => "Prepare",
        b'K' => "Commit Prepared",
        b'r' => "Rollback Prepared",
        b'p' => "Stream Prepare",
        _ => return None,
    })
}

fn read_relation(r: &mut Reader<'_>, xid: Option<u32>) -> Result<Relation, DecodeError> {
    let oid = r.u32("relation oid")?;
    let namespace = r.cstr("namespace")?.to_owned();
    let name = r.cstr("relation name")?.to_owned();
    let replica_identity = match r.u8("replica identity")? {
        b'd' => ReplicaIdentity::Default,
        b'n' => ReplicaIdentity::Nothing,
        b'f' => ReplicaIdentity::Full,
        b'i' => ReplicaIdentity::Index,
        other => {
            return Err(r.invalid_byte_before("replica identity", other, "'d', 'n', 'f' or 'i'"))
        }
    };
    let count = r.u16("column count")?;
    // Each column takes at least 10 bytes (flags, an empty name's NUL, type oid, typmod): cap the
    // preallocation by what is left so a garbage count cannot reserve gigabytes.
    let mut columns = Vec::with_capacity(usize::from(count).min(r.remaining() / 10));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: r.u8("column flags")?,
            name: r.cstr("column name")?.to_owned(),
            type_oid: r.u32("column type oid")?,
            type_modifier: r.i32("column type modifier")?,
        });
    }
    Ok(Relation {
        xid,
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

/// Real pgoutput messages captured from Postgres, for tests here and in `assembler/mod.rs`.
#[cfg(test)]
pub(crate) mod captured;
#[cfg(test)]
pub(crate) mod message_bytes;
#[cfg(test)]
mod tests;
