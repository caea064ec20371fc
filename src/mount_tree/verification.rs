//! When a standalone blob may be served, and when it must be hashed in
//! full first ([`VerifyPolicy`]: at the first open of each blob in this
//! process, at every open, or never).
//!
//! A local blob (a local store's file, or a remote store's cached copy) is
//! hashed as the policy asks; a cached copy this process filled, and hashed
//! while filling it, counts as verified at its first open. A remote blob
//! too large for the cache is served by ranged reads, each checked against
//! its verified piece tree ([`Pieces`], shared while any reader holds it
//! with `first-open`). A cached copy that fails its check, or cannot be
//! read, is dropped and fetched once more.
//!
//! Packed blobs are not covered here: decoding one checks it
//! (`blob::read`), whatever the policy.

use crate::error::{Error, ErrorKind};
use crate::storage::pieces::Pieces;
use crate::store::keys;
use crate::{Result, Store};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// When standalone blobs and assembled copies of chunked files are hashed
/// in full before they are served (chunks and packed blobs are checked as
/// they are decoded, always).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyPolicy {
    /// At the first open of each blob in this process.
    FirstOpen,
    /// At every open; a chunked file is then read from the store's chunks
    /// at every open, never from a kept copy.
    Always,
    /// Never (packed blobs are still checked: decoding includes the check).
    Off,
}

/// Counters of verification, for reports.
#[derive(Debug, Default)]
pub struct VerifyCounts {
    /// Standalone blobs verified in full (each once).
    pub verified: AtomicU64,
    /// Blobs or pieces that failed their check.
    pub failures: AtomicU64,
}

/// A standalone blob that may be served.
pub enum OpenedBlob {
    /// A local file, verified as the policy asks.
    Local(File),
    /// A remote blob too large for the local cache, to be read with
    /// [`Verifier::read_remote`]: each piece checked against `pieces`
    /// (`None`: verification is off).
    Remote {
        key: String,
        size: u64,
        pieces: Option<Arc<Pieces>>,
    },
}

/// The verification policy of one serving process and what it verified.
pub struct Verifier {
    policy: VerifyPolicy,
    counts: Arc<VerifyCounts>,
    /// Standalone blobs verified in full during this process.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// Verified piece trees of remote blobs read by ranged reads, shared
    /// by their readers.
    remote_pieces: Mutex<HashMap<[u8; 32], Weak<Pieces>>>,
}

impl Verifier {
    pub fn new(policy: VerifyPolicy, counts: Arc<VerifyCounts>) -> Verifier {
        Verifier {
            policy,
            counts,
            verified: Mutex::new(HashSet::new()),
            remote_pieces: Mutex::new(HashMap::new()),
        }
    }

    pub fn policy(&self) -> VerifyPolicy {
        self.policy
    }

    /// Whether a standalone blob must be hashed in full before it is
    /// served now.
    pub fn must_verify(&self, digest: &[u8; 32]) -> bool {
        match self.policy {
            VerifyPolicy::Off => false,
            VerifyPolicy::FirstOpen => !self
                .verified
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(digest),
            VerifyPolicy::Always => true,
        }
    }

    /// Open the standalone blob `digest` (`size` bytes) of `store` for
    /// serving, verified as the policy asks. A local copy of a remote blob
    /// that fails (its check, or its reading) is dropped and fetched once
    /// more; `dropped` is told the failure first.
    pub fn open_standalone(
        &self,
        store: &Store,
        digest: [u8; 32],
        size: u64,
        dropped: impl FnOnce(&Error),
    ) -> Result<OpenedBlob> {
        let key = keys::blob(&hex::encode(digest));
        match self.open_blob(store, &key, digest, size) {
            Err(e) if e.kind() != ErrorKind::InvalidInput && store.storage().evict_copy(&key) => {
                dropped(&e);
                self.open_blob(store, &key, digest, size)
            }
            r => r,
        }
    }

    fn open_blob(
        &self,
        store: &Store,
        key: &str,
        digest: [u8; 32],
        size: u64,
    ) -> Result<OpenedBlob> {
        let storage = store.storage();
        let Some(file) = storage.open_file(key)? else {
            let pieces = self.remote_pieces(store, key, size, digest)?;
            return Ok(OpenedBlob::Remote {
                key: key.to_string(),
                size,
                pieces,
            });
        };
        if self.policy == VerifyPolicy::FirstOpen && storage.verified_copy(key) {
            self.mark_verified(digest);
        } else if self.must_verify(&digest) {
            self.verify_file(&file, key, digest)?;
        }
        Ok(OpenedBlob::Local(file))
    }

    /// Check a local copy of the content `digest` before it is served: one
    /// this process made from verified parts (`made_here`) counts as
    /// verified at its first open; any other is hashed as the policy asks.
    pub fn check_copy(&self, file: &File, made_here: bool, digest: [u8; 32]) -> Result<()> {
        if made_here && self.policy == VerifyPolicy::FirstOpen {
            self.mark_verified(digest);
            return Ok(());
        }
        if self.must_verify(&digest) {
            self.verify_file(file, &hex::encode(digest), digest)?;
        }
        Ok(())
    }

    fn verify_file(&self, file: &File, key: &str, digest: [u8; 32]) -> Result<()> {
        let mut hasher = blake3::Hasher::new();
        let mut reader = file;
        std::io::copy(&mut reader, &mut hasher).map_err(|e| Error::io("read blob", key, e))?;
        if hasher.finalize().as_bytes() != &digest {
            self.counts.failures.fetch_add(1, Ordering::Relaxed);
            return Err(Error::corrupt(
                "blob",
                key,
                "content fails its BLAKE3 check",
            ));
        }
        self.mark_verified(digest);
        Ok(())
    }

    /// The verified piece tree of a remote blob served by ranged reads:
    /// shared while any reader holds it (with `first-open`), else built by
    /// hashing the blob in ranged reads; `None` when verification is off.
    fn remote_pieces(
        &self,
        store: &Store,
        key: &str,
        size: u64,
        digest: [u8; 32],
    ) -> Result<Option<Arc<Pieces>>> {
        if self.policy == VerifyPolicy::Off {
            return Ok(None);
        }
        if self.policy == VerifyPolicy::FirstOpen {
            let known = self
                .remote_pieces
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = known.get(&digest).and_then(Weak::upgrade) {
                return Ok(Some(p));
            }
        }
        let pieces = Pieces::verify(store.storage().as_ref(), key, size, &digest)
            .map(Arc::new)
            .inspect_err(|e| self.count_failure(e))?;
        self.mark_verified(digest);
        let mut known = self
            .remote_pieces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        known.retain(|_, w| w.strong_count() > 0);
        known.insert(digest, Arc::downgrade(&pieces));
        Ok(Some(pieces))
    }

    /// Up to `len` bytes at `offset` of a remote blob opened as
    /// [`OpenedBlob::Remote`] (`total` bytes), checked piece by piece
    /// unless verification is off.
    pub fn read_remote(
        &self,
        store: &Store,
        key: &str,
        total: u64,
        pieces: Option<&Pieces>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let storage = store.storage();
        let read = match pieces {
            Some(p) => p.read(storage.as_ref(), offset, len),
            None => {
                let start = offset.min(total);
                let n = len.min(total - start);
                if n == 0 {
                    return Ok(Vec::new());
                }
                storage.get_range_uncached(key, start, n)
            }
        };
        read.inspect_err(|e| self.count_failure(e))
    }

    fn count_failure(&self, e: &Error) {
        if e.kind() == ErrorKind::Corrupt {
            self.counts.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn mark_verified(&self, digest: [u8; 32]) {
        let new = self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest);
        if new {
            self.counts.verified.fetch_add(1, Ordering::Relaxed);
        }
    }
}
