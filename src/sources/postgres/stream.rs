//! (in progress)

mod spill;
