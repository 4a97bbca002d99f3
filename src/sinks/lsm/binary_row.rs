//! Paimon's `BinaryRow` encoding, and the bucket a key hashes to.
//!
//! Manifests carry keys and statistics as serialized `BinaryRow`s (`_MIN_KEY`, `_MAX_KEY`,
//! `_KEY_STATS`, `_PARTITION`), and a fixed-bucket table puts a row in bucket
//! `abs(murmur3(key BinaryRow) % buckets)`. Both must match Paimon byte for byte: readers decode
//! the statistics to prune files, and another Paimon writer must route a key to the bucket cdcd
//! used, or the deduplicate merge would see two live versions of one key.
//!
//! Layout (Paimon `BinaryRow`, `BinaryRowSerializer`; pypaimon `GenericRowSerializer.to_bytes`):
//! a 4-byte big-endian arity prefix (serialized form only), then the fixed part: a null bit set
//! of `((arity + 63 + 8) / 64) * 8` bytes whose first byte is the row kind (bit `i + 8` marks field
//! `i` NULL), then 8 bytes per field; then the variable part in 8-byte words. Fixed-size values sit
//! little-endian in their slot. Strings and bytes of at most 7 bytes sit inline with
//! `0x80 | len` in the slot's last byte; longer ones go to the variable part and the slot holds
//! `offset << 32 | len` (offset from the row start, after the prefix). Timestamps of precision
//! above 3 keep epoch millis in the variable part and `offset << 32 | nano-of-milli` in the slot;
//! decimals of precision above 18 keep 16 bytes of big-endian unscaled value in the variable part.
//! Row hashing covers the row without the arity prefix, word by word (`MurmurHashUtils.hashBytesByWords`,
//! seed 42).

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, Time32MillisecondType, TimestampMicrosecondType,
};
use arrow_array::{
    new_null_array, Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array,
    Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, StringArray,
    Time32MillisecondArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, TimeUnit};
use std::sync::Arc;

/// A value type `BinaryRow` cannot hold (the schema mapping rejects these first).
#[derive(Debug, thiserror::Error)]
#[error("type {0} has no Paimon BinaryRow encoding")]
pub struct UnsupportedRowType(pub DataType);

const HEADER_BITS: usize = 8;

fn null_bits_width(arity: usize) -> usize {
    (arity + 63 + HEADER_BITS) / 64 * 8
}

/// Appends the serialized `BinaryRow` (arity prefix included) of row `row` of `columns` to `out`.
/// `out` is cleared first so one buffer serves many rows.
pub fn encode(
    out: &mut Vec<u8>,
    columns: &[&dyn Array],
    row: usize,
) -> Result<(), UnsupportedRowType> {
    out.clear();
    let arity = columns.len();
    out.extend_from_slice(&(arity as i32).to_be_bytes());
    let base = out.len();
    let nulls = null_bits_width(arity);
    let fixed = nulls + arity * 8;
    out.resize(base + fixed, 0);
    for (i, col) in columns.iter().enumerate() {
        let slot = base + nulls + i * 8;
        if col.is_null(row) {
            let bit = i + HEADER_BITS;
            if let Some(b) = out.get_mut(base + bit / 8) {
                *b |= 1 << (bit % 8);
            }
            continue;
        }
        // `None`: the value wrote its slot itself (strings and bytes).
        let word: Option<u64> = Some(match col.data_type() {
            DataType::Boolean => u64::from(col.as_boolean().value(row)),
            DataType::Int8 => u64::from(col.as_primitive::<Int8Type>().value(row) as u8),
            DataType::Int16 => u64::from(col.as_primitive::<Int16Type>().value(row) as u16),
            DataType::Int32 => u64::from(col.as_primitive::<Int32Type>().value(row) as u32),
            DataType::Date32 => u64::from(col.as_primitive::<Date32Type>().value(row) as u32),
            DataType::Time32(TimeUnit::Millisecond) => {
                u64::from(col.as_primitive::<Time32MillisecondType>().value(row) as u32)
            }
            DataType::Int64 => col.as_primitive::<Int64Type>().value(row) as u64,
            DataType::Float32 => u64::from(col.as_primitive::<Float32Type>().value(row).to_bits()),
            DataType::Float64 => col.as_primitive::<Float64Type>().value(row).to_bits(),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                let micros = col.as_primitive::<TimestampMicrosecondType>().value(row);
                let millis = micros.div_euclid(1000);
                let nano_of_milli = (micros.rem_euclid(1000) * 1000) as u64;
                let offset = append_var(out, base, &millis.to_le_bytes(), 8);
                (offset << 32) | nano_of_milli
            }
            DataType::Decimal128(p, _) => {
                let unscaled = col.as_primitive::<Decimal128Type>().value(row);
                if *p <= 18 {
                    unscaled as i64 as u64
                } else {
                    let bytes = unscaled.to_be_bytes();
                    let minimal = minimal_be(&bytes, unscaled < 0);
                    let offset = append_var(out, base, minimal, 16);
                    (offset << 32) | minimal.len() as u64
                }
            }
            DataType::Utf8 => {
                var_len(
                    out,
                    base,
                    slot,
                    col.as_string::<i32>().value(row).as_bytes(),
                );
                continue;
            }
            DataType::Binary => {
                var_len(out, base, slot, col.as_binary::<i32>().value(row));
                continue;
            }
            other => return Err(UnsupportedRowType(other.clone())),
        });
        if let (Some(word), Some(s)) = (word, out.get_mut(slot..slot + 8)) {
            s.copy_from_slice(&word.to_le_bytes());
        }
    }
    Ok(())
}

/// The shortest two's-complement big-endian form (Java `BigInteger.toByteArray`).
fn minimal_be(bytes: &[u8; 16], negative: bool) -> &[u8] {
    let fill = if negative { 0xFF } else { 0x00 };
    let mut start = 0;
    while start < 15 {
        let (Some(&b), Some(&next)) = (bytes.get(start), bytes.get(start + 1)) else {
            break;
        };
        if b == fill && ((next & 0x80) != 0) == negative {
            start += 1;
        } else {
            break;
        }
    }
    bytes.get(start..).unwrap_or(bytes)
}

/// Appends `data` to the variable part, padded to `min(width)`/8-byte words; returns its offset
/// from the row start.
fn append_var(out: &mut Vec<u8>, base: usize, data: &[u8], min: usize) -> u64 {
    let offset = (out.len() - base) as u64;
    out.extend_from_slice(data);
    let len = data.len().max(min);
    let padded = len.div_ceil(8) * 8;
    out.resize(out.len() + (padded - data.len()), 0);
    offset
}

/// Writes a string or bytes value into `slot` (inline when at most 7 bytes).
fn var_len(out: &mut Vec<u8>, base: usize, slot: usize, data: &[u8]) {
    if data.len() <= 7 {
        if let Some(s) = out.get_mut(slot..slot + 8) {
            s.fill(0);
            if let Some(d) = s.get_mut(..data.len()) {
                d.copy_from_slice(data);
            }
            if let Some(last) = s.get_mut(7) {
                *last = 0x80 | data.len() as u8;
            }
        }
    } else {
        let offset = append_var(out, base, data, 0);
        let word = (offset << 32) | data.len() as u64;
        if let Some(s) = out.get_mut(slot..slot + 8) {
            s.copy_from_slice(&word.to_le_bytes());
        }
    }
}

/// A serialized `BinaryRow` that [`decode`] cannot read as the given types.
#[derive(Debug, thiserror::Error)]
#[error("BinaryRow of {len} bytes does not hold {types} values of these types: {detail}")]
pub struct MalformedRow {
    len: usize,
    types: usize,
    detail: &'static str,
}

/// Reads a serialized `BinaryRow` (arity prefix included), as [`encode`] writes it, back into
/// one-row arrays of `types` (a data file's key columns as stored). Used to compare a file's
/// `min_key`/`max_key` from a manifest with keys being written.
pub fn decode(serialized: &[u8], types: &[DataType]) -> Result<Vec<ArrayRef>, MalformedRow> {
    let bad = |detail| MalformedRow {
        len: serialized.len(),
        types: types.len(),
        detail,
    };
    let arity = serialized
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(i32::from_be_bytes)
        .ok_or_else(|| bad("no arity prefix"))?;
    if usize::try_from(arity).ok() != Some(types.len()) {
        return Err(bad("arity differs"));
    }
    let row = serialized.get(4..).unwrap_or_default();
    let nulls = null_bits_width(types.len());
    let mut out = Vec::with_capacity(types.len());
    for (i, dt) in types.iter().enumerate() {
        let bit = i + HEADER_BITS;
        let null = row.get(bit / 8).ok_or_else(|| bad("short null bits"))? & (1 << (bit % 8)) != 0;
        let slot: [u8; 8] = row
            .get(nulls + i * 8..nulls + i * 8 + 8)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("short fixed part"))?;
        let word = u64::from_le_bytes(slot);
        // Out-of-line data: `offset << 32 | len` from the row start.
        let var = |len: usize| {
            let at = (word >> 32) as usize;
            row.get(at..at + len)
                .ok_or_else(|| bad("variable part out of range"))
        };
        let array: ArrayRef = match dt {
            _ if null => new_null_array(dt, 1),
            DataType::Boolean => Arc::new(BooleanArray::from(vec![word & 1 == 1])),
            DataType::Int8 => Arc::new(Int8Array::from(vec![word as u8 as i8])),
            DataType::Int16 => Arc::new(Int16Array::from(vec![word as u16 as i16])),
            DataType::Int32 => Arc::new(Int32Array::from(vec![word as u32 as i32])),
            DataType::Date32 => Arc::new(Date32Array::from(vec![word as u32 as i32])),
            DataType::Time32(TimeUnit::Millisecond) => {
                Arc::new(Time32MillisecondArray::from(vec![word as u32 as i32]))
            }
            DataType::Int64 => Arc::new(Int64Array::from(vec![word as i64])),
            DataType::Float32 => Arc::new(Float32Array::from(vec![f32::from_bits(word as u32)])),
            DataType::Float64 => Arc::new(Float64Array::from(vec![f64::from_bits(word)])),
            DataType::Timestamp(TimeUnit::Microsecond, zone) => {
                let millis: [u8; 8] = var(8)?.try_into().map_err(|_| bad("timestamp"))?;
                let micros = i64::from_le_bytes(millis)
                    .saturating_mul(1000)
                    .saturating_add((word & 0xFFFF_FFFF) as i64 / 1000);
                Arc::new(
                    TimestampMicrosecondArray::from(vec![micros]).with_timezone_opt(zone.clone()),
                )
            }
            DataType::Decimal128(p, s) => {
                let unscaled = if *p <= 18 {
                    i128::from(word as i64)
                } else {
                    let bytes = var((word & 0xFFFF_FFFF) as usize)?;
                    if bytes.is_empty() || bytes.len() > 16 {
                        return Err(bad("decimal width"));
                    }
                    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
                    let mut full = [if negative { 0xFF } else { 0 }; 16];
                    if let Some(tail) = full.get_mut(16 - bytes.len()..) {
                        tail.copy_from_slice(bytes);
                    }
                    i128::from_be_bytes(full)
                };
                Arc::new(
                    Decimal128Array::from(vec![unscaled])
                        .with_precision_and_scale(*p, *s)
                        .map_err(|_| bad("decimal precision"))?,
                )
            }
            DataType::Utf8 | DataType::Binary => {
                let data = if slot[7] & 0x80 != 0 {
                    slot.get(..usize::from(slot[7] & 0x7F))
                        .ok_or_else(|| bad("inline length"))?
                } else {
                    var((word & 0xFFFF_FFFF) as usize)?
                };
                if *dt == DataType::Utf8 {
                    let text = std::str::from_utf8(data).map_err(|_| bad("string is not UTF-8"))?;
                    Arc::new(StringArray::from(vec![text]))
                } else {
                    Arc::new(BinaryArray::from(vec![data]))
                }
            }
            _ => return Err(bad("unsupported type")),
        };
        out.push(array);
    }
    Ok(out)
}

/// The empty row (no partition keys): what `_PARTITION` and partition statistics hold.
pub fn empty_row() -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&0i32.to_be_bytes());
    out.resize(4 + null_bits_width(0), 0);
    out
}

/// The bucket of a key whose serialized `BinaryRow` (with prefix) is `serialized`.
pub fn bucket(serialized: &[u8], buckets: u32) -> u32 {
    let body = serialized.get(4..).unwrap_or(&[]);
    let hash = hash_bytes_by_words(body, 42) as i32;
    // Java `Math.abs(hash % numBuckets)` (`KeyAndBucketExtractor.bucket`).
    (hash % buckets.max(1) as i32).unsigned_abs()
}

/// MurmurHash3 (32-bit) over whole little-endian words, as Paimon's `hashBytesByWords`.
fn hash_bytes_by_words(data: &[u8], seed: u32) -> u32 {
    let mut h1 = seed;
    for chunk in data.chunks_exact(4) {
        let k1 = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let k1 = k1
            .wrapping_mul(0xCC9E_2D51)
            .rotate_left(15)
            .wrapping_mul(0x1B87_3593);
        h1 ^= k1;
        h1 = h1.rotate_left(13).wrapping_mul(5).wrapping_add(0xE654_6B64);
    }
    h1 ^= data.len() as u32;
    h1 ^= h1 >> 16;
    h1 = h1.wrapping_mul(0x85EB_CA6B);
    h1 ^= h1 >> 13;
    h1 = h1.wrapping_mul(0xC2B2_AE35);
    h1 ^= h1 >> 16;
    h1
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray, TimestampMicrosecondArray};

    fn enc(cols: &[&dyn Array], row: usize) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, cols, row).unwrap();
        out
    }

    #[test]
    fn bigint_key_matches_pypaimon_bytes() {
        // Captured from a table pypaimon 2.1 wrote: `_MIN_KEY` of id = 1.
        let ids = Int64Array::from(vec![1, 2, 3]);
        let got = enc(&[&ids], 0);
        assert_eq!(
            got,
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
        );
        assert_eq!(empty_row(), vec![0u8; 12]);
    }

    #[test]
    fn strings_inline_and_in_the_variable_part() {
        let s = StringArray::from(vec![Some("abc"), Some("a longer string"), None]);
        let short = enc(&[&s], 0);
        assert_eq!(&short[12..20], b"abc\x00\x00\x00\x00\x83");
        let long = enc(&[&s], 1);
        assert_eq!(long.len(), 4 + 16 + 16);
        assert_eq!(&long[12..20], &((16u64 << 32) | 15).to_le_bytes());
        assert_eq!(&long[20..35], b"a longer string");
        let null = enc(&[&s], 2);
        assert_eq!(null[4], 0);
        assert_eq!(null[5], 1, "bit 8 marks field 0 NULL");
    }

    #[test]
    fn timestamps_keep_millis_out_of_line() {
        let ts = TimestampMicrosecondArray::from(vec![1_500_250]);
        let got = enc(&[&ts], 0);
        assert_eq!(&got[12..20], &((16u64 << 32) | 250_000).to_le_bytes());
        assert_eq!(&got[20..28], &1500i64.to_le_bytes());
    }

    #[test]
    fn decode_reads_back_what_encode_wrote() {
        use arrow_array::{BinaryArray, Decimal128Array, Int32Array};
        let ids = Int64Array::from(vec![Some(-7), None]);
        let short = StringArray::from(vec!["abc", "x"]);
        let long = BinaryArray::from(vec![b"a longer value".as_ref(), b"".as_ref()]);
        let ts = TimestampMicrosecondArray::from(vec![-1_500_250, 3]).with_timezone("UTC");
        let small = Decimal128Array::from(vec![-12345, 0])
            .with_precision_and_scale(12, 2)
            .unwrap();
        let wide = Decimal128Array::from(vec![-(10i128.pow(30)) - 1, 255])
            .with_precision_and_scale(38, 4)
            .unwrap();
        let day = Int32Array::from(vec![i32::MIN, 5]);
        let cols: Vec<&dyn Array> = vec![&ids, &short, &long, &ts, &small, &wide, &day];
        let types: Vec<DataType> = cols.iter().map(|c| c.data_type().clone()).collect();
        for row in 0..2 {
            let back = decode(&enc(&cols, row), &types).unwrap();
            for (c, b) in cols.iter().zip(&back) {
                assert_eq!(&c.slice(row, 1).to_data(), &b.to_data(), "row {row}");
            }
        }
        assert!(decode(&enc(&cols, 0), &types[..2]).is_err(), "arity");
        assert!(decode(&enc(&cols, 0)[..30], &types).is_err(), "truncated");
    }

    #[test]
    fn buckets_match_pypaimon() {
        // pypaimon 2.1 put ids 1 and 2 in bucket 0 and id 3 in bucket 1 of a 2-bucket table.
        let ids = Int64Array::from(vec![1, 2, 3]);
        let b: Vec<u32> = (0..3).map(|r| bucket(&enc(&[&ids], r), 2)).collect();
        assert_eq!(b, vec![0, 0, 1]);
    }
}
