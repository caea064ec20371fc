//! A bounded record of directory inode numbers, for the daemon's memory of
//! what it did with a directory (listed it bare, had it opened). Past its
//! capacity the record starts over: what it forgot only costs the work
//! the record was saving, never a wrong answer, so no eviction order is
//! kept.

use std::collections::HashSet;

pub(crate) struct InodeSet {
    inodes: HashSet<u64>,
    capacity: usize,
}

impl InodeSet {
    pub(crate) fn new(capacity: usize) -> InodeSet {
        InodeSet {
            inodes: HashSet::new(),
            capacity,
        }
    }

    /// Record `ino`; true if it was not recorded before. A record at
    /// capacity is cleared first.
    pub(crate) fn insert(&mut self, ino: u64) -> bool {
        if self.inodes.contains(&ino) {
            return false;
        }
        if self.inodes.len() >= self.capacity {
            self.inodes.clear();
        }
        self.inodes.insert(ino)
    }

    /// Everything recorded, leaving the record empty.
    pub(crate) fn take_all(&mut self) -> Vec<u64> {
        self.inodes.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_starts_over_at_capacity() {
        let mut set = InodeSet::new(3);
        assert!(set.insert(1) && set.insert(2) && set.insert(3));
        assert!(!set.insert(2), "already recorded");
        assert!(set.insert(4), "past capacity: started over");
        assert!(set.insert(1), "forgotten when the record started over");
        let mut all = set.take_all();
        all.sort();
        assert_eq!(all, [1, 4]);
        assert!(set.take_all().is_empty());
    }
}
