//! Staging: the private scratch of one writing attempt (a commit or a
//! materialization), named by its token and owned through a lease.
//!
//! An attempt takes `staging/<token>.owner` first, then waits while a sweep's
//! deletion batch runs (the fence of invariant 4: a writer either is seen by
//! the batch as live or starts after it; see `sweep`'s module docs), then
//! gets its directory and its disk-budget admission. Dropping the
//! [`Staging`] removes both. A dead attempt's staging is recognized by a
//! lock probe of its owner lease (never a PID) and reclaimed by the next
//! writer or sweep.

use crate::budget::Admission;
use crate::error::{Error, Result};
use crate::storage::{Lease, LeaseState, TryLease};
use crate::store::{keys, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a writer waits for a deletion batch before giving up.
const WRITER_WAIT_MAX: Duration = Duration::from_secs(300);

/// A staging directory owned by one attempt, named by its token and held
/// by an owner lease; removed when dropped.
pub struct Staging {
    pub dir: PathBuf,
    /// What this attempt may still write (the disk budget).
    pub admission: Arc<Admission>,
    store: Store,
    token: String,
    owner: Box<dyn Lease>,
}

impl Staging {
    /// Take the owner lease of `token` (held by `holder`) and make its directory.
    pub fn create(store: &Store, token: &str, holder: &str) -> Result<Staging> {
        let owner = match store
            .storage()
            .lease(&keys::staging_owner(token), holder, false)?
        {
            TryLease::Acquired(l) => l,
            TryLease::Busy { holder } => {
                return Err(Error::internal(format!(
                    "fresh staging token already held by {holder}"
                )))
            }
        };
        wait_while_deleting(store)?;
        let dir = store.storage().scratch_dir(&keys::staging_dir(token))?;
        let admission = Arc::new(Admission::new(store, &dir)?);
        Ok(Staging {
            dir,
            admission,
            store: store.clone(),
            token: token.to_string(),
            owner,
        })
    }

    /// The owner lease (for fencing publications made from this staging).
    pub fn owner(&self) -> &dyn Lease {
        &*self.owner
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = remove(&self.store, &self.token) {
            tracing::warn!(
                "staging not removed; it is reclaimed once its owner lease is unheld: token=`{}` error=`{}`",
                self.token,
                crate::cli_chain(&e)
            );
        }
    }
}

/// Refuse a token no attempt would take (one read from the store, such as a
/// task's owner), before anything is probed or removed under it.
pub fn check_token(token: &str) -> Result<()> {
    let valid = !token.is_empty()
        && token.len() <= 128
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(Error::Invalid(format!(
            "not the token of a staging attempt: token=`{token}`"
        )));
    }
    Ok(())
}

/// Remove the staging of `token` and its owner lease file.
pub fn remove(store: &Store, token: &str) -> Result<()> {
    check_token(token)?;
    store.storage().delete_dir(&keys::staging_dir(token))?;
    store.storage().delete(&keys::staging_owner(token))
}

/// Whether the attempt `token` is alive: its owner lease is held.
pub fn is_held(store: &Store, token: &str) -> Result<bool> {
    Ok(matches!(
        store.storage().probe_lease(&keys::staging_owner(token))?,
        LeaseState::Held { .. }
    ))
}

/// Tokens of every staging owner lease in the store.
pub fn owners(store: &Store) -> Result<Vec<String>> {
    let names = store.storage().list(keys::STAGING)?;
    Ok(names
        .into_iter()
        .filter_map(|n| n.strip_suffix(".owner").map(str::to_string))
        .collect())
}

/// Remove the staging of every attempt whose owner lease is unheld; returns
/// how many went.
pub fn reclaim_unheld(store: &Store) -> Result<u64> {
    let mut reclaimed = 0;
    for token in owners(store)? {
        if store.storage().probe_lease(&keys::staging_owner(&token))? == LeaseState::Unheld {
            remove(store, &token)?;
            reclaimed += 1;
        }
    }
    Ok(reclaimed)
}

/// Called by every writer right after it took its owner lease: wait while a
/// sweep's deletion batch runs.
pub fn wait_while_deleting(store: &Store) -> Result<()> {
    let start = Instant::now();
    // Locally a probe is a syscall; remotely a request.
    let poll = store
        .storage()
        .lease_ttl()
        .map_or(Duration::from_millis(2), |ttl| ttl / 8);
    loop {
        match store.storage().probe_lease(keys::DELETING_LEASE)? {
            LeaseState::Held { holder } if start.elapsed() > WRITER_WAIT_MAX => {
                return Err(Error::Conflict(format!(
                    "a sweep's deletion batch did not end: holder=`{holder}`"
                )))
            }
            LeaseState::Held { .. } => std::thread::sleep(poll),
            LeaseState::Unheld | LeaseState::Missing => return Ok(()),
        }
    }
}
