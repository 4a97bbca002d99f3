//! The copy plan of a MySQL/MariaDB table: primary-key ranges ("chunks"), each copied by one
//! `SELECT … WHERE <range>` inside the consistent snapshot. Pure: bound values in, ranges and SQL
//! text with their parameters out.
//!
//! Where it sits: `copy.rs` finds the bounds (`ORDER BY key LIMIT 1 OFFSET n` walked along the
//! primary key), announces the plan as
//! `SnapshotPlan` and copies chunk after chunk; the pipeline commits which chunks are done in
//! `cdcd.snapshot`, and a restart hands the same descriptions back.
//!
//! Why key ranges: a resumed copy reads the remaining chunks at a newer snapshot than the done
//! ones, so a row must belong to the same chunk at both snapshots; its key decides that (a key
//! change is a delete of the old key and a write of the new one, both replayed by the stream).
//!
//! A description is JSON: `{"lo":[{"i":100}],"hi":[{"i":200}]}` (`lo` inclusive, `hi` exclusive,
//! a missing bound open), key values typed as the server returned them (`i` signed, `u` unsigned,
//! `f` floating, `x` bytes in hex, `d` date/time parts, `t` a TIME), so they go back as typed
//! parameters and compare exactly (a string compared with an integer column would compare as a
//! double). Chunk 0 also records `from`: the binlog position the table is declared complete at
//! once copied (where streaming starts for it), because MySQL has no slot that remembers it: a
//! restart after a crash streams from there.

use mysql_async::Value;
use serde::{Deserialize, Serialize};

/// One primary-key value of a bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum KeyValue {
    #[serde(rename = "i")]
    Int(i64),
    #[serde(rename = "u")]
    UInt(u64),
    #[serde(rename = "f")]
    Float(f64),
    /// Bytes (strings, binary, decimals as text) in lowercase hex.
    #[serde(rename = "x")]
    Bytes(String),
    /// DATE/DATETIME/TIMESTAMP: year, month, day, hour, minute, second, microsecond.
    #[serde(rename = "d")]
    Date(u16, u8, u8, u8, u8, u8, u32),
    /// TIME: negative, days, hours, minutes, seconds, microseconds.
    #[serde(rename = "t")]
    Time(bool, u32, u8, u8, u8, u32),
}

impl KeyValue {
    /// `None` for NULL (a primary key has none).
    pub fn from_value(v: &Value) -> Option<KeyValue> {
        Some(match v {
            Value::NULL => return None,
            Value::Int(i) => KeyValue::Int(*i),
            Value::UInt(u) => KeyValue::UInt(*u),
            Value::Float(f) => KeyValue::Float(f64::from(*f)),
            Value::Double(f) => KeyValue::Float(*f),
            Value::Bytes(b) => KeyValue::Bytes(hex(b)),
            Value::Date(y, mo, d, h, mi, s, us) => KeyValue::Date(*y, *mo, *d, *h, *mi, *s, *us),
            Value::Time(neg, d, h, m, s, us) => KeyValue::Time(*neg, *d, *h, *m, *s, *us),
        })
    }

    /// The statement parameter; `None` when the hex text is corrupt.
    pub fn to_value(&self) -> Option<Value> {
        Some(match self {
            KeyValue::Int(i) => Value::Int(*i),
            KeyValue::UInt(u) => Value::UInt(*u),
            KeyValue::Float(f) => Value::Double(*f),
            KeyValue::Bytes(h) => Value::Bytes(unhex(h)?),
            KeyValue::Date(y, mo, d, h, mi, s, us) => Value::Date(*y, *mo, *d, *h, *mi, *s, *us),
            KeyValue::Time(neg, d, h, m, s, us) => Value::Time(*neg, *d, *h, *m, *s, *us),
        })
    }
}

/// A primary-key range `lo <= key < hi`, in the key's index order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lo: Option<Vec<KeyValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi: Option<Vec<KeyValue>>,
    /// Chunk 0 only: the position the table's copy is complete at (see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

impl KeyRange {
    pub fn to_description(&self) -> String {
        // Serializing numbers and strings cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_description(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// ` WHERE …` selecting the range over the quoted key `columns`, and its parameters in
    /// placeholder order; empty for the whole table. `None` when a stored bound is corrupt.
    ///
    /// A composite bound is spelled out (`a > ? OR (a = ? AND b >= ?)`) rather than as a row
    /// comparison `(a, b) >= (?, ?)`, which MariaDB does not turn into an index range.
    pub fn where_clause(&self, columns: &[String]) -> Option<(String, Vec<Value>)> {
        let mut parts = Vec::new();
        let mut params = Vec::new();
        if let Some(lo) = &self.lo {
            parts.push(bound(columns, lo, ">", ">=", &mut params)?);
        }
        if let Some(hi) = &self.hi {
            parts.push(bound(columns, hi, "<", "<", &mut params)?);
        }
        let clause = if parts.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", parts.join(" AND "))
        };
        Some((clause, params))
    }
}

/// `key <strict/last> values` in lexicographic order: for keys (a, b, c) and `>=`:
/// `(a > ? OR (a = ? AND (b > ? OR (b = ? AND c >= ?))))`.
fn bound(
    columns: &[String],
    values: &[KeyValue],
    strict: &str,
    last: &str,
    params: &mut Vec<Value>,
) -> Option<String> {
    if columns.len() != values.len() || columns.is_empty() {
        return None;
    }
    let mut text = String::new();
    let n = columns.len();
    for (i, (c, v)) in columns.iter().zip(values).enumerate() {
        let value = v.to_value()?;
        if i + 1 == n {
            text.push_str(&format!("{c} {last} ?"));
            params.push(value);
        } else {
            text.push_str(&format!("({c} {strict} ? OR ({c} = ? AND "));
            params.push(value.clone());
            params.push(value);
        }
    }
    for _ in 1..n {
        text.push_str("))");
    }
    Some(format!("({text})"))
}

/// How many chunks a table of `estimated_rows` gets.
pub fn chunk_count(estimated_rows: u64, chunk_rows: u64) -> u64 {
    estimated_rows.div_ceil(chunk_rows.max(1)).max(1)
}

/// Ranges between consecutive `bounds` (each a key, ascending): `(.., b0), [b0, b1), …, [bn, ..)`.
pub fn ranges_from_bounds(bounds: Vec<Vec<KeyValue>>) -> Vec<KeyRange> {
    let mut ranges = Vec::with_capacity(bounds.len() + 1);
    let mut lo = None;
    for b in bounds {
        ranges.push(KeyRange {
            lo: lo.take(),
            hi: Some(b.clone()),
            from: None,
        });
        lo = Some(b);
    }
    ranges.push(KeyRange {
        lo,
        hi: None,
        from: None,
    });
    ranges
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    text.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [h, l] => Some(digit(*h)? << 4 | digit(*l)?),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_round_trip_typed_values() {
        let r = KeyRange {
            lo: Some(vec![KeyValue::Int(-5), KeyValue::Bytes(hex(b"a'b\xff"))]),
            hi: Some(vec![
                KeyValue::UInt(u64::MAX),
                KeyValue::Date(2024, 1, 2, 3, 4, 5, 6),
            ]),
            from: Some("0-1-42".into()),
        };
        let d = r.to_description();
        assert_eq!(KeyRange::from_description(&d), Some(r.clone()));
        assert_eq!(
            r.lo.unwrap()[1].to_value(),
            Some(Value::Bytes(b"a'b\xff".to_vec()))
        );
        assert_eq!(
            KeyRange::default().to_description(),
            "{}",
            "an open range is the empty object"
        );
        assert_eq!(KeyValue::Bytes("zz".into()).to_value(), None);
        assert_eq!(KeyValue::Bytes("abc".into()).to_value(), None);
    }

    #[test]
    fn where_clauses_spell_out_composite_bounds() {
        let one = KeyRange {
            lo: Some(vec![KeyValue::Int(10)]),
            hi: Some(vec![KeyValue::Int(20)]),
            from: None,
        };
        let (sql, params) = one.where_clause(&["`id`".into()]).unwrap();
        assert_eq!(sql, " WHERE (`id` >= ?) AND (`id` < ?)");
        assert_eq!(params, [Value::Int(10), Value::Int(20)]);

        let two = KeyRange {
            lo: Some(vec![KeyValue::Int(1), KeyValue::Int(2)]),
            hi: None,
            from: None,
        };
        let (sql, params) = two.where_clause(&["`a`".into(), "`b`".into()]).unwrap();
        assert_eq!(sql, " WHERE ((`a` > ? OR (`a` = ? AND `b` >= ?)))");
        assert_eq!(params, [Value::Int(1), Value::Int(1), Value::Int(2)]);
        assert_eq!(
            KeyRange::default().where_clause(&["`a`".into()]),
            Some((String::new(), vec![]))
        );
        // A bound with the wrong arity is corrupt, not a full-table copy.
        assert_eq!(two.where_clause(&["`a`".into()]), None);
    }

    #[test]
    fn bounds_become_adjacent_ranges() {
        let r = ranges_from_bounds(vec![vec![KeyValue::Int(5)], vec![KeyValue::Int(9)]]);
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].lo, Some(vec![KeyValue::Int(5)]));
        assert_eq!(r[1].hi, Some(vec![KeyValue::Int(9)]));
        assert_eq!(ranges_from_bounds(vec![]), vec![KeyRange::default()]);
        assert_eq!(chunk_count(0, 10), 1);
        assert_eq!(chunk_count(25, 10), 3);
    }
}
