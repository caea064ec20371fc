//! Listings of the synthetic directories (the sets, a set, its generation
//! list, tags and history) and how the kernel's kept copies of them stay
//! true.
//!
//! Once the kernel keeps every listing it reads (listing_cache.rs), it
//! serves later readings of a directory alone. Before it serves a kept
//! listing from the start, it compares the directory's mtime with the one
//! it saw when it fetched that listing (the mount asks for
//! FUSE_AUTO_INVAL_DATA, so the attributes are fetched again first once
//! they have expired). A synthetic directory's mtime is the
//! daemon's start time with a fingerprint of what it lists in the
//! nanoseconds ([`mtime`]; for the directories that follow a set's index,
//! `gens/` and `history/…`, a fingerprint of the index's record names,
//! which change whenever those listings can: [`stamp`]), so that reading
//! the attributes stays cheap where a path walk passes, and a listing that
//! changed is fetched again
//! within the attributes' TTL, and one that did not is served by the kernel
//! alone. The refresher also drops `gens/` attributes the moment it sees a
//! new latest generation or a retirement, so that listing follows at once.
//!
//! A listing read in several replies (or from a `seekdir` offset) is served
//! from the [`Snapshots`] taken at its start: its offsets are positions in
//! that snapshot, so they stay valid while the directory changes.

use crate::node::{ino_of, Node};
use fuser::FileType;
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// Snapshots kept at most; past it the record starts over (a listing
/// continued after that is listed afresh: offsets stay right unless the
/// directory changed in between).
const CAPACITY: usize = 4096;

/// One entry of a synthetic directory.
pub(crate) struct DirItem {
    pub(crate) node: Node,
    pub(crate) kind: FileType,
    pub(crate) name: OsString,
}

/// The mtime of a synthetic directory listing `items`: `base` (whole
/// seconds kept) with a fingerprint of the listing as its nanoseconds.
pub(crate) fn mtime(base: SystemTime, items: &[DirItem]) -> SystemTime {
    stamp(
        base,
        items.iter().map(|item| {
            let mut part = ino_of(&item.node).to_le_bytes().to_vec();
            part.push(item.kind as u8);
            part.extend_from_slice(item.name.as_bytes());
            part
        }),
    )
}

/// `base` (whole seconds kept) with a fingerprint of `parts` (in order) as
/// its nanoseconds.
pub(crate) fn stamp(base: SystemTime, parts: impl IntoIterator<Item = Vec<u8>>) -> SystemTime {
    let mut h = blake3::Hasher::new();
    for part in parts {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(&part);
    }
    let mut first = [0u8; 4];
    first.copy_from_slice(&h.finalize().as_bytes()[..4]);
    let nanos = u32::from_le_bytes(first) % 1_000_000_000;
    let secs = base
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    SystemTime::UNIX_EPOCH + Duration::new(secs, nanos)
}

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

    fn sets(names: &[&str]) -> Vec<DirItem> {
        names
            .iter()
            .map(|n| DirItem {
                node: Node::Set(n.to_string()),
                kind: FileType::Directory,
                name: OsString::from(n),
            })
            .collect()
    }

    fn names(items: &[DirItem]) -> Vec<&str> {
        items.iter().map(|i| i.name.to_str().unwrap()).collect()
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

    #[test]
    fn the_mtime_follows_the_listing_and_keeps_the_seconds() {
        let base = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123);
        let ab = mtime(base, &sets(&["a", "b"]));
        assert_eq!(ab, mtime(base, &sets(&["a", "b"])));
        assert_ne!(ab, mtime(base, &sets(&["a", "c"])));
        assert_ne!(ab, mtime(base, &sets(&["ab"])));
        assert_ne!(ab, mtime(base, &sets(&["a"])));
        let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs(ab), 1_700_000_000);
        let names = |n: &[&str]| n.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let one = stamp(base, names(&["1.1", "2.1"]));
        assert_eq!(one, stamp(base, names(&["1.1", "2.1"])));
        assert_ne!(one, stamp(base, names(&["1.1", "2.1", "3.1"])));
        assert_ne!(one, stamp(base, names(&["1.1", "2.2"])));
    }
}
