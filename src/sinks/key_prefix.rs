//! Sorting encoded keys (`arrow_row` bytes) by their first 16 bytes before comparing them whole.
//!
//! The primary-key index's memtable and the LSM planner each sort a commit's keys; comparing
//! two keys through their containers is a `memcmp` call behind a lookup, while most pairs differ
//! in their first 16 bytes (an encoded int8 key is 9). Carrying [`key_prefix`] beside each entry
//! lets two integer compares decide those pairs.

/// `key`'s first 16 bytes as two big-endian words, zero-padded: ordered like the keys
/// themselves wherever they differ (a shorter key padded with zeros never sorts after a longer
/// one it is a prefix of), and equal words leave the order to the full keys.
pub(crate) fn key_prefix(key: &[u8]) -> [u64; 2] {
    let mut bytes = [0u8; 16];
    let n = key.len().min(16);
    if let (Some(dst), Some(src)) = (bytes.get_mut(..n), key.get(..n)) {
        dst.copy_from_slice(src);
    }
    let (hi, lo) = bytes.split_at(8);
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_be_bytes(w)
    };
    [word(hi), word(lo)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_order_like_the_keys_where_they_differ() {
        let keys: [&[u8]; 7] = [b"", b"\0", b"a", b"a\0", b"a\0\x01", &[7; 16], &[7; 20]];
        for a in keys {
            for b in keys {
                let (pa, pb) = (key_prefix(a), key_prefix(b));
                if pa != pb {
                    assert_eq!(pa.cmp(&pb), a.cmp(b), "{a:?} vs {b:?}");
                }
            }
        }
        assert_eq!(
            key_prefix(&[7; 16]),
            key_prefix(&[7; 20]),
            "ties go to the whole keys"
        );
    }
}
