//! Well-known binary geometries, read in the forms the sources send and written in the one
//! Iceberg v3 stores (ISO WKB, little-endian), with the bounding box of their coordinates. Pure.
//!
//! Forms read: OGC/ISO WKB (MySQL and MariaDB, after their 4-byte SRID prefix; type codes +1000
//! Z, +2000 M, +3000 ZM) and PostGIS's EWKB (flags in the type word: `0x80000000` Z,
//! `0x40000000` M, `0x20000000` an SRID follows the type). Either byte order, per geometry.
//! Every geometry is rewritten with ISO type codes and no SRID, so a value that went through a
//! data file once reads back as the same bytes.
//!
//! Layouts (OGC Simple Features 06-103r4 §8.2, ISO 13249-3): a point is its coordinates; a line
//! string, circular string, a count and that many points; a polygon, triangle, a count of rings
//! each a count of points; every other type (multi*, collections, compound curves, curve
//! polygons, polyhedral surfaces, TINs) a count of whole geometries.

/// The EWKB flags in a type word.
const EWKB_Z: u32 = 0x8000_0000;
const EWKB_M: u32 = 0x4000_0000;
const EWKB_SRID: u32 = 0x2000_0000;
/// Nesting deeper than this is refused rather than followed (a hostile value).
const MAX_DEPTH: u8 = 32;

/// Why a value is not a geometry this module reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a WKB geometry: {0}")]
pub(crate) struct WkbError(pub String);

fn bad(detail: impl Into<String>) -> WkbError {
    WkbError(detail.into())
}

/// The coordinate ranges of a geometry's points; NaN coordinates (an empty point) are left out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bbox {
    pub min: [f64; 4],
    pub max: [f64; 4],
}

impl Default for Bbox {
    fn default() -> Self {
        Bbox {
            min: [f64::INFINITY; 4],
            max: [f64::NEG_INFINITY; 4],
        }
    }
}

impl Bbox {
    fn add(&mut self, axis: usize, v: f64) {
        if !v.is_nan() {
            self.min[axis] = self.min[axis].min(v);
            self.max[axis] = self.max[axis].max(v);
        }
    }

    /// Widens this box to hold `other`.
    pub fn merge(&mut self, other: &Bbox) {
        for axis in 0..4 {
            self.min[axis] = self.min[axis].min(other.min[axis]);
            self.max[axis] = self.max[axis].max(other.max[axis]);
        }
    }

    fn has(&self, axis: usize) -> bool {
        self.min[axis] <= self.max[axis]
    }

    /// The Iceberg bounds (spec, "Bound Serialization"): each a point of little-endian doubles,
    /// `x:y`, `x:y:z`, `x:y:NaN:m` or `x:y:z:m`; `None` when no point has an x and a y.
    pub fn iceberg_bounds(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        if !self.has(0) || !self.has(1) {
            return None;
        }
        let point = |corner: &[f64; 4]| {
            let mut axes = vec![corner[0], corner[1]];
            match (self.has(2), self.has(3)) {
                (false, false) => {}
                (true, false) => axes.push(corner[2]),
                (false, true) => axes.extend([f64::NAN, corner[3]]),
                (true, true) => axes.extend([corner[2], corner[3]]),
            }
            axes.iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
        };
        Some((point(&self.min), point(&self.max)))
    }
}

/// A geometry rewritten as ISO WKB: its bytes, the SRID an EWKB value carried (`None`: none),
/// and its bounding box.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IsoWkb {
    pub bytes: Vec<u8>,
    pub srid: Option<u32>,
    pub bbox: Bbox,
}

/// Reads one geometry in any form above (the whole of `input`) and writes it as ISO WKB.
pub(crate) fn to_iso(input: &[u8]) -> Result<IsoWkb, WkbError> {
    let mut reader = Reader { input, pos: 0 };
    let mut out = IsoWkb {
        bytes: Vec::with_capacity(input.len()),
        srid: None,
        bbox: Bbox::default(),
    };
    geometry(&mut reader, &mut out, 0)?;
    if reader.pos != input.len() {
        return Err(bad(format!(
            "{} bytes after the geometry",
            input.len() - reader.pos
        )));
    }
    Ok(out)
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WkbError> {
        let bytes = self
            .input
            .get(self.pos..self.pos + N)
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or_else(|| bad(format!("ends at byte {}", self.input.len())))?;
        self.pos += N;
        Ok(bytes)
    }

    fn u32(&mut self, little: bool) -> Result<u32, WkbError> {
        let b = self.take::<4>()?;
        Ok(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }

    fn f64(&mut self, little: bool) -> Result<f64, WkbError> {
        let b = self.take::<8>()?;
        Ok(if little {
            f64::from_le_bytes(b)
        } else {
            f64::from_be_bytes(b)
        })
    }

    /// A count of items of at least `min_size` bytes each, checked against what is left.
    fn count(&mut self, little: bool, min_size: usize) -> Result<u32, WkbError> {
        let n = self.u32(little)?;
        let left = self.input.len() - self.pos;
        if (n as usize).saturating_mul(min_size) > left {
            return Err(bad(format!("a count of {n} in {left} bytes")));
        }
        Ok(n)
    }
}

fn geometry(r: &mut Reader<'_>, out: &mut IsoWkb, depth: u8) -> Result<(), WkbError> {
    if depth > MAX_DEPTH {
        return Err(bad("nested too deep"));
    }
    let little = match r.take::<1>()?[0] {
        0 => false,
        1 => true,
        other => return Err(bad(format!("byte order {other}"))),
    };
    let word = r.u32(little)?;
    let mut z = word & EWKB_Z != 0;
    let mut m = word & EWKB_M != 0;
    if word & EWKB_SRID != 0 {
        let srid = r.u32(little)?;
        if depth == 0 {
            out.srid = Some(srid);
        }
    }
    let code = word & 0x0FFF_FFFF;
    let base = code % 1000;
    match code / 1000 {
        0 => {}
        1 => z = true,
        2 => m = true,
        3 => (z, m) = (true, true),
        _ => return Err(bad(format!("type {code}"))),
    }
    let iso = base + u32::from(z) * 1000 + u32::from(m) * 2000;
    out.bytes.push(1);
    out.bytes.extend(iso.to_le_bytes());
    let dims = 2 + usize::from(z) + usize::from(m);
    let point = |r: &mut Reader<'_>, out: &mut IsoWkb| -> Result<(), WkbError> {
        for d in 0..dims {
            let v = r.f64(little)?;
            out.bytes.extend(v.to_le_bytes());
            let axis = match d {
                2 if !z => 3,
                d => d,
            };
            out.bbox.add(axis, v);
        }
        Ok(())
    };
    let points = |r: &mut Reader<'_>, out: &mut IsoWkb| -> Result<(), WkbError> {
        let n = r.count(little, dims * 8)?;
        out.bytes.extend(n.to_le_bytes());
        (0..n).try_for_each(|_| point(r, out))
    };
    match base {
        1 => point(r, out)?,
        // LineString, CircularString.
        2 | 8 => points(r, out)?,
        // Polygon, Triangle.
        3 | 17 => {
            let rings = r.count(little, 4)?;
            out.bytes.extend(rings.to_le_bytes());
            for _ in 0..rings {
                points(r, out)?;
            }
        }
        4..=7 | 9..=12 | 15 | 16 => {
            let n = r.count(little, 5)?;
            out.bytes.extend(n.to_le_bytes());
            for _ in 0..n {
                geometry(r, out, depth + 1)?;
            }
        }
        _ => return Err(bad(format!("type {code}"))),
    }
    Ok(())
}

/// Hex text (PostGIS's output of a geometry) as bytes.
pub(crate) fn from_hex(text: &[u8]) -> Result<Vec<u8>, WkbError> {
    if !text.len().is_multiple_of(2) {
        return Err(bad("odd hex length"));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(bad(format!("{:?} is not hex", char::from(c)))),
    };
    text.chunks_exact(2)
        .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Bytes as upper-case hex, the form PostGIS prints.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ewkb_with_srid_becomes_iso_wkb() {
        // PostGIS: 'SRID=4326;POINT(1 2)'::geometry.
        let ewkb = from_hex(b"0101000020E6100000000000000000F03F0000000000000040").unwrap();
        let iso = to_iso(&ewkb).unwrap();
        assert_eq!(iso.srid, Some(4326));
        assert_eq!(
            to_hex(&iso.bytes),
            "0101000000000000000000F03F0000000000000040"
        );
        assert_eq!(to_iso(&iso.bytes).unwrap().bytes, iso.bytes, "idempotent");
        let (lo, hi) = iso.bbox.iceberg_bounds().unwrap();
        assert_eq!(lo.len(), 16);
        assert_eq!(lo, hi);
    }

    #[test]
    fn z_and_m_take_iso_codes_and_bounds() {
        // PostGIS: 'LINESTRING M (0 0 5, 3 -1 7)' as big-endian EWKB.
        let mut ewkb = vec![0u8];
        ewkb.extend((2u32 | EWKB_M).to_be_bytes());
        ewkb.extend(2u32.to_be_bytes());
        for v in [0.0f64, 0.0, 5.0, 3.0, -1.0, 7.0] {
            ewkb.extend(v.to_be_bytes());
        }
        let iso = to_iso(&ewkb).unwrap();
        assert_eq!(&iso.bytes[1..5], &2002u32.to_le_bytes());
        let (lo, hi) = iso.bbox.iceberg_bounds().unwrap();
        let f = |b: &[u8], i: usize| f64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!((f(&lo, 0), f(&lo, 1), f(&lo, 3)), (0.0, -1.0, 5.0));
        assert!(f(&lo, 2).is_nan(), "x:y:NaN:m without z");
        assert_eq!((f(&hi, 0), f(&hi, 1), f(&hi, 3)), (3.0, 0.0, 7.0));
    }

    #[test]
    fn truncated_or_hostile_values_are_errors() {
        let ewkb = from_hex(b"0101000020E6100000000000000000F03F00000000000000").unwrap();
        assert!(to_iso(&ewkb).is_err());
        // A multipoint claiming 2^32-1 members in 0 bytes.
        let mut v = vec![1u8];
        v.extend(4u32.to_le_bytes());
        v.extend(u32::MAX.to_le_bytes());
        assert!(to_iso(&v).is_err());
        assert!(to_iso(&[2]).is_err());
        assert!(from_hex(b"0g").is_err());
    }

    #[test]
    fn empty_point_has_no_bounds() {
        let mut v = vec![1u8];
        v.extend(1u32.to_le_bytes());
        v.extend(f64::NAN.to_le_bytes());
        v.extend(f64::NAN.to_le_bytes());
        assert_eq!(to_iso(&v).unwrap().bbox.iceberg_bounds(), None);
    }
}
