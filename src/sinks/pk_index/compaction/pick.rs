//! Compaction policy: which runs to merge. Pure: it sees run sizes and decides; the index carries
//! the merge out (`PrimaryKeyIndex::compact`).
//!
//! Every persist flushes the memtable as a new small run, so runs must be merged to keep lookups
//! (one bloom probe per run, one block read per positive) and restart (one GET per run) cheap.
//! The rule is size-tiered like a binary counter: starting from the newest run, absorb the next
//! older run while it is no larger than everything absorbed so far. Run sizes then at least double
//! from newest to oldest, so a table of N bytes has at most log2(N / smallest run) runs, and each
//! entry is rewritten about once per doubling (write amplification log2 of the same ratio).

/// The number of newest runs to merge into one (at least 2), or `None`.
/// `sizes` are run sizes in bytes, newest first.
pub(crate) fn choose(sizes: &[u64]) -> Option<usize> {
    let mut iter = sizes.iter();
    let mut absorbed = *iter.next()?;
    let mut take = 1;
    for &older in iter {
        if older > absorbed {
            break;
        }
        absorbed += older;
        take += 1;
    }
    (take >= 2).then_some(take)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_like_a_binary_counter() {
        assert_eq!(choose(&[]), None);
        assert_eq!(choose(&[5]), None);
        assert_eq!(choose(&[1, 1]), Some(2));
        assert_eq!(choose(&[1, 3]), None);
        assert_eq!(choose(&[1, 1, 3]), Some(2));
        assert_eq!(choose(&[2, 1, 3]), Some(3));
        assert_eq!(choose(&[1, 2, 8]), None);
    }

    #[test]
    fn run_count_stays_logarithmic() {
        let mut runs: Vec<u64> = Vec::new();
        for _ in 0..10_000 {
            runs.insert(0, 1);
            while let Some(n) = choose(&runs) {
                let merged: u64 = runs.drain(..n).sum();
                runs.insert(0, merged);
            }
        }
        assert!(runs.len() <= 14, "{runs:?}");
        assert_eq!(runs.iter().sum::<u64>(), 10_000);
    }
}
