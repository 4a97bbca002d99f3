//! Tuple values: the TupleData part of Insert, Update and Delete messages ("TupleData" in the
//! pgoutput message formats), read lazily as borrowed [`ColumnValue`]s.
//!
//! The decoder walks each tuple once to validate it and find its end; callers then iterate it
//! again to append values straight into their builders, with no per-column allocation.

use std::fmt;

/// One column value of a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnValue<'a> {
    /// `'n'`: SQL NULL.
    Null,
    /// `'u'`: a TOASTed value that did not change; its bytes are not sent (the column is absent,
    /// not NULL).
    UnchangedToast,
    /// `'t'`: the value in the type's text format (not NUL-terminated).
    Text(&'a [u8]),
    /// `'b'`: the value in the type's binary format (only with the `binary` option).
    Binary(&'a [u8]),
}

/// A tuple's columns, validated while decoding and read lazily through [`TupleData::iter`].
#[derive(Clone, PartialEq, Eq)]
pub struct TupleData<'a> {
    /// Column count from the message.
    columns: u16,
    /// The column entries (after the count), already checked to hold exactly `columns` entries.
    data: &'a [u8],
}

impl<'a> TupleData<'a> {
    /// `data` must hold exactly `columns` entries that [`split_column`] accepts.
    pub(super) fn new(columns: u16, data: &'a [u8]) -> Self {
        TupleData { columns, data }
    }

    /// Number of columns in the tuple (the relation's column count at the time of the change).
    pub fn len(&self) -> usize {
        usize::from(self.columns)
    }

    pub fn is_empty(&self) -> bool {
        self.columns == 0
    }

    /// The column values, in relation column order. Allocates nothing.
    pub fn iter(&self) -> TupleIter<'a> {
        TupleIter {
            rest: self.data,
            remaining: self.columns,
        }
    }
}

impl fmt::Debug for TupleData<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &TupleData<'a> {
    type Item = ColumnValue<'a>;
    type IntoIter = TupleIter<'a>;

    fn into_iter(self) -> TupleIter<'a> {
        self.iter()
    }
}

/// Iterator over a [`TupleData`]'s values.
#[derive(Debug, Clone)]
pub struct TupleIter<'a> {
    rest: &'a [u8],
    remaining: u16,
}

impl<'a> Iterator for TupleIter<'a> {
    type Item = ColumnValue<'a>;

    fn next(&mut self) -> Option<ColumnValue<'a>> {
        if self.remaining == 0 {
            return None;
        }
        // The entries were validated by `Reader::tuple`; should they not parse (impossible), the
        // iterator ends rather than panicking.
        let (value, rest) = split_column(self.rest).ok()?;
        self.rest = rest;
        self.remaining -= 1;
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.remaining);
        (n, Some(n))
    }
}

impl ExactSizeIterator for TupleIter<'_> {}

/// Why a column entry did not parse, relative to the entry's start.
pub(super) enum ColumnFault {
    Truncated {
        field: &'static str,
        at: usize,
        needed: usize,
    },
    BadKind(u8),
    NegativeLength(i32),
}

/// Splits one column entry (`'n'`, `'u'`, or `'t'`/`'b'` + Int32 length + bytes) off `buf`.
pub(super) fn split_column(buf: &[u8]) -> Result<(ColumnValue<'_>, &[u8]), ColumnFault> {
    let (&kind, rest) = buf.split_first().ok_or(ColumnFault::Truncated {
        field: "column kind",
        at: 0,
        needed: 1,
    })?;
    match kind {
        b'n' => Ok((ColumnValue::Null, rest)),
        b'u' => Ok((ColumnValue::UnchangedToast, rest)),
        b't' | b'b' => {
            let (len, rest) = rest
                .split_first_chunk::<4>()
                .ok_or(ColumnFault::Truncated {
                    field: "column length",
                    at: 1,
                    needed: 4,
                })?;
            let len = i32::from_be_bytes(*len);
            let n = usize::try_from(len).map_err(|_| ColumnFault::NegativeLength(len))?;
            let value = rest.get(..n).ok_or(ColumnFault::Truncated {
                field: "column value",
                at: 5,
                needed: n,
            })?;
            let rest = rest.get(n..).unwrap_or_default();
            let value = if kind == b't' {
                ColumnValue::Text(value)
            } else {
                ColumnValue::Binary(value)
            };
            Ok((value, rest))
        }
        other => Err(ColumnFault::BadKind(other)),
    }
}
