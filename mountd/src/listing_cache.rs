//! Which directory listings the kernel is asked to keep.
//!
//! A listing opened with FOPEN_CACHE_DIR is copied into the directory's
//! page cache entry by entry as the reader reads it, and later reads of
//! the directory are served from there without asking the daemon. Filling
//! that cache costs the reading process kernel time on every entry (a page
//! lookup and lock each: ~0.15 µs, 0.15 s over a million entries, a fifth
//! of a cold `find` of them), which a walk that reads each directory once
//! (a backup, a one-off `find` or `grep -r`) pays for nothing.
//!
//! So a listing is admitted to the kernel's cache on its second opening:
//! the first opening of a directory in this daemon's life is served
//! uncached, and every later one with FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE,
//! which fills the cache once and then serves from it. Directories are
//! known by inode number (stable for a generation's rows, so a directory
//! forgotten by the kernel and looked up again is the same one). The record
//! is bounded: past [`CAPACITY`] directories it starts over, which only
//! makes a forgotten directory's next opening uncached again. Either way
//! the entries served are the same; only where they come from changes.

use crate::inode_set::InodeSet;
use std::sync::{Mutex, PoisonError};

/// Directories remembered at most (8 bytes each, ~10 MiB at the bound).
const CAPACITY: usize = 1 << 20;

/// Directories whose listing was opened before.
pub(crate) struct ListingCache {
    opened: Mutex<InodeSet>,
}

impl Default for ListingCache {
    fn default() -> Self {
        ListingCache {
            opened: Mutex::new(InodeSet::new(CAPACITY)),
        }
    }
}

impl ListingCache {
    /// Record an opening of directory `ino`: true if it was opened before,
    /// so its listing is worth keeping in the kernel.
    pub(crate) fn admit(&self, ino: u64) -> bool {
        let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        !opened.insert(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_admitted_on_its_second_opening() {
        let cache = ListingCache::default();
        assert!(!cache.admit(7));
        assert!(cache.admit(7));
        assert!(cache.admit(7));
        assert!(!cache.admit(8));
    }

    #[test]
    fn the_record_starts_over_at_capacity() {
        let cache = ListingCache::default();
        for ino in 0..CAPACITY as u64 {
            assert!(!cache.admit(ino));
        }
        assert!(!cache.admit(u64::MAX));
        assert!(!cache.admit(0), "the record started over");
        assert!(cache.admit(u64::MAX));
    }
}
