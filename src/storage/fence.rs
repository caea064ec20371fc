//! Fences: how long a lease holder's writes stay safe.
//!
//! A remote lease ([`super::lease_object`]) can be taken over once its
//! holder has not renewed it for a ttl. [`Lease::check`] confirms a recent
//! renewal and answers until when the holder's writes still land before any
//! takeover; [`enter`] makes that deadline the *fence* of the current
//! thread for the guarded writes. While a fence is up, every request to the
//! remote store that would start after the deadline fails with `Fenced`
//! instead of being sent, and a request still in flight at the deadline is
//! abandoned with `Fenced` (so no client retry carries a write past it).
//! Local leases are OS locks that cannot be taken over: no deadline.

use super::Lease;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::time::Instant;

/// The fence up on this thread: the lease it protects and its deadline.
#[derive(Debug, Clone)]
pub(crate) struct Active {
    pub(crate) key: String,
    pub(crate) deadline: Instant,
}

impl Active {
    /// `Fenced` if the deadline has passed.
    pub(crate) fn check(&self) -> Result<()> {
        if Instant::now() >= self.deadline {
            return Err(self.fenced());
        }
        Ok(())
    }

    pub(crate) fn fenced(&self) -> Error {
        Error::Fenced {
            key: self.key.clone(),
        }
    }
}

thread_local! {
    static FENCE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// The fence up on this thread, if any.
pub(crate) fn current() -> Option<Active> {
    FENCE.with(|f| f.borrow().clone())
}

/// Guard of a fence; dropping it restores the fence that was up before.
#[derive(Debug)]
#[must_use = "the fence is down as soon as the guard is dropped"]
pub struct Fence {
    prev: Option<Active>,
}

impl Drop for Fence {
    fn drop(&mut self) {
        let prev = self.prev.take();
        FENCE.with(|f| *f.borrow_mut() = prev);
    }
}

/// Check every lease and put up the earliest of their deadlines (within
/// any fence already up) for the writes that follow, until the guard drops.
pub fn enter(leases: &[&dyn Lease]) -> Result<Fence> {
    let mut next = current();
    for lease in leases {
        if let Some(deadline) = lease.check()? {
            if next.as_ref().is_none_or(|a| deadline < a.deadline) {
                next = Some(Active {
                    key: lease.key().to_string(),
                    deadline,
                });
            }
        }
    }
    Ok(put_up(next))
}

/// Put up a fence until `deadline` for the lease at `key` (a renewal's own
/// bound on its request).
pub(crate) fn until(key: &str, deadline: Instant) -> Fence {
    put_up(Some(Active {
        key: key.to_string(),
        deadline,
    }))
}

fn put_up(next: Option<Active>) -> Fence {
    let prev = FENCE.with(|f| std::mem::replace(&mut *f.borrow_mut(), next));
    Fence { prev }
}
