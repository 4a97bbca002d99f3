//! pgoutput messages written byte by byte, for the tests of the decoder and the assembler: one
//! builder, so both speak the wire format (PostgreSQL docs, "Logical Replication Message
//! Formats") the same way.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;

use super::ColumnValue;

/// A message under construction: its tag byte, then fields in the order they are appended.
pub struct Msg(pub Vec<u8>);

impl Msg {
    pub fn new(tag: u8) -> Self {
        Msg(vec![tag])
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// The transaction id a message inside a streamed transaction carries (protocol 2+).
    pub fn xid(self, xid: Option<u32>) -> Self {
        match xid {
            Some(x) => self.u32(x),
            None => self,
        }
    }
    pub fn cstr(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }
    /// A TupleData of decoded column values.
    pub fn tuple(mut self, cols: &[ColumnValue<'_>]) -> Self {
        self = self.u16(u16::try_from(cols.len()).unwrap());
        for c in cols {
            match c {
                ColumnValue::Null => self.0.push(b'n'),
                ColumnValue::UnchangedToast => self.0.push(b'u'),
                ColumnValue::Text(v) | ColumnValue::Binary(v) => {
                    self.0.push(if matches!(c, ColumnValue::Text(_)) {
                        b't'
                    } else {
                        b'b'
                    });
                    self = self.i32(i32::try_from(v.len()).unwrap());
                    self.0.extend_from_slice(v);
                }
            }
        }
        self
    }
    /// A TupleData of text values: `None` = NULL, [`TOAST`] = unchanged TOAST.
    pub fn text_tuple(self, values: &[Option<&str>]) -> Self {
        let cols: Vec<ColumnValue<'_>> = values
            .iter()
            .map(|v| match *v {
                None => ColumnValue::Null,
                TOAST => ColumnValue::UnchangedToast,
                Some(t) => ColumnValue::Text(t.as_bytes()),
            })
            .collect();
        self.tuple(&cols)
    }
    pub fn done(self) -> Bytes {
        Bytes::from(self.0)
    }
}

/// The text value [`Msg::text_tuple`] writes as an unchanged TOASTed column.
pub const TOAST: Option<&str> = Some("\u{0}u");
