//! The copy plan: a table split into primary-key ranges ("chunks"), each copied by one
//! `COPY (SELECT … WHERE key range) TO STDOUT`. Pure: samples in, ranges and SQL text out.
//!
//! Why key ranges and not ctid (page) ranges: a resumed copy reads the remaining chunks at a newer
//! snapshot than the finished ones, so a row must belong to the same chunk at both snapshots. An
//! update can move a row to another page, but never out of its key range (a key change is a
//! delete of the old key and an insert of the new one, which the stream replays). See the
//! argument in `snapshot.rs`.
//!
//! A chunk's description (what `SnapshotProgress::chunks` stores) is its range as JSON, the key
//! values as Postgres text: `{"lo":["100"],"hi":["200"]}`, `lo` inclusive, `hi` exclusive, a
//! missing bound open. Text keeps any key type exact, and the server casts it back.

use serde::{Deserialize, Serialize};

use super::quote_literal;

/// A primary-key range: `lo <= key < hi`, each bound a row of key values as text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lo: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi: Option<Vec<String>>,
}

/// The primary key's columns (quoted identifiers) and their types (`format_type` text), in key
/// order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyColumns {
    pub names: Vec<String>,
    pub types: Vec<String>,
}

impl KeyRange {
    pub fn to_description(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_description(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// ` WHERE (k1, k2) >= (lo…) AND (k1, k2) < (hi…)`, or nothing for the whole table. Row
    /// comparison is the btree order of the primary key index, so the range is an index scan
    /// and the same order `TABLESAMPLE … ORDER BY` produced the bounds in.
    pub fn where_clause(&self, key: &KeyColumns) -> String {
        let columns = format!("({})", key.names.join(", "));
        let row = |values: &[String]| {
            let cast: Vec<String> = values
                .iter()
                .zip(&key.types)
                .map(|(v, t)| format!("{}::{t}", quote_literal(v)))
                .collect();
            format!("({})", cast.join(", "))
        };
        let mut parts = Vec::new();
        if let Some(lo) = &self.lo {
            parts.push(format!("{columns} >= {}", row(lo)));
        }
        if let Some(hi) = &self.hi {
            parts.push(format!("{columns} < {}", row(hi)));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", parts.join(" AND "))
        }
    }
}

/// How many chunks a table of `estimated_rows` gets.
pub fn chunk_count(estimated_rows: u64, chunk_rows: u64) -> usize {
    usize::try_from(estimated_rows.div_ceil(chunk_rows.max(1)))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// Splits the key space at evenly spaced `samples` (sorted in key order, as the server returned
/// them) into at most `chunks` ranges that together cover every key exactly once.
pub fn ranges_from_samples(samples: &[Vec<String>], chunks: usize) -> Vec<KeyRange> {
    let mut bounds: Vec<&Vec<String>> = Vec::new();
    if chunks > 1 && !samples.is_empty() {
        for i in 1..chunks {
            let Some(b) = samples.get(i * samples.len() / chunks) else {
                continue;
            };
            // Equal bounds would make an empty range; the server's order makes them adjacent.
            if bounds.last() != Some(&b) {
                bounds.push(b);
            }
        }
    }
    let mut ranges = Vec::with_capacity(bounds.len() + 1);
    let mut lo: Option<Vec<String>> = None;
    for b in bounds {
        ranges.push(KeyRange {
            lo: lo.take(),
            hi: Some(b.clone()),
        });
        lo = Some(b.clone());
    }
    ranges.push(KeyRange { lo, hi: None });
    ranges
}

/// The TABLESAMPLE percentage that yields about `wanted` of `total` (rows for BERNOULLI, pages
/// for SYSTEM).
pub fn sample_percent(total: u64, wanted: u64) -> f64 {
    if total == 0 {
        return 100.0;
    }
    (100.0 * wanted as f64 / total as f64).clamp(0.001, 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn ranges_cover_the_key_space_once() {
        let samples: Vec<Vec<String>> = (0..100).map(|i| s(&[&i.to_string()])).collect();
        let r = ranges_from_samples(&samples, 4);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].lo, None);
        assert_eq!(r[3].hi, None);
        for w in r.windows(2) {
            assert_eq!(w[0].hi, w[1].lo);
        }
        assert_eq!(r[1].lo, Some(s(&["25"])));
    }

    #[test]
    fn duplicate_bounds_and_few_samples_give_fewer_ranges() {
        let samples = vec![s(&["1"]), s(&["1"]), s(&["1"]), s(&["2"])];
        let r = ranges_from_samples(&samples, 4);
        assert_eq!(r.len(), 3, "bounds 1 and 2 once each: {r:?}");
        assert_eq!(ranges_from_samples(&[], 8), vec![KeyRange::default()]);
        assert_eq!(ranges_from_samples(&samples, 1), vec![KeyRange::default()]);
    }

    #[test]
    fn where_clause_casts_text_bounds() {
        let key = KeyColumns {
            names: s(&["\"a\"", "\"b\""]),
            types: s(&["integer", "text"]),
        };
        let r = KeyRange {
            lo: Some(s(&["1", "x'y"])),
            hi: None,
        };
        assert_eq!(
            r.where_clause(&key),
            r#" WHERE ("a", "b") >= ('1'::integer, 'x''y'::text)"#
        );
        assert_eq!(KeyRange::default().where_clause(&key), "");
        let d = r.to_description();
        assert_eq!(d, r#"{"lo":["1","x'y"]}"#);
        assert_eq!(KeyRange::from_description(&d), Some(r));
    }

    #[test]
    fn chunk_counts() {
        assert_eq!(chunk_count(0, 100), 1);
        assert_eq!(chunk_count(250, 100), 3);
        assert_eq!(sample_percent(0, 10), 100.0);
        assert!((sample_percent(1_000_000, 1000) - 0.1).abs() < 1e-9);
    }
}
