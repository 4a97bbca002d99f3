//! Puffin files (stub).
