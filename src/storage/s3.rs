//! The object-store backend: a strata store under `s3://bucket/prefix` on any
//! S3-compatible service (AWS S3, MinIO, Ceph RGW, SeaweedFS, ...).
//!
//! Owns the mapping of the [`Storage`] seam onto conditional requests:
//! - every create-exclusive write (index records, manifests, tags, tasks,
//!   sweep epochs, content-named data) is a PUT with `If-None-Match: *`;
//! - a content-named object that failed its adoption check is replaced by
//!   an unconditional PUT, and checks of stored bytes read the service, not
//!   the cache;
//! - every pointer CAS (the latest hint, retention policies) is a PUT with
//!   `If-Match` on the version just read. Pointer bodies carry a counter and
//!   a fresh nonce, so a body, and with it a content ETag, never repeats: an
//!   A → B → A sequence cannot match (no ABA);
//! - a conditional write whose first response was lost and whose retry then
//!   fails its precondition is recognised by reading our own bytes back;
//! - leases are lease objects ([`super::lease_object`]);
//! - immutable objects are read through a verified local cache
//!   ([`super::cache`]); scratch files live in a local directory.
//!
//! Deletes are not conditional; the sweep protocol (docs/FORMAT.md) makes
//! them safe by grace and by re-reading pins before each batch.

use super::cache::{self, Cache};
use super::lease_object::LeaseTable;
use super::remote::{Endpoint, Put, Remote, RANGED_PART};
use super::{CasOutcome, LeaseState, PutOutcome, Storage, TryLease};
use crate::error::{Error, IoContext, Result};
use bytes::Bytes;
use object_store::PutMode;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Pointers and small records are at most this large.
const MAX_POINTER_BYTES: u64 = 1 << 20;
/// Local files above this size are uploaded in parts.
const SINGLE_PUT_MAX: u64 = 64 << 20;
/// Packs up to this size are fetched whole into the cache on first read.
const PREFETCH_MAX: u64 = 64 << 20;

/// How to reach the store and where its local state lives.
#[derive(Debug, Clone)]
pub struct S3Options {
    pub endpoint: Endpoint,
    /// Scratch, cache, control sockets and logs.
    pub local_dir: PathBuf,
    pub cache_bytes: u64,
    pub lease_ttl: Duration,
}

#[derive(Debug)]
pub struct S3Storage {
    remote: Arc<Remote>,
    leases: Arc<LeaseTable>,
    cache: Cache,
    scratch: PathBuf,
    /// One gate per key being filled, so concurrent readers of an object
    /// missing from the cache fetch it once.
    filling: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl S3Storage {
    pub fn open(opts: &S3Options) -> Result<S3Storage> {
        let remote = Arc::new(Remote::connect(&opts.endpoint)?);
        super::ensure_local_dir(&opts.local_dir)?;
        let scratch = opts.local_dir.join("scratch");
        super::ensure_local_dir(&scratch)?;
        Ok(S3Storage {
            leases: LeaseTable::start(remote.clone(), opts.lease_ttl),
            cache: Cache::open(&opts.local_dir.join("cache"), opts.cache_bytes)?,
            remote,
            scratch,
            filling: Mutex::default(),
        })
    }

    /// Fetch an immutable object into the cache (verified) and open it.
    fn fill(&self, key: &str, max: u64) -> Result<Option<File>> {
        let Some(size) = self.remote.head(key)? else {
            return Err(not_found(key));
        };
        if size > max || !self.cache.fits(size) {
            return Ok(None);
        }
        let (tmp, file) = self.cache.temp(key)?;
        let filled = if size >= RANGED_PART {
            self.remote
                .download(key, size, &file, key.starts_with("blobs/"))
        } else {
            self.remote
                .get(key, size)
                .and_then(|got| got.ok_or_else(|| not_found(key)))
                .and_then(|(b, _)| file.write_all_at(&b, 0).ctx("write", &tmp))
                .map(|()| None)
        };
        let blake3 = match filled {
            Ok(hash) => hash,
            Err(e) => {
                super::remove_or_warn(&tmp, "temporary cache file");
                return Err(e);
            }
        };
        self.cache.admit(key, &tmp, blake3)?;
        Ok(self.cache.open_copy(key))
    }

    /// The cached copy of an immutable object; on a miss, filled when the
    /// object is at most `fill_max` bytes (0: never).
    fn cached(&self, key: &str, fill_max: u64) -> Result<Option<File>> {
        if !cache::is_immutable(key) {
            return Ok(None);
        }
        if let Some(f) = self.cache.open_copy(key) {
            self.remote.counts.hit(false);
            return Ok(Some(f));
        }
        if fill_max > 0 {
            return self.fill_once(key, fill_max);
        }
        Ok(None)
    }

    /// Fill `key` unless a concurrent reader just did.
    fn fill_once(&self, key: &str, fill_max: u64) -> Result<Option<File>> {
        let gate = {
            let mut filling = self.filling.lock().unwrap_or_else(PoisonError::into_inner);
            filling.retain(|_, g| Arc::strong_count(g) > 1);
            filling.entry(key.to_string()).or_default().clone()
        };
        let _turn = gate.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = self.cache.open_copy(key) {
            self.remote.counts.hit(false);
            return Ok(Some(f));
        }
        self.remote.counts.hit(true);
        self.fill(key, fill_max)
    }

    /// A create-exclusive PUT; a lost response is recognised by our bytes.
    fn create(&self, key: &str, body: Bytes) -> Result<PutOutcome> {
        match self.remote.put(key, body.clone(), PutMode::Create)? {
            Put::Done(_) => Ok(PutOutcome::Created),
            // Content-named: the caller checks the existing object before
            // it adopts it (`store::adopt`).
            Put::Exists | Put::Changed if cache::is_immutable(key) => Ok(PutOutcome::AlreadyExists),
            Put::Exists | Put::Changed => {
                // Longer than ours (TooLarge) cannot be ours.
                let mine = match self.remote.get(key, body.len() as u64) {
                    Ok(Some((b, _))) => b == body,
                    Ok(None) | Err(Error::TooLarge { .. }) => false,
                    Err(e) => return Err(e),
                };
                Ok(if mine {
                    PutOutcome::Created
                } else {
                    PutOutcome::AlreadyExists
                })
            }
        }
    }
}

fn not_found(key: &str) -> Error {
    Error::missing_object(key)
}

fn read_all(file: &File, key: &str, limit: u64) -> Result<Vec<u8>> {
    let size = file.metadata().ctx("stat", key)?.len();
    if size > limit {
        return Err(Error::TooLarge {
            what: "stored object",
            size,
            limit,
        });
    }
    let mut buf = vec![0u8; size as usize];
    super::local::read_exact_chunked(file, &mut buf, 0).ctx("read-cache", key)?;
    Ok(buf)
}

fn read_range(file: &File, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
    super::local::read_range(file, key, Path::new(key), offset, len)
}

impl Storage for S3Storage {
    fn describe(&self) -> String {
        self.remote.describe().to_string()
    }

    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>> {
        if let Some(f) = self.cached(key, 0)? {
            return read_all(&f, key, limit);
        }
        let (bytes, _) = self.remote.get(key, limit)?.ok_or_else(|| not_found(key))?;
        if cache::is_immutable(key) && self.cache.fits(bytes.len() as u64) {
            // Keep a verified copy; a failure to keep one is not a read error.
            let kept = self
                .cache
                .temp(key)
                .and_then(|(tmp, f)| match f.write_all_at(&bytes, 0) {
                    Ok(()) => self.cache.admit(key, &tmp, None),
                    Err(e) => {
                        super::remove_or_warn(&tmp, "temporary cache file");
                        Err(Error::io("write", &tmp, e))
                    }
                });
            if let Err(e) = kept {
                tracing::warn!(
                    "read not kept in the cache: key=`{key}` error=`{}`",
                    crate::cli_chain(&e)
                );
            }
        }
        Ok(bytes.to_vec())
    }

    fn get_range_uncached(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        if let Some(f) = self.cached(key, 0)? {
            return read_range(&f, key, offset, len);
        }
        Ok(self.remote.get_range(key, offset, len)?.to_vec())
    }

    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let prefetch = if key.starts_with("packs/") {
            PREFETCH_MAX
        } else {
            0
        };
        if let Some(f) = self.cached(key, prefetch)? {
            return read_range(&f, key, offset, len);
        }
        Ok(self.remote.get_range(key, offset, len)?.to_vec())
    }

    fn size(&self, key: &str) -> Result<Option<u64>> {
        if let Some(f) = self.cached(key, 0)? {
            return Ok(Some(f.metadata().ctx("stat", key)?.len()));
        }
        self.remote.head(key)
    }

    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome> {
        self.create(key, Bytes::copy_from_slice(bytes))
    }

    fn put_file_if_absent(&self, key: &str, staged: &Path) -> Result<PutOutcome> {
        let size = fs::metadata(staged).ctx("stat", staged)?.len();
        let outcome = if size <= SINGLE_PUT_MAX {
            let bytes = fs::read(staged).ctx("read", staged)?;
            self.create(key, Bytes::from(bytes))
        } else if self.remote.head(key)?.is_some() {
            Ok(PutOutcome::AlreadyExists)
        } else {
            self.remote
                .put_large(key, staged)
                .map(|_| PutOutcome::Created)
        };
        // An existing name's staged file is the caller's, to check it with.
        if !matches!(outcome, Ok(PutOutcome::AlreadyExists)) {
            super::remove_or_warn(staged, "staged upload");
        }
        outcome
    }

    /// An unconditional PUT: the service swaps the whole object at once.
    fn replace(&self, key: &str, bytes: &[u8]) -> Result<()> {
        let body = Bytes::copy_from_slice(bytes);
        self.remote.put(key, body, PutMode::Overwrite).map(|_| ())
    }

    fn replace_file(&self, key: &str, staged: &Path) -> Result<()> {
        let size = fs::metadata(staged).ctx("stat", staged)?.len();
        let replaced = if size <= SINGLE_PUT_MAX {
            fs::read(staged)
                .ctx("read", staged)
                .and_then(|b| self.replace(key, &b))
        } else {
            self.remote.put_large(key, staged)
        };
        super::remove_or_warn(staged, "staged upload");
        replaced
    }

    fn size_stored(&self, key: &str) -> Result<Option<u64>> {
        self.remote.head(key)
    }

    fn get_range_stored(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        Ok(self.remote.get_range(key, offset, len)?.to_vec())
    }

    fn cas(&self, key: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<CasOutcome> {
        let current = self.remote.get(key, MAX_POINTER_BYTES)?;
        let mode = match (&current, expected) {
            (None, None) => PutMode::Create,
            (Some((b, v)), Some(e)) if b.as_ref() == e => PutMode::Update(v.clone()),
            _ => {
                return Ok(CasOutcome::Mismatch {
                    current: current.map(|(b, _)| b.to_vec()),
                })
            }
        };
        match self.remote.put(key, Bytes::copy_from_slice(new), mode)? {
            Put::Done(_) => Ok(CasOutcome::Swapped),
            Put::Exists | Put::Changed => {
                let now = self
                    .remote
                    .get(key, MAX_POINTER_BYTES)?
                    .map(|(b, _)| b.to_vec());
                if now.as_deref() == Some(new) {
                    return Ok(CasOutcome::Swapped);
                }
                Ok(CasOutcome::Mismatch { current: now })
            }
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let listing = self.remote.list(dir)?;
        let mut names: Vec<String> = listing
            .dirs
            .into_iter()
            .chain(listing.objects.into_iter().map(|(n, _)| n))
            .filter(|n| !n.starts_with(".tmp-"))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn list_sizes(&self, dir: &str) -> Result<Vec<(String, u64)>> {
        let mut objects = self.remote.list(dir)?.objects;
        objects.retain(|(n, _)| !n.starts_with(".tmp-"));
        objects.sort();
        Ok(objects)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.remote.delete(key)
    }

    fn delete_dir(&self, dir: &str) -> Result<()> {
        super::check_scratch_dir(dir)?;
        let local = self.scratch.join(dir);
        match fs::remove_dir_all(&local) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("rmdir", &local, e)),
        }
        self.remote.delete_prefix(dir)
    }

    fn local_path(&self, _key: &str) -> Option<PathBuf> {
        None
    }

    fn open_file(&self, key: &str) -> Result<Option<File>> {
        self.cached(key, u64::MAX)
    }

    fn verified_copy(&self, key: &str) -> bool {
        self.cache.admitted_here(key)
    }

    fn evict_copy(&self, key: &str) -> bool {
        self.cache.remove(key)
    }

    fn scratch_dir(&self, key: &str) -> Result<PathBuf> {
        super::check_scratch_dir(key)?;
        let dir = self.scratch.join(key);
        super::ensure_local_dir(&dir)?;
        Ok(dir)
    }

    fn lease(&self, key: &str, holder: &str, wait: bool) -> Result<TryLease> {
        self.leases.acquire(key, holder, wait)
    }

    fn probe_lease(&self, key: &str) -> Result<LeaseState> {
        self.leases.probe(key)
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>> {
        self.leases.holder(key)
    }

    fn settle_leases(&self, keys: &[String]) -> Result<()> {
        self.leases.settle(keys)
    }

    fn lease_ttl(&self) -> Option<Duration> {
        Some(self.leases.ttl())
    }

    fn abort_stale_uploads(&self, age: Duration, dry_run: bool) -> Result<Vec<String>> {
        let before =
            crate::token::now_ns().saturating_sub(age.as_nanos().min(i64::MAX as u128) as i64);
        let mut aborted = Vec::new();
        for upload in self.remote.uploads()? {
            if upload.initiated_ns > before {
                continue;
            }
            if !dry_run {
                self.remote.abort_upload(&upload)?;
            }
            aborted.push(upload.key);
        }
        Ok(aborted)
    }

    fn request_counts(&self) -> Option<BTreeMap<&'static str, u64>> {
        let mut counts = self.remote.counts.snapshot();
        counts.insert("cache_bytes", self.cache.used());
        Some(counts)
    }
}
