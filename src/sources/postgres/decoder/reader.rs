//! The byte cursor under the decoder: big-endian integers, NUL-terminated strings and TupleData,
//! each read with a bounds check that names the message, field and offset in the error.

use super::tuple::{split_column, ColumnFault, TupleData};
use super::DecodeError;
use crate::changelog::Lsn;

/// A cursor over one payload that names the message and field in every error.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    message: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader positioned after the payload's tag byte; `message` names it in errors.
    pub(super) fn after_tag(buf: &'a [u8], message: &'static str) -> Self {
        Reader {
            buf,
            pos: 1,
            message,
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn truncated(&self, field: &'static str, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            message: self.message,
            field,
            offset: self.pos,
            needed,
            available: self.remaining(),
        }
    }

    fn invalid(&self, field: &'static str, offset: usize, detail: String) -> DecodeError {
        DecodeError::Invalid {
            message: self.message,
            field,
            offset,
            detail,
        }
    }

    /// An error for the byte just read.
    pub(super) fn invalid_byte_before(
        &self,
        field: &'static str,
        byte: u8,
        expected: &str,
    ) -> DecodeError {
        self.invalid(
            field,
            self.pos.saturating_sub(1),
            format!("0x{byte:02x}, expected {expected}"),
        )
    }

    pub(super) fn bytes(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| self.truncated(field, n))?;
        let out = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| self.truncated(field, n))?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let (head, _) = rest
            .split_first_chunk::<N>()
            .ok_or_else(|| self.truncated(field, N))?;
        self.pos += N;
        Ok(*head)
    }

    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        self.array::<1>(field).map(|[b]| b)
    }

    pub(super) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_be_bytes)
    }

    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_be_bytes)
    }

    pub(super) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.array(field).map(i32::from_be_bytes)
    }

    pub(super) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_be_bytes)
    }

    pub(super) fn lsn(&mut self, field: &'static str) -> Result<Lsn, DecodeError> {
        self.array(field).map(|b| Lsn(u64::from_be_bytes(b)))
    }

    /// An Int32 count or length, which must be non-negative and, at `unit` bytes per item, fit in
    /// what is left of the payload.
    pub(super) fn count32(
        &mut self,
        field: &'static str,
        unit: usize,
    ) -> Result<usize, DecodeError> {
        let at = self.pos;
        let raw = self.i32(field)?;
        let n = usize::try_from(raw).map_err(|_| self.invalid(field, at, format!("{raw} < 0")))?;
        if n.saturating_mul(unit) > self.remaining() {
            return Err(self.truncated(field, n.saturating_mul(unit)));
        }
        Ok(n)
    }

    /// A NUL-terminated UTF-8 string (the replication connection's client_encoding is UTF8).
    pub(super) fn cstr(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let start = self.pos;
        let rest = self.buf.get(start..).unwrap_or_default();
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.truncated(field, rest.len() + 1))?;
        let raw = rest.get(..len).unwrap_or_default();
        let s = std::str::from_utf8(raw)
            .map_err(|e| self.invalid(field, start + e.valid_up_to(), "not UTF-8".to_owned()))?;
        self.pos = start + len + 1;
        Ok(s)
    }

    pub(super) fn expect_tag(&mut self, field: &'static str, want: u8) -> Result<(), DecodeError> {
        match self.u8(field)? {
            b if b == want => Ok(()),
            other => {
                Err(self.invalid_byte_before(field, other, &format!("{:?}", char::from(want))))
            }
        }
    }

    /// A TupleData: Int16 column count, then one entry per column. Walks every entry once so the
    /// returned [`TupleData`] iterates without failing, and so the next field's offset is known.
    pub(super) fn tuple(&mut self) -> Result<TupleData<'a>, DecodeError> {
        let columns = self.u16("tuple column count")?;
        let start = self.pos;
        let mut rest = self.buf.get(start..).unwrap_or_default();
        for column in 0..columns {
            let at = self.buf.len() - rest.len();
            match split_column(rest) {
                Ok((_, next)) => rest = next,
                Err(fault) => return Err(self.column_fault(column, at, rest.len(), fault)),
            }
        }
        let end = self.buf.len() - rest.len();
        self.pos = end;
        Ok(TupleData::new(
            columns,
            self.buf.get(start..end).unwrap_or_default(),
        ))
    }

    fn column_fault(&self, column: u16, at: usize, left: usize, fault: ColumnFault) -> DecodeError {
        let (field, offset, detail) = match fault {
            ColumnFault::Truncated {
                field,
                at: rel,
                needed,
            } => (
                field,
                at + rel,
                format!(
                    "truncated: need {needed} bytes, {} left",
                    left.saturating_sub(rel)
                ),
            ),
            ColumnFault::BadKind(b) => (
                "column kind",
                at,
                format!("0x{b:02x}, expected 'n', 'u', 't' or 'b'"),
            ),
            ColumnFault::NegativeLength(n) => ("column length", at + 1, format!("{n} < 0")),
        };
        DecodeError::InvalidColumn {
            message: self.message,
            column,
            field,
            offset,
            detail,
        }
    }

    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes {
                message: self.message,
                offset: self.pos,
                extra,
            }),
        }
    }
}
