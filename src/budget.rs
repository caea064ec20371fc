//! Disk budget: commits and materializations admit what they write against
//! a free-space floor on the filesystem that holds the store's local files
//! (the store itself, or a remote store's scratch) and an optional limit on
//! the store's size.
//!
//! Owns the `budget.json` record (`strata budget`) and [`Admission`]. Work is
//! admitted before it writes: a commit or materialization checks the budget
//! before its first write, and again before each pack and each standalone
//! blob it stages (a few calls per commit, one `statvfs` each). A refusal is
//! [`Error::NoSpace`] naming what needed how much, and like every failure
//! before publication it leaves nothing half-published (the attempt's
//! staging goes with it). ENOSPC that strikes anyway (another process
//! filled the disk) fails the same way.

use crate::cas::pointer::{self, Counted};
use crate::cas::versioned;
use crate::error::{Error, Result};
use crate::format::parse_versioned;
use crate::store::keys;
use crate::Store;
use serde::{Deserialize, Serialize};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

const BUDGET_TAG: &str = "strata-budget";
const BUDGET_VERSION: u32 = 1;
/// Default floor: keep 1% of the filesystem free.
pub const DEFAULT_MIN_FREE_PERCENT: f64 = 1.0;

/// The configured budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Bytes that must stay free on the filesystem (`None`: use the percent).
    pub min_free_bytes: Option<u64>,
    /// Percent of the filesystem that must stay free, when no byte floor is set.
    pub min_free_percent: f64,
    /// The most bytes the store's objects may take (`None`: no limit).
    pub max_store_bytes: Option<u64>,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            min_free_bytes: None,
            min_free_percent: DEFAULT_MIN_FREE_PERCENT,
            max_store_bytes: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct BudgetRecord {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    #[serde(flatten)]
    budget: Budget,
    /// Counter and nonce make every record's bytes unique, so the CAS on
    /// the exact previous bytes cannot be fooled by A -> B -> A.
    counter: u64,
    nonce: String,
}

/// The store's budget (the default when none was set).
pub fn load(store: &Store) -> Result<Budget> {
    Ok(read(store)?.map_or_else(Budget::default, |(r, _)| r.budget))
}

fn read(store: &Store) -> Result<Option<(BudgetRecord, Vec<u8>)>> {
    let Some(bytes) = versioned::try_get(store, keys::BUDGET, 64 << 10)? else {
        return Ok(None);
    };
    let r: BudgetRecord =
        parse_versioned("budget", keys::BUDGET, BUDGET_TAG, BUDGET_VERSION, &bytes)?;
    Ok(Some((r, bytes)))
}

impl Counted for BudgetRecord {
    fn counter(&self) -> u64 {
        self.counter
    }
}

/// Change the store's budget by CAS: `change` turns the current budget
/// (the default when none was set) into the new one, and runs again on the
/// newer budget when another writer changed it meanwhile. Returns the
/// budget stored.
pub fn update(store: &Store, change: impl Fn(Budget) -> Result<Budget>) -> Result<Budget> {
    let mut stored = Budget::default();
    pointer::update(
        store,
        keys::BUDGET,
        "budget",
        || read(store),
        |current, stamp| {
            stored = change(current.map_or_else(Budget::default, |r| r.budget))?;
            invariant_floor_in_range(&stored)?;
            let record = BudgetRecord {
                tag: BUDGET_TAG.into(),
                version: BUDGET_VERSION,
                budget: stored,
                counter: stamp.counter,
                nonce: stamp.nonce,
            };
            let body = serde_json::to_vec_pretty(&record)
                .map_err(|e| Error::internal_from("encode the budget record", e))?;
            Ok(Some(body))
        },
    )?;
    Ok(stored)
}

/// Protects admission from a floor that would refuse everything or nothing:
/// the free-space percent stays within 0..=50.
fn invariant_floor_in_range(budget: &Budget) -> Result<()> {
    if (0.0..=50.0).contains(&budget.min_free_percent) {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "min-free percent must be between 0 and 50: got={}",
        budget.min_free_percent
    )))
}

/// Bytes the store's objects take (manifests, segments, packs, blobs).
pub fn store_bytes(store: &Store) -> Result<u64> {
    let mut total = 0;
    for top in keys::OBJECT_DIRS {
        total += dir_bytes(store, top)?;
    }
    Ok(total)
}

fn dir_bytes(store: &Store, dir: &str) -> Result<u64> {
    let sized = store.storage().list_sizes(dir)?;
    let mut total: u64 = sized.iter().map(|(_, s)| s).sum();
    for name in store.storage().list(dir)? {
        if !sized.iter().any(|(n, _)| *n == name) {
            total += dir_bytes(store, &format!("{dir}/{name}"))?;
        }
    }
    Ok(total)
}

/// Free space is read again after this many bytes were admitted since the
/// last reading (and for any larger request), so small files cost no
/// syscall each while other writers on the filesystem are still noticed.
const RECHECK_BYTES: u64 = 8 << 20;

/// What one commit or materialization may still write.
pub struct Admission {
    dir: PathBuf,
    floor: u64,
    /// Store size at the start and the limit, when one is set.
    limit: Option<(u64, u64)>,
    /// Total admitted, and (free bytes at the last reading, admitted since).
    state: Mutex<(u64, Option<(u64, u64)>)>,
}

impl Admission {
    /// The budget of `store` for work writing into `dir` (its staging).
    pub fn new(store: &Store, dir: &Path) -> Result<Admission> {
        let budget = load(store)?;
        let (_, total) = crate::os::filesystem_space(dir)?;
        let floor = budget
            .min_free_bytes
            .unwrap_or((total as f64 * budget.min_free_percent / 100.0) as u64);
        let limit = match budget.max_store_bytes {
            Some(max) => Some((store_bytes(store)?, max)),
            None => None,
        };
        Ok(Admission {
            dir: dir.to_path_buf(),
            floor,
            limit,
            state: Mutex::new((0, None)),
        })
    }

    /// Admit `need` more bytes for `what`, or refuse with [`Error::NoSpace`].
    pub fn admit(&self, what: &'static str, need: u64) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, reading) = &mut *state;
        let (free, since) = match *reading {
            Some((free, since)) if since.saturating_add(need) <= RECHECK_BYTES => (free, since),
            _ => (crate::os::filesystem_space(&self.dir)?.0, 0),
        };
        let available = free.saturating_sub(since).saturating_sub(self.floor);
        if need > available || free < self.floor {
            return Err(Error::NoSpace {
                what,
                need,
                available,
                limit: "free-space floor",
            });
        }
        if let Some((start, max)) = self.limit {
            let size = start.saturating_add(*total);
            if size.saturating_add(need) > max {
                return Err(Error::NoSpace {
                    what,
                    need,
                    available: max.saturating_sub(size),
                    limit: "store size limit",
                });
            }
        }
        *total += need;
        *reading = Some((free, since + need));
        Ok(())
    }
}
