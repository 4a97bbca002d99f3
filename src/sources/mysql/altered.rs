//! A table altered under the initial copy: which server errors say that a table cannot be read
//! at the copy's consistent snapshot any more, and what the copy does then (pure).
//!
//! Where it sits: `copy.rs` reads each table inside one consistent-snapshot transaction;
//! `copy_job.rs` copies a table found altered again, whole, at a snapshot of its own.
//!
//! Why a table can be unreadable at its snapshot: `information_schema` and the table definition
//! are not versioned. A read at an older snapshot of a table rebuilt after it (a table-copying
//! or in-place rebuilding `ALTER TABLE`: a type change, `FORCE`, …) fails with
//! `ER_TABLE_DEF_CHANGED` (1412, "Table definition has changed, please retry transaction"); a
//! column an instant `ALTER` dropped or renamed after it is unknown (1054); a table dropped or
//! renamed after it does not exist (1146). An instant `ADD COLUMN` reads fine: the columns the
//! copy selects are the ones at the snapshot. Once the transaction has read a table it holds
//! the table's metadata lock, so an `ALTER` of it waits for the copy's end: these errors come
//! only at a table's first read in the transaction (its chunk planning, or its first chunk),
//! before any of its rows is sent.

use std::fmt;

use crate::sources::SourceError;

/// ER_BAD_FIELD_ERROR.
const ER_BAD_FIELD_ERROR: u16 = 1054;
/// ER_NO_SUCH_TABLE.
const ER_NO_SUCH_TABLE: u16 = 1146;
/// ER_TABLE_DEF_CHANGED.
const ER_TABLE_DEF_CHANGED: u16 = 1412;

/// How often one table is copied again after finding it altered, before cdcd stops: each copy is
/// at a new snapshot, so only ALTERs that keep landing on it before its first read exhaust this.
pub const COPY_ATTEMPTS: u32 = 10;

/// Why a table cannot be read at the copy's snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Altered {
    /// Rebuilt after the snapshot (1412).
    Rebuilt,
    /// A column the copy reads was dropped or renamed after the snapshot (1054).
    ColumnGone,
    /// The table was dropped or renamed after the snapshot (1146).
    TableGone,
}

impl Altered {
    /// The alteration a server error reports, if it is one.
    pub fn of(e: &mysql_async::Error) -> Option<Altered> {
        match e {
            mysql_async::Error::Server(s) => match s.code {
                ER_TABLE_DEF_CHANGED => Some(Altered::Rebuilt),
                ER_BAD_FIELD_ERROR => Some(Altered::ColumnGone),
                ER_NO_SUCH_TABLE => Some(Altered::TableGone),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether a copy at a newer snapshot can read the table.
    pub fn copies_again(self) -> bool {
        self != Altered::TableGone
    }
}

impl fmt::Display for Altered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Altered::Rebuilt => {
                "rebuilt by an ALTER TABLE after the copy's snapshot (error 1412, table definition has changed)"
            }
            Altered::ColumnGone => {
                "a column was dropped or renamed by an ALTER TABLE after the copy's snapshot (error 1054)"
            }
            Altered::TableGone => {
                "dropped or renamed after the copy's snapshot, before the copy reached it (error 1146)"
            }
        })
    }
}

/// A read of a table at the copy's snapshot failed.
#[derive(Debug)]
pub enum CopyError {
    /// The table changed after the snapshot, and none of its rows was sent at this snapshot.
    Altered(Altered),
    Source(SourceError),
}

impl From<SourceError> for CopyError {
    fn from(e: SourceError) -> Self {
        CopyError::Source(e)
    }
}

/// A failed read at the snapshot as a [`CopyError`]: an [`Altered`] table, or a server error
/// naming `context`.
pub fn read_err(context: impl Into<String>) -> impl FnOnce(mysql_async::Error) -> CopyError {
    let context = context.into();
    move |e| match Altered::of(&e) {
        Some(altered) => CopyError::Altered(altered),
        None => CopyError::Source(SourceError::Server {
            context,
            detail: e.to_string(),
        }),
    }
}

/// The stop for a table that cannot be copied: what happened, and the way out.
pub fn stop(table: &crate::changelog::TableId, altered: Altered, attempts: u32) -> SourceError {
    let detail = if altered.copies_again() {
        format!(
            "{altered}, at each of {attempts} copies in a row at a new snapshot: cdcd stops rather than copy it again without end. Nothing is lost: restart cdcd once the ALTER TABLEs on it are done, and it copies the table again"
        )
    } else {
        format!(
            "{altered}; the binlog stream cannot follow a dropped or renamed table either. Remove it from source.tables (or restore it under its name) and restart cdcd: the tables copied so far are kept"
        )
    };
    SourceError::Table {
        table: table.clone(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "m".into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn alterations_are_told_from_other_errors() {
        assert_eq!(Altered::of(&server(1412)), Some(Altered::Rebuilt));
        assert_eq!(Altered::of(&server(1054)), Some(Altered::ColumnGone));
        assert_eq!(Altered::of(&server(1146)), Some(Altered::TableGone));
        assert_eq!(Altered::of(&server(1205)), None);
        assert!(matches!(
            read_err("copying t")(server(2013)),
            CopyError::Source(SourceError::Server { .. })
        ));
        let t = crate::changelog::TableId::new("shop", "z");
        let gone = stop(&t, Altered::TableGone, 1).to_string();
        assert!(gone.starts_with("shop.z: dropped or renamed"), "{gone}");
        assert!(gone.contains("Remove it from source.tables"), "{gone}");
        let again = stop(&t, Altered::Rebuilt, COPY_ATTEMPTS).to_string();
        assert!(
            again.contains("error 1412") && again.contains("10 copies"),
            "{again}"
        );
    }
}
