//! Reading a generation: a representation's segments, and the composition of
//! a base with one cumulative delta.
//!
//! Offers what every reader needs without knowing about FUSE: resolve a path,
//! list a directory range, stream all rows in key order. Every row has a
//! [`RowPos`] (which representation, segment, row group and index), stable
//! for as long as the view is open: the mount derives inode numbers and
//! directory offsets from it, so it keeps no per-entry state. Segments are loaded
//! and SHA-256-verified on first use and kept in a small LRU; decoded row
//! groups likewise (invariant 6: bounded by counts, not by the tree).

mod cache;
mod merge;
mod representation;
mod view;

pub use merge::{HasRow, Merge};
pub use representation::{
    load_manifest, load_segment, Cursor, Located, RepPos, Representation, RowPos,
};
pub use view::{DirEntries, GenView};
