//! Versioned records: create-once objects named by a version number.
//!
//! A record chain `…/{version}` (1, 2, …) holds the history of one object;
//! the newest version is its state. A change creates the next version with
//! `put_if_absent`; whoever creates it first wins and everyone else gets a
//! conflict and re-reads (invariant 1 for the index, the task lease protocol
//! for tasks).

use crate::error::{Error, Result};
use crate::storage::PutOutcome;
use crate::store::Store;

/// The object at `key`, at most `limit` bytes; `None` when it does not exist.
pub fn try_get(store: &Store, key: &str, limit: u64) -> Result<Option<Vec<u8>>> {
    match store.storage().get(key, limit) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The newest version of a chain: `probe(1)`, `probe(2)`, … until one is
/// missing. `None` when version 1 is missing.
pub fn newest<T>(mut probe: impl FnMut(u32) -> Result<Option<T>>) -> Result<Option<T>> {
    let mut found = None;
    let mut version = 1;
    while let Some(record) = probe(version)? {
        found = Some(record);
        version += 1;
    }
    Ok(found)
}

/// Create the record at `key` exclusively: the CAS. Losing the race is an
/// [`Error::Conflict`] with the message `lost` gives.
pub fn create(store: &Store, key: &str, bytes: &[u8], lost: impl FnOnce() -> String) -> Result<()> {
    match store.storage().put_if_absent(key, bytes)? {
        PutOutcome::Created => Ok(()),
        PutOutcome::AlreadyExists => Err(Error::Conflict(lost())),
    }
}

/// Create the record at `key` exclusively; `false` when it already existed
/// (for records whose existing copy the caller checks itself).
pub fn create_or_existing(store: &Store, key: &str, bytes: &[u8]) -> Result<bool> {
    Ok(store.storage().put_if_absent(key, bytes)? == PutOutcome::Created)
}
