//! The store: one root holding every set, opened through a [`Storage`].
//!
//! Owns the `STORE` format marker (refusing a newer one), set-name rules,
//! the key layout ([`keys`]: every key of the store is built there) and the
//! writes of content-named objects ([`adopt`]: an existing object is checked
//! before it is adopted).
//! Everything else reaches storage through a `Store`.

use crate::error::{Error, ErrorKind, Result};
use crate::failpoint::FailPoints;
use crate::format::parse_versioned;
use crate::storage::{LocalStorage, PutOutcome, Storage};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

/// 1: initial layout.
pub const STORE_VERSION: u32 = 1;
const STORE_TAG: &str = "strata-store";

#[derive(Debug, Serialize, Deserialize)]
struct StoreMarker {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    created_ns: i64,
}

#[derive(Debug, Clone)]
pub struct Store {
    storage: Arc<dyn Storage>,
    failpoints: FailPoints,
    /// Segments whose SHA-256 this process has checked (by name).
    verified_segments: Arc<Mutex<HashSet<String>>>,
    /// Objects replaced after they failed the adoption check ([`adopt`]).
    repaired: Arc<AtomicU64>,
}

impl Store {
    /// Create the marker if absent; an existing store is opened (and checked).
    pub fn init(storage: Arc<dyn Storage>) -> Result<(Store, bool)> {
        let marker = StoreMarker {
            tag: STORE_TAG.into(),
            version: STORE_VERSION,
            created_ns: crate::token::now_ns(),
        };
        let bytes = serde_json::to_vec_pretty(&marker)
            .map_err(|e| Error::internal_from("encode the store marker", e))?;
        let created = storage.put_if_absent(keys::MARKER, &bytes)? == PutOutcome::Created;
        Ok((Store::open(storage)?, created))
    }

    pub fn open(storage: Arc<dyn Storage>) -> Result<Store> {
        let bytes = storage
            .get(keys::MARKER, 1 << 20)
            .map_err(|e| match e.is_not_found() {
                true => Error::Invalid(format!(
                    "no strata store here (run `strata init`): store=`{}`",
                    storage.describe()
                )),
                false => e,
            })?;
        let _: StoreMarker = parse_versioned(
            "store marker",
            keys::MARKER,
            STORE_TAG,
            STORE_VERSION,
            &bytes,
        )?;
        Ok(Store {
            storage,
            failpoints: FailPoints::none(),
            verified_segments: Arc::default(),
            repaired: Arc::default(),
        })
    }

    pub fn open_local(root: &Path) -> Result<Store> {
        Store::open(Arc::new(LocalStorage::new(root)))
    }

    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Store {
        self.failpoints = failpoints;
        self
    }

    /// The same store as a newly started process sees it: no segment is
    /// counted as checked. A long-lived process whose every job must read
    /// the store as a fresh process would (the daemon's sweep helper) takes
    /// one per job.
    pub fn reopened(&self) -> Store {
        Store {
            storage: self.storage.clone(),
            failpoints: self.failpoints.clone(),
            verified_segments: Arc::default(),
            repaired: Arc::default(),
        }
    }

    /// The same store with a count of replaced objects of its own, from
    /// zero ([`Store::repaired_objects`]): an operation that reports what
    /// it repaired takes one.
    pub fn counting_repairs(&self) -> Store {
        Store {
            repaired: Arc::default(),
            ..self.clone()
        }
    }

    /// Run `read` of the object at `key`; when it finds the bytes corrupt
    /// and they came from a local copy of a remote object, drop the copy
    /// and run it once more against the store itself.
    pub fn read_fresh<T>(&self, key: &str, read: impl Fn() -> Result<T>) -> Result<T> {
        match read() {
            Err(e) if e.kind() == ErrorKind::Corrupt && self.storage().evict_copy(key) => read(),
            r => r,
        }
    }

    /// Whether this process has checked the segment `name` against its
    /// SHA-256 already; `mark` records that it just did.
    pub(crate) fn segment_verified(&self, name: &str, mark: bool) -> bool {
        let mut set = self
            .verified_segments
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if mark {
            set.insert(name.to_string());
        }
        set.contains(name)
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub fn failpoints(&self) -> &FailPoints {
        &self.failpoints
    }

    /// Names of the sets that have at least one index record.
    pub fn sets(&self) -> Result<Vec<String>> {
        Ok(self
            .storage
            .list(keys::SETS)?
            .into_iter()
            .filter(|s| check_set_name(s).is_ok())
            .collect())
    }
}

/// Set names match `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn check_set_name(name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c));
    if !ok {
        return Err(Error::Invalid(format!(
            "set names match [a-z0-9][a-z0-9._-]{{0,63}}: set=`{name}`"
        )));
    }
    Ok(())
}

mod adopt;
pub mod keys;

pub(crate) use adopt::Written;
