//! Pointers: small mutable objects replaced by CAS on their exact bytes.
//!
//! Every pointer body carries a counter (one more than the body it
//! replaces) and a fresh nonce ([`Stamp`]), so its bytes are never repeated
//! and a stale expectation never matches (no ABA). [`update`] reads the
//! pointer, lets the caller decide the next body from the current value,
//! and swaps; a lost race re-reads and decides again.

use crate::error::{Error, Result};
use crate::storage::CasOutcome;
use crate::store::Store;

/// Rounds of read, decide and swap before concurrent writers win.
const CAS_RETRIES: usize = 16;

/// A decoded pointer body that knows its counter.
pub trait Counted {
    fn counter(&self) -> u64;
}

/// What the next body must carry: the counter after the current one and a
/// fresh nonce.
#[derive(Debug, Clone)]
pub struct Stamp {
    pub counter: u64,
    pub nonce: String,
}

/// How an [`update`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updated {
    /// The new body replaced the current one.
    Swapped,
    /// The caller found nothing to change.
    Unchanged,
}

/// Read the pointer at `key` with `read` (the value and its exact bytes,
/// `None` when absent), ask `next` for the body that replaces it (`None`:
/// nothing to do), and swap; a lost race starts over. `what` names the
/// pointer in the conflict after [`CAS_RETRIES`] lost rounds.
pub fn update<T: Counted>(
    store: &Store,
    key: &str,
    what: &str,
    read: impl Fn() -> Result<Option<(T, Vec<u8>)>>,
    mut next: impl FnMut(Option<&T>, Stamp) -> Result<Option<Vec<u8>>>,
) -> Result<Updated> {
    for _ in 0..CAS_RETRIES {
        let current = read()?;
        let stamp = Stamp {
            counter: current
                .as_ref()
                .map_or(0, |(v, _)| v.counter())
                .saturating_add(1),
            nonce: crate::token::new_token(),
        };
        let Some(body) = next(current.as_ref().map(|(v, _)| v), stamp)? else {
            return Ok(Updated::Unchanged);
        };
        let expected = current.as_ref().map(|(_, bytes)| bytes.as_slice());
        if store.storage().cas(key, expected, &body)? == CasOutcome::Swapped {
            return Ok(Updated::Swapped);
        }
    }
    Err(Error::Conflict(format!(
        "{what} kept changing under concurrent writers: key=`{key}`"
    )))
}
