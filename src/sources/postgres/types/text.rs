//! Parsers for Postgres text output, from `&[u8]` without allocating.
//!
//! Each parser reads exactly what the type's output function writes under the session settings the
//! source pins (`DateStyle=ISO`, `IntervalStyle=iso_8601`, `TimeZone=UTC`, `bytea_output=hex`), and
//! returns a static reason on anything else; [`super::ColumnType::append_text`] turns that into a
//! `ValueError` naming the type and the text.

use std::borrow::Cow;
use std::io::Write;

use arrow_array::builder::BinaryBuilder;

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;
/// Days from 0000-03-01 to 1970-01-01 in the proleptic Gregorian calendar.
const EPOCH_SHIFT_DAYS: i64 = 719_468;

pub(super) fn utf8(v: &[u8]) -> Option<&str> {
    std::str::from_utf8(v).ok()
}

/// A decimal integer with an optional sign (`int2out`, `int4out`, `int8out`, `oidout`).
pub(super) fn parse_i64(v: &[u8]) -> Option<i64> {
    let (neg, digits) = match v {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, v),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulate negatively so that i64::MIN parses.
    let mut acc: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_sub(i64::from(d))?;
    }
    if neg {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

/// `numeric_out` text (`-123.4500`; never an exponent) as an i128 scaled by `10^scale`.
pub(super) fn parse_decimal(v: &[u8], precision: u8, scale: i8) -> Result<i128, &'static str> {
    if matches!(v, b"NaN" | b"Infinity" | b"-Infinity") {
        return Err("is NaN or infinite, which a numeric with precision and scale cannot hold");
    }
    const TOO_LONG: &str = "has more digits than the column's precision";
    let (neg, digits) = match v {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, v),
    };
    let (int_part, frac_part) = match digits.iter().position(|&b| b == b'.') {
        Some(dot) => (
            digits.get(..dot).unwrap_or_default(),
            digits.get(dot + 1..).unwrap_or_default(),
        ),
        None => (digits, &[][..]),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err("is not a number");
    }
    let scale = usize::try_from(scale).unwrap_or(0);
    let mut acc: i128 = 0;
    let push = |acc: i128, b: u8| -> Result<i128, &'static str> {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return Err("is not a number");
        }
        acc.checked_mul(10)
            .and_then(|a| a.checked_add(i128::from(d)))
            .ok_or(TOO_LONG)
    };
    for &b in int_part {
        acc = push(acc, b)?;
    }
    let mut taken = 0;
    for &b in frac_part {
        if taken < scale {
            acc = push(acc, b)?;
            taken += 1;
        } else if b != b'0' {
            if !b.is_ascii_digit() {
                return Err("is not a number");
            }
            return Err("has more fractional digits than the column's scale");
        }
    }
    for _ in taken..scale {
        acc = acc.checked_mul(10).ok_or(TOO_LONG)?;
    }
    let limit = 10i128
        .checked_pow(u32::from(precision))
        .unwrap_or(i128::MAX);
    if acc >= limit {
        return Err(TOO_LONG);
    }
    Ok(if neg { -acc } else { acc })
}

/// `byteaout`: hex (`\x0aff`) or the older escape format (`a\\b\001`), written straight into the
/// builder's value buffer.
pub(super) fn append_bytea(b: &mut BinaryBuilder, v: &[u8]) -> Result<(), &'static str> {
    const WRITE: &str = "could not be written to the Arrow builder";
    if let Some(hex) = v.strip_prefix(b"\\x") {
        // Validate first: bytes written before an error would leak into the next value.
        if hex.len() % 2 != 0 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err("is not valid bytea hex");
        }
        let mut chunk = [0u8; 256];
        for pairs in hex.chunks(chunk.len() * 2) {
            let mut n = 0;
            for (out, pair) in chunk.iter_mut().zip(pairs.chunks_exact(2)) {
                if let [hi, lo] = pair {
                    *out = (hex_value(*hi) << 4) | hex_value(*lo);
                    n += 1;
                }
            }
            b.write_all(chunk.get(..n).unwrap_or_default())
                .map_err(|_| WRITE)?;
        }
    } else {
        // Escape format: `\\` is a backslash, `\ooo` an octal byte, anything else itself.
        let mut i = 0;
        while i < v.len() {
            if v.get(i) == Some(&b'\\') {
                match v.get(i + 1..i + 4) {
                    Some([b'\\', ..]) => i += 2,
                    Some([a, b, c]) if is_octal(*a) && is_octal(*b) && is_octal(*c) => i += 4,
                    _ => return Err("is not valid bytea escape text"),
                }
            } else {
                i += 1;
            }
        }
        let mut rest = v;
        while !rest.is_empty() {
            let plain = rest.iter().position(|&c| c == b'\\').unwrap_or(rest.len());
            let (run, tail) = rest.split_at(plain);
            b.write_all(run).map_err(|_| WRITE)?;
            rest = match tail {
                [b'\\', b'\\', more @ ..] => {
                    b.write_all(b"\\").map_err(|_| WRITE)?;
                    more
                }
                [b'\\', a, c, d, more @ ..] => {
                    let byte = ((a - b'0') << 6) | ((c - b'0') << 3) | (d - b'0');
                    b.write_all(&[byte]).map_err(|_| WRITE)?;
                    more
                }
                _ => &[],
            };
        }
    }
    // Closes the value whose bytes were written above.
    b.append_value(b"");
    Ok(())
}

fn is_octal(b: u8) -> bool {
    (b'0'..=b'7').contains(&b)
}

/// The value of an ASCII hex digit (callers check `is_ascii_hexdigit` first).
pub(crate) fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

/// `uuid_out`: 32 hex digits in 8-4-4-4-12 groups.
pub(super) fn parse_uuid(v: &[u8]) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut nibbles = 0usize;
    for &b in v {
        if b == b'-' {
            continue;
        }
        if !b.is_ascii_hexdigit() {
            return None;
        }
        let byte = out.get_mut(nibbles / 2)?;
        *byte = (*byte << 4) | hex_value(b);
        nibbles += 1;
    }
    (nibbles == 32).then_some(out)
}

/// `date_out` with `DateStyle=ISO`: `2024-01-02`, `4713-01-01 BC`, `infinity`, `-infinity`.
/// Days since 1970-01-01; infinities are `±i32::MAX`.
pub(super) fn parse_date(v: &[u8]) -> Result<i32, &'static str> {
    match v {
        b"infinity" => return Ok(i32::MAX),
        b"-infinity" => return Ok(-i32::MAX),
        _ => {}
    }
    let (v, bc) = strip_bc(v);
    let (days, rest) = parse_ymd(v, bc)?;
    if !rest.is_empty() {
        return Err("is not a date");
    }
    i32::try_from(days).map_err(|_| "is out of the Date32 range")
}

/// `time_out`: `HH:MM:SS[.ffffff]` as microseconds since midnight.
pub(super) fn parse_time(v: &[u8]) -> Result<i64, &'static str> {
    match parse_hms(v)? {
        (micros, []) => Ok(micros),
        _ => Err("is not a time"),
    }
}

/// `timestamp_out` / `timestamptz_out` with `DateStyle=ISO`: `2024-01-02 03:04:05.123456`, then
/// for timestamptz an offset `+HH[:MM[:SS]]`, then ` BC` for BC years. Microseconds since the
/// epoch in UTC; infinities are `±i64::MAX`.
pub(super) fn parse_timestamp(v: &[u8], with_offset: bool) -> Result<i64, &'static str> {
    match v {
        b"infinity" => return Ok(i64::MAX),
        b"-infinity" => return Ok(-i64::MAX),
        _ => {}
    }
    const BAD: &str = "is not a timestamp";
    let (v, bc) = strip_bc(v);
    let (days, rest) = parse_ymd(v, bc)?;
    let time = rest.strip_prefix(b" ").ok_or(BAD)?;
    let (micros, rest) = parse_hms(time)?;
    let offset = match (with_offset, rest) {
        (false, []) => 0,
        (true, [sign @ (b'+' | b'-'), tz @ ..]) => {
            let seconds = parse_offset(tz).ok_or("has an invalid UTC offset")?;
            if *sign == b'-' {
                -seconds
            } else {
                seconds
            }
        }
        _ => return Err(BAD),
    };
    days.checked_mul(MICROS_PER_DAY)
        .and_then(|d| d.checked_add(micros))
        .and_then(|t| t.checked_sub(offset * MICROS_PER_SECOND))
        .ok_or("is out of the timestamp range")
}

/// `HH[:MM[:SS]]` of a UTC offset, in seconds.
fn parse_offset(v: &[u8]) -> Option<i64> {
    let (h, rest) = two_digits(v)?;
    let (m, rest) = match rest {
        [b':', more @ ..] => two_digits(more)?,
        _ => (0, rest),
    };
    let (s, rest) = match rest {
        [b':', more @ ..] => two_digits(more)?,
        _ => (0, rest),
    };
    (rest.is_empty() && m < 60 && s < 60).then_some(h * 3600 + m * 60 + s)
}

fn strip_bc(v: &[u8]) -> (&[u8], bool) {
    match v.strip_suffix(b" BC") {
        Some(rest) => (rest, true),
        None => (v, false),
    }
}

/// `Y…Y-MM-DD` (four or more year digits) at the start of `v`: days since 1970-01-01 and the rest.
fn parse_ymd(v: &[u8], bc: bool) -> Result<(i64, &[u8]), &'static str> {
    const BAD: &str = "is not a date";
    let year_len = v.iter().take_while(|b| b.is_ascii_digit()).count();
    if !(1..=9).contains(&year_len) {
        return Err(BAD);
    }
    let (year_digits, rest) = v.split_at(year_len);
    let year = parse_i64(year_digits).ok_or(BAD)?;
    let (month, rest) = rest.strip_prefix(b"-").and_then(two_digits).ok_or(BAD)?;
    let (day, rest) = rest.strip_prefix(b"-").and_then(two_digits).ok_or(BAD)?;
    // Postgres counts 1 BC, 2 BC…; the proleptic Gregorian calendar has year 0 = 1 BC.
    let year = if bc { 1 - year } else { year };
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err("is not a valid calendar date");
    }
    Ok((days_from_civil(year, month, day), rest))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant, "chrono-Compatible Low-Level
/// Date Algorithms", `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - EPOCH_SHIFT_DAYS
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year.rem_euclid(4) == 0
            && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0) =>
        {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `HH:MM:SS[.f…]` (1–6 fraction digits) at the start of `v`: microseconds and the rest.
fn parse_hms(v: &[u8]) -> Result<(i64, &[u8]), &'static str> {
    const BAD: &str = "is not a time of day";
    let (h, rest) = two_digits(v).ok_or(BAD)?;
    let (m, rest) = rest.strip_prefix(b":").and_then(two_digits).ok_or(BAD)?;
    let (s, mut rest) = rest.strip_prefix(b":").and_then(two_digits).ok_or(BAD)?;
    let mut fraction = 0;
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|b| b.is_ascii_digit()).count();
        if !(1..=6).contains(&n) {
            return Err("has other than 1 to 6 fractional second digits");
        }
        let (digits, after) = frac.split_at(n);
        fraction = parse_i64(digits).ok_or(BAD)? * 10i64.pow(6 - n as u32);
        rest = after;
    }
    if m > 59 || s > 60 {
        return Err(BAD);
    }
    let micros = (h * 3600 + m * 60 + s) * MICROS_PER_SECOND + fraction;
    if micros > MICROS_PER_DAY {
        return Err(BAD);
    }
    Ok((micros, rest))
}

fn two_digits(v: &[u8]) -> Option<(i64, &[u8])> {
    match v {
        [a, b, rest @ ..] if a.is_ascii_digit() && b.is_ascii_digit() => {
            Some((i64::from((a - b'0') * 10 + (b - b'0')), rest))
        }
        _ => None,
    }
}

pub(super) fn trim_start(v: &[u8]) -> &[u8] {
    let n = v.iter().take_while(|b| b.is_ascii_whitespace()).count();
    v.get(n..).unwrap_or_default()
}

fn trim_end(v: &[u8]) -> &[u8] {
    let n = v
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_whitespace())
        .count();
    v.get(..v.len() - n).unwrap_or_default()
}

/// One element of an array literal.
pub(super) enum ArrayItem<'a> {
    Null,
    /// The element's text, unescaped (borrowed unless it had backslash escapes).
    Value(Cow<'a, [u8]>),
}

/// The element at the start of `v` (`array_in` syntax) and what follows it. Quoted elements
/// (`"a \"b\""`) are never NULL; an unquoted `NULL` is.
pub(super) fn array_item(v: &[u8]) -> Result<(ArrayItem<'_>, &[u8]), &'static str> {
    match v.first() {
        Some(b'{') => Err("is a multi-dimensional array"),
        Some(b'"') => {
            let body = v.get(1..).unwrap_or_default();
            let mut escaped = false;
            let mut i = 0;
            let end = loop {
                match body.get(i) {
                    None => return Err("has an unterminated quoted element"),
                    Some(b'\\') => {
                        escaped = true;
                        i += 2;
                    }
                    Some(b'"') => break i,
                    Some(_) => i += 1,
                }
            };
            let raw = body.get(..end).unwrap_or_default();
            let after = body.get(end + 1..).unwrap_or_default();
            Ok((ArrayItem::Value(unescape(raw, escaped)), after))
        }
        Some(_) => {
            let mut escaped = false;
            let mut i = 0;
            while let Some(&b) = v.get(i) {
                match b {
                    b',' => break,
                    b'\\' => {
                        escaped = true;
                        i += 2;
                    }
                    b'"' | b'{' | b'}' => return Err("has a malformed element"),
                    _ => i += 1,
                }
            }
            let raw = trim_end(v.get(..i).unwrap_or(v));
            let after = v.get(i..).unwrap_or_default();
            if raw.is_empty() {
                return Err("has an empty element");
            }
            if !escaped && raw.eq_ignore_ascii_case(b"NULL") {
                return Ok((ArrayItem::Null, after));
            }
            Ok((ArrayItem::Value(unescape(raw, escaped)), after))
        }
        None => Err("has an empty element"),
    }
}

/// Drops the backslash of each `\c` pair (array element escaping); allocates only if there is one.
fn unescape(raw: &[u8], escaped: bool) -> Cow<'_, [u8]> {
    if !escaped {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            if let Some(&next) = bytes.next() {
                out.push(next);
            }
        } else {
            out.push(b);
        }
    }
    Cow::Owned(out)
}
