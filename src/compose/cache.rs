//! The read path's cache: bounded LRUs of slots, each filled once by
//! whichever reader loads it first (invariant 6: bounded by counts).

use crate::error::Result;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// One cached segment or decoded row group, filled once by whichever reader
/// loads it first; readers that want it meanwhile wait for that load
/// instead of repeating it (a segment is read whole and hashed; a group is
/// decoded). `None` when the load failed: the readers that waited load it
/// again and meet the error themselves, and the slot leaves the cache, so
/// a failure that passes (a remote store's timeout) is not kept.
pub(super) type Slot<T> = OnceLock<Option<Arc<T>>>;
/// Slots by key, the most recently used kept.
pub(super) type SlotCache<K, T> = Mutex<Lru<K, Arc<Slot<T>>>>;

/// The item of `cache` at `key`, loaded with `load` unless it is cached or
/// being loaded by another reader (then that load is waited for).
pub(super) fn cached<K: PartialEq + Copy, T>(
    cache: &SlotCache<K, T>,
    key: K,
    load: impl Fn() -> Result<T>,
) -> Result<Arc<T>> {
    let slot = {
        let mut items = cache.lock().unwrap_or_else(PoisonError::into_inner);
        items.get(&key).unwrap_or_else(|| {
            let slot = Arc::new(Slot::new());
            items.put(key, slot.clone());
            slot
        })
    };
    let mut failed = None;
    let loaded = slot.get_or_init(|| match load() {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    match (loaded, failed) {
        (Some(v), _) => Ok(v.clone()),
        (None, Some(e)) => {
            let mut items = cache.lock().unwrap_or_else(PoisonError::into_inner);
            items.remove_if(&key, |s| Arc::ptr_eq(s, &slot));
            Err(e)
        }
        // Another reader's load of it failed: meet the error here too.
        (None, None) => load().map(Arc::new),
    }
}

pub(super) struct Lru<K, V> {
    cap: usize,
    items: VecDeque<(K, V)>,
}

impl<K: PartialEq, V: Clone> Lru<K, V> {
    pub(super) fn new(cap: usize) -> Self {
        Lru {
            cap,
            items: VecDeque::new(),
        }
    }
    pub(super) fn get(&mut self, k: &K) -> Option<V> {
        let i = self.items.iter().position(|(key, _)| key == k)?;
        let item = self.items.remove(i)?;
        let v = item.1.clone();
        self.items.push_front(item);
        Some(v)
    }
    pub(super) fn put(&mut self, k: K, v: V) {
        self.items.push_front((k, v));
        self.items.truncate(self.cap);
    }
    pub(super) fn clear(&mut self) {
        self.items.clear();
    }
    /// Drop the item at `k` if `which` says it is the one meant.
    pub(super) fn remove_if(&mut self, k: &K, which: impl Fn(&V) -> bool) {
        self.items.retain(|(key, v)| key != k || !which(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn readers_of_one_item_share_one_load() {
        let cache: SlotCache<usize, usize> = Mutex::new(Lru::new(2));
        let loads = AtomicUsize::new(0);
        let load = || {
            loads.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            Ok(7)
        };
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| cached(&cache, 1, load)))
                .collect();
            for r in readers {
                assert_eq!(*r.join().unwrap().unwrap(), 7);
            }
        });
        assert_eq!(loads.load(Ordering::SeqCst), 1, "one load for four readers");
    }

    #[test]
    fn a_failed_load_is_met_by_every_reader_and_evicted_items_load_again() {
        let cache: SlotCache<usize, usize> = Mutex::new(Lru::new(1));
        let fail = || Err(Error::Invalid("no".into()));
        assert!(cached(&cache, 1, fail).is_err());
        assert!(cached(&cache, 1, fail).is_err(), "the error is met again");
        assert_eq!(*cached(&cache, 2, || Ok(2)).unwrap(), 2);
        assert_eq!(*cached(&cache, 1, || Ok(1)).unwrap(), 1, "1 was evicted");
    }

    #[test]
    fn a_failure_that_passes_is_not_kept() {
        let cache: SlotCache<usize, usize> = Mutex::new(Lru::new(4));
        let loads = AtomicUsize::new(0);
        let flaky = || match loads.fetch_add(1, Ordering::SeqCst) {
            0 => Err(Error::Invalid("timeout".into())),
            _ => Ok(7),
        };
        assert!(cached(&cache, 1, flaky).is_err());
        assert_eq!(*cached(&cache, 1, flaky).unwrap(), 7, "loaded anew");
        assert_eq!(*cached(&cache, 1, flaky).unwrap(), 7, "and kept");
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }
}
