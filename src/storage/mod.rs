//! The storage seam: every byte strata keeps goes through [`Storage`].
//!
//! Keys are `/`-separated relative names (see docs/FORMAT.md for the layout).
//! The interface is what both a local directory and an object store can offer:
//! create-exclusive puts (the only way a versioned record comes to exist), an
//! atomic replacement of a content-named object that failed its adoption
//! check (`store::adopt`), a compare-and-swap of a small pointer object,
//! whole and ranged reads with a size bound (and reads of the store's own
//! bytes, past any local copy), listing, deletion, and leases whose liveness
//! is decided by the backend (an OS lock locally), never by a PID or a
//! holder string.

mod cache;
pub mod fence;
mod lease_object;
mod local;
mod location;
pub mod pieces;
mod remote;
mod s3;
mod uploads;

pub(crate) use local::ensure_dir as ensure_local_dir;
pub use local::LocalStorage;
pub use location::{default_location, parse_duration, parse_size, Location, StoreArgs};
pub use remote::Endpoint;
pub use s3::{S3Options, S3Storage};

use crate::error::Result;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Result of a create-exclusive write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// Someone created the name first; the existing object was not touched.
    AlreadyExists,
}

/// Result of a pointer compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    Swapped,
    /// The pointer did not hold the expected bytes; `current` is what it holds.
    Mismatch {
        current: Option<Vec<u8>>,
    },
}

/// Whether a lease is held by a live owner, as decided by the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    Held { holder: String },
    Unheld,
    Missing,
}

/// A held lease; dropping it releases the lease.
pub trait Lease: Send + Sync + Debug {
    fn key(&self) -> &str;
    /// Fail with `Fenced` if the lease may have been taken over (a remote
    /// lease not renewed in time); otherwise until when writes sent under it
    /// still land before any takeover (`None`: it cannot be taken over).
    /// Callers put the answer up as a fence ([`fence::enter`]) around the
    /// writes it protects.
    fn check(&self) -> Result<Option<std::time::Instant>> {
        Ok(None)
    }
}

/// Outcome of trying to take a lease without waiting.
#[derive(Debug)]
pub enum TryLease {
    Acquired(Box<dyn Lease>),
    Busy { holder: String },
}

pub trait Storage: Send + Sync + Debug {
    /// Human-readable location of the store (for messages).
    fn describe(&self) -> String;
    /// Whole object; refuses objects over `limit` bytes before reading them.
    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>>;
    /// `len` bytes at `offset`; a short object is an error.
    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Like [`Storage::get_range`], but never fetching the whole object into
    /// a local cache (for scans that touch each object once, like a sweep).
    fn get_range_uncached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.get_range(key, offset, len)
    }
    /// Size of an object, `None` if absent.
    fn size(&self, key: &str) -> Result<Option<u64>>;
    /// Durably create `key` with `bytes` unless it exists.
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome>;
    /// Durably create each `(key, bytes)` unless it exists, as
    /// [`Storage::put_if_absent`] does one by one; a backend may make them
    /// durable together (a local one syncs its filesystem once, and each
    /// directory once). Every object is durable when this returns.
    fn put_many_if_absent(&self, items: &[(String, Vec<u8>)]) -> Result<Vec<PutOutcome>> {
        use rayon::prelude::*;
        items
            .par_iter()
            .map(|(key, bytes)| self.put_if_absent(key, bytes))
            .collect()
    }
    /// Durably move a fully written, fsynced local file to `key` unless it
    /// exists. The staged file is consumed when the object is created; when
    /// the name exists it is left in place, so that the caller can check the
    /// existing object against it (`store::adopt`), and the caller removes it.
    fn put_file_if_absent(&self, key: &str, staged: &Path) -> Result<PutOutcome>;
    /// Durably and atomically replace the content-named object at `key`
    /// with `bytes`, after its stored bytes failed the adoption check:
    /// readers see the old or the new object whole, never a mix.
    fn replace(&self, key: &str, bytes: &[u8]) -> Result<()>;
    /// [`Storage::replace`] from a fully written, fsynced local file, which
    /// is consumed.
    fn replace_file(&self, key: &str, staged: &Path) -> Result<()>;
    /// Size of the object as the store itself holds it (never a local
    /// copy's), `None` if absent: what checks of stored bytes read.
    fn size_stored(&self, key: &str) -> Result<Option<u64>> {
        self.size(key)
    }
    /// `len` bytes at `offset` read from the store itself, never from a
    /// local copy (a copy was checked when it was made; the store's object
    /// may have changed since); a short object is an error.
    fn get_range_stored(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.get_range(key, offset, len)
    }
    /// Replace a small pointer object iff it currently holds `expected`
    /// (`None`: iff it does not exist).
    fn cas(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<CasOutcome>;
    /// Names directly under `dir` (files and sub-directories), sorted.
    fn list(&self, dir: &str) -> Result<Vec<String>>;
    /// Objects (not directories) directly under `dir` with their sizes, sorted.
    fn list_sizes(&self, dir: &str) -> Result<Vec<(String, u64)>>;
    /// Remove an object; absent is fine.
    fn delete(&self, key: &str) -> Result<()>;
    /// Remove the scratch directory `dir` (a key [`Storage::scratch_dir`]
    /// was given), empty or not, and any objects under it.
    fn delete_dir(&self, dir: &str) -> Result<()>;
    /// Local file backing `key`, when the backend has one (for passthrough reads).
    fn local_path(&self, key: &str) -> Option<PathBuf>;
    /// An open local file holding the whole immutable object at `key` (the
    /// object itself locally; a verified cache copy for a remote store);
    /// `None` when the object is too large to keep locally (read it with
    /// [`Storage::get_range`]).
    fn open_file(&self, key: &str) -> Result<Option<File>>;
    /// True when this process filled the local copy of `key` and hashed it
    /// against its name while doing so (a first-open check need not hash
    /// it again).
    fn verified_copy(&self, _key: &str) -> bool {
        false
    }
    /// Drop the local copy of `key` after it failed a check, so that the
    /// next read fetches the object again; true if there was a copy (a
    /// local backend has none: its files are the store).
    fn evict_copy(&self, _key: &str) -> bool {
        false
    }
    /// Local scratch directory for the staging files under key `dir`
    /// (created if missing). Which keys are scratch is the caller's layout
    /// (`store::keys`); the backend only maps the key to a local directory.
    fn scratch_dir(&self, dir: &str) -> Result<PathBuf>;
    /// Take the lease at `key`, waiting for it if `wait`. Without `wait`,
    /// a lease only probed at that instant ([`Storage::probe_lease`]) is not
    /// reported busy.
    fn lease(&self, key: &str, holder: &str, wait: bool) -> Result<TryLease>;
    /// Probe a lease without taking it for longer than the probe.
    fn probe_lease(&self, key: &str) -> Result<LeaseState>;
    /// The holder text a lease was taken with (`None` if it is gone).
    fn lease_holder(&self, key: &str) -> Result<Option<String>>;
    /// Where liveness is decided by observation (remote leases), watch the
    /// undecided leases among `keys` for up to a lease ttl, so that the
    /// probes that follow give settled verdicts. A lease that does not
    /// parse is left to the probe that reports it.
    fn settle_leases(&self, _keys: &[String]) -> Result<()> {
        Ok(())
    }
    /// Longest time a dead holder's lease still looks held (`None`: the
    /// backend knows at once, as with OS locks).
    fn lease_ttl(&self) -> Option<Duration> {
        None
    }
    /// Abort the incomplete multipart uploads (a remote store's; a local
    /// one has none) initiated at least `age` ago, or with `dry_run` only
    /// name them: the keys they were for.
    fn abort_stale_uploads(&self, _age: Duration, _dry_run: bool) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    /// Requests sent to a remote store so far, by kind, and cache use
    /// (`None` for the local backend).
    fn request_counts(&self) -> Option<BTreeMap<&'static str, u64>> {
        None
    }
}

/// Sequential reads of one object in ranged pieces, never more than a
/// piece in memory (for objects read as a stream, like a condemned list).
pub struct ObjectReader<'a> {
    storage: &'a dyn Storage,
    key: String,
    size: u64,
    offset: u64,
    piece: std::io::Cursor<Vec<u8>>,
}

/// Bytes fetched per ranged read.
const READ_PIECE: u64 = 4 << 20;

impl<'a> ObjectReader<'a> {
    /// A reader of the first `size` bytes of `key`.
    pub fn new(storage: &'a dyn Storage, key: &str, size: u64) -> ObjectReader<'a> {
        ObjectReader {
            storage,
            key: key.to_string(),
            size,
            offset: 0,
            piece: std::io::Cursor::new(Vec::new()),
        }
    }
}

impl std::io::Read for ObjectReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = std::io::Read::read(&mut self.piece, buf)?;
        if n > 0 || self.offset >= self.size || buf.is_empty() {
            return Ok(n);
        }
        let len = READ_PIECE.min(self.size - self.offset);
        let bytes = self
            .storage
            .get_range_uncached(&self.key, self.offset, len)
            .map_err(std::io::Error::other)?;
        self.offset += len;
        self.piece = std::io::Cursor::new(bytes);
        std::io::Read::read(&mut self.piece, buf)
    }
}

/// Remove a local file as a best-effort cleanup: one already gone is fine;
/// any other failure has no caller to go to, so it is logged.
pub(crate) fn remove_or_warn(path: &std::path::Path, what: &str) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("{what} not removed: path=`{}` error=`{e}`", path.display()),
    }
}

/// A scratch directory key is at least two plain components deep (never a
/// top-level directory of the store), so a removal cannot reach past it.
pub(crate) fn check_scratch_dir(dir: &str) -> Result<()> {
    let parts: Vec<&str> = dir.split('/').collect();
    let plain = |p: &&str| !p.is_empty() && *p != "." && *p != "..";
    if parts.len() < 2 || !parts.iter().all(plain) {
        return Err(crate::error::Error::Invalid(format!(
            "not a scratch directory key: dir=`{dir}`"
        )));
    }
    Ok(())
}
