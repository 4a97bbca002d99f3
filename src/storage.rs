//! Storage (in progress).
