//! Pipeline (in progress).
