//! Where a row is: the snapshot's live files and vectors cached between commits (`live.rs`), the
//! current rows that complete partial updates (`lookup.rs`), the primary-key index and its
//! background slot (`index.rs`, `index/slot.rs`) with the locator that turns keys into file
//! positions (`locator.rs`), multiset rows without a key (`multiset.rs`), and the upsert window's
//! droppable partial updates (`window.rs`).

pub(crate) mod index;
pub(crate) mod live;
pub(crate) mod locator;
pub(crate) mod lookup;
pub(crate) mod multiset;
pub(crate) mod window;
