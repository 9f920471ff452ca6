//! Reads the workspace's Rust sources to check its layering (see `tests/layers.rs`). Text-level on
//! purpose: it needs no compiler internals, and what it reads (`crate::` paths, `fn` items, line
//! counts) is what a reviewer reads.

pub mod graph;
pub mod sizes;
pub mod source;
