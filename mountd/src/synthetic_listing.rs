//! Synthetic directories as the kernel reads them. Their listings and
//! stamps are the core's (`strata::mount_tree::listing`): a synthetic
//! directory's mtime is the daemon's start time with a fingerprint of what
//! it lists in the nanoseconds, and the mount asks for FUSE_AUTO_INVAL_DATA,
//! so before the kernel serves a kept listing from the start it fetches the
//! attributes again (once their TTL is over) and drops a listing whose
//! mtime changed. A listing that did not change is served by the kernel
//! alone. The refresher also drops `gens/` attributes the moment it sees a
//! new latest generation or a retirement, so that listing follows at once.
//!
//! A listing read in several replies (or from a `seekdir` offset) is served
//! from the [`Snapshots`] taken at its start: its offsets are positions in
//! that snapshot, so they stay valid while the directory changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use strata::mount_tree::DirItem;

/// Snapshots kept at most; past it the record starts over (a listing
/// continued after that is listed afresh: offsets stay right unless the
/// directory changed in between).
const CAPACITY: usize = 4096;

/// The listing each synthetic directory had when its current reading began.
#[derive(Default)]
pub(crate) struct Snapshots {
    taken: Mutex<HashMap<u64, Arc<Vec<DirItem>>>>,
}

impl Snapshots {
    /// The listing of directory `ino` for a read from the start (taken now
    /// with `list`) or one that goes on (the snapshot of its start, or a
    /// new one if none is kept).
    pub(crate) fn get<E>(
        &self,
        ino: u64,
        from_start: bool,
        list: impl FnOnce() -> Result<Vec<DirItem>, E>,
    ) -> Result<Arc<Vec<DirItem>>, E> {
        if !from_start {
            let taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(items) = taken.get(&ino) {
                return Ok(items.clone());
            }
        }
        let items = Arc::new(list()?);
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        if taken.len() >= CAPACITY && !taken.contains_key(&ino) {
            taken.clear();
        }
        taken.insert(ino, items.clone());
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata::mount_tree::{Node, NodeKind};

    fn sets(names: &[&str]) -> Vec<DirItem> {
        names
            .iter()
            .map(|n| DirItem {
                node: Node::Set(n.to_string()),
                kind: NodeKind::Dir,
                name: n.as_bytes().to_vec(),
            })
            .collect()
    }

    fn names(items: &[DirItem]) -> Vec<&str> {
        items
            .iter()
            .map(|i| std::str::from_utf8(&i.name).unwrap())
            .collect()
    }

    #[test]
    fn a_listing_that_goes_on_reads_the_snapshot_of_its_start() {
        let s = Snapshots::default();
        let first = s.get(5, true, || Ok::<_, ()>(sets(&["a", "b"]))).unwrap();
        assert_eq!(names(&first), ["a", "b"]);
        let more = s.get(5, false, || Ok::<_, ()>(sets(&["a", "c"]))).unwrap();
        assert_eq!(names(&more), ["a", "b"], "the same listing goes on");
        let fresh = s.get(5, true, || Ok::<_, ()>(sets(&["a", "c"]))).unwrap();
        assert_eq!(names(&fresh), ["a", "c"], "a new reading lists anew");
        let other = s.get(6, false, || Ok::<_, ()>(sets(&["z"]))).unwrap();
        assert_eq!(names(&other), ["z"], "none kept: listed now");
    }

    #[test]
    fn a_failed_listing_keeps_nothing() {
        let s = Snapshots::default();
        assert_eq!(s.get(5, true, || Err::<Vec<DirItem>, _>(7)).err(), Some(7));
        let later = s.get(5, false, || Ok::<_, ()>(sets(&["a"]))).unwrap();
        assert_eq!(names(&later), ["a"]);
    }

    #[test]
    fn snapshots_are_bounded() {
        let s = Snapshots::default();
        for ino in 0..CAPACITY as u64 {
            s.get(ino, true, || Ok::<_, ()>(sets(&["a"]))).unwrap();
        }
        s.get(u64::MAX, true, || Ok::<_, ()>(sets(&["b"]))).unwrap();
        let taken = s.taken.lock().unwrap();
        assert_eq!(taken.len(), 1, "the record started over");
    }
}
