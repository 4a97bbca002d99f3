//! The merge's order of its cursors: a binary min-heap of cursor indexes by (current key, run
//! index), so finding the next entry among k runs costs O(log k) key comparisons, not k. A
//! flush leaves up to 16 runs for one merge (`FLUSHED_RUNS`), where scanning every cursor per
//! entry made the merge's key comparisons grow with the runs merged.
//!
//! Ties between runs at one key go to the lowest index, the newest run, which is the entry
//! the merge keeps.

use crate::sinks::pk_index::cursor::RunCursor;

/// Indexes of the cursors still holding entries, heap-ordered (the smallest first).
pub(crate) struct CursorHeap(Vec<usize>);

/// Whether cursor `a` comes before cursor `b` in the merge.
fn before(cursors: &[RunCursor], a: usize, b: usize) -> bool {
    match (cursors.get(a), cursors.get(b)) {
        (Some(x), Some(y)) => (x.key(), a) < (y.key(), b),
        _ => false,
    }
}

impl CursorHeap {
    /// The heap of the cursors `alive` says hold an entry.
    pub(crate) fn new(cursors: &[RunCursor], alive: &[bool]) -> CursorHeap {
        let mut heap = CursorHeap(Vec::with_capacity(cursors.len()));
        for (i, a) in alive.iter().enumerate() {
            if *a {
                heap.0.push(i);
                heap.sift_up(cursors, heap.0.len() - 1);
            }
        }
        heap
    }

    /// The cursor with the smallest key.
    pub(crate) fn top(&self) -> Option<usize> {
        self.0.first().copied()
    }

    /// The cursor that comes next after the top: the smaller of the top's children.
    pub(crate) fn second(&self, cursors: &[RunCursor]) -> Option<usize> {
        match (self.0.get(1).copied(), self.0.get(2).copied()) {
            (Some(a), Some(b)) => Some(if before(cursors, b, a) { b } else { a }),
            (a, _) => a,
        }
    }

    /// The top cursor moved on (`alive`: it still holds an entry; otherwise it leaves).
    pub(crate) fn replace_top(&mut self, cursors: &[RunCursor], alive: bool) {
        if !alive {
            let Some(last) = self.0.pop() else {
                return;
            };
            match self.0.first_mut() {
                Some(top) => *top = last,
                None => return,
            }
        }
        self.sift_down(cursors, 0);
    }

    fn sift_up(&mut self, cursors: &[RunCursor], mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            match (self.0.get(i).copied(), self.0.get(parent).copied()) {
                (Some(c), Some(p)) if before(cursors, c, p) => {
                    self.0.swap(i, parent);
                    i = parent;
                }
                _ => break,
            }
        }
    }

    fn sift_down(&mut self, cursors: &[RunCursor], mut i: usize) {
        loop {
            let mut smallest = i;
            for child in [2 * i + 1, 2 * i + 2] {
                if let (Some(c), Some(s)) =
                    (self.0.get(child).copied(), self.0.get(smallest).copied())
                {
                    if before(cursors, c, s) {
                        smallest = child;
                    }
                }
            }
            if smallest == i {
                return;
            }
            self.0.swap(i, smallest);
            i = smallest;
        }
    }
}
