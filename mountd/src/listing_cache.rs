//! When the kernel starts keeping directory listings.
//!
//! A daemon that answers `opendir` with ENOSYS gets no `opendir` or
//! `releasedir` for the rest of the connection (two round trips per
//! directory a walk enters), and the kernel then keeps every listing it
//! reads (FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE) and serves later readings
//! alone: a warm `find` runs at the native filesystem's speed. The switch
//! is one-way and for the whole mount, and it has a price: filling the
//! kernel's cache costs the reading process a page lookup per entry
//! (~0.19 µs; 0.19 s in a cold `find` of a million entries, a third of
//! it), which a walk that reads each directory once pays for nothing.
//!
//! So a mount starts by opening directories (served uncached, no handle
//! kept: listings are read by inode), and switches the first time a
//! directory of a generation is opened again: that `opendir` is answered
//! ENOSYS, and from then on every listing is kept. A one-off walk of a
//! fresh mount (a backup, a `find`, a `grep -r`) pays no cache filling; a
//! mount that is browsed again keeps its listings. Directories are known by
//! inode number (stable for a generation's rows). The record is bounded:
//! past [`CAPACITY`] directories it starts over, which only delays the
//! switch. Either way the entries served are the same; only where they
//! come from changes. What keeps a kept listing true is in
//! synthetic_listing.rs (synthetic directories) and stat_habits.rs (bare
//! listings).

use crate::inode_set::InodeSet;
use std::sync::{Mutex, PoisonError};

/// Directories remembered at most (8 bytes each, ~10 MiB at the bound).
const CAPACITY: usize = 1 << 20;

/// Generation directories opened while the mount opens directories.
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
    /// Record an opening of generation directory `ino`: true if it was
    /// opened before, so listings are worth keeping in the kernel.
    pub(crate) fn opened_again(&self, ino: u64) -> bool {
        let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        !opened.insert(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_opening_is_noticed() {
        let cache = ListingCache::default();
        assert!(!cache.opened_again(7));
        assert!(cache.opened_again(7));
        assert!(cache.opened_again(7));
        assert!(!cache.opened_again(8));
    }

    #[test]
    fn the_record_starts_over_at_capacity() {
        let cache = ListingCache::default();
        for ino in 0..CAPACITY as u64 {
            assert!(!cache.opened_again(ino));
        }
        assert!(!cache.opened_again(u64::MAX));
        assert!(!cache.opened_again(0), "the record started over");
        assert!(cache.opened_again(u64::MAX));
    }
}
