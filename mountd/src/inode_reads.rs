//! Read state of files the kernel reads without opening them (FUSE no-open,
//! `--opens none`): the kernel sends no `open` or `release`, keeps each
//! file's pages across opens, and its reads name only the inode. The state
//! a read needs (an open blob, a chunk list, a decoded packed blob) is made
//! at an inode's first read and kept here for the reads that follow.
//!
//! What is kept is bounded by count and by the bytes of decoded blobs it
//! holds; past either bound the least recently used states go, a quarter
//! at a time, so a walk over many files sorts the kept states once per
//! 64 new inodes rather than scanning them at every one. Forgetting
//! state only costs the work of making it again, never a wrong answer: an
//! entry's inode names one row of one generation view, whose content never
//! changes. The kernel's `forget` of an inode drops its state at once.

use crate::fs::Handle;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Most inodes with kept state (each may hold an open file).
const MAX_ENTRIES: usize = 256;
/// Most bytes of decoded packed blobs kept.
const MAX_BYTES: u64 = 16 << 20;

#[derive(Default)]
pub(crate) struct InodeReads {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u64, Kept>,
    clock: u64,
    bytes: u64,
}

struct Kept {
    handle: Arc<Handle>,
    /// Decoded bytes the state holds (or will once read).
    bytes: u64,
    used: u64,
}

impl InodeReads {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state kept for `ino`, marked as just used.
    pub(crate) fn get(&self, ino: u64) -> Option<Arc<Handle>> {
        let mut inner = self.inner();
        inner.clock += 1;
        let now = inner.clock;
        let kept = inner.entries.get_mut(&ino)?;
        kept.used = now;
        Some(kept.handle.clone())
    }

    /// Keep `handle` as `ino`'s state, holding `bytes` of decoded content;
    /// the least recently used states go past the bounds. State larger
    /// than the byte bound alone is not kept.
    pub(crate) fn keep(&self, ino: u64, handle: Arc<Handle>, bytes: u64) {
        if bytes > MAX_BYTES {
            return;
        }
        let mut inner = self.inner();
        inner.clock += 1;
        let used = inner.clock;
        let kept = Kept {
            handle,
            bytes,
            used,
        };
        if let Some(old) = inner.entries.insert(ino, kept) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        if inner.entries.len() > MAX_ENTRIES || inner.bytes > MAX_BYTES {
            inner.evict_oldest();
        }
    }

    /// The kernel forgot `ino`: drop its state.
    pub(crate) fn forget(&self, ino: u64) {
        let mut inner = self.inner();
        if let Some(old) = inner.entries.remove(&ino) {
            inner.bytes -= old.bytes;
        }
    }

    /// Inodes with kept state.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner().entries.len()
    }
}

impl Inner {
    /// Drop the least recently used states until both bounds have a
    /// quarter to spare.
    fn evict_oldest(&mut self) {
        let mut by_age: Vec<(u64, u64)> = self.entries.iter().map(|(i, k)| (k.used, *i)).collect();
        by_age.sort_unstable();
        for (_, ino) in by_age {
            if self.entries.len() <= MAX_ENTRIES * 3 / 4 && self.bytes <= MAX_BYTES * 3 / 4 {
                break;
            }
            if let Some(old) = self.entries.remove(&ino) {
                self.bytes -= old.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Arc<Handle> {
        Arc::new(Handle::File(std::fs::File::open("/dev/null").unwrap()))
    }

    #[test]
    fn the_least_recently_used_state_goes_first() {
        let reads = InodeReads::default();
        for ino in 0..MAX_ENTRIES as u64 {
            reads.keep(ino, file(), 0);
        }
        assert!(reads.get(0).is_some(), "used again: now the newest");
        reads.keep(1_000, file(), 0);
        assert_eq!(reads.len(), MAX_ENTRIES * 3 / 4, "a quarter went at once");
        assert!(reads.get(0).is_some());
        assert!(reads.get(1).is_none(), "the oldest went");
        assert!(reads.get(1_000).is_some());
    }

    #[test]
    fn decoded_bytes_are_bounded_and_forget_drops_state() {
        let reads = InodeReads::default();
        reads.keep(1, file(), MAX_BYTES / 2);
        reads.keep(2, file(), MAX_BYTES / 2);
        reads.keep(3, file(), 1);
        assert!(
            reads.get(1).is_none(),
            "over the byte bound: the oldest went"
        );
        assert!(reads.get(2).is_some() && reads.get(3).is_some());
        reads.keep(4, file(), MAX_BYTES + 1);
        assert!(reads.get(4).is_none(), "larger than the bound: not kept");
        reads.forget(2);
        assert!(reads.get(2).is_none());
        assert_eq!(reads.inner().bytes, 1);
    }
}
